//! `relays`: the relays of a durable store (docs/CONTRACT.md §10), each
//! with its cursor, lag and parked effects; and the operator's changes:
//! retry failed effects, skip one, rewind a relay. A running relay notices
//! a change at its next save and reads its state again.

use crate::error::InputError;
use crate::options::{Format, StoreArgs};
use crate::terminal::shown;
use snapshot_receiver::store::{change_relay, RelayChange, RelayStatus};
use std::io::Write;
use std::time::SystemTime;

/// The arguments of `relays`.
#[derive(clap::Args)]
pub(crate) struct RelaysArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Retries relay NAME's failed effects now, from the first attempt of
    /// their schedule (only the one at --position, when given; refused
    /// when that one is not failed).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["skip", "rewind"])]
    retry: Option<String>,
    /// Drops relay NAME's parked effect at --position without delivering
    /// it; its object's next effect goes then.
    #[arg(
        long,
        value_name = "NAME",
        requires = "position",
        conflicts_with = "rewind"
    )]
    skip: Option<String>,
    /// Moves relay NAME's cursor to --position: every effect after it is
    /// delivered again, with its same id.
    #[arg(long, value_name = "NAME", requires = "position")]
    rewind: Option<String>,
    /// The outbox position --retry, --skip or --rewind applies to.
    #[arg(long, value_name = "POSITION")]
    position: Option<u64>,
    /// Seconds the store keeps history (outbox) rows, as the receiver
    /// writing it was told (`--history-retention`): a relay whose oldest
    /// pending effect is older is reported behind the window. Default 7
    /// days.
    #[arg(long, value_name = "SECONDS",
          default_value_t = snapshot_receiver::store::DEFAULT_HISTORY_RETENTION.as_secs_f64())]
    history_retention: f64,
    /// Output format: text for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs `relays`: the change asked for (if any), then the relays as they
/// are.
pub(crate) fn run(args: RelaysArgs) -> anyhow::Result<()> {
    if let (Some(position), None, None, None) =
        (args.position, &args.retry, &args.skip, &args.rewind)
    {
        return Err(InputError::new(format!(
            "--position {position}: says where --retry, --skip or --rewind applies; give one of them"
        ))
        .into());
    }
    // Checks that the store exists and is a receiver's before opening it
    // for writing (which would create the tables).
    args.store.reader()?;
    let mut store = snapshot_receiver::store::open_in_schema(
        &args.store.store,
        args.store.store_schema.as_deref(),
    )?;
    let mut outbox = store.outbox_store()?.ok_or_else(|| {
        InputError::new(format!(
            "--store {}: this store keeps no relays",
            args.store.store
        ))
    })?;
    drop(store);
    let now = SystemTime::now();
    let asked = match (&args.retry, &args.skip, &args.rewind, args.position) {
        (Some(name), ..) => Some((
            name,
            RelayChange::Retry {
                position: args.position,
            },
        )),
        (_, Some(name), _, Some(position)) => Some((name, RelayChange::Skip { position })),
        (_, _, Some(name), Some(position)) => Some((name, RelayChange::Rewind { position })),
        _ => None,
    };
    let mut changed = None;
    if let Some((name, change)) = asked {
        // The same rule as `serve`'s POST /relays/{name}/...
        match change_relay(outbox.as_mut(), name, change, now)? {
            Ok(done) => changed = Some(format!("{}: {done}", shown(name))),
            Err(refused) => return Err(InputError::new(refused.to_string()).into()),
        }
    }
    let window = crate::options::history_window(args.history_retention)?;
    let report = snapshot_receiver::store::relays_report(outbox.as_mut(), now, Some(window))?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            let mut json = serde_json::to_value(&report)?;
            json["changed"] = serde_json::json!(changed);
            writeln!(out, "{json}")?;
        }
        Format::Text => {
            if let Some(changed) = &changed {
                writeln!(out, "{changed}")?;
            }
            writeln!(out, "last outbox position: {}", report.last_position)?;
            if report.relays.is_empty() {
                writeln!(out, "no relays")?;
            }
            for relay in &report.relays {
                write_relay(&mut out, relay)?;
            }
        }
    }
    Ok(())
}

/// One relay as text: its line (cursor, effects after it, parked, failed,
/// how many are not delivered (those after the cursor and those parked),
/// whether it runs), what it missed, whether it is backlogged (since when,
/// its parked heads' bytes, as its last save recorded them) or holds
/// effects past the history window, then each parked effect. Names, ids and error texts are escaped
/// ([`crate::terminal::shown`]).
pub(crate) fn write_relay(out: &mut impl Write, r: &RelayStatus) -> std::io::Result<()> {
    writeln!(
        out,
        "relay {}: position {}, {} after it, {} parked ({} failed): {} not delivered, {}",
        shown(&r.name),
        r.position,
        r.lag,
        r.parked.len(),
        r.failed,
        r.undelivered,
        match (&r.owner, &r.lease_until) {
            (Some(owner), Some(until)) if r.running => {
                format!("held by {} until {}", shown(owner), shown(until))
            }
            _ => "not running".to_owned(),
        }
    )?;
    if r.missed > 0 {
        writeln!(
            out,
            "  missed: {} effect(s) after its cursor are no longer kept; it resumes past them",
            r.missed
        )?;
    }
    if r.backlogged == Some(true) {
        write!(out, "  backlogged")?;
        if let Some(since) = &r.backlogged_since {
            write!(out, " since {}", shown(since))?;
        }
        write!(out, ": its parked effects")?;
        if let Some(bytes) = r.parked_bytes {
            write!(out, " ({bytes} bytes of heads)")?;
        }
        writeln!(
            out,
            " fill their part of the memory budget; its cursor stops until they are delivered, \
             skipped or retried"
        )?;
    }
    if r.behind_window {
        writeln!(
            out,
            "  behind the history window: its oldest pending effect ({}) is older than the \
             window; the purge keeps it and what follows until the relay passes it",
            crate::terminal::shown_or_dash(r.oldest_pending.as_deref())
        )?;
    }
    for p in &r.parked {
        write!(
            out,
            "  {} {} {} v{} ({}, {} attempt(s)",
            p.status,
            p.position,
            shown(&p.object_id),
            p.version,
            p.effect_id,
            p.attempts
        )?;
        if let Some(due) = &p.due {
            write!(out, ", next {}", shown(due))?;
        }
        if let Some(error) = &p.error {
            write!(out, "): {}", shown(error))?;
        } else {
            write!(out, ")")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
