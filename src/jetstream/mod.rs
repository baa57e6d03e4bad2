//! A NATS JetStream source: several receiver processes, one shared PostgreSQL
//! database, one stream of deliveries. And a relay destination the other
//! way ([`JetStreamDestination`]): effects published with their effect id
//! as `Nats-Msg-Id` (docs/CONTRACT.md §10).
//!
//! # The scheme
//! - **Subjects.** The stream `NAME` takes the subjects `<prefix>.<partition>`
//!   (the prefix defaults to the stream name). A delivery's partition is
//!   [`partition_of`]: the xxh3 hash of its `object_id` modulo the partition
//!   count, the same stable hash the router uses for its shards
//!   ([`crate::core::shard_of`]). Bodies without a readable `object_id`
//!   go to partition 0. So every event of one object travels through one
//!   partition, in publish order. The partition count is fixed when the
//!   stream is created and written into its description
//!   (`partitions=N`), so publishers and consumers agree on it.
//! - **Consumers.** Each partition has one durable pull consumer
//!   (`p<partition>`) with explicit acks and `max_ack_pending` set to the
//!   messages in flight allowed per partition
//!   ([`ConsumeOptions::max_in_flight`], default
//!   [`DEFAULT_MAX_IN_FLIGHT`]). The worker of a partition pulls that many,
//!   hands what has arrived to [`crate::Receiver::deliver_batch`] (up to
//!   [`ConsumeOptions::batch`] at a time: one call, one shard message per
//!   shard, the deliveries joining the receiver's group commits) and only
//!   then acknowledges them, while the next messages arrive. Concurrency
//!   comes from the partitions and from the messages of each batch.
//! - **Order.** The receiver does not need arrival order to be right, but
//!   the worker keeps each partition's decisions in stream order anyway, so
//!   that a crash or a `retry` does not change what a run decides. JetStream
//!   redelivers a message (after a negative acknowledgement, or after the
//!   ack wait when its holder died) after newer ones it handed out
//!   meanwhile, and several in no promised order. So arrivals wait in the
//!   worker (kept "in progress") while an older message of the partition is
//!   owed: one it handed back (`retry`) must come back first, and a
//!   partition taken over with unacknowledged messages waits until the
//!   server's count of unacknowledged messages says all of them have
//!   arrived; then what waited is decided in stream order. Within one batch
//!   the deliveries of one object are decided in order and committed
//!   together, so a failed commit answers `retry` to all of them. What the
//!   worker cannot see is a message the server handed to it that never
//!   arrived (lost with a connection): the newer ones are decided first,
//!   and it comes back after its ack wait, so a run then decides as its
//!   arrival order says. The cluster simulation (`sim/`, docs/TESTING.md)
//!   checks stream order in every run whose deliveries all arrived, and
//!   arrival order in the others.
//! - **Who consumes what.** A process consumes the partitions it holds a
//!   lease on (module `lease`): leases are keys of a JetStream key-value bucket
//!   whose entries expire a lease-TTL after their last renewal, and members
//!   announce themselves there with heartbeats. Partition `p` is meant for
//!   the live member at position `p mod n` of the sorted member names; a
//!   process releases the partitions that are no longer meant for it (after
//!   finishing its pull in flight) and takes the free ones that are. A
//!   stopped process releases everything; a killed one's leases expire. The
//!   leases only decide who pulls; they are not what keeps the data
//!   correct (see below).
//! - **Acknowledgement.** A message is acknowledged only after its receipt
//!   from [`crate::Receiver::deliver_batch`] answered
//!   [`crate::Ack::Acknowledge`], which happens after the group commit that
//!   recorded its decision. A batch's acknowledgements are sent together and
//!   the server's confirmation of the last one awaited (the server handles
//!   one connection's acknowledgements of a consumer in order). `retry` is a
//!   negative acknowledgement with a delay; `reject` terminates the message
//!   and logs the reason.//!
//! # What guarantees what
//! JetStream gives durability of published deliveries and at-least-once
//! delivery; the workers add the per-partition order above. Its duplicate window
//! (`Nats-Msg-Id`, see [`message_id`]) only drops exact re-publishes within
//! minutes; it is a saving, not the correctness mechanism. Correctness comes
//! from the receiver and the database: every redelivery, re-publish or
//! overlap between two processes (a lease that expired while its holder was
//! still working) is one more delivery to decide, and PostgreSQL arbitrates
//! between processes (unique receipts, conditional updates, decisions
//! redone on conflict).

mod consume;
mod forward;
mod lease;
mod publish;

pub use crate::partition::partition_of;
pub use consume::{
    consume, ConsumeEvent, ConsumeOptions, ConsumeReport, EventSink, DEFAULT_BATCH,
    DEFAULT_MAX_IN_FLIGHT,
};
pub use forward::{largest_effect_message, subject_for, JetStreamDestination, EFFECT_OVERHEAD};
pub use publish::{message_id, PublishReport, Publisher, DEFAULT_ACK_TIMEOUTS};

use crate::core::BodyParser;
use async_nats::jetstream;

/// Default number of partitions of a new stream.
pub const DEFAULT_PARTITIONS: u32 = 64;

/// Why a JetStream operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JetStreamError {
    /// The NATS server could not be reached.
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        /// The server URL.
        url: String,
        /// The client's error.
        source: async_nats::ConnectError,
    },
    /// The stream does not exist (consumers do not create it).
    #[error("stream `{0}` does not exist (publish creates it)")]
    NoStream(String),
    /// The stream exists but was not made for this scheme, or disagrees
    /// with the requested partition count or prefix.
    #[error("stream `{stream}`: {message}")]
    Incompatible {
        /// The stream.
        stream: String,
        /// What disagrees.
        message: String,
    },
    /// A publish was not acknowledged by the server after every attempt
    /// (see [`Publisher::ack_timeouts`]).
    #[error(
        "publish acknowledgement of message `{message_id}` on `{subject}`: timed out {attempts} times \
         ({waited:?} in all); the bodies before it are stored, and the stream keeps at most one copy \
         of this one"
    )]
    PublishNotConfirmed {
        /// The message's `Nats-Msg-Id` ([`message_id`]).
        message_id: String,
        /// The subject it was published on.
        subject: String,
        /// Attempts made.
        attempts: usize,
        /// The attempts' waits added up.
        waited: std::time::Duration,
    },
    /// A relay destination's server takes messages smaller than the
    /// largest effect the receiver can make
    /// ([`JetStreamDestination::check_body_limit`]).
    #[error(
        "the NATS server's max_payload is {max_payload} bytes, but the effect of a body of up to \
         {max_body_bytes} bytes (the body limit) takes up to {largest} bytes: lower the body limit \
         to at most {fits} bytes, or raise the server's max_payload to at least {largest} bytes"
    )]
    PayloadTooSmall {
        /// The server's `max_payload` (bytes).
        max_payload: usize,
        /// The body limit checked (bytes).
        max_body_bytes: usize,
        /// The largest message an effect of such a body makes (bytes,
        /// [`largest_effect_message`]).
        largest: usize,
        /// The largest body limit whose effects fit (bytes).
        fits: usize,
    },
    /// A JetStream request failed.
    #[error("{what}: {message}")]
    Request {
        /// What was being done.
        what: String,
        /// The client's error.
        message: String,
    },
}

impl JetStreamError {
    pub(crate) fn request(what: impl Into<String>, e: impl std::fmt::Display) -> Self {
        JetStreamError::Request {
            what: what.into(),
            message: e.to_string(),
        }
    }
}

/// Connects to a NATS server.
///
/// # Errors
/// [`JetStreamError::Connect`].
pub async fn connect(url: &str) -> Result<async_nats::Client, JetStreamError> {
    async_nats::ConnectOptions::new()
        .name("snapshot-receiver")
        .connect(url)
        .await
        .map_err(|source| JetStreamError::Connect {
            url: url.to_owned(),
            source,
        })
}

/// How a stream is partitioned: what its description and subjects say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamLayout {
    /// The stream's name.
    pub stream: String,
    /// Subjects are `<subject_prefix>.<partition>`.
    pub subject_prefix: String,
    /// Number of partitions, fixed at creation.
    pub partitions: u32,
}

impl StreamLayout {
    /// The subject of one partition.
    pub fn subject(&self, partition: u32) -> String {
        format!("{}.{partition}", self.subject_prefix)
    }

    /// The durable consumer of one partition.
    pub fn consumer(&self, partition: u32) -> String {
        format!("p{partition}")
    }

    fn description(&self) -> String {
        format!(
            "snapshot-receiver deliveries; partitions={}; subjects={}.<partition>",
            self.partitions, self.subject_prefix
        )
    }

    /// Reads the layout back from a stream's configuration.
    fn of(config: &jetstream::stream::Config) -> Result<Self, JetStreamError> {
        let incompatible = |message: &str| JetStreamError::Incompatible {
            stream: config.name.clone(),
            message: message.to_owned(),
        };
        let partitions = config
            .description
            .as_deref()
            .and_then(|d| d.split("; ").find_map(|p| p.strip_prefix("partitions=")))
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                incompatible(
                    "not created by snapshot-receiver publish (no partitions=N in its description)",
                )
            })?;
        let subject_prefix = match config.subjects.as_slice() {
            [one] => one
                .strip_suffix(".*")
                .ok_or_else(|| incompatible("its subject is not `<prefix>.*`"))?
                .to_owned(),
            _ => return Err(incompatible("it has more than one subject")),
        };
        Ok(Self {
            stream: config.name.clone(),
            subject_prefix,
            partitions,
        })
    }

    /// Opens an existing stream and reads its layout; with `create`, makes
    /// the stream first when it does not exist (file storage, limits
    /// retention, the default 2-minute duplicate window).
    ///
    /// # Errors
    /// [`JetStreamError::NoStream`] without `create`,
    /// [`JetStreamError::Incompatible`] when the stream exists with another
    /// partition count or prefix than requested, [`JetStreamError::Request`].
    pub async fn open(
        js: &jetstream::Context,
        stream: &str,
        requested: Option<u32>,
        subject_prefix: Option<&str>,
        create: bool,
    ) -> Result<Self, JetStreamError> {
        let existing = match js.get_stream(stream).await {
            Ok(mut s) => Some(
                s.info()
                    .await
                    .map_err(|e| JetStreamError::request(format!("stream {stream}"), e))?
                    .config
                    .clone(),
            ),
            Err(e)
                if matches!(
                    e.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(j)
                        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                None
            }
            Err(e) => return Err(JetStreamError::request(format!("stream {stream}"), e)),
        };
        let layout = match existing {
            Some(config) => Self::of(&config)?,
            None if create => {
                let layout = Self {
                    stream: stream.to_owned(),
                    subject_prefix: subject_prefix.unwrap_or(stream).to_owned(),
                    partitions: requested.unwrap_or(DEFAULT_PARTITIONS),
                };
                let config = jetstream::stream::Config {
                    name: stream.to_owned(),
                    description: Some(layout.description()),
                    subjects: vec![format!("{}.*", layout.subject_prefix)],
                    storage: jetstream::stream::StorageType::File,
                    retention: jetstream::stream::RetentionPolicy::Limits,
                    ..Default::default()
                };
                js.get_or_create_stream(config)
                    .await
                    .map_err(|e| JetStreamError::request(format!("create stream {stream}"), e))?;
                return Ok(layout);
            }
            None => return Err(JetStreamError::NoStream(stream.to_owned())),
        };
        if let Some(n) = requested.filter(|n| *n != layout.partitions) {
            return Err(JetStreamError::Incompatible {
                stream: stream.to_owned(),
                message: format!("it has {} partitions, not {n}", layout.partitions),
            });
        }
        if let Some(p) = subject_prefix.filter(|p| *p != layout.subject_prefix) {
            return Err(JetStreamError::Incompatible {
                stream: stream.to_owned(),
                message: format!("its subject prefix is {}, not {p}", layout.subject_prefix),
            });
        }
        Ok(layout)
    }
}

/// A parser with the default limits and the card profile, shared by the
/// publisher helpers (the one [`partition_of`] reads bodies with).
fn reader() -> &'static BodyParser {
    crate::partition::reader()
}
