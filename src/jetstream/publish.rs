//! Publishing deliveries to the partitioned stream.

use super::{reader, JetStreamError, StreamLayout};
use async_nats::jetstream::{self, context::PublishErrorKind, publish::PublishAck};
use std::collections::VecDeque;
use std::future::{Future, IntoFuture};
use std::time::{Duration, Instant};

/// How long each attempt of a publish waits for the server's
/// acknowledgement by default: the first attempt and three re-publishes,
/// 65 s in all, inside the stream's 2-minute duplicate window.
pub const DEFAULT_ACK_TIMEOUTS: [Duration; 4] = [
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(20),
    Duration::from_secs(30),
];

/// Publishes delivery bodies to a partitioned stream (see the module
/// documentation for the scheme), pipelined: up to `window` publishes wait
/// for their acknowledgement from the server at once, and their order on the
/// stream is the order of the calls.
pub struct Publisher {
    /// The JetStream context of the connection.
    js: jetstream::Context,
    /// The stream's partition layout, read from (or written to) the server.
    layout: StreamLayout,
    /// How many publishes may await their server acknowledgement at once: a
    /// window keeps throughput without unbounded memory.
    window: usize,
    /// How long each attempt waits for the acknowledgement; the length is
    /// the number of attempts (see [`Publisher::ack_timeouts`]).
    ack_timeouts: Vec<Duration>,
}

/// What a run of [`Publisher::publish_all`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Bodies handed to the stream.
    pub published: u64,
    /// Of those, how many the stream's duplicate window dropped (an exact
    /// re-publish of the same bytes within the window).
    pub dropped_as_duplicate: u64,
    /// Re-publishes after an acknowledgement timed out (same message id, so
    /// the stream stores the body once whichever attempts reached it).
    pub ack_retries: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl Publisher {
    /// A publisher for `stream`, created with `partitions` partitions (default
    /// [`super::DEFAULT_PARTITIONS`]) and subjects `<subject_prefix>.<n>`
    /// (default: the stream name) when it does not exist yet.
    ///
    /// # Errors
    /// [`JetStreamError::Incompatible`] when the existing stream has another
    /// layout, [`JetStreamError::Request`] when the server refuses.
    pub async fn new(
        client: async_nats::Client,
        stream: &str,
        partitions: Option<u32>,
        subject_prefix: Option<&str>,
    ) -> Result<Self, JetStreamError> {
        let mut js = jetstream::new(client);
        let layout = StreamLayout::open(&js, stream, partitions, subject_prefix, true).await?;
        // Each attempt's own wait decides; the client's must not be shorter.
        js.set_timeout(DEFAULT_ACK_TIMEOUTS[DEFAULT_ACK_TIMEOUTS.len() - 1]);
        Ok(Self {
            js,
            layout,
            window: 1024,
            ack_timeouts: DEFAULT_ACK_TIMEOUTS.to_vec(),
        })
    }

    /// How many publishes may await their acknowledgement at once (at
    /// least 1; default 1024).
    pub fn window(mut self, window: usize) -> Self {
        self.window = window.max(1);
        self
    }

    /// How long each attempt of one publish waits for the server's
    /// acknowledgement ([`DEFAULT_ACK_TIMEOUTS`] unless set; an empty list
    /// means one attempt of 5 s). When an attempt times out the same body
    /// is published again with the same `Nats-Msg-Id` ([`message_id`]), so
    /// the stream's duplicate window (2 minutes for the streams
    /// [`Publisher::new`] creates) stores it once even if the timed-out
    /// attempt did reach the stream; the attempts together should stay
    /// inside that window. After the last attempt the publish fails with
    /// [`JetStreamError::PublishNotConfirmed`].
    pub fn ack_timeouts(mut self, timeouts: Vec<Duration>) -> Self {
        self.ack_timeouts = if timeouts.is_empty() {
            vec![DEFAULT_ACK_TIMEOUTS[0]]
        } else {
            timeouts
        };
        // The client's own timeout must not cut an attempt short.
        let longest = self.ack_timeouts.iter().max().copied().unwrap_or_default();
        self.js.set_timeout(longest.max(Duration::from_millis(1)));
        self
    }

    /// The stream's layout.
    pub fn layout(&self) -> &StreamLayout {
        &self.layout
    }

    /// Publishes every body in order and waits for the server to have stored
    /// them all.
    ///
    /// # Errors
    /// [`JetStreamError::PublishNotConfirmed`] on the first publish whose
    /// every attempt timed out, [`JetStreamError::Request`] on the first the
    /// server refused; the bodies before it are stored.
    pub async fn publish_all<B: AsRef<[u8]>>(
        &self,
        bodies: impl IntoIterator<Item = B>,
    ) -> Result<PublishReport, JetStreamError> {
        let started = Instant::now();
        let mut report = PublishReport::default();
        // The highest stream sequence confirmed so far (see `stored_here`).
        let mut high_water = 0;
        let mut waiting = VecDeque::with_capacity(self.window);
        for body in bodies {
            let body = body.as_ref();
            let (partition, id) = route(body, self.layout.partitions);
            let pending = Pending {
                subject: self.layout.subject(partition),
                id,
                body: body.to_vec(),
            };
            let ack = self.send(&pending).await?;
            waiting.push_back((pending, ack));
            if waiting.len() >= self.window {
                if let Some((p, ack)) = waiting.pop_front() {
                    self.confirmed(p, ack, &mut report, &mut high_water).await?;
                }
            }
        }
        while let Some((p, ack)) = waiting.pop_front() {
            self.confirmed(p, ack, &mut report, &mut high_water).await?;
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// Publishes one body (first attempt or a re-publish, same headers).
    async fn send(
        &self,
        pending: &Pending,
    ) -> Result<jetstream::context::PublishAckFuture, JetStreamError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, pending.id.as_str());
        self.js
            .publish_with_headers(
                pending.subject.clone(),
                headers,
                pending.body.clone().into(),
            )
            .await
            .map_err(|e| JetStreamError::request("publish", e))
    }

    /// Waits for the acknowledgement of `pending`, publishing it again (same
    /// message id) each time an attempt times out, and counts it.
    async fn confirmed(
        &self,
        pending: Pending,
        first: jetstream::context::PublishAckFuture,
        report: &mut PublishReport,
        high_water: &mut u64,
    ) -> Result<(), JetStreamError> {
        let confirmed = with_retries(
            first,
            &self.ack_timeouts,
            |e| e.kind() == PublishErrorKind::TimedOut,
            || self.send(&pending),
        )
        .await;
        let (ack, retries) = match confirmed {
            Ok(done) => done,
            Err(Failure::Other(e)) => return Err(e),
            Err(Failure::Refused(e)) => {
                return Err(JetStreamError::request("publish acknowledgement", e))
            }
            Err(Failure::TimedOut) => {
                return Err(JetStreamError::PublishNotConfirmed {
                    message_id: pending.id,
                    subject: pending.subject,
                    attempts: self.ack_timeouts.len(),
                    waited: self.ack_timeouts.iter().sum(),
                })
            }
        };
        report.published += 1;
        report.ack_retries += u64::from(retries);
        if !stored_here(&ack, retries > 0, *high_water) {
            report.dropped_as_duplicate += 1;
        }
        *high_water = (*high_water).max(ack.sequence);
        Ok(())
    }
}

/// One body on its way to the stream, kept until its acknowledgement.
struct Pending {
    /// Its partition's subject.
    subject: String,
    /// Its `Nats-Msg-Id`.
    id: String,
    /// The body, kept for a re-publish.
    body: Vec<u8>,
}

/// Why [`with_retries`] gave up.
#[derive(Debug)]
enum Failure<E> {
    /// Every attempt timed out.
    TimedOut,
    /// The server answered with an error (not a timeout).
    Refused(E),
    /// A re-publish could not be sent.
    Other(JetStreamError),
}

/// Awaits `first`; each time an attempt times out (its entry of
/// `timeouts` elapsed, or the error is one `is_timeout` recognises),
/// `resend` publishes again and the next entry applies. Returns the
/// acknowledgement and how many re-publishes it took.
async fn with_retries<A, T, E, R, RF>(
    first: A,
    timeouts: &[Duration],
    is_timeout: impl Fn(&E) -> bool,
    mut resend: R,
) -> Result<(T, u32), Failure<E>>
where
    A: IntoFuture<Output = Result<T, E>>,
    R: FnMut() -> RF,
    RF: Future<Output = Result<A, JetStreamError>>,
{
    let mut attempt = first;
    for (n, wait) in timeouts.iter().enumerate() {
        match tokio::time::timeout(*wait, attempt.into_future()).await {
            Ok(Ok(ack)) => return Ok((ack, n as u32)),
            Ok(Err(e)) if !is_timeout(&e) => return Err(Failure::Refused(e)),
            Ok(Err(_)) | Err(_) => {}
        }
        if n + 1 == timeouts.len() {
            break;
        }
        tracing::warn!(
            attempt = n + 1,
            wait = ?wait,
            "publish acknowledgement timed out: publishing again with the same message id"
        );
        attempt = resend().await.map_err(Failure::Other)?;
    }
    Err(Failure::TimedOut)
}

/// Whether the body of an acknowledged publish is stored because of this
/// publish (counted as published) rather than dropped by the duplicate
/// window as an exact copy of an earlier body. A first attempt answered
/// `duplicate` met an earlier copy. A re-publish answered `duplicate` met
/// either its own timed-out attempt or an earlier copy: the server answers
/// with the stored message's sequence, and the timed-out attempt was sent
/// after every earlier body of this run, so its sequence is above
/// `high_water`, the highest sequence confirmed before it; an earlier copy's
/// is not.
fn stored_here(ack: &PublishAck, retried: bool, high_water: u64) -> bool {
    !ack.duplicate || (retried && ack.sequence > high_water)
}

/// The `Nats-Msg-Id` of a body: its `event_id` (when it has one) and a
/// 128-bit xxh3 hash of its exact bytes, `<event_id>/<hash>`. Only an exact
/// re-publish of the same bytes has the same id, so JetStream's duplicate
/// window drops it; a changed variant under the same `event_id`, or the same
/// event encoded differently, passes through to the receiver, whose registry
/// decides it. The broker window is a saving, not the correctness mechanism:
/// it is minutes long and keyed on bytes, the receiver's registry is keyed on
/// semantic content for the whole retention window.
pub fn message_id(body: &[u8]) -> String {
    route(body, 1).1
}

/// The partition ([`super::partition_of`]) and the [`message_id`] of a body, from one parse.
fn route(body: &[u8], partitions: u32) -> (u32, String) {
    let parsed = reader().parse(body).ok();
    let partition = parsed.as_ref().and_then(|d| d.object_id()).map_or(0, |id| {
        crate::core::shard_of(id, partitions.max(1) as usize) as u32
    });
    (
        partition,
        id_of(body, parsed.as_ref().and_then(|d| d.event_id())),
    )
}

fn id_of(body: &[u8], event_id: Option<&str>) -> String {
    let hash = xxhash_rust::xxh3::xxh3_128(body);
    match event_id {
        // A header value must stay printable and short; other ids are hashed.
        Some(id) if id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic()) => {
            format!("{id}/{hash:032x}")
        }
        Some(id) => format!(
            "h{:016x}/{hash:032x}",
            xxhash_rust::xxh3::xxh3_64(id.as_bytes())
        ),
        None => format!("-/{hash:032x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// An attempt that is never answered (the acknowledgement was lost).
    fn lost() -> std::future::Pending<Result<u64, &'static str>> {
        std::future::pending()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn a_timed_out_attempt_is_sent_again_until_one_is_answered() {
        let sent = AtomicU32::new(0);
        let waits = [
            Duration::from_secs(5),
            Duration::from_secs(10),
            Duration::from_secs(20),
        ];
        let result = rt().block_on(with_retries(
            futures_util::future::Either::Left(lost()),
            &waits,
            |_| false,
            || {
                // The second re-publish is answered.
                let n = sent.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    Ok(if n == 2 {
                        futures_util::future::Either::Right(std::future::ready(Ok(42)))
                    } else {
                        futures_util::future::Either::Left(lost())
                    })
                }
            },
        ));
        assert_eq!(result.unwrap(), (42, 2));
        assert_eq!(sent.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_attempts_are_bounded_and_a_timeout_error_counts_as_a_timeout() {
        let sent = AtomicU32::new(0);
        let waits = [Duration::from_secs(1); 3];
        let result = rt().block_on(with_retries(
            std::future::ready(Err("timed out")),
            &waits,
            |e| *e == "timed out",
            || {
                sent.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, JetStreamError>(std::future::ready(Err::<u64, _>("timed out"))) }
            },
        ));
        assert!(matches!(result, Err(Failure::TimedOut)), "{result:?}");
        assert_eq!(
            sent.load(Ordering::SeqCst),
            2,
            "three attempts: two re-publishes"
        );
    }

    #[test]
    fn a_refusal_is_not_retried() {
        let result = rt().block_on(with_retries(
            std::future::ready(Err::<u64, _>("stream full")),
            &DEFAULT_ACK_TIMEOUTS,
            |e| *e == "timed out",
            || async {
                Err::<std::future::Ready<Result<u64, &str>>, _>(JetStreamError::NoStream(
                    "x".into(),
                ))
            },
        ));
        assert!(
            matches!(result, Err(Failure::Refused("stream full"))),
            "{result:?}"
        );
    }

    #[test]
    fn a_duplicate_answer_to_a_re_publish_counts_as_stored_only_above_the_high_water() {
        let ack = |sequence, duplicate| PublishAck {
            sequence,
            duplicate,
            ..PublishAck::default()
        };
        // First attempts: a new message is stored, a duplicate met an earlier copy.
        assert!(stored_here(&ack(11, false), false, 10));
        assert!(!stored_here(&ack(3, true), false, 10));
        // Re-publishes: the timed-out attempt had been stored (sequence above
        // everything confirmed before it) ...
        assert!(stored_here(&ack(11, true), true, 10));
        // ... or the body is an exact copy of an earlier one.
        assert!(!stored_here(&ack(7, true), true, 10));
        assert!(!stored_here(&ack(10, true), true, 10));
    }

    #[test]
    fn the_default_attempts_fit_in_the_default_duplicate_window() {
        let total: Duration = DEFAULT_ACK_TIMEOUTS.iter().sum();
        assert_eq!(total, Duration::from_secs(65));
        assert!(total < Duration::from_secs(120));
    }
}
