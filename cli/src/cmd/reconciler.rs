//! `reconciler`: fetches authoritative snapshots for the objects of a
//! durable store that need one (`serve --authority` does the same inside the
//! server), until SIGTERM or ctrl-c: for deployments that keep ingest and
//! reconciliation apart.
//!
//! Its receiver knows at start what the store holds (pauses, held and
//! parked events); what a receiver in another process pauses or holds later
//! is found by reading the store every `--authority-rescan` seconds: each
//! object that needs an authority there and does not wait in this
//! reconciler already is asked for (while the circuit breaker is closed),
//! and from then on waits under the reconciler's own backoff.

use super::authority::ReconcilerArgs;
use crate::error::InputError;
use crate::options::{EqualVersions, LimitArgs, ProfileArgs, StoreArgs};
use crate::terminal::shown;
use snapshot_receiver::core::engine::{MemoryBudget, QueuedBytes};
use snapshot_receiver::reconciler::{BreakerState, Reconciler};
use snapshot_receiver::store::StoreReader;
use snapshot_receiver::{Config, Limits, Receiver};
use std::collections::BTreeSet;
use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// The arguments of `reconciler`.
#[derive(clap::Args)]
pub(crate) struct ReconcilerCommandArgs {
    /// The store whose objects are reconciled (the one `serve` records to).
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    reconciler: ReconcilerArgs,
    #[command(flatten)]
    profile: ProfileArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// Must be what the receivers of this store use: how a held event with
    /// an equal version and another state is decided again.
    #[arg(long, value_enum, default_value_t = EqualVersions::Conflict)]
    equal_versions: EqualVersions,
}

/// Runs `reconciler` until SIGTERM or ctrl-c.
pub(crate) fn run(args: ReconcilerCommandArgs) -> anyhow::Result<()> {
    let location = snapshot_receiver::store::Location::parse(&args.store.store)
        .map_err(|e| InputError::new(format!("--store: {e}")))?;
    if location.is_memory() {
        return Err(InputError::new(
            "--store memory: a reconciler reads a durable store (sqlite:PATH or \
             postgres://...); to reconcile in memory, use serve --authority",
        )
        .into());
    }
    let profile = args.profile.resolve()?.unwrap_or_default();
    let limits: Limits = args.limits.into();
    let budget = Arc::new(QueuedBytes::new(MemoryBudget::default().queued));
    let authority = args
        .reconciler
        .authority
        .resolve(&profile, &limits, budget)?
        .ok_or_else(|| InputError::new("reconciler needs an authority: --authority URL"))?;
    let options = args.reconciler.options();
    let rescan = Duration::from_secs(args.reconciler.authority_rescan);
    // The store must exist and be a receiver's before a receiver opens it
    // (opening would create the tables): exit 3 or 4, nothing created.
    let reader = Arc::new(args.store.reader()?);
    super::runtime()?.block_on(async {
        let config = Config {
            profile,
            limits,
            equal_versions: args.equal_versions.into(),
            // The store keeps the audit trail.
            audit: false,
            ..Config::default()
        };
        let mut builder = Receiver::builder().config(config);
        if let Some(schema) = &args.store.store_schema {
            builder = builder.store_schema(schema);
        }
        let receiver = builder
            .store(&args.store.store)
            .build()
            .map_err(crate::error::receiver_error)?;
        let stopped = super::stop_signal();
        let url = authority.shown().to_owned();
        let reconciler = Arc::new(
            receiver
                .reconciler(Arc::new(authority), options)
                .map_err(|e| InputError::new(format!("--authority: {e}")))?,
        );
        {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "fetching authoritative snapshots from {} for the objects of {}",
                shown(&url),
                shown(&crate::redact::url(&args.store.store))
            );
            let _ = out.flush();
        }
        tokio::select! {
            () = stopped => {}
            () = scan_store(&reader, &reconciler, rescan) => {}
        }
        let status = reconciler.status();
        if let Ok(reconciler) = Arc::try_unwrap(reconciler) {
            reconciler.stop().await?;
        }
        receiver.shutdown().await;
        let f = status.fetches;
        let _ = writeln!(
            std::io::stdout(),
            "stopped: {} applied, {} unchanged, {} absent, {} older, {} wrong object, {} \
             unavailable, {} timed out, {} bad answers; {} objects waiting",
            f.applied,
            f.unchanged,
            f.absent,
            f.older,
            f.wrong_object,
            f.unavailable,
            f.timeout,
            f.bad_answer,
            status.waiting
        );
        Ok(())
    })
}

/// Every `every`, asks `reconciler` for each object the store says needs
/// an authority and that does not wait in it already, while its breaker is
/// closed (never returns).
async fn scan_store(reader: &Arc<StoreReader>, reconciler: &Arc<Reconciler>, every: Duration) {
    let mut asked = tokio::task::JoinSet::new();
    loop {
        tokio::time::sleep(every).await;
        while asked.try_join_next().is_some() {}
        if !matches!(reconciler.status().breaker, BreakerState::Closed { .. }) {
            continue;
        }
        let reader = reader.clone();
        let needs = match tokio::task::spawn_blocking(move || store_needs(&reader)).await {
            Ok(Ok(needs)) => needs,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read what needs an authority from the store");
                continue;
            }
            Err(_) => continue,
        };
        let waiting: BTreeSet<String> = reconciler
            .waiting()
            .into_iter()
            .map(|w| w.object_id.to_string())
            .collect();
        for object_id in needs.difference(&waiting) {
            let (reconciler, object_id) = (reconciler.clone(), object_id.clone());
            asked.spawn(async move {
                let outcome = reconciler.fetch_now(&object_id).await;
                tracing::debug!(object_id, outcome = ?outcome, "fetched for the store's need");
            });
        }
    }
}

/// The objects the store says need an authority
/// ([`super::inspect::authority_needs`]).
///
/// # Errors
/// The store's, when it cannot be read.
fn store_needs(
    reader: &StoreReader,
) -> Result<BTreeSet<String>, snapshot_receiver::store::StoreError> {
    let (paused, held) = (reader.objects(true)?, reader.held(None)?);
    Ok(super::inspect::authority_needs(&paused, &held)
        .into_keys()
        .collect())
}
