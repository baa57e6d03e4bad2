//! `purge`: removes the event-identity records (receipts and variants) older
//! than the retention window from a durable store (docs/CONTRACT.md §5), and
//! the audit, history and resolved held rows older than their windows (§9),
//! as a receiver's periodic purge does, through the store's own purge.

use crate::error::InputError;
use crate::options::{Format, RetentionArgs, StoreArgs};
use snapshot_receiver::{format_rfc3339, parse_rfc3339, DEFAULT_RETENTION};
use std::io::Write;
use std::time::{Duration, SystemTime};

/// The arguments of `purge`.
#[derive(clap::Args)]
pub(crate) struct PurgeArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The retention window in seconds: identities first recorded longer ago
    /// than this are removed. Use the receivers' own retention (a shorter one
    /// removes records they still trust; a receiver started later on this
    /// store would not see them).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_RETENTION.as_secs_f64())]
    retention: f64,
    #[command(flatten)]
    records: RetentionArgs,
    /// Most rows deleted per transaction (each batch commits on its own, so
    /// a receiver writing the store waits at most one batch).
    #[arg(long, value_name = "ROWS", default_value_t = snapshot_receiver::store::PURGE_BATCH_ROWS,
          value_parser = crate::options::whole::<usize>(1, usize::MAX as u64))]
    batch: usize,
    /// SQLite only: after the purge, rebuild the file (`VACUUM`) with
    /// `auto_vacuum = INCREMENTAL`, returning every free page to the file
    /// system; once is enough for a store created before this mode was
    /// set, whose purges then give back their pages too. It rewrites the
    /// whole file and holds the write lock meanwhile.
    #[arg(long)]
    vacuum: bool,
    /// The clock the windows are measured from (RFC 3339 UTC); default: now.
    #[arg(long, value_name = "TIME")]
    now: Option<String>,
    /// Output format: text for a person, or one JSON object.
    #[arg(long, value_enum, default_value_t = crate::options::Format::Text)]
    format: Format,
}

/// What `purge` reports; `--format json` prints it as one JSON object with
/// these members.
struct Purged {
    /// The store.
    location: String,
    /// The clock (RFC 3339 UTC).
    now: String,
    /// The window, in seconds.
    retention_seconds: f64,
    /// The cut-off: records first seen before it were removed (RFC 3339 UTC).
    before: String,
    /// Receipts and variants removed.
    purged: u64,
    /// Audit, history and resolved held rows removed.
    records: snapshot_receiver::store::Purged,
    /// The audit and history windows.
    windows: snapshot_receiver::store::Retention,
    /// Whether the file was rebuilt (`--vacuum`).
    vacuumed: bool,
    /// Identities left.
    identities: u64,
    /// Variants left.
    variants: u64,
    /// When the oldest identity left was recorded; `null` when none is left.
    oldest_identity_at: Option<String>,
}

/// Runs `purge`.
pub(crate) fn run(args: PurgeArgs) -> anyhow::Result<()> {
    let retention = Duration::try_from_secs_f64(args.retention).map_err(|_| {
        InputError::new(format!(
            "--retention: not a number of seconds: {}",
            args.retention
        ))
    })?;
    let now = match &args.now {
        None => SystemTime::now(),
        Some(text) => parse_rfc3339(text)
            .ok_or_else(|| InputError::new(format!("--now: not an RFC 3339 time: {text:?}")))?,
    };
    let before = now.checked_sub(retention).unwrap_or(SystemTime::UNIX_EPOCH);
    let windows = snapshot_receiver::store::Retention {
        batch: args.batch,
        ..args.records.resolve()?
    };
    let location = snapshot_receiver::store::Location::parse(&args.store.store)?;
    if args.vacuum && !matches!(location, snapshot_receiver::store::Location::Sqlite(_)) {
        return Err(InputError::new(
            "--vacuum: only a SQLite store is vacuumed (PostgreSQL leaves it to autovacuum)",
        )
        .into());
    }
    // Checks that the store exists and is a receiver's before opening it
    // for writing (which would create the tables).
    let reader = args.store.reader()?;
    let mut store = snapshot_receiver::store::open_in_schema(
        &args.store.store,
        args.store.store_schema.as_deref(),
    )?;
    let purged = store.purge_receipts(before)?;
    let records = snapshot_receiver::store::purge_all(&mut *store, now, &windows)?;
    drop(store);
    if let snapshot_receiver::store::Location::Sqlite(path) = &location {
        if args.vacuum {
            snapshot_receiver::store::SqliteStore::open(path, Default::default())?.vacuum()?;
        }
    }
    let left = reader.summary()?;
    let report = Purged {
        location: left.location,
        now: format_rfc3339(now),
        retention_seconds: retention.as_secs_f64(),
        before: format_rfc3339(before),
        purged,
        records,
        windows,
        vacuumed: args.vacuum,
        identities: left.identities,
        variants: left.variants,
        oldest_identity_at: left.oldest_identity_at,
    };
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            let json = serde_json::json!({
                "location": report.location,
                "now": report.now,
                "retention_seconds": report.retention_seconds,
                "before": report.before,
                "purged": report.purged,
                "audit": report.records.audit,
                "history": report.records.history,
                "resolved": report.records.resolved,
                "audit_retention_seconds": report.windows.audit.as_secs_f64(),
                "history_retention_seconds": report.windows.history.as_secs_f64(),
                "vacuumed": report.vacuumed,
                "identities": report.identities,
                "variants": report.variants,
                "oldest_identity_at": report.oldest_identity_at,
            });
            serde_json::to_writer(&mut out, &json)?;
            writeln!(out)?;
        }
        Format::Text => {
            writeln!(
                out,
                "purged {} identity records (receipts and variants) first recorded before {} (retention {} s, clock {})",
                report.purged, report.before, report.retention_seconds, report.now
            )?;
            writeln!(
                out,
                "purged {} audit rows and {} resolved held rows (audit retention {} s), {} history rows (history retention {} s){}",
                report.records.audit,
                report.records.resolved,
                report.windows.audit.as_secs_f64(),
                report.records.history,
                report.windows.history.as_secs_f64(),
                if report.vacuumed { "; file rebuilt (VACUUM)" } else { "" }
            )?;
            let oldest = report
                .oldest_identity_at
                .as_deref()
                .map_or_else(String::new, |at| format!(", oldest recorded {at}"));
            writeln!(
                out,
                "left: identities {}, variants {}{oldest}",
                report.identities, report.variants
            )?;
        }
    }
    Ok(())
}
