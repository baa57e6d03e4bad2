//! Authority sources: where reconciliation gets authoritative snapshots
//! (docs/CONTRACT.md §4). The embedding service implements [`AuthoritySource`] against
//! its trusted source; [`FixtureAuthority`] serves supplied data for tests.
//! Nothing here contacts a provider.

use crate::Receiver;
use crate::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A fetch that failed (it may succeed if tried again): what kind of
/// failure, in words, and how long the authority asked to be left alone.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AuthorityError {
    /// What kind of failure: the reconciler counts fetches by it.
    pub kind: AuthorityErrorKind,
    /// What went wrong, in one line (no credentials in it).
    pub message: String,
    /// The wait the authority asked for (`Retry-After` of a 429 or 503),
    /// at least which the next fetch of this object waits.
    pub retry_after: Option<Duration>,
}

/// The kinds of [`AuthorityError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuthorityErrorKind {
    /// The authority could not be reached or refused to answer (a
    /// connection that failed, a status other than 2xx, 404 or 410).
    Unavailable,
    /// No whole answer within the per-attempt deadline.
    Timeout,
    /// An answer that is not a snapshot of the object asked for: malformed,
    /// over a limit, about another object, a redirect.
    BadAnswer,
}

impl AuthorityError {
    /// An [`AuthorityErrorKind::Unavailable`] error.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::of(AuthorityErrorKind::Unavailable, message)
    }

    /// An [`AuthorityErrorKind::Timeout`] error.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::of(AuthorityErrorKind::Timeout, message)
    }

    /// An [`AuthorityErrorKind::BadAnswer`] error.
    pub fn bad_answer(message: impl Into<String>) -> Self {
        Self::of(AuthorityErrorKind::BadAnswer, message)
    }

    /// This error with the wait the authority asked for.
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    fn of(kind: AuthorityErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }
}

/// A separately trusted source of authoritative snapshots.
pub trait AuthoritySource: Send + Sync + 'static {
    /// The authoritative snapshot of `object_id`, or `Ok(None)` when the
    /// authority does not know the object.
    ///
    /// # Errors
    /// [`AuthorityError`] for a failure worth retrying.
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
