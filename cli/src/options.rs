//! Option groups that more than one command takes (the receiver's limits,
//! the envelope profile, the output format, a store), and the value parsers
//! whose errors say in words what a flag takes: [`store_location`],
//! [`whole`].

use crate::error::InputError;
use clap::ValueEnum;
use snapshot_receiver::{Limits, Profile, ProfileError};
use std::path::PathBuf;

/// Output format of a command.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    // For people: a table or a few lines of text. (Plain comments: a doc
    // comment here would add a "Possible values" list to --help.)
    Text,
    // For scripts: JSON (Lines).
    Json,
}

/// The receiver's limits (see docs/HOSTILE-INPUT.md). A body over a size,
/// depth or id limit is answered `reject`; a delivery that would pass a queue
/// limit is answered `retry`. Neither is recorded.
#[derive(clap::Args)]
pub(crate) struct LimitArgs {
    /// Largest accepted body in bytes; larger bodies are rejected (HTTP 413).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Deepest accepted JSON nesting (the top-level object is depth 1; values
    /// above 1024 act as 1024); deeper bodies are rejected (HTTP 400).
    #[arg(long, value_name = "LEVELS", default_value_t = Limits::default().max_depth,
          value_parser = whole::<usize>(1, usize::MAX as u64))]
    max_depth: usize,
    /// Longest accepted `event_id` / `object_id`, in bytes of decoded UTF-8;
    /// longer ids are rejected (HTTP 400).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_id_bytes)]
    max_id_bytes: usize,
    /// Most events held for one known object; one more hold is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_held_per_object)]
    max_held_per_object: usize,
    /// Most events parked for one unknown object; one more is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_parked_per_object)]
    max_parked_per_object: usize,
    /// Most events parked for unknown objects per shard; one more is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_parked_per_shard)]
    max_parked_per_shard: usize,
}

impl From<LimitArgs> for Limits {
    fn from(a: LimitArgs) -> Self {
        Limits {
            max_body_bytes: a.max_body_bytes,
            max_depth: a.max_depth,
            max_id_bytes: a.max_id_bytes,
            max_held_per_object: a.max_held_per_object,
            max_parked_per_object: a.max_parked_per_object,
            max_parked_per_shard: a.max_parked_per_shard,
        }
    }
}

/// How long a durable store keeps audit and history rows (docs/CONTRACT.md
/// §9): `serve`, `replay` and `purge` take the same two windows.
#[derive(clap::Args)]
pub(crate) struct RetentionArgs {
    /// Seconds a durable store keeps audit rows (and held rows already
    /// resolved); older ones are purged, except those of events still held,
    /// parked or unresolved. Default 7 days.
    #[arg(long, value_name = "SECONDS",
          default_value_t = snapshot_receiver::store::DEFAULT_AUDIT_RETENTION.as_secs_f64())]
    pub(crate) audit_retention: f64,
    /// Seconds a durable store keeps replacement-history (outbox) rows;
    /// older ones are purged. Default 7 days.
    #[arg(long, value_name = "SECONDS",
          default_value_t = snapshot_receiver::store::DEFAULT_HISTORY_RETENTION.as_secs_f64())]
    pub(crate) history_retention: f64,
}

/// `--history-retention SECONDS` of the commands that judge relays against
/// the history window (`relays`, `inspect`) as a duration.
///
/// # Errors
/// An [`InputError`] naming the flag when the value is not a number of
/// seconds.
pub(crate) fn history_window(seconds: f64) -> Result<std::time::Duration, InputError> {
    std::time::Duration::try_from_secs_f64(seconds).map_err(|_| {
        InputError::new(format!(
            "--history-retention: not a number of seconds: {seconds}"
        ))
    })
}

impl RetentionArgs {
    /// The windows, with the default purge batch.
    ///
    /// # Errors
    /// An [`InputError`] naming the flag whose value is not a number of
    /// seconds (negative, not finite, too large).
    pub(crate) fn resolve(&self) -> Result<snapshot_receiver::store::Retention, InputError> {
        let seconds = |flag: &str, value: f64| {
            std::time::Duration::try_from_secs_f64(value)
                .map_err(|_| InputError::new(format!("--{flag}: not a number of seconds: {value}")))
        };
        Ok(snapshot_receiver::store::Retention {
            audit: seconds("audit-retention", self.audit_retention)?,
            history: seconds("history-retention", self.history_retention)?,
            ..snapshot_receiver::store::Retention::default()
        })
    }
}

/// Which envelope profile reads the bodies (docs/CONTRACT.md §2).
#[derive(clap::Args)]
pub(crate) struct ProfileArgs {
    /// Envelope profile: card (docs/CONTRACT.md §2), shipment or generic. Default: the
    /// fixture's `profile`, else card.
    #[arg(long, value_name = "NAME", conflicts_with = "profile_file")]
    profile: Option<String>,
    /// A profile in a JSON file (pointers for event_id, object_id, version, ...).
    #[arg(long, value_name = "PATH")]
    profile_file: Option<PathBuf>,
    /// With `--profile generic`: where the version is (a JSON Pointer).
    #[arg(long, value_name = "POINTER", default_value = "/data/object/version")]
    version_pointer: String,
}

impl ProfileArgs {
    /// The profile asked for; `None` when neither `--profile` nor
    /// `--profile-file` was given.
    ///
    /// # Errors
    /// An [`InputError`] naming `--profile` (and the file) when the name is
    /// unknown or the file cannot be read or is not a valid profile.
    pub(crate) fn resolve(self) -> Result<Option<Profile>, InputError> {
        match (self.profile.as_deref(), self.profile_file) {
            (Some("generic"), _) => Some(Profile::generic(&self.version_pointer)),
            (Some(name), _) => Some(Profile::named(name)),
            (None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|e| ProfileError(format!("{}: cannot read: {e}", path.display())))
                    .and_then(|text| Profile::from_json(&text))
                    .map_err(|e| ProfileError(format!("{}: {e}", path.display()))),
            ),
            (None, None) => None,
        }
        .transpose()
        .map_err(|e| InputError::new(format!("--profile: {e}")))
    }
}

/// Where an operator command finds its store: an existing receiver store,
/// given as everywhere else (`--store`, `--store-schema`).
#[derive(clap::Args)]
pub(crate) struct StoreArgs {
    /// The store: `sqlite:PATH`, `postgres://USER@HOST:PORT/DB` or `lsm:DIR`
    /// (read only while no other process holds it). It must exist and hold
    /// a receiver's tables; nothing is created.
    #[arg(long, value_name = "LOCATION", value_parser = store_location)]
    pub(crate) store: String,
    /// PostgreSQL only: the schema holding the tables (default: the
    /// connection's search path).
    #[arg(long, value_name = "NAME")]
    pub(crate) store_schema: Option<String>,
}

impl StoreArgs {
    /// Opens the store for reading, checking that it is a receiver store.
    ///
    /// # Errors
    /// The reader's [`snapshot_receiver::store::StoreError`], which `main`
    /// maps to its exit code (missing store, not a receiver store, other).
    pub(crate) fn reader(&self) -> anyhow::Result<snapshot_receiver::store::StoreReader> {
        Ok(snapshot_receiver::store::StoreReader::open(
            &self.store,
            self.store_schema.as_deref(),
        )?)
    }
}

/// `--equal-versions`: the policy for an equal version with another state
/// (docs/CONTRACT.md §3.4).
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum EqualVersions {
    // A `conflict` that pauses the object (the default).
    Conflict,
    // Recorded as `stale` (the reducer's rule).
    Ignore,
}

impl From<EqualVersions> for snapshot_receiver::EqualVersionPolicy {
    fn from(e: EqualVersions) -> Self {
        match e {
            EqualVersions::Conflict => Self::Conflict,
            EqualVersions::Ignore => Self::Ignore,
        }
    }
}

/// The value parser of every `--store`: a location as
/// [`snapshot_receiver::store::Location`] reads it, which this build can
/// open. Checked while the arguments are read, so a bad one is named with
/// its flag before anything is opened or created.
///
/// # Errors
/// What is wrong with the text (`sqlite:` with no path, an unsupported
/// scheme, ...), or, for `postgres://` (`lsm:`) in a build without the
/// `postgres` (`lsm`) feature, that feature and the install command that
/// adds it.
pub(crate) fn store_location(text: &str) -> Result<String, String> {
    use snapshot_receiver::store::{Location, StoreError};
    match Location::parse(text) {
        Err(StoreError::InvalidLocation(why)) => Err(why),
        Err(other) => Err(other.to_string()),
        Ok(Location::Postgres(_)) if !cfg!(feature = "postgres") => Err(format!(
            "this build has no `postgres` feature, which postgres:// stores need ({})",
            crate::error::install_with("postgres")
        )),
        Ok(Location::Lsm(_)) if !cfg!(feature = "lsm") => Err(format!(
            "this build has no `lsm` feature, which lsm: stores need ({})",
            crate::error::install_with("lsm")
        )),
        Ok(_) => Ok(text.to_owned()),
    }
}

/// A value parser for a whole number from `min` to `max` (inclusive) whose
/// errors say so in words, where clap's own ranged parsers print Rust's
/// (`invalid digit found in string`, `0 is not in 1..18446744073709551615`).
pub(crate) fn whole<T>(
    min: u64,
    max: u64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    move |text: &str| {
        let range = if max == u64::MAX || Some(max) == usize::MAX.try_into().ok() {
            format!("a whole number, {min} or more")
        } else {
            format!("a whole number from {min} to {max}")
        };
        let n: u64 = text
            .parse()
            .map_err(|_| format!("not {range} (digits only)"))?;
        if !(min..=max).contains(&n) {
            return Err(format!("{n} is out of range: expected {range}"));
        }
        T::try_from(n).map_err(|_| format!("{n} is out of range: expected {range}"))
    }
}

/// A value parser for `--memory-budget`: a size with a unit (`512MiB`,
/// `2GiB`, `600MB`; binary and decimal units as the parse-size crate reads
/// them) or bytes, at least [`snapshot_receiver::MIN_MEMORY_BUDGET`].
#[cfg(feature = "serve")]
pub(crate) fn memory_size(text: &str) -> Result<usize, String> {
    let bytes = parse_size::parse_size(text).map_err(|e| {
        format!("not a size ({e}): expected bytes or a number with a unit, such as 512MiB or 2GiB")
    })?;
    let min = snapshot_receiver::MIN_MEMORY_BUDGET;
    match usize::try_from(bytes) {
        Ok(n) if n >= min => Ok(n),
        Ok(_) => Err(format!(
            "{bytes} bytes is below the smallest memory budget, {min} bytes (16MiB)"
        )),
        Err(_) => Err(format!(
            "{bytes} bytes is more than this machine can address"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "serve")]
    #[test]
    fn a_memory_size_takes_units_and_refuses_in_words() {
        assert_eq!(memory_size("512MiB"), Ok(512 << 20));
        assert_eq!(memory_size("2GiB"), Ok(2 << 30));
        assert_eq!(memory_size("600MB"), Ok(600_000_000));
        assert_eq!(memory_size("16777216"), Ok(16 << 20));
        assert_eq!(
            memory_size("1MiB"),
            Err(
                "1048576 bytes is below the smallest memory budget, 16777216 bytes (16MiB)"
                    .to_owned()
            )
        );
        let e = memory_size("lots").unwrap_err();
        assert!(e.starts_with("not a size ("), "{e}");
        assert!(
            e.ends_with("expected bytes or a number with a unit, such as 512MiB or 2GiB"),
            "{e}"
        );
    }

    #[test]
    fn a_whole_number_is_refused_in_words() {
        let one_or_more = whole::<usize>(1, usize::MAX as u64);
        assert_eq!(one_or_more("64"), Ok(64));
        assert_eq!(
            one_or_more("0"),
            Err("0 is out of range: expected a whole number, 1 or more".to_owned())
        );
        assert_eq!(
            one_or_more("six"),
            Err("not a whole number, 1 or more (digits only)".to_owned())
        );
        let bounded = whole::<u32>(0, 1_000);
        assert_eq!(bounded("1000"), Ok(1000));
        assert_eq!(
            bounded("1001"),
            Err("1001 is out of range: expected a whole number from 0 to 1000".to_owned())
        );
        assert_eq!(
            bounded("-1"),
            Err("not a whole number from 0 to 1000 (digits only)".to_owned())
        );
    }

    #[test]
    fn a_store_location_is_checked_before_anything_is_opened() {
        assert_eq!(store_location("sqlite:a.db"), Ok("sqlite:a.db".to_owned()));
        assert_eq!(
            store_location("sqlite:"),
            Err(
                "`sqlite:` has no path: write sqlite:PATH, for example sqlite:receiver.db"
                    .to_owned()
            )
        );
        let postgres = store_location("postgres://u@127.0.0.1/db");
        if cfg!(feature = "postgres") {
            assert_eq!(postgres, Ok("postgres://u@127.0.0.1/db".to_owned()));
        } else {
            let why = postgres.unwrap_err();
            assert!(
                why.starts_with("this build has no `postgres` feature, which postgres:// stores need (cargo install --locked --path cli --features "),
                "{why}"
            );
            assert!(why.contains("postgres)"), "{why}");
        }
    }
}
