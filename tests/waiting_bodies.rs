//! Waiting bodies stay in the store (docs/CONTRACT.md §9): a durable
//! receiver keeps of a held, parked or malformed event only what its
//! decisions need (ids, reason, place), reads the body back when a
//! reconciliation decides the event again, never refuses a hold for memory,
//! and starts without reading a body; the in-memory receiver keeps its
//! bodies and refuses past its waiting share. On SQLite and PostgreSQL.

use crate::common::{body, t};
use crate::durability::{drop_schema, pg_url};
use crate::store::temp_db;
use snapshot_receiver::core::engine::{
    ReevaluationOutcome, STORED_WAITING_OVERHEAD, WAITING_OVERHEAD,
};
use snapshot_receiver::store::{Loaded, PostgresStore, SqliteOptions, SqliteStore, Store};
use snapshot_receiver::{
    AuthoritativeSnapshot, Clock, Config, ConflictKind, Decision, HoldReason, ManualClock,
    MemoryBudget, Outcome, Receiver, ReceiverBuilder, RetryReason, Verdict,
};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// A durable store the receivers of a test share.
#[derive(Clone, Debug)]
enum Durable {
    Sqlite(String),
    Postgres { url: String, schema: String },
}

impl Durable {
    /// A SQLite file and, when the server answers, a PostgreSQL schema,
    /// both empty, named after `name`.
    fn both(name: &str) -> Vec<Durable> {
        let path = temp_db(&format!("waiting-{name}"));
        let mut all = vec![Durable::Sqlite(format!("sqlite:{}", path.display()))];
        if let Some(url) = pg_url() {
            let schema = format!("sr_waiting_{name}_{}", std::process::id());
            drop_schema(&url, &schema);
            all.push(Durable::Postgres { url, schema });
        }
        all
    }

    fn on(&self, builder: ReceiverBuilder) -> ReceiverBuilder {
        match self {
            Durable::Sqlite(location) => builder.store(location),
            Durable::Postgres { url, schema } => builder.store(url).store_schema(schema),
        }
    }

    /// What the store gives a start-up that reads on demand
    /// (`load_resident`) and one that loads everything (`load`), read off
    /// the runtime (PostgreSQL's synchronous client must not run on it).
    fn loads(&self) -> (Loaded, Loaded) {
        let store = self.clone();
        std::thread::spawn(move || {
            let mut s: Box<dyn Store> = match &store {
                Durable::Sqlite(location) => {
                    let path = location.trim_start_matches("sqlite:");
                    Box::new(SqliteStore::open(path, SqliteOptions::default()).unwrap())
                }
                Durable::Postgres { url, schema } => {
                    Box::new(PostgresStore::connect_in_schema(url, Some(schema)).unwrap())
                }
            };
            (
                s.load_resident(UNIX_EPOCH).unwrap(),
                s.load(UNIX_EPOCH).unwrap(),
            )
        })
        .join()
        .unwrap()
    }
}

/// A receiver with card-8 v3 (the fixture's) on one shard, under `config`
/// (its memory budget), on `store` when given.
fn receiver(store: Option<&Durable>, config: Config) -> Receiver {
    let clock = Arc::new(ManualClock::new(t()));
    let builder = Receiver::builder()
        .config(Config {
            shards: 1,
            ..config
        })
        .clock(clock as Arc<dyn Clock>)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#);
    match store {
        Some(s) => s.on(builder).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

/// A state with `pad` bytes of padding: bodies much larger than what a
/// durable receiver keeps of them.
fn padded(stage: &str, label: &str, pad: usize) -> String {
    format!(
        r#"{{"stage":"{stage}","label":"{label}","pad":"{}"}}"#,
        "x".repeat(pad)
    )
}

/// What memory keeps of a waiting event whose body is in the store.
fn stored(event_id: &str) -> usize {
    event_id.len() + STORED_WAITING_OVERHEAD
}

/// The re-evaluations of a reconciliation as (event, outcome) words.
fn lines(report: &snapshot_receiver::ReconcileReport) -> Vec<(String, String)> {
    report
        .reevaluated
        .iter()
        .map(|r| {
            let outcome = match r.outcome {
                ReevaluationOutcome::Decided(v, _) => v.code(),
                ReevaluationOutcome::Unresolved(v) => format!("unresolved {}", v.code()),
            };
            (r.event_id.to_string(), outcome)
        })
        .collect()
}

const MALFORMED: &str = "{not json";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_bodies_leave_memory_survive_a_restart_and_are_read_back_when_reconciled() {
    for store in Durable::both("reread") {
        let pad = 4096;
        let bodies = [
            // card-8 v4 applied, then its other state at v4: paused.
            body(
                "e-206",
                "card-8",
                Some("4"),
                "2024-01-01T08:00:05Z",
                &padded("review", "Chart", pad),
            ),
            body(
                "e-205",
                "card-8",
                Some("4"),
                "2024-01-01T08:00:12Z",
                &padded("blocked", "Chart", pad),
            ),
            // Held while paused; equal to the authority below.
            body(
                "e-209",
                "card-8",
                Some("5"),
                "2024-01-01T08:00:13Z",
                r#"{"stage":"ready","label":"Chart"}"#,
            ),
            body(
                "e-204",
                "card-8",
                None,
                "2024-01-01T08:00:08Z",
                &padded("blocked", "Chart", pad),
            ),
            body(
                "e-207",
                "card-9",
                Some("1"),
                "2024-01-01T08:00:16Z",
                r#"{"stage":"ready","label":"Table"}"#,
            ),
        ];
        let rx = receiver(Some(&store), Config::default());
        let mut decided = Vec::new();
        for b in &bodies {
            decided.push(rx.deliver(b.as_bytes()).await.outcome);
        }
        decided.push(rx.deliver(MALFORMED.as_bytes()).await.outcome);
        let held = |r| Outcome::Decided(Decision::Held(r));
        assert_eq!(
            decided,
            [
                Outcome::Decided(Decision::Applied),
                Outcome::Decided(Decision::Conflict(ConflictKind::VersionState)),
                held(HoldReason::Paused),
                held(HoldReason::MissingVersion),
                held(HoldReason::UnknownObject),
                held(HoldReason::Malformed),
            ],
            "{store:?}"
        );
        // Four events and a body without ids wait; once their holds are
        // committed, memory keeps none of their bodies.
        let waiting = stored("e-205")
            + stored("e-209")
            + stored("e-204")
            + stored("e-207")
            + STORED_WAITING_OVERHEAD;
        assert_eq!(rx.memory_bytes().await.waiting, waiting, "{store:?}");
        rx.shutdown().await;

        // A restart reads no body either.
        let rx = receiver(Some(&store), Config::default());
        assert_eq!(
            rx.memory_bytes().await.waiting,
            waiting,
            "{store:?} restarted"
        );
        // The malformed body's digest is read back when one arrives: its
        // redelivery is its duplicate, and its body leaves memory again.
        assert_eq!(
            rx.deliver(MALFORMED.as_bytes()).await.outcome,
            Outcome::Decided(Decision::Duplicate {
                original: Verdict::Held(HoldReason::Malformed)
            }),
            "{store:?}"
        );
        assert_eq!(rx.memory_bytes().await.waiting, waiting, "{store:?}");

        // The authority: the held bodies are read from the store and decided
        // again with the normal rules (docs/CONTRACT.md §4).
        let authority =
            AuthoritativeSnapshot::new("card-8", 5, r#"{"stage":"ready","label":"Chart"}"#, t())
                .unwrap();
        let report = rx.reconcile(authority).await.unwrap();
        let words = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(e, o)| (e.to_string(), o.to_string()))
                .collect()
        };
        assert_eq!(
            lines(&report),
            words(&[
                ("e-205", "stale"),
                ("e-209", "equal"),
                ("e-204", "unresolved held:missing_version"),
            ]),
            "{store:?}"
        );
        let ghost =
            AuthoritativeSnapshot::new("card-9", 1, r#"{"stage":"ready","label":"Table"}"#, t())
                .unwrap();
        let report = rx.reconcile(ghost).await.unwrap();
        assert_eq!(lines(&report), words(&[("e-207", "equal")]), "{store:?}");
        // Only the malformed body waits now, still without its bytes.
        assert_eq!(
            rx.memory_bytes().await.waiting,
            STORED_WAITING_OVERHEAD,
            "{store:?}"
        );
        let card = rx.object("card-8").await.unwrap();
        assert_eq!((card.version, card.paused, card.held), (5, false, 0));
        rx.shutdown().await;
    }
}

/// Three events parked for an unknown object, each far larger than the
/// waiting share.
fn ghosts() -> Vec<String> {
    (1..=3)
        .map(|n| {
            body(
                &format!("e-{n}"),
                "ghost",
                Some(&n.to_string()),
                "2099-01-01T00:00:00Z",
                &padded("ready", "Ghost", 2000),
            )
        })
        .collect()
}

fn tiny_waiting() -> Config {
    Config {
        memory: MemoryBudget {
            waiting: 1,
            ..MemoryBudget::default()
        },
        ..Config::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_receiver_holds_past_its_waiting_share_the_in_memory_one_refuses() {
    let parked = Outcome::Decided(Decision::Held(HoldReason::UnknownObject));
    let bodies = ghosts();
    // In memory the bodies cannot leave: past the share (one always gets
    // in), `retry`.
    let rx = receiver(None, tiny_waiting());
    let mut decided = Vec::new();
    for b in &bodies {
        decided.push(rx.deliver(b.as_bytes()).await.outcome);
    }
    let full = Outcome::Retry(RetryReason::MemoryFull {
        part: "waiting",
        limit: 1,
    });
    assert_eq!(decided, [parked.clone(), full.clone(), full]);
    assert_eq!(
        rx.memory_bytes().await.waiting,
        bodies[0].len() + WAITING_OVERHEAD
    );
    rx.shutdown().await;
    for store in Durable::both("tiny") {
        let rx = receiver(Some(&store), tiny_waiting());
        let mut decided = Vec::new();
        for b in &bodies {
            decided.push(rx.deliver(b.as_bytes()).await.outcome);
        }
        assert_eq!(decided, vec![parked.clone(); 3], "{store:?}");
        assert_eq!(
            rx.memory_bytes().await.waiting,
            3 * stored("e-1"),
            "{store:?}"
        );
        rx.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_up_on_many_held_rows_reads_no_body() {
    const HELD: usize = 400;
    for store in Durable::both("startup") {
        let rx = receiver(Some(&store), Config::default());
        // card-8 paused by a conflict, then HELD events of 3 KB held for it.
        let pause = [
            body(
                "e-a",
                "card-8",
                Some("4"),
                "2024-01-01T08:00:05Z",
                r#"{"v":1}"#,
            ),
            body(
                "e-b",
                "card-8",
                Some("4"),
                "2024-01-01T08:00:05Z",
                r#"{"v":2}"#,
            ),
        ];
        for b in &pause {
            rx.deliver(b.as_bytes()).await;
        }
        let bodies: Vec<String> = (0..HELD)
            .map(|n| {
                let state = padded("ready", &n.to_string(), 3000);
                body(
                    &format!("h-{n:04}"),
                    "card-8",
                    Some("9"),
                    "2024-01-01T08:00:09Z",
                    &state,
                )
            })
            .collect();
        for chunk in bodies.chunks(100) {
            for r in rx.deliver_batch(chunk).await {
                assert_eq!(r.decision(), Some(Decision::Held(HoldReason::Paused)));
            }
        }
        rx.shutdown().await;

        // The store's start-up read leaves every body out; the full load
        // (a receiver that cannot read on demand) has them.
        let (resident, full) = store.loads();
        assert_eq!(resident.held.len(), HELD + 1, "{store:?}");
        assert!(resident.held.iter().all(|h| h.body.is_empty()), "{store:?}");
        let bytes: usize = full.held.iter().map(|h| h.body.len()).sum();
        let sent: usize = bodies.iter().map(String::len).sum::<usize>() + pause[1].len();
        assert_eq!(bytes, sent, "{store:?}");

        let rx = receiver(Some(&store), Config::default());
        let waiting = stored("e-b") + bodies.len() * stored("h-0000");
        assert_eq!(rx.memory_bytes().await.waiting, waiting, "{store:?}");
        assert_eq!(rx.object("card-8").await.unwrap().held, HELD + 1);
        rx.shutdown().await;
    }
}
