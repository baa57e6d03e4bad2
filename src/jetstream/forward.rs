//! A relay destination on JetStream (docs/CONTRACT.md §10): each effect
//! published to a subject of its object, with `Nats-Msg-Id` = the effect
//! id, so that the stream's duplicate window drops a re-send; delivered
//! once the stream acknowledged it. An effect with a trace context
//! ([`Effect::trace`]) continues its trace in the message's `traceparent`
//! header (same trace id and flags, a new parent id for the publish) and
//! passes its `tracestate` on. A destination whose server's
//! `max_payload` cannot take the effect of the largest body the receiver
//! accepts is refused before it starts ([`JetStreamDestination::check_body_limit`]),
//! rather than failing that effect later and holding its object's next
//! ones behind it.

use crate::core::engine::Effect;
use crate::relay::{Handler, HandlerError, HandlerFuture};
use async_nats::jetstream;
use std::fmt::Write as _;

/// Publishes effects to the subjects `<prefix>.<object token>` of a stream
/// that takes them (created by the operator, e.g. with subjects
/// `<prefix>.>`). The object token is the object id with every byte
/// outside `A-Z a-z 0-9 _ -` written as `~` and two hex digits (`~2e` for
/// a dot), so that every id gives one valid subject token and two ids never
/// share one. The body is the effect's JSON (`{"effect_id", "position",
/// "at", "object_id", "version", "state", "cause"}`).
#[derive(Clone)]
pub struct JetStreamDestination {
    /// The JetStream context of the connection.
    js: jetstream::Context,
    /// The subjects' prefix.
    prefix: String,
    /// The connection, for the server's `max_payload` (the context does
    /// not say it).
    client: async_nats::Client,
}

/// Bytes an effect's message takes, at most, beyond the body of the
/// delivery it comes from: the effect's own fields (`effect_id` up to 40
/// characters, `position` and `version` up to 20 digits each, `at` 30
/// characters of RFC 3339 with nanoseconds (`invalid-time`, shorter, for a
/// time past year 9999), `cause` `authority` for an authoritative
/// snapshot), the JSON keys and punctuation around them, and the header
/// block (`NATS/1.0` line, `Nats-Msg-Id`, `traceparent` and `tracestate`
/// at their longest, blank line), which the server counts in `max_payload`
/// too. The object id, event id and state
/// an effect carries are parts of its body, written no longer than they
/// arrived (the state as it arrived; serde_json's string escapes are never
/// longer than the JSON escapes a body must use).
pub const EFFECT_OVERHEAD: usize = EFFECT_KEYS + 40 + 20 + 20 + 30 + "authority".len() + HEADERS;

/// `{"effect_id":"`, `","position":`, `,"at":"`, `","object_id":"`,
/// `","version":`, `,"state":`, `,"cause":"`, `"}`.
const EFFECT_KEYS: usize = 14 + 13 + 7 + 15 + 12 + 9 + 10 + 2;

/// `NATS/1.0\r\n`, `Nats-Msg-Id: ` + the effect id (up to 40) + `\r\n`,
/// `traceparent: ` + 55 + `\r\n`, `tracestate: ` + up to
/// [`crate::core::MAX_TRACESTATE`] + `\r\n`, `\r\n`.
const HEADERS: usize = 10 + 13 + 40 + 2 + 13 + 55 + 2 + 12 + crate::core::MAX_TRACESTATE + 2 + 2;

/// The largest message (body and headers, bytes) the effect of a delivery
/// of up to `max_body_bytes` bytes makes: `max_body_bytes` +
/// [`EFFECT_OVERHEAD`], saturating.
pub fn largest_effect_message(max_body_bytes: usize) -> usize {
    max_body_bytes.saturating_add(EFFECT_OVERHEAD)
}

impl JetStreamDestination {
    /// A destination on `client`'s JetStream, publishing under `prefix`.
    pub fn new(client: async_nats::Client, prefix: impl Into<String>) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            prefix: prefix.into(),
            client,
        }
    }

    /// The largest message the server takes (bytes, headers included), as
    /// it announced when the connection was made (its `max_payload`, 1 MiB
    /// unless configured otherwise).
    pub fn max_payload(&self) -> usize {
        self.client.max_payload()
    }

    /// Checks that the effect of every delivery the receiver accepts (a
    /// body of up to `max_body_bytes` bytes) fits in one message of this
    /// server ([`largest_effect_message`] <= [`Self::max_payload`]). An
    /// effect that did not would be refused by the server at every attempt,
    /// end `failed`, and hold every later effect of its object behind it.
    ///
    /// Effects of authoritative snapshots (whose states the body limit
    /// does not bound) and a coalescing relay's `replaces` list (up to 120
    /// bytes per effect it stands for) can still exceed it: such an effect
    /// is refused with the server's limit and its size in the reason.
    ///
    /// # Errors
    /// [`super::JetStreamError::PayloadTooSmall`], with both numbers and
    /// the largest body limit that fits.
    pub fn check_body_limit(&self, max_body_bytes: usize) -> Result<(), super::JetStreamError> {
        let max_payload = self.max_payload();
        let largest = largest_effect_message(max_body_bytes);
        if largest <= max_payload {
            return Ok(());
        }
        Err(super::JetStreamError::PayloadTooSmall {
            max_payload,
            max_body_bytes,
            largest,
            fits: max_payload.saturating_sub(EFFECT_OVERHEAD),
        })
    }

    /// Connects to the NATS server at `url` ([`super::connect`]) and
    /// publishes under `prefix`.
    ///
    /// # Errors
    /// [`super::JetStreamError::Connect`].
    pub async fn connect(
        url: &str,
        prefix: impl Into<String>,
    ) -> Result<Self, super::JetStreamError> {
        Ok(Self::new(super::connect(url).await?, prefix))
    }

    /// The subject the effects of `object_id` go to ([`subject_for`]).
    pub fn subject(&self, object_id: &str) -> String {
        subject_for(&self.prefix, object_id)
    }
}

/// `<prefix>.<token>`, the token being `object_id` with every byte outside
/// `A-Z a-z 0-9 _ -` written as `~` and two lowercase hex digits: one valid
/// subject token per id (no dot, wildcard or space), never the same for two
/// ids.
pub fn subject_for(prefix: &str, object_id: &str) -> String {
    let mut subject = format!("{prefix}.");
    for b in object_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            subject.push(char::from(b));
        } else {
            let _ = write!(subject, "~{b:02x}");
        }
    }
    subject
}

impl Handler for JetStreamDestination {
    fn handle(&self, effect: Effect) -> HandlerFuture {
        let this = self.clone();
        Box::pin(async move {
            let body = serde_json::to_vec(&effect)
                .map_err(|e| HandlerError::new(format!("the effect does not serialize: {e}")))?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                effect.id.to_string().as_str(),
            );
            if let Some(trace) = &effect.trace {
                let next = crate::trace::continue_trace(trace);
                headers.insert("traceparent", next.traceparent().as_str());
                if let Some(state) = next.tracestate() {
                    headers.insert("tracestate", state);
                }
            }
            let subject = this.subject(&effect.object_id);
            let ack = this
                .js
                .publish_with_headers(subject.clone(), headers, body.into())
                .await
                .map_err(|e| HandlerError::new(format!("publish to {subject}: {e}")))?;
            // Delivered only once the stream stored it: the server answers
            // a publish no stream takes with "no responders" (status 503),
            // which the client reports as StreamNotFound.
            ack.await.map_err(|e| {
                HandlerError::new(match e.kind() {
                    jetstream::context::PublishErrorKind::StreamNotFound => {
                        format!("no stream takes the subject {subject} (no responders)")
                    }
                    _ => format!("no acknowledgement from {subject}: {e}"),
                })
            })?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{largest_effect_message, subject_for, EFFECT_OVERHEAD};
    use crate::core::engine::Effect;
    use crate::core::write::{EffectRow, HeldKey};
    use crate::core::{TraceContext, MAX_TRACESTATE};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    /// The message of `effect` as the destination publishes it: its JSON
    /// and the `Nats-Msg-Id` header block, bytes.
    fn message_len(effect: &Effect) -> usize {
        let mut headers = format!("NATS/1.0\r\nNats-Msg-Id: {}\r\n", effect.id);
        if let Some(trace) = &effect.trace {
            headers.push_str(&format!("traceparent: {}\r\n", trace.traceparent()));
            if let Some(state) = trace.tracestate() {
                headers.push_str(&format!("tracestate: {state}\r\n"));
            }
        }
        headers.push_str("\r\n");
        serde_json::to_vec(effect).unwrap().len() + headers.len()
    }

    #[test]
    fn the_overhead_bounds_an_effect_with_the_longest_fields_exactly() {
        // Every field at its longest around a one-byte object id and state:
        // 9999-12-31T23:59:59.999999999Z, u64::MAX everywhere.
        let longest_state = format!("k={}", "v".repeat(MAX_TRACESTATE - 2));
        let trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some(&longest_state),
        )
        .unwrap();
        assert_eq!(trace.tracestate().map(str::len), Some(MAX_TRACESTATE));
        let effect = |cause: Option<&str>| {
            Effect::from_row(
                u64::MAX,
                EffectRow {
                    key: HeldKey {
                        origin: u64::MAX,
                        seq: u64::MAX,
                    },
                    at: UNIX_EPOCH + Duration::new(253_402_300_799, 999_999_999),
                    object_id: "o".into(),
                    version: u64::MAX,
                    state: "0".to_owned(),
                    cause_event: cause.map(Into::into),
                    trace: Some(Arc::new(trace.clone())),
                },
            )
        };
        // An authority's effect (cause `authority`) reaches the bound.
        assert_eq!(message_len(&effect(None)), 2 + EFFECT_OVERHEAD);
        // An event's: its id is part of the body.
        assert_eq!(message_len(&effect(Some("e"))), 3 + EFFECT_OVERHEAD - 9);
        assert_eq!(EFFECT_OVERHEAD, 864);
        assert_eq!(largest_effect_message(1 << 20), 1_049_440);
        assert_eq!(largest_effect_message(usize::MAX), usize::MAX);
    }

    #[test]
    fn object_ids_map_to_one_valid_token_each() {
        assert_eq!(subject_for("fx", "card-7"), "fx.card-7");
        assert_eq!(
            subject_for("fx", "acme/SHP-1.a b"),
            "fx.acme~2fSHP-1~2ea~20b"
        );
        assert_eq!(subject_for("fx", "~"), "fx.~7e");
        assert_eq!(subject_for("fx", "é*>"), "fx.~c3~a9~2a~3e");
    }
}
