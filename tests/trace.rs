//! W3C Trace Context from a delivery to its effect (docs/CONTRACT.md §10,
//! docs/OPERATIONS.md *Traces*): the trace a delivery comes with is kept
//! with the effect it makes, in memory, on SQLite and on PostgreSQL
//! (across a restart, and in a store created before the column), and
//! continued on the forwarded request (HTTP) and message (JetStream): the
//! same trace id and flags, version 00, a new valid parent id. A delivery
//! that makes no effect keeps no trace; an invalid `traceparent` is
//! ignored and counted, the delivery decided as without one.

use crate::common::runtime;
use crate::durability::{drop_schema, pg, pg_url};
use crate::forward::{CliStore, Got, Sink};
use crate::jetstream::{card_1, drop_stream, fresh_stream, nats_url};
use crate::serve::{envelope, now_seconds, standard_headers, Server, NEW_SECRET, OLD_SECRET};
use crate::store::temp_db;
use snapshot_receiver::store::{PostgresStore, SqliteOptions, SqliteStore};
use snapshot_receiver::{
    AuthoritativeSnapshot, Decision, DeliveryMeta, Effect, Receiver, ReceiverBuilder, TraceContext,
};
use std::time::{Duration, Instant, SystemTime};

/// The specification's example: sampled (flags 01), with a `tracestate`.
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const STATE: &str = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
/// Another trace, not sampled (flags 00).
const OTHER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

fn traced(parent: &str, state: Option<&str>) -> DeliveryMeta {
    DeliveryMeta::new().trace(TraceContext::parse(parent, state).unwrap())
}

/// `text` is a `traceparent` this hop made from [`PARENT`]: version 00,
/// the same trace id and flags, a parent id of 16 lowercase hex digits,
/// not all zeros, not the sender's.
fn continues_parent(text: &str) {
    let parts: Vec<&str> = text.split('-').collect();
    assert_eq!(parts.len(), 4, "{text}");
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", TRACE_ID, "01"),
        "{text}"
    );
    let id = parts[2];
    assert_eq!(id.len(), 16, "{text}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{text}"
    );
    assert_ne!(id, "0000000000000000", "{text}");
    assert_ne!(
        id, PARENT_ID,
        "the forward reused the sender's span id: {text}"
    );
    // It parses as a trace context, as the destination reads it.
    TraceContext::parse(text, None).unwrap();
}

/// One effect as these tests compare it: its object, version, and
/// `traceparent` and `tracestate` as kept, if any.
type Traced = (String, u64, Option<String>, Option<String>);

/// [`Traced`] for each effect.
fn traces(effects: &[Effect]) -> Vec<Traced> {
    effects
        .iter()
        .map(|e| {
            (
                e.object_id.to_string(),
                e.version,
                e.trace.as_ref().map(|t| t.traceparent()),
                e.trace
                    .as_ref()
                    .and_then(|t| t.tracestate().map(str::to_owned)),
            )
        })
        .collect()
}

/// The trace of card-1 v1 is kept; a duplicate with another trace, an
/// event held for an unknown object, a delivery without one and an
/// authority add no trace; what the outbox reads is as expected.
async fn keeps_the_trace(builder: impl Fn() -> ReceiverBuilder) {
    let rx = builder().object("card-1", 0, r#"{"v":0}"#).build().unwrap();
    let applied = rx
        .deliver_with(card_1(1).as_bytes(), traced(PARENT, Some(STATE)))
        .await;
    assert_eq!(applied.decision(), Some(Decision::Applied), "{applied:?}");
    let again = rx
        .deliver_with(card_1(1).as_bytes(), traced(OTHER, None))
        .await;
    assert!(
        matches!(again.decision(), Some(Decision::Duplicate { .. })),
        "{again:?}"
    );
    // An object the receiver does not know: held (parked), no effect.
    let unknown = card_1(3).replace("card-1", "card-9").replace("e-3", "e-9");
    let held = rx
        .deliver_with(unknown.as_bytes(), traced(OTHER, None))
        .await;
    assert!(
        matches!(held.decision(), Some(Decision::Held(_))),
        "{held:?}"
    );
    let plain = rx.deliver(card_1(2).as_bytes()).await;
    assert_eq!(plain.decision(), Some(Decision::Applied), "{plain:?}");
    rx.reconcile(AuthoritativeSnapshot::new("card-1", 9, r#"{"v":9}"#, SystemTime::now()).unwrap())
        .await
        .unwrap();
    // card-9 introduced by an authority: its parked event is decided again
    // and applied, without the trace it came with (held events keep none).
    rx.reconcile(AuthoritativeSnapshot::new("card-9", 2, r#"{"v":2}"#, SystemTime::now()).unwrap())
        .await
        .unwrap();
    let card = |object: &str, version, parent: Option<&str>, state: Option<&str>| {
        (
            object.to_owned(),
            version,
            parent.map(str::to_owned),
            state.map(str::to_owned),
        )
    };
    let expected = vec![
        card("card-1", 1, Some(PARENT), Some(STATE)),
        card("card-1", 2, None, None),
        card("card-1", 9, None, None),
        card("card-9", 2, None, None),
        card("card-9", 3, None, None),
    ];
    assert_eq!(traces(&rx.outbox(0, 10).await.unwrap()), expected);
    rx.shutdown().await;
    expected_after_restart(builder, expected).await;
}

/// A receiver built again on the same store reads the same traces (an
/// in-memory receiver has nothing to read again: skipped by its caller).
async fn expected_after_restart(builder: impl Fn() -> ReceiverBuilder, expected: Vec<Traced>) {
    let rx = builder().build().unwrap();
    if rx.store_stats().is_some() {
        assert_eq!(traces(&rx.outbox(0, 10).await.unwrap()), expected);
    }
    rx.shutdown().await;
}

#[test]
fn in_memory_the_effect_keeps_its_delivery_trace() {
    runtime().block_on(keeps_the_trace(Receiver::builder));
}

#[test]
fn on_sqlite_the_effect_keeps_its_delivery_trace_across_a_restart() {
    let path = temp_db("trace-keep").to_str().unwrap().to_owned();
    runtime().block_on(keeps_the_trace(|| {
        let path = path.clone();
        Receiver::builder().store_with(move || SqliteStore::open(&path, SqliteOptions::default()))
    }));
}

#[test]
fn on_postgres_the_effect_keeps_its_delivery_trace_across_a_restart() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_trace_keep_{}", std::process::id());
    drop_schema(&url, &schema);
    runtime().block_on(keeps_the_trace(|| {
        let (url, schema) = (url.clone(), schema.clone());
        Receiver::builder()
            .store_with(move || PostgresStore::connect_in_schema(&url, Some(&schema)))
    }));
    drop_schema(&url, &schema);
}

/// A store written before trace contexts (its history without the
/// column): opened, it gains the column; its effect reads without a
/// trace, and the next one keeps its own.
async fn an_old_store_gains_the_column(
    builder: impl Fn() -> ReceiverBuilder,
    drop_column: impl FnOnce(),
    has_column: impl Fn() -> bool,
) {
    let rx = builder().object("card-1", 0, r#"{"v":0}"#).build().unwrap();
    assert_eq!(
        rx.deliver(card_1(1).as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    rx.shutdown().await;
    drop_column();
    assert!(!has_column(), "the old layout has no trace_context");
    let rx = builder().build().unwrap();
    assert!(has_column(), "opening the store added trace_context");
    let applied = rx
        .deliver_with(card_1(2).as_bytes(), traced(PARENT, None))
        .await;
    assert_eq!(applied.decision(), Some(Decision::Applied), "{applied:?}");
    assert_eq!(
        traces(&rx.outbox(0, 10).await.unwrap()),
        vec![
            ("card-1".to_owned(), 1, None, None),
            ("card-1".to_owned(), 2, Some(PARENT.to_owned()), None)
        ]
    );
    rx.shutdown().await;
}

#[test]
fn on_sqlite_a_store_without_the_trace_column_gains_it_when_opened() {
    let path = temp_db("trace-old").to_str().unwrap().to_owned();
    let sqlite = |sql: &str| {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap()
    };
    runtime().block_on(an_old_store_gains_the_column(
        || {
            let path = path.clone();
            Receiver::builder()
                .store_with(move || SqliteStore::open(&path, SqliteOptions::default()))
        },
        || {
            rusqlite::Connection::open(&path)
                .unwrap()
                .execute_batch("ALTER TABLE replacements DROP COLUMN trace_context")
                .unwrap();
        },
        || {
            sqlite(
                "SELECT count(*) FROM pragma_table_info('replacements') \
                 WHERE name = 'trace_context'",
            ) == 1
        },
    ));
}

#[test]
fn on_postgres_a_store_without_the_trace_column_gains_it_when_opened() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_trace_old_{}", std::process::id());
    drop_schema(&url, &schema);
    let has = {
        let (url, schema) = (url.clone(), schema.clone());
        move || {
            let schema = schema.clone();
            pg(&url, move |c| {
                c.query_one(
                    "SELECT count(*) FROM information_schema.columns WHERE table_schema = $1 \
                     AND table_name = 'replacements' AND column_name = 'trace_context'",
                    &[&schema],
                )
                .unwrap()
                .get::<_, i64>(0)
            }) == 1
        }
    };
    let drop = {
        let sql = format!("ALTER TABLE {schema}.replacements DROP COLUMN trace_context");
        let url = url.clone();
        move || pg(&url, move |c| c.batch_execute(&sql).unwrap())
    };
    runtime().block_on(an_old_store_gains_the_column(
        || {
            let (url, schema) = (url.clone(), schema.clone());
            Receiver::builder()
                .store_with(move || PostgresStore::connect_in_schema(&url, Some(&schema)))
        },
        drop,
        has,
    ));
    drop_schema(&url, &schema);
}

/// A signed delivery with `traceparent` (and `tracestate`) posted to
/// serve, which records it and stops; serve started again with
/// `--forward` sends its effect, read back from the store, with a
/// `traceparent` continuing the trace. Beside it: an invalid traceparent
/// ignored and counted (its delivery applied, its effect without trace),
/// a delivery without one.
fn serve_forwards_the_trace(store: &CliStore) {
    // card-7 at v10 and card-8 at v3.
    let seed = crate::common::repo("fixtures/B62-15-events.json")
        .display()
        .to_string();
    let server = Server::start(&store.with(&["--initial", &seed, "--webhook-secret", OLD_SECRET]));
    let post = |body: &str, trace: &[(&'static str, &str)]| {
        let mut headers = standard_headers(OLD_SECRET, now_seconds(), body);
        headers.extend(trace.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let reply = server.post(&headers, body);
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.json()["decision"], "applied", "{}", reply.body);
    };
    post(
        &envelope("e-11", "card-7", 11, r#"{"stage":"a"}"#),
        &[("traceparent", PARENT), ("tracestate", STATE)],
    );
    post(
        &envelope("e-4", "card-8", 4, r#"{"stage":"b"}"#),
        &[(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        )],
    );
    post(&envelope("e-12", "card-7", 12, r#"{"stage":"c"}"#), &[]);
    let metrics = server.get("/metrics").body;
    assert!(
        metrics.contains(
            "snapshot_receiver_http_trace_context_invalid_total{reason=\"zero_trace_id\"} 1"
        ),
        "{metrics}"
    );
    assert!(server.stop().0.success());

    let sink = Sink::start(Box::new(|_, _, _| (204, None)));
    let server = Server::start(&store.with(&[
        "--webhook-secret",
        OLD_SECRET,
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
    ]));
    let accepted = sink.wait_accepted(3);
    let by = |object: &str, version: u64| -> Got {
        accepted
            .iter()
            .find(|g| g.body["object_id"] == object && g.body["version"] == version)
            .unwrap_or_else(|| panic!("{object} v{version}: {accepted:?}"))
            .clone()
    };
    let traced = by("card-7", 11);
    continues_parent(traced.traceparent.as_deref().expect("a traceparent"));
    assert_eq!(traced.tracestate.as_deref(), Some(STATE));
    for (object, version) in [("card-8", 4), ("card-7", 12)] {
        let got = by(object, version);
        assert_eq!(
            (got.traceparent, got.tracestate),
            (None, None),
            "{object} v{version}"
        );
    }
    assert!(server.stop().0.success());
}

#[test]
fn on_sqlite_serve_forwards_the_delivery_trace_after_a_restart() {
    serve_forwards_the_trace(&CliStore::sqlite("trace"));
}

#[test]
fn on_postgres_serve_forwards_the_delivery_trace_after_a_restart() {
    let Some(store) = CliStore::postgres("trace") else {
        return;
    };
    serve_forwards_the_trace(&store);
}

/// The JetStream destination puts the continued trace in the message's
/// headers (`traceparent`, `tracestate`); an effect without a trace has
/// neither.
#[test]
fn the_jetstream_destination_continues_the_trace_in_the_message_headers() {
    use snapshot_receiver::jetstream::JetStreamDestination;
    use snapshot_receiver::relay::RelayOptions;
    let Some(nats) = nats_url() else { return };
    runtime().block_on(async {
        let stream = format!("SR_TRACE_{}", std::process::id());
        let prefix = format!("sr-trace-{}", std::process::id());
        let (client, js) = fresh_stream(&nats, &stream).await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
        let rx = Receiver::builder()
            .object("card-1", 0, r#"{"v":0}"#)
            .build()
            .unwrap();
        rx.deliver_with(card_1(1).as_bytes(), traced(PARENT, Some(STATE)))
            .await;
        rx.deliver(card_1(2).as_bytes()).await;
        let relay = rx
            .relay(
                RelayOptions {
                    poll_interval: Duration::from_millis(1),
                    ..RelayOptions::new("js-trace")
                },
                JetStreamDestination::new(client, prefix.clone()),
            )
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while relay.progress().delivered < 2 {
            assert!(Instant::now() < deadline, "{:?}", relay.progress());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        relay.stop().await.unwrap();
        let s = js.get_stream(&stream).await.unwrap();
        let header = |m: &async_nats::jetstream::message::StreamMessage, name: &str| {
            m.headers.get(name).map(|v| v.as_str().to_owned())
        };
        let first = s.get_raw_message(1).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
        assert_eq!(body["version"], 1);
        continues_parent(&header(&first, "traceparent").expect("a traceparent header"));
        assert_eq!(header(&first, "tracestate").as_deref(), Some(STATE));
        let second = s.get_raw_message(2).await.unwrap();
        assert_eq!(
            (
                header(&second, "traceparent"),
                header(&second, "tracestate")
            ),
            (None, None)
        );
        rx.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}
