//! A browser's way to the status page when an operator token guards it:
//! `GET /login` shows a form, `POST /login` with the right token sets a
//! page cookie, `GET /logout` clears it.
//!
//! The cookie lets a browser **read** (the page and the read endpoints,
//! [`super::operator::authorize_read`]); it never admits an operator
//! change (`/reconcile`, `/purge`, the relay changes), which keep taking the
//! bearer token alone, so a page open in a browser cannot be made to change
//! anything by another site. It is `HttpOnly` (no script reads it) and
//! `SameSite=Strict` (no other site's request carries it), and holds no
//! token: its value is `EXPIRES.MAC`, the Unix second it lapses
//! ([`SESSION`] after the login) and the HMAC-SHA256 of that second keyed
//! with the token's digest, compared in constant time. A new token (a
//! restart with another `--operator-token`) ends every session. It is as
//! private as the connection: over plain HTTP, put TLS in front of `serve`
//! before a browser logs in from another machine.

use super::operator::OperatorToken;
use super::warn::WarnKind;
use super::App;
use axum::extract::{Form, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hmac::{KeyInit, Mac};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use subtle::ConstantTimeEq;

/// How long a login lasts: 12 hours.
pub(crate) const SESSION: Duration = Duration::from_secs(12 * 3600);

/// The cookie's name.
const COOKIE: &str = "sr_page";

/// The login page's policy: the page's own (no script, no framing), but
/// its form may post to this server.
const LOGIN_POLICY: &str =
    "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The MAC of a session lapsing at `expires` (Unix seconds), keyed with
/// the token's digest (`None` only if HMAC refused the key, which it never
/// does: it takes keys of any length).
fn session_mac(key: &[u8; 32], expires: u64) -> Option<[u8; 32]> {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
    mac.update(b"snapshot-receiver page session ");
    mac.update(expires.to_string().as_bytes());
    Some(mac.finalize().into_bytes().into())
}

/// Seconds since the Unix epoch at `at` (0 before it).
fn unix(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl OperatorToken {
    /// The cookie value of a session opened at `now` (`None` when no
    /// session can be made: see [`session_mac`]).
    pub(crate) fn session(&self, now: SystemTime) -> Option<String> {
        let expires = unix(now).saturating_add(SESSION.as_secs());
        let mac = session_mac(self.digest(), expires)?;
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{expires}.{hex}"))
    }

    /// Whether `headers` carry a page cookie of this token that has not
    /// lapsed at `now`.
    pub(crate) fn admits_session(&self, headers: &HeaderMap, now: SystemTime) -> bool {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .any(|value| self.session_valid(value, now))
    }

    fn session_valid(&self, value: &str, now: SystemTime) -> bool {
        let Some((expires, hex)) = value.split_once('.') else {
            return false;
        };
        let Ok(expires) = expires.parse::<u64>() else {
            return false;
        };
        if expires <= unix(now) || hex.len() != 64 {
            return false;
        }
        let given: Option<Vec<u8>> = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
            .collect();
        match (given, session_mac(self.digest(), expires)) {
            (Some(given), Some(mac)) => mac.ct_eq(given.as_slice()).into(),
            _ => false,
        }
    }
}

/// Whether the request asks for HTML (a browser's `Accept`).
pub(crate) fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/html"))
}

/// The login page answered with `status`, saying `note` above the form.
pub(crate) fn page(status: StatusCode, note: &str) -> Response {
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>snapshot-receiver: log in</title><style>\
         body{{font-family:sans-serif;margin:2em;max-width:32em}}\
         label,input,button{{display:block;margin:.5em 0}}</style></head><body>\
         <h1>snapshot-receiver</h1><p id=\"note\">{note}</p>\
         <form method=\"post\" action=\"/login\">\
         <label for=\"token\">Operator token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required>\
         <button type=\"submit\">Show the status page</button></form>\
         <p>The page and the read endpoints open for {hours} hours in this browser; \
         operator changes still take the token as a bearer credential.</p></body></html>\n",
        hours = SESSION.as_secs() / 3600,
    );
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response();
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(LOGIN_POLICY),
    );
    response
}

/// `GET /login`.
pub(crate) async fn form(State(app): State<Arc<App>>) -> Response {
    match &app.operator {
        Some(_) => page(
            StatusCode::OK,
            "This server's status page needs its operator token.",
        ),
        None => see_other("/", None),
    }
}

/// The fields of the login form.
#[derive(serde::Deserialize)]
pub(crate) struct Login {
    /// The operator token as typed.
    token: String,
}

/// `POST /login`: the right token sets the page cookie and goes to the
/// page (303); a wrong one shows the form again (401, counted and logged
/// as a refused operator token).
pub(crate) async fn login(State(app): State<Arc<App>>, Form(login): Form<Login>) -> Response {
    let Some(token) = &app.operator else {
        return see_other("/", None);
    };
    if token.matches(login.token.trim()) {
        if let Some(session) = token.session(SystemTime::now()) {
            let cookie = format!(
                "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
                SESSION.as_secs()
            );
            return see_other("/", Some(cookie));
        }
    }
    metrics::counter!("snapshot_receiver_http_unauthorized_total", "reason" => "operator_token")
        .increment(1);
    if app.warnings.admit(WarnKind::OperatorRefused) {
        tracing::warn!("operator token wrong at /login: answered 401");
    }
    page(StatusCode::UNAUTHORIZED, "That is not the operator token.")
}

/// `GET /logout`: clears the page cookie and goes to the login form.
pub(crate) async fn logout() -> Response {
    see_other(
        "/login",
        Some(format!(
            "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
        )),
    )
}

/// A 303 to `location`, setting `cookie` if given.
fn see_other(location: &'static str, cookie: Option<String>) -> Response {
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    if let Some(value) = cookie.and_then(|c| HeaderValue::try_from(c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::try_from(format!("other=1; {COOKIE}={value}")).unwrap(),
        );
        headers
    }

    #[test]
    fn a_session_is_admitted_until_it_lapses_and_only_for_its_token() {
        let token = OperatorToken::new("t0k").unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let value = token.session(t0).unwrap();
        assert_eq!(value.split_once('.').unwrap().0, "1800043200");
        let headers = with_cookie(&value);
        assert!(token.admits_session(&headers, t0));
        assert!(token.admits_session(&headers, t0 + SESSION - Duration::from_secs(1)));
        assert!(!token.admits_session(&headers, t0 + SESSION));
        let other = OperatorToken::new("t0k2").unwrap();
        assert!(!other.admits_session(&headers, t0));
    }

    #[test]
    fn a_changed_expiry_or_mac_is_refused() {
        let token = OperatorToken::new("t0k").unwrap();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let value = token.session(t0).unwrap();
        let (expires, mac) = value.split_once('.').unwrap();
        let later = format!("{}.{mac}", expires.parse::<u64>().unwrap() + 3600);
        assert!(!token.admits_session(&with_cookie(&later), t0));
        let mut flipped = mac.to_owned();
        flipped.replace_range(0..1, if mac.starts_with('0') { "1" } else { "0" });
        assert!(!token.admits_session(&with_cookie(&format!("{expires}.{flipped}")), t0));
        for bad in [
            "",
            ".",
            "x.y",
            &format!("{expires}."),
            &format!("{expires}.{mac}00"),
        ] {
            assert!(!token.admits_session(&with_cookie(bad), t0), "{bad:?}");
        }
        assert!(!token.admits_session(&HeaderMap::new(), t0));
    }
}
