//! Authority sources: where reconciliation gets authoritative snapshots
//! (docs/CONTRACT.md §4). The embedding service implements [`AuthoritySource`] against
//! its trusted source; [`FixtureAuthority`] serves supplied data for tests.
//! Nothing here contacts a provider. A fetch fails with an [`AuthorityError`]
//! of an [`AuthorityErrorKind`] (unavailable, timed out, a bad answer), with
//! the authority's `Retry-After` when it gave one.
//!
//! Two ways to use a source: [`Receiver::reconcile_from`], one pass over
//! what needs an authority now; and [`Receiver::reconciler`]
//! ([`crate::reconciler`]), which runs in the background and fetches
//! whatever comes to need one, without being asked.

use crate::Receiver;
use crate::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use crate::core::reconciler::{AuthorityError, AuthorityErrorKind};

/// A separately trusted source of authoritative snapshots.
pub trait AuthoritySource: Send + Sync + 'static {
    /// The authoritative snapshot of `object_id`, or `Ok(None)` when the
    /// authority does not know the object (HTTP 404 or 410). A snapshot of
    /// another object is a bad answer: the reconciler records nothing.
    ///
    /// # Errors
    /// [`AuthorityError`] for a failure worth retrying: the authority
    /// unavailable, the attempt timed out, or an answer that is not a usable
    /// snapshot; with `retry_after` when the authority asked to wait.
    fn fetch(
        &self,
        object_id: &str,
    ) -> impl Future<Output = Result<Option<AuthoritativeSnapshot>, AuthorityError>> + Send;
}

/// Serves fixed snapshots (for example a fixture's `authority` list).
#[derive(Clone, Debug, Default)]
pub struct FixtureAuthority {
    /// Snapshot per object id.
    snapshots: HashMap<Arc<str>, AuthoritativeSnapshot>,
}

impl FixtureAuthority {
    /// An authority that knows `snapshots` (the last one per object wins).
    pub fn new(snapshots: impl IntoIterator<Item = AuthoritativeSnapshot>) -> Self {
        Self {
            snapshots: snapshots
                .into_iter()
                .map(|s| (s.object_id.clone(), s))
                .collect(),
        }
    }
}

impl AuthoritySource for FixtureAuthority {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        Ok(self.snapshots.get(object_id).cloned())
    }
}

/// How [`Receiver::reconcile_from`] calls the source.
#[derive(Clone, Copy, Debug)]
pub struct FetchOptions {
    /// Most fetches in flight at once. Default 4.
    pub concurrency: usize,
    /// Tries per object before giving up. Default 3.
    pub attempts: u32,
    /// Wait before the second try; doubled for each further try. Default 100 ms.
    pub backoff: Duration,
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            concurrency: 4,
            attempts: 3,
            backoff: Duration::from_millis(100),
        }
    }
}

/// What [`Receiver::reconcile_from`] did, per object, sorted by object id
/// (each reconciled object's own [`ReconcileReport`] inside).
#[derive(Debug, Default)]
pub struct FetchReport {
    /// Objects reconciled, with what each authority step did.
    pub reconciled: Vec<(Arc<str>, ReconcileReport)>,
    /// Objects whose authority was refused (older than the object, or the
    /// store failed).
    pub refused: Vec<(Arc<str>, ReconcileError)>,
    /// Objects the authority does not know: they stay as they are.
    pub unknown: Vec<Arc<str>>,
    /// Objects whose fetch failed on every try, with the last error.
    pub unavailable: Vec<(Arc<str>, AuthorityError)>,
}

impl Receiver {
    /// Asks `source` about every object that needs it (paused objects and
    /// objects with held missing-version events, see
    /// [`Receiver::needing_authority`]), at most `options.concurrency` at a
    /// time, retrying failed fetches, and reconciles each object with what it
    /// returns.
    pub async fn reconcile_from<A: AuthoritySource>(
        &self,
        source: Arc<A>,
        options: FetchOptions,
    ) -> FetchReport {
        let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        for object_id in self.needing_authority().await {
            let (source, permits, receiver) = (source.clone(), permits.clone(), self.clone());
            tasks.spawn(async move {
                let fetched = {
                    let _permit = permits.acquire().await;
                    fetch_with_retries(&*source, &object_id, options).await
                };
                let outcome = match fetched {
                    Ok(Some(snapshot)) => Outcome::Done(receiver.reconcile(snapshot).await),
                    Ok(None) => Outcome::Unknown,
                    Err(e) => Outcome::Unavailable(e),
                };
                (object_id, outcome)
            });
        }
        let mut summary = FetchReport::default();
        while let Some(joined) = tasks.join_next().await {
            let Ok((id, outcome)) = joined else {
                tracing::error!("an authority task ended abnormally");
                continue;
            };
            match outcome {
                Outcome::Done(Ok(report)) => summary.reconciled.push((id, report)),
                Outcome::Done(Err(e)) => summary.refused.push((id, e)),
                Outcome::Unknown => summary.unknown.push(id),
                Outcome::Unavailable(e) => summary.unavailable.push((id, e)),
            }
        }
        summary.reconciled.sort_by(|a, b| a.0.cmp(&b.0));
        summary.refused.sort_by(|a, b| a.0.cmp(&b.0));
        summary.unknown.sort();
        summary.unavailable.sort_by(|a, b| a.0.cmp(&b.0));
        summary
    }
}

enum Outcome {
    Done(Result<ReconcileReport, ReconcileError>),
    Unknown,
    Unavailable(AuthorityError),
}

async fn fetch_with_retries<A: AuthoritySource>(
    source: &A,
    object_id: &str,
    options: FetchOptions,
) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
    let mut wait = options.backoff;
    let mut attempt = 1;
    loop {
        match source.fetch(object_id).await {
            Ok(found) => return Ok(found),
            Err(e) if attempt >= options.attempts.max(1) => return Err(e),
            Err(e) => {
                tracing::debug!(object_id, attempt, error = %e, "authority fetch failed; retrying");
                tokio::time::sleep(wait).await;
                wait = wait.saturating_mul(2);
                attempt += 1;
            }
        }
    }
}
