//! `relays`: the relays of a durable store (docs/CONTRACT.md §10), each
//! with its cursor, lag and parked effects; and the operator's changes:
//! retry failed effects, skip one, rewind a relay. A running relay notices
//! a change at its next save and reads its state again.

use crate::error::InputError;
use crate::options::{Format, StoreArgs};
use snapshot_receiver::format_rfc3339;
use snapshot_receiver::store::{OutboxStore, ParkedEffect, RelayRow};
use std::io::Write;
use std::time::SystemTime;

/// The arguments of `relays`.
#[derive(clap::Args)]
pub(crate) struct RelaysArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Retries relay NAME's failed effects now, from the first attempt of
    /// their schedule (only the one at --position, when given).
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
    /// Output format: text for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs `relays`: the change asked for (if any), then the relays as they
/// are.
pub(crate) fn run(args: RelaysArgs) -> anyhow::Result<()> {
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
    let known = |outbox: &mut Box<dyn OutboxStore>, name: &str| -> anyhow::Result<()> {
        if outbox.relays()?.iter().any(|r| r.name == name) {
            Ok(())
        } else {
            Err(InputError::new(format!("no relay named {name:?} in this store")).into())
        }
    };
    let mut changed = None;
    if let Some(name) = &args.retry {
        known(&mut outbox, name)?;
        let n = outbox.retry_failed(name, args.position, now)?;
        changed = Some(format!("{name}: {n} failed effect(s) to be retried now"));
    } else if let (Some(name), Some(position)) = (&args.skip, args.position) {
        known(&mut outbox, name)?;
        if !outbox.skip(name, position, now)? {
            return Err(InputError::new(format!(
                "relay {name:?} has no parked effect at position {position}"
            ))
            .into());
        }
        changed = Some(format!("{name}: the effect at position {position} skipped"));
    } else if let (Some(name), Some(position)) = (&args.rewind, args.position) {
        known(&mut outbox, name)?;
        outbox.rewind(name, position, now)?;
        changed = Some(format!("{name}: rewound to position {position}"));
    }
    let last = outbox.last_position()?;
    let mut relays = Vec::new();
    for row in outbox.relays()? {
        let parked = outbox.parked(&row.name)?;
        relays.push((row, parked));
    }
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            let json = serde_json::json!({
                "changed": changed,
                "last_position": last,
                "relays": relays.iter().map(|(row, parked)| relay_json(row, parked, last)).collect::<Vec<_>>(),
            });
            writeln!(out, "{json}")?;
        }
        Format::Text => {
            if let Some(changed) = &changed {
                writeln!(out, "{changed}")?;
            }
            writeln!(out, "last outbox position: {last}")?;
            if relays.is_empty() {
                writeln!(out, "no relays")?;
            }
            for (row, parked) in &relays {
                write_relay(&mut out, row, parked, last)?;
            }
        }
    }
    Ok(())
}

/// How many effects relay `row` has not passed.
fn lag(row: &RelayRow, last: u64) -> u64 {
    last.saturating_sub(row.position)
}

fn relay_json(row: &RelayRow, parked: &[ParkedEffect], last: u64) -> serde_json::Value {
    serde_json::json!({
        "name": row.name,
        "position": row.position,
        "lag": lag(row, last),
        "generation": row.generation,
        "owner": row.owner,
        "lease_until": row.lease_until.map(format_rfc3339),
        "updated": format_rfc3339(row.updated),
        "parked": parked.iter().map(|p| serde_json::json!({
            "position": p.effect.position,
            "effect_id": p.effect.id.to_string(),
            "object_id": p.effect.object_id,
            "version": p.effect.version,
            "status": p.status.as_str(),
            "attempts": p.attempts,
            "due": p.due.map(format_rfc3339),
            "error": p.error,
        })).collect::<Vec<_>>(),
    })
}

fn write_relay(
    out: &mut impl Write,
    row: &RelayRow,
    parked: &[ParkedEffect],
    last: u64,
) -> std::io::Result<()> {
    let failed = parked
        .iter()
        .filter(|p| p.status == snapshot_receiver::store::ParkedStatus::Failed)
        .count();
    writeln!(
        out,
        "relay {}: position {} (lag {}), {} parked ({failed} failed), {}",
        row.name,
        row.position,
        lag(row, last),
        parked.len(),
        match (&row.owner, row.lease_until) {
            (Some(owner), Some(until)) if until > SystemTime::now() =>
                format!("held by {owner} until {}", format_rfc3339(until)),
            _ => "not running".to_owned(),
        }
    )?;
    for p in parked {
        write!(
            out,
            "  {} {} {} v{} ({}, {} attempt(s)",
            p.status.as_str(),
            p.effect.position,
            p.effect.object_id,
            p.effect.version,
            p.effect.id,
            p.attempts
        )?;
        if let Some(due) = p.due {
            write!(out, ", next {}", format_rfc3339(due))?;
        }
        if let Some(error) = &p.error {
            write!(out, "): {error}")?;
        } else {
            write!(out, ")")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
