//! `audit`: the audit trail of one event identity or one object, in the
//! order it was recorded, read without taking the store over.

use crate::options::{Format, StoreArgs};
use crate::terminal::shown;
use snapshot_receiver::store::AuditLine;
use std::io::Write;

/// The arguments of `audit`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["event", "object"])))]
pub(crate) struct AuditArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The trail of this event identity (every delivery of it, its
    /// re-decisions, what it paused).
    #[arg(long, value_name = "ID")]
    event: Option<String>,
    /// The trail of this object (its deliveries, pauses, authorities,
    /// re-decisions).
    #[arg(long, value_name = "ID")]
    object: Option<String>,
    /// Output format: a table for a person, or JSON Lines (one audit row
    /// each, with the replay report's field names).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs `audit`. An id with no trail prints nothing (JSON) or says so (text).
pub(crate) fn run(args: AuditArgs) -> anyhow::Result<()> {
    let reader = args.store.reader()?;
    let (what, lines) = match (&args.event, &args.object) {
        (Some(id), _) => (format!("event {}", shown(id)), reader.audit_for_event(id)?),
        (None, Some(id)) => (
            format!("object {}", shown(id)),
            reader.audit_for_object(id)?,
        ),
        (None, None) => unreachable!("clap requires --event or --object"),
    };
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            for line in &lines {
                serde_json::to_writer(&mut out, line)?;
                writeln!(out)?;
            }
        }
        Format::Text => {
            if lines.is_empty() {
                writeln!(
                    out,
                    "no audit rows for {what} in {}",
                    shown(reader.location())
                )?;
            }
            // The whole line escaped: ids, reasons and details are the
            // client's or the store's text.
            for line in &lines {
                writeln!(out, "{}", shown(&text(line)))?;
            }
        }
    }
    Ok(())
}

/// One audit row in words: time, event, object, what happened, version.
fn text(a: &AuditLine) -> String {
    let what = match (&a.decision, &a.original_decision) {
        (Some(d), Some(original)) => format!("{d} (of {original})"),
        (Some(d), None) => match a.reason.as_deref().or(a.conflict.as_deref()) {
            Some(why) => format!("{d} ({why})"),
            None => d.clone(),
        },
        (None, _) => a.kind.clone(),
    };
    let version = a.version.map_or_else(String::new, |v| format!(" v{v}"));
    let replaced = if a.replacement { ", replaced" } else { "" };
    let detail = a
        .detail
        .as_deref()
        .map_or_else(String::new, |d| format!("; {d}"));
    format!(
        "{} {} {} {}: {what}{version}{replaced}{detail}",
        a.at,
        a.kind,
        a.event_id.as_deref().unwrap_or("-"),
        a.object_id.as_deref().unwrap_or("-"),
    )
}
