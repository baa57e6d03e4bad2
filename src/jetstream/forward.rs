//! A relay destination on JetStream (docs/CONTRACT.md §10): each effect
//! published to a subject of its object, with `Nats-Msg-Id` = the effect
//! id, so that the stream's duplicate window drops a re-send; delivered
//! once the stream acknowledged it.

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
}

impl JetStreamDestination {
    /// A destination on `client`'s JetStream, publishing under `prefix`.
    pub fn new(client: async_nats::Client, prefix: impl Into<String>) -> Self {
        Self {
            js: jetstream::new(client),
            prefix: prefix.into(),
        }
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
    use super::subject_for;

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
