//! `inspect`: what a durable store holds, read without taking it over (also
//! while a receiver process writes it): counts by decision, paused objects
//! with what paused them, held events by reason, parked unknown objects,
//! identities, the objects waiting for an authority and why
//! (docs/CONTRACT.md §4), and the relays (docs/CONTRACT.md §10): each one's
//! cursor, lag, failed effects, and whether it is behind.

use crate::options::{Format, StoreArgs};
use crate::terminal::{shown, shown_or_dash};
use snapshot_receiver::store::{
    AuthorityWaitLine, HeldEvent, RelaysReport, StoreSummary, StoredObject,
};
use std::io::Write;

/// The arguments of `inspect`.
#[derive(clap::Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Seconds the store keeps history (outbox) rows, as the receiver
    /// writing it was told (`--history-retention`): a relay whose oldest
    /// pending effect is older is reported behind the window. Default 7
    /// days.
    #[arg(long, value_name = "SECONDS",
          default_value_t = snapshot_receiver::store::DEFAULT_HISTORY_RETENTION.as_secs_f64())]
    history_retention: f64,
    /// Output format: text for a person, or one JSON object
    /// (`{"summary": {...}, "paused": [...], "held": [...], "relays": {...}}`).
    ///
    /// JSON: the objects waiting for an authority are in
    /// `waiting_for_authority`, each with its `last_error` (null before a
    /// reconciler's fetch failed).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// What `inspect` shows; `--format json` prints it as one JSON object with
/// these three members.
struct Inspection {
    /// The counts.
    summary: StoreSummary,
    /// Paused objects with the cause of their pause, by object id.
    paused: Vec<StoredObject>,
    /// Events still held, in arrival order.
    held: Vec<HeldEvent>,
    /// The relays, with the last outbox position.
    relays: RelaysReport,
    /// The last errors a reconciler wrote, by object id.
    waits: Vec<AuthorityWaitLine>,
}

/// Runs `inspect`.
pub(crate) fn run(args: InspectArgs) -> anyhow::Result<()> {
    let reader = args.store.reader()?;
    let window = crate::options::history_window(args.history_retention)?;
    // Five reads: each is consistent in itself; a receiver writing
    // meanwhile can make them differ by what it recorded in between.
    let inspection = Inspection {
        summary: reader.summary()?,
        paused: reader.objects(true)?,
        held: reader.held(None)?,
        relays: reader.relays(std::time::SystemTime::now(), Some(window))?,
        waits: reader.authority_waits()?,
    };
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            let waiting: Vec<_> = authority_needs(&inspection.paused, &inspection.held)
                .into_iter()
                .map(|(object_id, reasons)| {
                    let last_error = last_error(&inspection.waits, &object_id).map(|w| {
                        serde_json::json!({
                            "outcome": w.outcome,
                            "error": w.error,
                            "attempts": w.attempts,
                            "since": w.since,
                            "next_try": w.next_try,
                            "at": w.at,
                        })
                    });
                    serde_json::json!({
                        "object_id": object_id,
                        "reasons": reasons,
                        "last_error": last_error,
                    })
                })
                .collect();
            let json = serde_json::json!({
                "summary": inspection.summary,
                "paused": inspection.paused,
                "held": inspection.held,
                "waiting_for_authority": waiting,
                "relays": inspection.relays,
            });
            serde_json::to_writer(&mut out, &json)?;
            writeln!(out)?;
        }
        Format::Text => write_text(&mut out, &inspection)?,
    }
    Ok(())
}

/// The inspection as text; every string a client or the store chose (ids,
/// decisions, reasons, details) escaped for a terminal
/// ([`crate::terminal::shown`]).
fn write_text(out: &mut impl Write, i: &Inspection) -> std::io::Result<()> {
    let s = &i.summary;
    writeln!(out, "store: {}", shown(&s.location))?;
    let decisions: Vec<String> = s
        .decisions
        .iter()
        .map(|(d, n)| format!("{} {n}", shown(d)))
        .collect();
    let recorded: u64 = s.decisions.values().sum();
    writeln!(
        out,
        "deliveries recorded: {recorded} ({})",
        decisions.join(", ")
    )?;
    writeln!(
        out,
        "objects: {} ({} paused, {} deleted)",
        s.objects, s.paused_objects, s.deleted_objects
    )?;
    let held: u64 = s.held.values().sum();
    if held == 0 {
        writeln!(out, "held events: none")?;
    } else {
        let by: Vec<String> = s
            .held
            .iter()
            .map(|(r, n)| format!("{} {n}", shown(r)))
            .collect();
        writeln!(out, "held events: {held} ({})", by.join(", "))?;
    }
    writeln!(out, "superseded inputs: {}", s.superseded)?;
    if s.parked.is_empty() {
        writeln!(out, "parked unknown objects: none")?;
    } else {
        let parked: Vec<String> = s
            .parked
            .iter()
            .map(|p| format!("{} ({})", shown(&p.object_id), p.events))
            .collect();
        writeln!(
            out,
            "parked unknown objects: {} ({})",
            s.parked.len(),
            parked.join(", ")
        )?;
    }
    let oldest = s
        .oldest_identity_at
        .as_deref()
        .map_or_else(String::new, |at| format!(", oldest recorded {}", shown(at)));
    writeln!(
        out,
        "event identities: {}, variants: {}{oldest}",
        s.identities, s.variants
    )?;
    if let Some(at) = &s.last_recorded_at {
        writeln!(out, "last recorded: {}", shown(at))?;
    }
    writeln!(out, "\n== paused objects ==")?;
    if i.paused.is_empty() {
        writeln!(out, "none")?;
    }
    for o in &i.paused {
        let cause = match (&o.pause_reason, &o.paused_by, &o.paused_at) {
            (Some(reason), Some(by), Some(at)) => {
                format!("{} by {} at {}", shown(reason), shown(by), shown(at))
            }
            _ => "cause not in the audit trail".to_owned(),
        };
        writeln!(
            out,
            "{} v{} {}: {cause}",
            shown(&o.object_id),
            o.version,
            shown(o.state.get())
        )?;
    }
    writeln!(out, "\n== held events (arrival order) ==")?;
    if i.held.is_empty() {
        writeln!(out, "none")?;
    }
    for h in &i.held {
        let detail = h
            .detail
            .as_deref()
            .map_or_else(String::new, |d| format!(": {}", shown(d)));
        // A variant naming another object than its first record paused
        // that object too: it is listed under both.
        let first = h
            .first_record_object_id
            .as_deref()
            .map_or_else(String::new, |first| {
                format!(" (first record on {}, paused by it)", shown(first))
            });
        writeln!(
            out,
            "{} on {}{first}: {} ({}), {} since {}{detail}",
            shown_or_dash(h.event_id.as_deref()),
            shown_or_dash(h.object_id.as_deref()),
            shown(&h.decision),
            shown(&h.reason),
            shown(&h.status),
            shown(&h.held_at)
        )?;
    }
    writeln!(out, "\n== waiting for an authority ==")?;
    let needs = authority_needs(&i.paused, &i.held);
    if needs.is_empty() {
        writeln!(out, "none")?;
    }
    for (object_id, reasons) in &needs {
        let error = match last_error(&i.waits, object_id) {
            Some(w) => {
                let next = w
                    .next_try
                    .as_deref()
                    .map_or_else(String::new, |at| format!(", next try {}", shown(at)));
                format!(
                    "; last error at {} after {} attempts: {}{next}",
                    shown(&w.at),
                    w.attempts,
                    shown(&w.error)
                )
            }
            None => String::new(),
        };
        writeln!(out, "{}: {}{error}", shown(object_id), reasons.join(", "))?;
    }
    // Only a store that has relays shows them.
    if !i.relays.relays.is_empty() {
        writeln!(
            out,
            "\n== relays (last outbox position {}) ==",
            i.relays.last_position
        )?;
        for relay in &i.relays.relays {
            super::relays::write_relay(out, relay)?;
        }
    }
    Ok(())
}

/// The last error a reconciler wrote for `object_id`, if any (`waits` is
/// sorted by object id).
pub(crate) fn last_error<'a>(
    waits: &'a [AuthorityWaitLine],
    object_id: &str,
) -> Option<&'a AuthorityWaitLine> {
    waits
        .binary_search_by(|w| w.object_id.as_str().cmp(object_id))
        .ok()
        .map(|i| &waits[i])
}

/// Hold reasons of held events an authority can settle; a parked event
/// (an unknown object) counts by its status, `parked`, as `unknown_object`.
const SETTLED_BY_AN_AUTHORITY: [&str; 4] = [
    "missing_version",
    "invalid_version",
    "unsupported_type",
    "malformed",
];

/// What the store says needs an authority (docs/CONTRACT.md §4), by object
/// id: `paused` for a paused object, `unknown_object` for parked events,
/// and the reasons of held events an authority can settle, each once, in
/// that order. What a reconciler fetches (`serve --authority`,
/// `reconciler`); the last error it wrote per object is in the store's
/// `authority_waits` ([`last_error`]).
pub(crate) fn authority_needs(
    paused: &[StoredObject],
    held: &[HeldEvent],
) -> std::collections::BTreeMap<String, Vec<&'static str>> {
    let mut needs: std::collections::BTreeMap<String, Vec<&'static str>> = paused
        .iter()
        .map(|o| (o.object_id.clone(), vec!["paused"]))
        .collect();
    for h in held {
        let reason = if h.status == "parked" {
            Some("unknown_object")
        } else if h.decision == "held" {
            SETTLED_BY_AN_AUTHORITY
                .iter()
                .copied()
                .find(|r| *r == h.reason)
        } else {
            None
        };
        if let (Some(reason), Some(object_id)) = (reason, &h.object_id) {
            let reasons = needs.entry(object_id.clone()).or_default();
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
        }
    }
    needs
}
