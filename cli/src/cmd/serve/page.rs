//! `GET /`: a small status page rendered on the server from the durable
//! store (no script): counts by decision, paused objects with the reason
//! and the event that paused them, held events by reason, the relays (each
//! one's cursor, lag, failed effects and whether it is behind), the last
//! commits.
//! Every id shown sits in an element with a stable `id` or `class`, so a
//! test (or a person) can find it. Each string from senders is escaped for
//! the context it lands in:
//!
//! - in text ([`text`]), HTML-escaped, and characters that would not show
//!   as themselves (controls, bidi overrides and isolates, zero-width and
//!   line separators) shown as their code point in a marked box, so
//!   `unknown-<U+202E>txt.exe` cannot read as `unknown-exe.txt`;
//! - in an attribute or a URL ([`ident`]), percent-encoded as JavaScript's
//!   `encodeURIComponent` writes it (RFC 3986), so an attribute holds only
//!   ASCII letters, digits and `-_.!~*'()%` and never markup: a paused
//!   object's row is `id="paused-" + encodeURIComponent(id)` and links to
//!   `/objects/` + the same.
//!
//! Every response of `serve` carries [`security_headers`]: no script, no
//! framing, no content sniffing.

use super::read::with_reader;
use super::App;
use crate::terminal::invisible;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use snapshot_receiver::reconciler::{BreakerState, ReconcilerStatus, WaitingObject};
use snapshot_receiver::store::{
    AuditLine, AuthorityWaitLine, HeldEvent, RelaysReport, StoreSummary, StoredObject,
};
use std::fmt::Write as _;
use std::sync::Arc;

/// How many of the last audit rows the page lists.
const LAST_COMMITS: usize = 20;

/// What one page shows, read in one blocking call.
struct PageData {
    summary: StoreSummary,
    paused: Vec<StoredObject>,
    held: Vec<HeldEvent>,
    recent: Vec<AuditLine>,
    relays: RelaysReport,
    /// The reconciler's state and the objects waiting for an authority
    /// (`None`: no `--authority`).
    authority: Option<(ReconcilerStatus, Vec<WaitingObject>)>,
    /// The last errors reconcilers wrote to the store (shown when this
    /// server runs none: another process may).
    waits: Vec<AuthorityWaitLine>,
}

/// The page's policy: nothing but its own inline style; never in a frame.
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Middleware of every route: `Content-Security-Policy` (with
/// `frame-ancestors 'none'`), `X-Content-Type-Options: nosniff` and
/// `X-Frame-Options: DENY` (for browsers without `frame-ancestors`).
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    // A handler that set a policy of its own (the login form, which posts
    // to this server) keeps it.
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// `text` for an element's text: `&`, `<`, `>`, `"` and `'` escaped for
/// HTML, and each [`invisible`] character shown as its code point (such as
/// `U+202E`) in a `<span class="ctl">`. Never for an attribute: use
/// [`ident`].
fn text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if invisible(c) => {
                let _ = write!(out, "<span class=\"ctl\">U+{:04X}</span>", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// `value` for an attribute or a URL's path segment or query value: its
/// UTF-8 bytes percent-encoded (`%XX`, upper-case hex) except ASCII letters,
/// digits and `-_.!~*'()`, as JavaScript's `encodeURIComponent`; then `'`
/// as `&#39;`, so it is safe in an attribute quoted either way. Distinct
/// values give distinct results, and the result has no markup.
fn ident(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'\'' => out.push_str("&#39;"),
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'_'
            | b'.'
            | b'!'
            | b'~'
            | b'*'
            | b'('
            | b')' => out.push(char::from(byte)),
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// An optional string for text ([`text`]); `-` when absent.
fn opt(value: &Option<String>) -> String {
    value.as_deref().map_or_else(|| "-".to_owned(), text)
}

/// `GET /`.
pub(crate) async fn status(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    // A browser without the token gets the login form (still a 401); an
    // API client the JSON refusal every read endpoint gives.
    if !super::operator::may_read(&app, &headers) && super::login::wants_html(&headers) {
        return super::login::page(
            StatusCode::UNAUTHORIZED,
            "This server's status page needs its operator token.",
        );
    }
    let window = app.history;
    let guarded = app.operator.is_some();
    let authority = app
        .reconciler
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .map(|r| (r.status(), r.waiting()));
    let runs_reconciler = authority.is_some();
    let data = with_reader(&app, &headers, move |r| {
        Ok(PageData {
            authority,
            summary: r.summary()?,
            paused: r.objects(true)?,
            held: r.held(None)?,
            recent: r.recent_audit(LAST_COMMITS)?,
            relays: r.relays(std::time::SystemTime::now(), window)?,
            waits: if runs_reconciler {
                Vec::new()
            } else {
                r.authority_waits()?
            },
        })
    })
    .await;
    match data {
        Ok(mut data) => {
            app.live(&mut data.relays);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                render(&data, guarded),
            )
                .into_response()
        }
        Err(response) => *response,
    }
}

/// The whole page; `guarded` (an operator token is set) adds a link that
/// ends the browser's login.
fn render(d: &PageData, guarded: bool) -> String {
    let s = &d.summary;
    let mut h = String::with_capacity(8192);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>snapshot-receiver</title><style>\
         body{{font-family:sans-serif;margin:1.5em;color:#222}}\
         table{{border-collapse:collapse;margin-bottom:1.5em}}\
         th,td{{border:1px solid #ccc;padding:.25em .6em;text-align:left}}\
         th{{background:#f0f0f0}}td.n{{text-align:right}}\
         .none{{color:#777}}\
         .ctl{{border:1px solid #b00;color:#b00;font-size:.8em;padding:0 .15em}}</style></head><body>\n\
         <h1>snapshot-receiver</h1>\n<p>store <code id=\"store\">{}</code>; \
         <span id=\"objects-count\">{}</span> objects, \
         <span id=\"paused-count\">{}</span> paused, \
         <span id=\"identities-count\">{}</span> event identities</p>\n",
        text(&s.location),
        s.objects,
        s.paused_objects,
        s.identities
    );
    h.push_str(
        "<h2>Decisions</h2>\n<table id=\"decisions\"><tr><th>decision</th><th>count</th></tr>\n",
    );
    for (decision, n) in &s.decisions {
        let _ = writeln!(
            h,
            "<tr id=\"decision-{}\"><td>{}</td><td class=\"n\">{n}</td></tr>",
            ident(decision),
            text(decision)
        );
    }
    h.push_str("</table>\n<h2>Paused objects</h2>\n");
    if d.paused.is_empty() {
        h.push_str("<p class=\"none\" id=\"paused-none\">none</p>\n");
    } else {
        h.push_str(
            "<table id=\"paused\"><tr><th>object</th><th>version</th><th>reason</th>\
             <th>paused by event</th><th>since</th></tr>\n",
        );
        for o in &d.paused {
            let _ = writeln!(
                h,
                "<tr id=\"paused-{0}\"><td class=\"object\"><a href=\"/objects/{0}\">{1}</a></td>\
                 <td class=\"n\">{2}</td><td class=\"reason\">{3}</td><td class=\"event\">{4}</td>\
                 <td>{5}</td></tr>",
                ident(&o.object_id),
                text(&o.object_id),
                o.version,
                opt(&o.pause_reason),
                opt(&o.paused_by),
                opt(&o.paused_at),
            );
        }
        h.push_str("</table>\n");
    }
    h.push_str("<h2>Held events by reason</h2>\n");
    if s.held.is_empty() {
        h.push_str("<p class=\"none\" id=\"held-none\">none</p>\n");
    } else {
        h.push_str("<table id=\"held-counts\"><tr><th>reason</th><th>count</th></tr>\n");
        for (reason, n) in &s.held {
            let _ = writeln!(
                h,
                "<tr id=\"held-count-{}\"><td>{}</td><td class=\"n\">{n}</td></tr>",
                ident(reason),
                text(reason)
            );
        }
        h.push_str(
            "</table>\n<table id=\"held\"><tr><th>reason</th><th>event</th><th>object</th>\
             <th>status</th><th>held at</th></tr>\n",
        );
        for e in &d.held {
            let _ = writeln!(
                h,
                "<tr class=\"held-{}\"><td class=\"reason\">{}</td><td class=\"event\">{}</td>\
                 <td class=\"object\">{}</td><td>{}</td><td>{}</td></tr>",
                ident(&e.reason),
                text(&e.reason),
                opt(&e.event_id),
                opt(&e.object_id),
                text(&e.status),
                text(&e.held_at),
            );
        }
        h.push_str("</table>\n");
    }
    match &d.authority {
        Some((status, waiting)) => render_authority(&mut h, status, waiting),
        None => render_stored_waits(&mut h, d),
    }
    render_relays(&mut h, &d.relays);
    let _ = writeln!(
        h,
        "<h2>Last commits</h2>\n<table id=\"recent\"><tr><th>seq</th><th>at</th><th>kind</th>\
         <th>event</th><th>object</th><th>decision</th><th>version</th></tr>"
    );
    for a in d.recent.iter().rev() {
        let decision = match (&a.decision, &a.reason, &a.conflict, &a.original_decision) {
            (Some(d), _, _, Some(original)) => format!("{d} (original: {original})"),
            (Some(d), Some(detail), _, _) | (Some(d), None, Some(detail), _) => {
                format!("{d} ({detail})")
            }
            (Some(d), None, None, None) => d.clone(),
            (None, ..) => "-".to_owned(),
        };
        let _ = writeln!(
            h,
            "<tr class=\"commit\"><td class=\"n\">{}</td><td>{}</td><td>{}</td>\
             <td class=\"event\">{}</td><td class=\"object\">{}</td><td class=\"decision\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            a.seq,
            text(&a.at),
            text(&a.kind),
            opt(&a.event_id),
            opt(&a.object_id),
            text(&decision),
            a.version.map_or_else(|| "-".to_owned(), |v| v.to_string()),
        );
    }
    h.push_str("</table>\n");
    if guarded {
        h.push_str("<p><a id=\"logout\" href=\"/logout\">Log out</a></p>\n");
    }
    h.push_str("</body></html>\n");
    h
}

/// The authority section: the breaker, fetches in flight and by outcome,
/// then one row per object waiting for an authority (`id="waiting-" +
/// its id`) with why, since when, its attempts, its last error and its
/// next try.
fn render_authority(h: &mut String, status: &ReconcilerStatus, waiting: &[WaitingObject]) {
    let breaker = match status.breaker {
        BreakerState::Closed { .. } => "closed",
        BreakerState::Open { .. } => "open",
        _ => "half-open",
    };
    let f = &status.fetches;
    let _ = writeln!(
        h,
        "<h2>Waiting for an authority</h2>\n<p>breaker <span id=\"breaker\">{breaker}</span>; \
         <span id=\"in-flight\">{}</span> fetches in flight; fetched: {} applied, {} unchanged, \
         {} absent, {} older, {} wrong object, {} unavailable, {} timed out, {} bad answers</p>",
        status.in_flight,
        f.applied,
        f.unchanged,
        f.absent,
        f.older,
        f.wrong_object,
        f.unavailable,
        f.timeout,
        f.bad_answer
    );
    if waiting.is_empty() {
        h.push_str("<p class=\"none\" id=\"waiting-none\">none</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"waiting\"><tr><th>object</th><th>why</th><th>since</th><th>attempts</th>\
         <th>last error</th><th>next try</th></tr>\n",
    );
    let at = |t: std::time::SystemTime| text(&snapshot_receiver::format_rfc3339(t));
    for w in waiting {
        let why: Vec<&str> = w.reasons.iter().map(|r| r.as_str()).collect();
        let _ = writeln!(
            h,
            "<tr id=\"waiting-{}\"><td class=\"object\">{}</td><td class=\"reason\">{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"error\">{}</td><td>{}</td></tr>",
            ident(&w.object_id),
            text(&w.object_id),
            text(&why.join(", ")),
            at(w.since),
            w.attempts,
            opt(&w.last_error),
            w.next_try.map_or_else(|| "in flight".to_owned(), at),
        );
    }
    h.push_str("</table>\n");
}

/// The authority section of a server that runs no reconciler: the objects
/// the store says need an authority (`id="waiting-" + its id`), each with
/// the last error a reconciler in another process wrote, if any; nothing
/// when none waits.
fn render_stored_waits(h: &mut String, d: &PageData) {
    let needs = crate::cmd::inspect::authority_needs(&d.paused, &d.held);
    if needs.is_empty() {
        return;
    }
    h.push_str(
        "<h2>Waiting for an authority</h2>\n<p>as the store says; this server fetches none \
         (no <code>--authority</code>): last errors as a reconciler wrote them</p>\n\
         <table id=\"waiting\"><tr><th>object</th><th>why</th><th>since</th><th>attempts</th>\
         <th>last error</th><th>next try</th></tr>\n",
    );
    for (object_id, reasons) in &needs {
        let wait = crate::cmd::inspect::last_error(&d.waits, object_id);
        let _ = writeln!(
            h,
            "<tr id=\"waiting-{}\"><td class=\"object\">{}</td><td class=\"reason\">{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"error\">{}</td><td>{}</td></tr>",
            ident(object_id),
            text(object_id),
            text(&reasons.join(", ")),
            wait.map_or_else(|| "-".to_owned(), |w| text(&w.since)),
            wait.map_or(0, |w| w.attempts),
            wait.map_or_else(|| "-".to_owned(), |w| text(&w.error)),
            opt(&wait.and_then(|w| w.next_try.clone())),
        );
    }
    h.push_str("</table>\n");
}

/// The relays section: one row per relay (`id="relay-" + its name`), then
/// every failed effect (`class="failed-effect"`).
fn render_relays(h: &mut String, report: &RelaysReport) {
    let _ = writeln!(
        h,
        "<h2>Relays</h2>\n<p>last outbox position <span id=\"last-position\">{}</span></p>",
        report.last_position
    );
    if report.relays.is_empty() {
        h.push_str("<p class=\"none\" id=\"relays-none\">none</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"relays\"><tr><th>relay</th><th>position</th><th>after cursor</th><th>parked</th>\
         <th>failed</th><th>not delivered</th><th>missed</th><th>oldest pending</th><th>behind window</th>\
         <th>running</th></tr>\n",
    );
    for r in &report.relays {
        let _ = writeln!(
            h,
            "<tr id=\"relay-{}\"><td class=\"name\">{}</td><td class=\"n position\">{}</td>\
             <td class=\"n lag\">{}</td><td class=\"n parked\">{}</td>\
             <td class=\"n failed\">{}</td><td class=\"n undelivered\">{}</td>\
             <td class=\"n missed\">{}</td>\
             <td class=\"oldest\">{}</td><td class=\"behind\">{}</td><td class=\"running\">{}</td></tr>",
            ident(&r.name),
            text(&r.name),
            r.position,
            r.lag,
            r.parked.len(),
            r.failed,
            r.undelivered,
            r.missed,
            opt(&r.oldest_pending),
            if r.behind_window { "yes" } else { "no" },
            if r.running { "yes" } else { "no" },
        );
    }
    h.push_str("</table>\n");
    for r in report.relays.iter().filter(|r| r.backlogged == Some(true)) {
        let since = r
            .backlogged_since
            .as_deref()
            .map(|since| format!(" since {}", text(since)))
            .unwrap_or_default();
        let _ = writeln!(
            h,
            "<p class=\"backlogged\" id=\"backlogged-{}\">relay {} is backlogged{since}: its \
             parked effects fill their part of the memory budget; its cursor stops until they are \
             delivered, skipped or retried</p>",
            ident(&r.name),
            text(&r.name),
        );
    }
    let failed: Vec<_> = report
        .relays
        .iter()
        .flat_map(|r| r.parked.iter().map(move |p| (r, p)))
        .filter(|(_, p)| p.status == "failed")
        .collect();
    if failed.is_empty() {
        h.push_str("<p class=\"none\" id=\"failed-none\">no failed effects</p>\n");
        return;
    }
    h.push_str(
        "<table id=\"failed-effects\"><tr><th>relay</th><th>position</th><th>effect</th>\
         <th>object</th><th>version</th><th>attempts</th><th>last refusal</th></tr>\n",
    );
    for (r, p) in failed {
        let _ = writeln!(
            h,
            "<tr class=\"failed-effect\"><td class=\"relay\">{}</td><td class=\"n position\">{}</td>\
             <td class=\"effect\">{}</td><td class=\"object\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"error\">{}</td></tr>",
            text(&r.name),
            p.position,
            text(&p.effect_id),
            text(&p.object_id),
            p.version,
            p.attempts,
            opt(&p.error),
        );
    }
    h.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::{ident, render_relays, text};
    use snapshot_receiver::store::{RelayStatus, RelaysReport};

    /// Issue 48 item 11: a relay the server runs that is backlogged gets a
    /// line of its own under the table; one the server only reads from the
    /// store (not known) or that is not backlogged gets none.
    #[test]
    fn a_backlogged_relay_is_said_under_the_relays_table() {
        let relay = |name: &str| RelayStatus {
            name: name.to_owned(),
            position: 3,
            lag: 5,
            undelivered: 8,
            missed: 0,
            oldest_pending: None,
            behind_window: false,
            generation: 1,
            running: true,
            owner: None,
            lease_until: None,
            updated: "2026-12-06T00:00:00Z".to_owned(),
            failed: 0,
            parked: Vec::new(),
            backlogged: None,
            backlogged_since: None,
            parked_bytes: None,
        };
        let mut report = RelaysReport {
            last_position: 8,
            history_window_seconds: None,
            relays: vec![relay("forward"), relay("other")],
        };
        let mut page = String::new();
        render_relays(&mut page, &report);
        assert!(!page.contains("backlogged"), "{page}");
        report.mark_backlogged("forward", true);
        report.mark_backlogged("other", false);
        assert_eq!(report.relays[1].backlogged, Some(false));
        let mut page = String::new();
        render_relays(&mut page, &report);
        assert_eq!(page.matches("class=\"backlogged\"").count(), 1, "{page}");
        assert!(
            page.contains(
                "<p class=\"backlogged\" id=\"backlogged-forward\">relay forward is backlogged: \
                 its parked effects fill their part of the memory budget; its cursor stops until \
                 they are delivered, skipped or retried</p>"
            ),
            "{page}"
        );
        // Recorded in the store by the relay's saves: the start is said
        // (escaped as every text of the page).
        report.relays[1].backlogged = Some(true);
        report.relays[1].backlogged_since = Some("2026-12-06T00:00:00Z<".to_owned());
        let mut page = String::new();
        render_relays(&mut page, &report);
        assert!(
            page.contains(
                "<p class=\"backlogged\" id=\"backlogged-other\">relay other is backlogged since \
                 2026-12-06T00:00:00Z&lt;: its parked effects fill"
            ),
            "{page}"
        );
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            text(r#"<b>"x" & 'y'</b>"#),
            "&lt;b&gt;&quot;x&quot; &amp; &#39;y&#39;&lt;/b&gt;"
        );
    }

    #[test]
    fn shows_controls_and_bidi_characters_as_code_points() {
        assert_eq!(
            text("unknown-\u{202E}txt.exe"),
            "unknown-<span class=\"ctl\">U+202E</span>txt.exe"
        );
        assert_eq!(
            text("a\u{0}b\u{1b}[31m\u{7f}\u{85}\u{2066}\u{200B}\u{FEFF}\u{2028}"),
            "a<span class=\"ctl\">U+0000</span>b<span class=\"ctl\">U+001B</span>[31m\
             <span class=\"ctl\">U+007F</span><span class=\"ctl\">U+0085</span>\
             <span class=\"ctl\">U+2066</span><span class=\"ctl\">U+200B</span>\
             <span class=\"ctl\">U+FEFF</span><span class=\"ctl\">U+2028</span>"
        );
        // Letters of right-to-left scripts are text, not controls.
        assert_eq!(text("\u{5d0}\u{627}é"), "\u{5d0}\u{627}é");
    }

    /// Issue 37 item 3: in an attribute the control-character box (and any
    /// other markup) never appears; ids that differ stay apart.
    #[test]
    fn attributes_and_urls_get_ids_percent_encoded_as_encode_uri_component() {
        assert_eq!(ident("card-7_v1.x~!*()"), "card-7_v1.x~!*()");
        assert_eq!(ident("a\u{202E}b"), "a%E2%80%AEb");
        assert_eq!(
            ident("x\"><h1 id='p'>&</h1> %/?#\u{0}\u{1b}\r\n\u{85}é"),
            "x%22%3E%3Ch1%20id%3D&#39;p&#39;%3E%26%3C%2Fh1%3E%20%25%2F%3F%23%00%1B%0D%0A%C2%85%C3%A9"
        );
        // `%` is encoded: the literal text `%E2%80%AE` is not U+202E.
        assert_eq!(ident("a%E2%80%AEb"), "a%25E2%2580%25AEb");
    }
}
