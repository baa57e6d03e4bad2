//! `fill`: writes objects and receipts straight into a durable store, in
//! large transactions, for trying a receiver at scale (its start-up, the
//! identity filter's scan, the working set) without deciding every
//! delivery first.
//!
//! Object `obj-K` is written at version 1 with the state `{"v":1}`, as an
//! initial object is seeded (one the store already has keeps its row).
//! Receipt `fill-e-N` is the first delivery of
//! `{"event_id":"fill-e-N","object_id":"obj-K","object_version":1,"type":"card.snapshot","state":{"v":1}}`
//! (K = N mod the objects), decided `applied`, with that body's fingerprint:
//! a receiver given that body again answers `duplicate`, any other content
//! under the same event id is a variant. First-seen times are spread evenly
//! over the `--spread` seconds before now, inside the default retention
//! window, so that a receiver started on the store counts every receipt.
//! With `--held N`, held event `fill-h-N` waits on object `obj-K` (K = N
//! mod the objects, which the fill pauses), held as `held:paused`, with a
//! `card.snapshot` body of `--held-bytes` bytes: a store for trying what a
//! receiver does with many waiting bodies (docs/CONTRACT.md §9).
//! Nothing else is written (no audit or history rows).

use crate::error::InputError;
use snapshot_receiver::core::BodyParser;
use snapshot_receiver::store::{
    HeldKey, HeldRow, HeldStatus, ObjectRow, ReceiptRow, StoreError, StoreReader, Write,
};
use snapshot_receiver::{HoldReason, Verdict};
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The arguments of `fill`.
#[derive(clap::Args)]
pub(crate) struct FillArgs {
    /// The store to fill: `sqlite:PATH` (created when absent) or
    /// `postgres://USER@HOST:PORT/DB`. Its receipts must not already hold
    /// the ids `fill-e-N` (a second fill of one store fails, nothing written
    /// by that transaction).
    #[arg(long, value_name = "LOCATION", value_parser = crate::options::store_location)]
    store: String,
    /// PostgreSQL only: the schema holding the tables (created when absent).
    #[arg(long, value_name = "NAME")]
    store_schema: Option<String>,
    /// Objects `obj-0`, `obj-1`, ... (at least 1).
    #[arg(long, default_value_t = 1_000, value_parser = crate::options::whole::<u64>(1, u64::MAX))]
    objects: u64,
    /// Receipts `fill-e-0`, `fill-e-1`, ..., spread over the objects in turn.
    #[arg(long, default_value_t = 100_000, value_parser = crate::options::whole::<u64>(0, u64::MAX))]
    receipts: u64,
    /// Over how many seconds before now the receipts were first seen (keep
    /// it inside the receivers' retention window, 24 h by default).
    #[arg(long, value_name = "SECONDS", default_value_t = 3_600,
          value_parser = crate::options::whole::<u64>(1, u64::MAX))]
    spread: u64,
    /// Held events `fill-h-0`, `fill-h-1`, ..., spread over the objects in
    /// turn; each object holding one is paused.
    #[arg(long, default_value_t = 0, value_parser = crate::options::whole::<u64>(0, u64::MAX))]
    held: u64,
    /// The length of each held event's body, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1_000,
          value_parser = crate::options::whole::<usize>(200, 1 << 20))]
    held_bytes: usize,
    /// Rows per transaction.
    #[arg(long, value_name = "ROWS", default_value_t = 10_000,
          value_parser = crate::options::whole::<usize>(1, usize::MAX as u64))]
    batch: usize,
}

/// The body whose first delivery receipt `n` records, on object `object`.
fn body(n: u64, object: u64) -> String {
    format!(
        r#"{{"event_id":"fill-e-{n}","object_id":"obj-{object}","object_version":1,"type":"card.snapshot","state":{{"v":1}}}}"#
    )
}

/// The body of held event `n` on object `object`, padded to `len` bytes.
fn held_body(n: u64, object: u64, len: usize) -> String {
    let head = format!(
        r#"{{"event_id":"fill-h-{n}","object_id":"obj-{object}","object_version":2,"type":"card.snapshot","state":{{"v":2,"pad":""#
    );
    let pad = len.saturating_sub(head.len() + 3);
    format!("{head}{}\"}}}}", "x".repeat(pad))
}

/// Writes `args.held` held events in transactions of `args.batch` rows,
/// pausing the objects that hold them first.
fn fill_held(
    store: &mut dyn snapshot_receiver::store::Store,
    args: &FillArgs,
) -> anyhow::Result<()> {
    let paused = args.held.min(args.objects);
    let mut k = 0;
    while k < paused {
        let end = paused.min(k + args.batch as u64);
        let writes: Vec<Write> = (k..end)
            .map(|k| Write::Pause {
                object_id: Arc::from(format!("obj-{k}")),
            })
            .collect();
        store.commit(&writes)?;
        k = end;
    }
    // A run of its own: the receivers' origins are random, this one is
    // the time of the fill.
    let origin = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let now = SystemTime::now();
    let mut n = 0;
    while n < args.held {
        let end = args.held.min(n + args.batch as u64);
        let writes: Vec<Write> = (n..end)
            .map(|i| {
                let k = i % args.objects;
                Write::Held(HeldRow {
                    key: HeldKey { origin, seq: i + 1 },
                    at: now,
                    event_id: Some(Arc::from(format!("fill-h-{i}"))),
                    object_id: Some(Arc::from(format!("obj-{k}"))),
                    held_as: Verdict::Held(HoldReason::Paused),
                    body: Arc::from(held_body(i, k, args.held_bytes).into_bytes()),
                    status: HeldStatus::Held,
                    superseded_by: None,
                    detail: None,
                })
            })
            .collect();
        store.commit(&writes)?;
        n = end;
    }
    Ok(())
}

/// Runs `fill`: prints one line with what it wrote and what the store holds.
pub(crate) fn run(args: FillArgs) -> anyhow::Result<()> {
    let mut store =
        snapshot_receiver::store::open_in_schema(&args.store, args.store_schema.as_deref())?;
    let state = "{\"v\":1}".to_owned();
    let mut object = 0;
    while object < args.objects {
        let end = args.objects.min(object + args.batch as u64);
        let writes: Vec<Write> = (object..end)
            .map(|k| {
                Write::Seed(ObjectRow {
                    object_id: Arc::from(format!("obj-{k}")),
                    version: 1,
                    state: state.clone(),
                    paused: false,
                })
            })
            .collect();
        store.commit(&writes)?;
        object = end;
    }
    let parser = BodyParser::default();
    let now = SystemTime::now();
    let spread = Duration::from_secs(args.spread);
    let mut n = 0;
    while n < args.receipts {
        let end = args.receipts.min(n + args.batch as u64);
        let mut writes = Vec::with_capacity((end - n) as usize);
        for i in n..end {
            let k = i % args.objects;
            let fingerprint = parser
                .parse(body(i, k).as_bytes())
                .ok()
                .and_then(|d| d.fingerprint())
                .ok_or_else(|| anyhow::anyhow!("the body of fill-e-{i} did not parse"))?;
            // Evenly from `spread` before now (the first) towards now.
            let age = spread.mul_f64(1.0 - i as f64 / args.receipts as f64);
            writes.push(Write::Receipt(ReceiptRow {
                event_id: Arc::from(format!("fill-e-{i}")),
                fingerprint,
                object_id: Arc::from(format!("obj-{k}")),
                decision: Verdict::Applied,
                first_seen: now.checked_sub(age).unwrap_or(now),
                retention_cutoff: None,
            }));
        }
        store.commit(&writes).map_err(|e| match e {
            StoreError::Conflict(_) => anyhow::Error::new(InputError::new(format!(
                "the store already holds receipts among fill-e-{n}..fill-e-{}: fill an empty store",
                end - 1
            ))),
            other => anyhow::Error::new(other),
        })?;
        n = end;
    }
    fill_held(&mut *store, &args)?;
    drop(store);
    let summary = StoreReader::open(&args.store, args.store_schema.as_deref())?.summary()?;
    let held = if args.held == 0 {
        String::new()
    } else {
        format!(
            " and {} held events on {} paused objects",
            args.held,
            args.held.min(args.objects)
        )
    };
    writeln!(
        std::io::stdout().lock(),
        "filled {}: {} objects and {} receipts{held} written; the store holds {} objects and {} identities",
        summary.location,
        args.objects,
        args.receipts,
        summary.objects,
        summary.identities
    )?;
    Ok(())
}
