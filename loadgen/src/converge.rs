//! Reconciliation during a run: the receiver's reconciler against the
//! [`StreamAuthority`] beside the producers, the wait for every known
//! object to converge after the last delivery, and the un-pause latency
//! (from a conflict's decision to its object's un-pause).

use crate::authority::{known_index, AuthorityCounts, AuthorityOptions, StreamAuthority};
use crate::code::{decision_code, EVENT_VARIANT, VERSION_STATE};
use crate::generate::Stream;
use hdrhistogram::Histogram;
use snapshot_receiver::reconciler::{FetchCounts, NeedReason, Reconciler};
use snapshot_receiver::{Notification, Receiver};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, oneshot};

/// How often the un-pause tracker asks about the objects it waits for.
const POLL: Duration = Duration::from_millis(1);

/// How often the drain asks whether every known object converged.
const DRAIN_POLL: Duration = Duration::from_millis(10);

/// What reconciliation did during a run ([`crate::RunOutcome::authority`]).
#[derive(Clone, Debug)]
pub struct AuthorityRun {
    /// `true` for the baselines: each conflict reconciled right after its
    /// step from the generator's truth, with no latency (the receiver:
    /// `false`, its reconciler in the background).
    pub inline: bool,
    /// The receiver's: what its authority answered.
    pub answered: AuthorityCounts,
    /// The receiver's: its reconciler's fetches by outcome.
    pub fetches: Option<FetchCounts>,
    /// The baselines': reconciliations made in line.
    pub reconciled: u64,
    /// How long after the last delivery was answered every known object
    /// was un-paused with nothing held (zero in line); `None`: not within
    /// [`AuthorityOptions::drain`].
    pub converged_after: Option<Duration>,
    /// Open loop only: nanoseconds from each pausing conflict's decision
    /// (when its notification arrived) to its object's un-pause, checked
    /// every millisecond.
    pub unpause: Option<Histogram<u64>>,
    /// Open loop only: decisions the un-pause tracker missed because it
    /// fell behind the receiver's notifications.
    pub unpause_missed: u64,
}

impl AuthorityRun {
    /// A baseline's run: `reconciled` conflicts reconciled in line.
    pub(crate) fn inline(reconciled: u64) -> Self {
        Self {
            inline: true,
            answered: AuthorityCounts::default(),
            fetches: None,
            reconciled,
            converged_after: Some(Duration::ZERO),
            unpause: None,
            unpause_missed: 0,
        }
    }
}

/// The reconciler running beside a run, and what watches it.
pub(crate) struct Beside {
    /// The authority it fetches from.
    authority: Arc<StreamAuthority>,
    /// The reconciler.
    reconciler: Reconciler,
    /// The un-pause tracker, with what stops it.
    tracker: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<Tracked>)>,
    /// The options.
    options: AuthorityOptions,
}

impl Beside {
    /// Starts the reconciler of `receiver` against `stream`'s authority;
    /// with `track`, the un-pause tracker too.
    pub(crate) fn start(
        receiver: &Receiver,
        stream: &Arc<Stream>,
        options: &AuthorityOptions,
        track: bool,
    ) -> Result<Self, String> {
        let authority = Arc::new(StreamAuthority::new(stream.clone(), options));
        let reconciler = receiver
            .reconciler(authority.clone(), options.reconciler.clone())
            .map_err(|e| e.to_string())?;
        let tracker = track.then(|| {
            let (stop, stopped) = oneshot::channel();
            let task = tokio::spawn(track_unpauses(
                receiver.clone(),
                receiver.subscribe(),
                stopped,
            ));
            (stop, task)
        });
        Ok(Self {
            authority,
            reconciler,
            tracker,
            options: options.clone(),
        })
    }

    /// After the last delivery was answered (at `ingested`): waits until no
    /// known object needs an authority (or the drain's deadline), stops the
    /// tracker and the reconciler, and says what happened.
    pub(crate) async fn finish(self, receiver: &Receiver, ingested: Instant) -> AuthorityRun {
        let deadline = self
            .options
            .drain_deadline(self.authority.started(), ingested);
        let stream = self.authority.stream();
        let converged_after = loop {
            let waiting = receiver
                .authority_needs()
                .await
                .iter()
                .any(|need| known_index(stream, &need.object_id).is_some());
            if !waiting {
                break Some(ingested.elapsed());
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        };
        let tracked = match self.tracker {
            Some((stop, task)) => {
                let _ = stop.send(());
                task.await.ok()
            }
            None => None,
        };
        let fetches = self.reconciler.status().fetches;
        if let Err(e) = self.reconciler.stop().await {
            tracing::error!(error = %e, "the load test's reconciler stopped abnormally");
        }
        AuthorityRun {
            inline: false,
            answered: self.authority.counts(),
            fetches: Some(fetches),
            reconciled: 0,
            converged_after,
            unpause_missed: tracked.as_ref().map_or(0, |t| t.missed),
            unpause: tracked.map(|t| t.latency),
        }
    }
}

/// What the un-pause tracker measured.
struct Tracked {
    /// Nanoseconds from a pausing conflict to the un-pause.
    latency: Histogram<u64>,
    /// Notifications it missed.
    missed: u64,
}

/// Notes every pausing conflict the receiver publishes, with when it
/// arrived, and asks every millisecond whether each noted object is still
/// paused; records the time to its un-pause. A conflict on an object
/// already waiting keeps the earlier time. Ends when `stop` fires, after a
/// last look at what it waits for.
async fn track_unpauses(
    receiver: Receiver,
    mut notes: broadcast::Receiver<Notification>,
    mut stop: oneshot::Receiver<()>,
) -> Tracked {
    let mut latency =
        Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds");
    let mut missed = 0u64;
    let mut paused: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut listening = true;
    loop {
        tokio::select! {
            note = notes.recv(), if listening => match note {
                Ok(Notification::Decision(receipt)) => {
                    let code = decision_code(&receipt);
                    if let (true, Some(id)) = (code == EVENT_VARIANT || code == VERSION_STATE, receipt.object_id) {
                        paused.entry(id).or_insert_with(Instant::now);
                    }
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => missed += n,
                Err(broadcast::error::RecvError::Closed) => listening = false,
            },
            _ = tick.tick(), if !paused.is_empty() => {
                look(&receiver, &mut paused, &mut latency).await;
            }
            _ = &mut stop => break,
        }
    }
    look(&receiver, &mut paused, &mut latency).await;
    Tracked { latency, missed }
}

/// Records and forgets every object of `paused` that is no longer paused.
async fn look(
    receiver: &Receiver,
    paused: &mut HashMap<Arc<str>, Instant>,
    latency: &mut Histogram<u64>,
) {
    let ids: Vec<Arc<str>> = paused.keys().cloned().collect();
    for id in ids {
        if !receiver
            .authority_need(&id)
            .await
            .contains(NeedReason::Paused)
        {
            if let Some(since) = paused.remove(&id) {
                let ns = since.elapsed().as_nanos().clamp(1, u64::MAX as u128) as u64;
                latency.saturating_record(ns);
            }
        }
    }
}
