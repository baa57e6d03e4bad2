//! `reconcile`: applies authoritative snapshots (JSON Lines) to a durable
//! store through a receiver opened on it, so that the engine's
//! reconciliation (docs/CONTRACT.md §4) decides, as it does everywhere else.
//!
//! Every line is checked before anything is applied: one bad line and
//! nothing changes. Each snapshot is then its own transaction, arbitrated by
//! the store like any receiver's commit, so it is safe beside a receiver
//! process writing the same store (see the README, *Operate a store*).

use crate::error::{Exit, InputError, EXIT_BAD_SNAPSHOT, EXIT_SNAPSHOT_REFUSED};
use crate::options::{EqualVersions, Format, ProfileArgs, StoreArgs};
use crate::terminal::{shown, shown_or_dash};
use anyhow::Context as _;
use snapshot_receiver::{
    fixture::parse_authority,
    replay::{reconcile_lines, ReplayLine},
    AuthoritativeSnapshot, Config, Receiver, ReconcileError,
};
use std::io::{Read, Write};
use std::path::PathBuf;

/// The id of `--fetch` (named in `--snapshot`'s requirement, which the
/// build without it does not have).
#[cfg(feature = "serve")]
const FETCH: &str = "fetch";
#[cfg(not(feature = "serve"))]
const FETCH: &str = "snapshot";

/// The arguments of `reconcile`.
#[derive(clap::Args)]
pub(crate) struct ReconcileArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// JSON Lines of authoritative snapshots, `-` for stdin. One object per
    /// line, as in a fixture's `authority`: {"object_id": "card-7",
    /// "version": 14, "state": {...}, "as_of": "2024-01-01T08:00:20Z"}, plus
    /// "force": true to replace an object newer than the snapshot. Blank
    /// lines are skipped, and so is one byte order mark at the start of the file.
    #[arg(long, value_name = "FILE", required_unless_present = FETCH)]
    snapshot: Option<PathBuf>,
    /// Fetch this object's snapshot from --authority and apply it, instead
    /// of --snapshot: a hand-made fetch of what the service fetches by
    /// itself. An answer of another object, malformed, over a limit or a
    /// redirect applies nothing (exit 9); no such object: exit 7; the
    /// authority unavailable or too slow: exit 8.
    #[cfg(feature = "serve")]
    #[arg(
        long,
        value_name = "OBJECT",
        conflicts_with = "snapshot",
        requires = "authority"
    )]
    fetch: Option<String>,
    #[cfg(feature = "serve")]
    #[command(flatten)]
    authority: super::authority::AuthorityArgs,
    /// With --fetch: the largest answer accepted, in bytes (serve's
    /// --max-body-bytes).
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "BYTES", default_value_t = snapshot_receiver::Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// With --fetch: the deepest JSON nesting accepted in an answer
    /// (serve's --max-depth).
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "LEVELS", default_value_t = snapshot_receiver::Limits::default().max_depth,
          value_parser = crate::options::whole::<usize>(1, usize::MAX as u64))]
    max_depth: usize,
    /// With --fetch: the longest object_id accepted in an answer, in bytes
    /// (serve's --max-id-bytes).
    #[cfg(feature = "serve")]
    #[arg(long, value_name = "BYTES", default_value_t = snapshot_receiver::Limits::default().max_id_bytes)]
    max_id_bytes: usize,
    /// Output format: text for a person, or JSON Lines: `line` (the input
    /// line) followed by the replay report's reconcile fields.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    #[command(flatten)]
    profile: ProfileArgs,
    /// Must be what the receivers of this store use: how a held event with
    /// an equal version and another state is decided again.
    #[arg(long, value_enum, default_value_t = EqualVersions::Conflict)]
    equal_versions: EqualVersions,
}

/// Runs `reconcile`.
pub(crate) fn run(args: ReconcileArgs) -> anyhow::Result<()> {
    #[cfg(feature = "serve")]
    if let Some(object_id) = args.fetch.clone() {
        return fetch::run(args, &object_id);
    }
    let ReconcileArgs {
        store,
        snapshot,
        format,
        profile,
        equal_versions,
        ..
    } = args;
    let profile = profile.resolve()?;
    let Some(snapshot) = snapshot else {
        return Err(InputError::new("reconcile needs --snapshot FILE (or --fetch OBJECT)").into());
    };
    let snapshots = read_snapshots(&snapshot)?;
    // The store must exist and be a receiver's before a receiver opens it
    // (opening would create the tables). The reader is dropped here, off the
    // runtime.
    drop(store.reader()?);
    let runtime = super::runtime()?;
    let config = Config {
        profile: profile.unwrap_or_default(),
        equal_versions: equal_versions.into(),
        // The store keeps the audit trail; this short-lived receiver need not.
        audit: false,
        ..Config::default()
    };
    let mut out = std::io::stdout().lock();
    let refused = runtime.block_on(async {
        let mut builder = Receiver::builder().config(config).store(&store.store);
        if let Some(schema) = &store.store_schema {
            builder = builder.store_schema(schema);
        }
        let receiver = builder.build().map_err(crate::error::receiver_error)?;
        let result = apply(&receiver, &snapshots, format, &mut out).await;
        receiver.shutdown().await;
        result
    })?;
    if refused > 0 {
        return Err(Exit::new(
            EXIT_SNAPSHOT_REFUSED,
            format!(
                "{refused} of {} snapshots refused (older than the object, not forced); the others were applied",
                snapshots.len()
            ),
        )
        .into());
    }
    Ok(())
}

/// Applies the snapshots in order, printing each one's lines once it is
/// committed; returns how many were refused.
///
/// # Errors
/// When the store could not record a snapshot (busy past its timeout, lost,
/// full): the snapshots printed before it are committed, it and the later
/// ones are not.
async fn apply(
    receiver: &Receiver,
    snapshots: &[(usize, AuthoritativeSnapshot)],
    format: Format,
    out: &mut impl Write,
) -> anyhow::Result<usize> {
    let mut refused = 0;
    let mut step = 1;
    for (line_no, snapshot) in snapshots {
        let (lines, error) = reconcile_lines(receiver, snapshot, step).await;
        match error {
            None => {}
            Some(ReconcileError::AuthorityOlder { .. }) => refused += 1,
            Some(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "line {line_no} ({}): not applied, nor any line after it",
                    shown(&snapshot.object_id)
                )))
            }
        }
        step += lines.len();
        match format {
            Format::Json => {
                for line in &lines {
                    // `line` first, then the §7 fields in their usual order.
                    let fields = serde_json::to_string(line)?;
                    let fields = fields.strip_prefix('{').unwrap_or(&fields);
                    writeln!(out, "{{\"line\":{line_no},{fields}")?;
                }
            }
            Format::Text => write_text(out, &format!("line {line_no}"), &lines)?,
        }
        out.flush()?;
    }
    Ok(refused)
}

/// Reads and checks every line. Each bad line is reported (number and what
/// is wrong) on stderr.
///
/// # Errors
/// An [`InputError`] when the file cannot be read; an [`Exit`] with
/// [`EXIT_BAD_SNAPSHOT`] when a line is bad or there is none.
fn read_snapshots(path: &std::path::Path) -> anyhow::Result<Vec<(usize, AuthoritativeSnapshot)>> {
    let (name, text) = if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the snapshots from stdin")?;
        ("<stdin>".to_owned(), text)
    } else {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| InputError::new(format!("--snapshot {name}: cannot read: {e}")))?;
        (name, text)
    };
    // One leading UTF-8 byte order mark is ignored, as for a fixture.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let mut snapshots = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_authority(line, &format!("{name}:{}", i + 1)) {
            Ok(s) => snapshots.push((i + 1, s)),
            Err(e) => bad.push(e.to_string()),
        }
    }
    match bad.len() {
        0 => {}
        1 => {
            return Err(Exit::new(
                EXIT_BAD_SNAPSHOT,
                format!("{}; nothing was applied", bad[0]),
            )
            .into())
        }
        n => {
            for message in &bad {
                eprintln!("error: {}", shown(message));
            }
            return Err(Exit::new(
                EXIT_BAD_SNAPSHOT,
                format!("{name}: {n} bad snapshot lines (above); nothing was applied"),
            )
            .into());
        }
    }
    if snapshots.is_empty() {
        return Err(Exit::new(
            EXIT_BAD_SNAPSHOT,
            format!("{name}: no snapshot lines; nothing was applied"),
        )
        .into());
    }
    Ok(snapshots)
}

/// One snapshot's outcome in words (after `label`, `line 3` or
/// `fetched`): the authority line, then one indented
/// line per held event it decided again or left unresolved; ids, reasons
/// and states escaped for a terminal ([`crate::terminal::shown`]).
fn write_text(out: &mut impl Write, label: &str, lines: &[ReplayLine]) -> std::io::Result<()> {
    for (i, l) in lines.iter().enumerate() {
        let version = l.version.map_or_else(String::new, |v| format!(" v{v}"));
        let why = l
            .reason
            .as_deref()
            .or(l.conflict)
            .map_or_else(String::new, |r| format!(" ({})", shown(r)));
        let replaced = match l.replacement {
            Some(true) => ", replaced",
            _ => "",
        };
        let paused = match l.paused {
            Some(true) => ", paused",
            Some(false) => ", not paused",
            None => "",
        };
        let state = l
            .state
            .as_ref()
            .map_or_else(String::new, |s| format!(" {}", shown(&s.to_string())));
        let decision = l.decision.unwrap_or("-");
        if i == 0 {
            writeln!(
                out,
                "{label}: {} {decision}{why}{version}{replaced}{paused}{state}",
                shown_or_dash(l.object_id.as_deref())
            )?;
        } else {
            writeln!(
                out,
                "  {} {decision}{why}{version}{replaced}{paused}",
                shown_or_dash(l.event_id.as_deref())
            )?;
        }
    }
    Ok(())
}

/// `reconcile --fetch OBJECT --authority URL`: one object's snapshot
/// fetched by hand and applied as a `--snapshot` line is.
#[cfg(feature = "serve")]
mod fetch {
    use super::{write_text, ReconcileArgs};
    use crate::error::{
        Exit, EXIT_AUTHORITY_UNAVAILABLE, EXIT_BAD_ANSWER, EXIT_NO_SUCH_OBJECT,
        EXIT_SNAPSHOT_REFUSED,
    };
    use crate::options::Format;
    use crate::terminal::shown;
    use snapshot_receiver::authority::{AuthorityErrorKind, AuthoritySource as _};
    use snapshot_receiver::core::engine::{MemoryBudget, QueuedBytes};
    use snapshot_receiver::replay::reconcile_lines;
    use snapshot_receiver::{Config, Limits, Receiver, ReconcileError};
    use std::io::Write as _;
    use std::sync::Arc;

    /// Fetches `object_id` from the authority and reconciles the store with
    /// it, printing what it did as `--snapshot` does (the label `fetched`,
    /// or `"fetched": OBJECT` first in JSON).
    ///
    /// # Errors
    /// An [`Exit`] with [`EXIT_NO_SUCH_OBJECT`] (404 or 410),
    /// [`EXIT_AUTHORITY_UNAVAILABLE`] (no connection, a refusal, no whole
    /// answer in time), [`EXIT_BAD_ANSWER`] (a redirect, a body that is
    /// not this object's snapshot within the limits) or
    /// [`EXIT_SNAPSHOT_REFUSED`] (older than the object); in each case
    /// nothing changed. Bad arguments and store errors as `--snapshot`.
    pub(super) fn run(args: ReconcileArgs, object_id: &str) -> anyhow::Result<()> {
        let profile = args.profile.resolve()?.unwrap_or_default();
        let limits = Limits {
            max_body_bytes: args.max_body_bytes,
            max_depth: args.max_depth,
            max_id_bytes: args.max_id_bytes,
            ..Limits::default()
        };
        // The answer is read into the part of the default budget a
        // server reads bodies into: this command holds no other.
        let budget = Arc::new(QueuedBytes::new(MemoryBudget::default().queued));
        let authority = args
            .authority
            .resolve(&profile, &limits, budget)?
            .ok_or_else(|| crate::error::InputError::new("--fetch needs --authority URL"))?;
        drop(args.store.reader()?);
        let runtime = super::super::runtime()?;
        let config = Config {
            profile,
            equal_versions: args.equal_versions.into(),
            audit: false,
            ..Config::default()
        };
        let from = shown(authority.shown());
        let nothing = |code: u8, what: String| -> anyhow::Error {
            Exit::new(
                code,
                format!("--fetch {}: {what}; nothing changed", shown(object_id)),
            )
            .into()
        };
        let snapshot = match runtime.block_on(authority.fetch(object_id)) {
            Ok(Some(snapshot)) => snapshot,
            Ok(None) => {
                return Err(nothing(
                    EXIT_NO_SUCH_OBJECT,
                    format!("the authority at {from} has no such object (HTTP 404 or 410)"),
                ))
            }
            Err(e) => {
                let why = shown(&e.message);
                return Err(match e.kind {
                    AuthorityErrorKind::BadAnswer => nothing(
                        EXIT_BAD_ANSWER,
                        format!("a bad answer from the authority at {from}: {why}"),
                    ),
                    AuthorityErrorKind::Timeout => nothing(
                        EXIT_AUTHORITY_UNAVAILABLE,
                        format!("the authority at {from} did not answer in time: {why}"),
                    ),
                    _ => {
                        let wait = e.retry_after.map_or_else(String::new, |w| {
                            format!(" (it asks for {} s before the next try)", w.as_secs())
                        });
                        nothing(
                            EXIT_AUTHORITY_UNAVAILABLE,
                            format!("the authority at {from} is unavailable: {why}{wait}"),
                        )
                    }
                });
            }
        };
        let mut out = std::io::stdout().lock();
        let (store, format) = (args.store, args.format);
        let (lines, error) = runtime.block_on(async {
            let mut builder = Receiver::builder().config(config).store(&store.store);
            if let Some(schema) = &store.store_schema {
                builder = builder.store_schema(schema);
            }
            let receiver = builder.build().map_err(crate::error::receiver_error)?;
            let done = reconcile_lines(&receiver, &snapshot, 1).await;
            receiver.shutdown().await;
            anyhow::Ok(done)
        })?;
        match error {
            None | Some(ReconcileError::AuthorityOlder { .. }) => {}
            Some(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("--fetch {}: not applied", shown(object_id))))
            }
        }
        match format {
            Format::Json => {
                let fetched = serde_json::to_string(object_id)?;
                for line in &lines {
                    let fields = serde_json::to_string(line)?;
                    let fields = fields.strip_prefix('{').unwrap_or(&fields);
                    writeln!(out, "{{\"fetched\":{fetched},{fields}")?;
                }
            }
            Format::Text => write_text(&mut out, "fetched", &lines)?,
        }
        out.flush()?;
        if let Some(older) = error {
            return Err(Exit::new(EXIT_SNAPSHOT_REFUSED, format!("--fetch: {older}")).into());
        }
        Ok(())
    }
}
