//! Embedding the receiver behind HTTP (axum).
//!
//! ```sh
//! cargo run --example http_receiver -- --listen 127.0.0.1:8080 \
//!     --fixture fixtures/B62-15-events.json          # initial objects
//! #   --store postgres://postgres@127.0.0.1:5432/test # durable, shared
//! curl -i -X POST --data-binary @body.json http://127.0.0.1:8080/deliveries
//! ```
//!
//! `POST /deliveries` takes one envelope as the request body and answers:
//!
//! | receipt | HTTP | meaning for the sender |
//! |---|---|---|
//! | `acknowledge` | 200 | recorded (applied, duplicate, stale, equal — or held / conflict: the receiver took responsibility for reconciliation) |
//! | `retry` | 503 + `Retry-After` | nothing recorded: send it again later |
//! | `reject`, body too large | 413 | not recorded: the sender keeps its copy |
//! | `reject`, too deep / id too long | 400 | not recorded: the sender keeps its copy |
//!
//! The handler verifies nothing: the authenticity check (a signature over the
//! raw body, a client certificate, ...) goes where the comment in
//! [`deliver`] says, before the receiver sees the body. The response is sent
//! only after the receiver returned, which with a durable store is after the
//! decision was committed.

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use snapshot_receiver::{Ack, Outcome, Receiver, RejectReason};

/// Seconds a sender is asked to wait before redelivering after a `retry`.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// The HTTP routes around `receiver`. The body limit is one byte above the
/// receiver's own, so the receiver decides every body it could accept and
/// axum refuses (413) only what the receiver would refuse too, without
/// buffering it whole.
pub fn router(receiver: Receiver) -> Router {
    let limit = receiver.context().config().limits.max_body_bytes + 1;
    Router::new()
        .route("/deliveries", post(deliver))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(receiver)
}

/// `POST /deliveries`: one delivery, answered after it is recorded.
async fn deliver(State(receiver): State<Receiver>, headers: HeaderMap, body: Bytes) -> Response {
    // --- Authenticity boundary -------------------------------------------
    // Verify the sender here, on the raw bytes, before anything is decided:
    // for example an HMAC of `body` against a signature header, with a
    // timestamp check against replays. Refuse with 401 on failure. This
    // example accepts everything; the receiver itself never authenticates.
    let _ = &headers;
    // ----------------------------------------------------------------------
    let receipt = receiver.deliver(&body).await;
    let json = |status: StatusCode, value: serde_json::Value| {
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            value.to_string(),
        )
            .into_response()
    };
    match receipt.ack() {
        Ack::Acknowledge => json(
            StatusCode::OK,
            serde_json::json!({
                "event_id": receipt.event_id.as_deref(),
                "decision": receipt.decision().map(|d| d.as_str()),
                "meaning": receipt.ack_meaning(),
            }),
        ),
        Ack::Retry => {
            let mut response = json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"retry": receipt.ack_meaning()}),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
            response
        }
        Ack::Reject => {
            let status = match &receipt.outcome {
                Outcome::Rejected(RejectReason::BodyTooLarge { .. }) => {
                    StatusCode::PAYLOAD_TOO_LARGE
                }
                _ => StatusCode::BAD_REQUEST,
            };
            let reason = match &receipt.outcome {
                Outcome::Rejected(why) => why.as_str(),
                _ => "rejected",
            };
            json(
                status,
                serde_json::json!({"rejected": reason, "meaning": receipt.ack_meaning()}),
            )
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen = "127.0.0.1:8080".to_owned();
    let (mut fixture, mut store) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs ADDRESS:PORT")?,
            "--fixture" => fixture = Some(args.next().ok_or("--fixture needs a file")?),
            "--store" => store = Some(args.next().ok_or("--store needs a location")?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let mut builder = Receiver::builder();
    if let Some(path) = fixture {
        let fixture = snapshot_receiver::fixture::Fixture::load(std::path::Path::new(&path))?;
        for (id, version, state) in &fixture.initial_state {
            builder = builder.object(id, *version, state);
        }
    }
    if let Some(store) = store {
        builder = builder.store(&store);
    }
    let receiver = builder.build()?;
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("listening on http://{}/deliveries", listener.local_addr()?);
    axum::serve(listener, router(receiver.clone()))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    receiver.shutdown().await;
    Ok(())
}
