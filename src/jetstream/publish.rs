//! Publishing deliveries to the partitioned stream.

use super::{reader, JetStreamError, StreamLayout};
use async_nats::jetstream;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
}

/// What a run of [`Publisher::publish_all`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Bodies handed to the stream.
    pub published: u64,
    /// Of those, how many the stream's duplicate window dropped (an exact
    /// re-publish of the same bytes within the window).
    pub dropped_as_duplicate: u64,
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
        let js = jetstream::new(client);
        let layout = StreamLayout::open(&js, stream, partitions, subject_prefix, true).await?;
        Ok(Self {
            js,
            layout,
            window: 1024,
        })
    }

    /// The stream's layout.
    pub fn layout(&self) -> &StreamLayout {
        &self.layout
    }

    /// Publishes every body in order and waits for the server to have stored
    /// them all.
    ///
    /// # Errors
    /// [`JetStreamError::Request`] on the first publish the server did not
    /// confirm; the bodies before it are stored.
    pub async fn publish_all<B: AsRef<[u8]>>(
        &self,
        bodies: impl IntoIterator<Item = B>,
    ) -> Result<PublishReport, JetStreamError> {
        let started = Instant::now();
        let mut report = PublishReport::default();
        let mut waiting = VecDeque::with_capacity(self.window);
        for body in bodies {
            let body = body.as_ref();
            let (partition, id) = route(body, self.layout.partitions);
            let subject = self.layout.subject(partition);
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let pending = self
                .js
                .publish_with_headers(subject, headers, body.to_vec().into())
                .await
                .map_err(|e| JetStreamError::request("publish", e))?;
            waiting.push_back(pending);
            if waiting.len() >= self.window {
                if let Some(p) = waiting.pop_front() {
                    Self::confirmed(p, &mut report).await?;
                }
            }
        }
        while let Some(p) = waiting.pop_front() {
            Self::confirmed(p, &mut report).await?;
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    async fn confirmed(
        pending: jetstream::context::PublishAckFuture,
        report: &mut PublishReport,
    ) -> Result<(), JetStreamError> {
        let ack = pending
            .await
            .map_err(|e| JetStreamError::request("publish acknowledgement", e))?;
        report.published += 1;
        report.dropped_as_duplicate += u64::from(ack.duplicate);
        Ok(())
    }
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
        crate::shard_of(id, partitions.max(1) as usize) as u32
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
