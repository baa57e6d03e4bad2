//! `purge`: removes the event-identity records (receipts and variants) older
//! than the retention window from a durable store (docs/CONTRACT.md §5), as
//! a receiver's periodic purge does, through the store's own purge.

use crate::error::InputError;
use crate::options::{Format, StoreArgs};
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
    /// The clock the window is measured from (RFC 3339 UTC); default: now.
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
    // Checks that the store exists and is a receiver's before opening it
    // for writing (which would create the tables).
    let reader = args.store.reader()?;
    let mut store = snapshot_receiver::store::open_in_schema(
        &args.store.store,
        args.store.store_schema.as_deref(),
    )?;
    let purged = store.purge_receipts(before)?;
    drop(store);
    let left = reader.summary()?;
    let report = Purged {
        location: left.location,
        now: format_rfc3339(now),
        retention_seconds: retention.as_secs_f64(),
        before: format_rfc3339(before),
        purged,
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
