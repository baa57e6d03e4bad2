//! A relay's row in a durable store (docs/CONTRACT.md §10), on SQLite and
//! on PostgreSQL, through [`OutboxStore`] directly: a take-over raises the
//! generation, so that a stale save is refused; an operator's retry starts
//! an effect's schedule again; leases are timed on the store's clock, not
//! the caller's; a PostgreSQL store whose parked attempts are a 32-bit
//! column (as created by earlier versions) is widened when opened.

use crate::common::{t, versioned};
use crate::durability::pg;
use crate::relay::At;
use snapshot_receiver::store::{
    change_relay, OutboxStore, ParkedEffect, ParkedStatus, RelayChange, RelaySave,
};
use snapshot_receiver::{Clock, ManualClock, Receiver};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A receiver on `at` whose outbox holds `obj-1` versions 1 to `n`
/// (positions 1 to `n`), and a relay connection of its own.
pub(crate) async fn with_effects(at: &At, n: u64) -> (Receiver, Box<dyn OutboxStore>) {
    let rx = at
        .store(
            Receiver::builder()
                .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
                .object("obj-1", 0, r#"{"v":0}"#),
        )
        .build()
        .unwrap();
    for v in 1..=n {
        let (_, body) = versioned(1, v);
        let receipt = rx.deliver(body.as_bytes()).await;
        assert_eq!(
            receipt.decision(),
            Some(snapshot_receiver::Decision::Applied),
            "{receipt:?}"
        );
    }
    let store = rx.outbox_store().await.unwrap();
    (rx, store)
}

/// Runs `f` on the relay connection off the runtime (its calls block).
async fn blocking<T: Send + 'static>(
    mut store: Box<dyn OutboxStore>,
    f: impl FnOnce(&mut dyn OutboxStore) -> T + Send + 'static,
) -> (T, Box<dyn OutboxStore>) {
    tokio::task::spawn_blocking(move || {
        let out = f(store.as_mut());
        (out, store)
    })
    .await
    .unwrap()
}

/// (owner, generation) of relay `name`.
fn holder(store: &mut dyn OutboxStore, name: &str) -> (Option<String>, u64) {
    let row = store
        .relays()
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no relay {name}"));
    (row.owner, row.generation)
}

/// Waits until a lease of `lease` taken now has ended on any clock.
fn outlive(lease: Duration) {
    std::thread::sleep(lease + Duration::from_millis(50));
}

/// Issue D2: A takes the relay, B takes it over once A's lease ended, A
/// takes it back: each take-over raises the generation, so that a save
/// A's first run makes with the generation it read is refused (it would
/// move the cursor behind the run that holds the relay now), and the
/// current run's save goes through.
async fn take_over_raises_the_generation(at: At) {
    let (rx, store) = with_effects(&at, 2).await;
    let ((), _store) = blocking(store, |s| {
        let lease = Duration::from_millis(200);
        let now = SystemTime::now();
        let first = s.open_relay("app", 0, Some("A"), now, lease).unwrap();
        assert_eq!((first.owner.as_deref(), first.generation), (Some("A"), 1));
        outlive(lease);
        let b = s
            .open_relay("app", 0, Some("B"), SystemTime::now(), lease)
            .unwrap();
        assert_eq!((b.owner.as_deref(), b.generation), (Some("B"), 2));
        outlive(lease);
        let again = s
            .open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap();
        assert_eq!((again.owner.as_deref(), again.generation), (Some("A"), 3));
        let save = RelaySave {
            position: 2,
            ..RelaySave::default()
        };
        let stale = s
            .save_relay(
                "app",
                first.generation,
                "A",
                &save,
                SystemTime::now(),
                lease,
            )
            .unwrap();
        assert!(
            !stale,
            "a save of A's first run (generation 1) was accepted"
        );
        assert_eq!(
            s.relays().unwrap()[0].position,
            0,
            "the stale save moved the cursor"
        );
        let current = s
            .save_relay(
                "app",
                again.generation,
                "A",
                &save,
                SystemTime::now(),
                lease,
            )
            .unwrap();
        assert!(current, "the save of the run holding the relay was refused");
        assert_eq!(s.relays().unwrap()[0].position, 2);
    })
    .await;
    rx.shutdown().await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_a_take_over_raises_the_generation_and_refuses_a_stale_save() {
    take_over_raises_the_generation(At::lsm("relay-store-generation-lsm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_take_over_raises_the_generation_and_refuses_a_stale_save() {
    take_over_raises_the_generation(At::sqlite("relay-store-generation")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_take_over_raises_the_generation_and_refuses_a_stale_save() {
    let Some(at) = At::postgres("relay_store_generation") else {
        return;
    };
    take_over_raises_the_generation(at.clone()).await;
    at.done();
}

/// Issue D3: an operator's retry of a failed effect starts its schedule
/// again: status `retrying`, attempts back to 0, due at the retry's time;
/// the relay's generation is raised (its run reads the parked effects
/// again). The last refusal stays for the operator to read.
async fn an_operators_retry_restarts_the_schedule(at: At) {
    let (rx, store) = with_effects(&at, 1).await;
    let ((), _store) = blocking(store, |s| {
        let lease = Duration::from_secs(30);
        let effect = s.effects_after(0, 1).unwrap().remove(0);
        let row = s
            .open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap();
        let failed = ParkedEffect {
            effect: effect.head(),
            status: ParkedStatus::Failed,
            attempts: 3,
            due: None,
            error: Some("HTTP 500 Internal Server Error".to_owned()),
            updated: t(),
        };
        let save = RelaySave {
            park: vec![failed],
            unpark: Vec::new(),
            position: 1,
            ..RelaySave::default()
        };
        assert!(s
            .save_relay("app", row.generation, "A", &save, SystemTime::now(), lease)
            .unwrap());
        let at_retry = t() + Duration::from_secs(3600);
        assert_eq!(s.retry_failed("app", Some(1), at_retry).unwrap(), 1);
        let parked = s.parked("app").unwrap();
        assert_eq!(
            parked
                .iter()
                .map(|p| (
                    p.effect.position,
                    p.status,
                    p.attempts,
                    p.due,
                    p.error.clone(),
                    p.updated
                ))
                .collect::<Vec<_>>(),
            [(
                1,
                ParkedStatus::Retrying,
                0,
                Some(at_retry),
                Some("HTTP 500 Internal Server Error".to_owned()),
                at_retry
            )]
        );
        assert_eq!(holder(s, "app"), (Some("A".to_owned()), row.generation + 1));
        // Nothing failed is left: a second retry changes nothing.
        assert_eq!(s.retry_failed("app", None, at_retry).unwrap(), 0);
        assert_eq!(holder(s, "app").1, row.generation + 1);
    })
    .await;
    rx.shutdown().await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_an_operators_retry_restarts_the_effects_schedule() {
    an_operators_retry_restarts_the_schedule(At::lsm("relay-store-retry-lsm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_an_operators_retry_restarts_the_effects_schedule() {
    an_operators_retry_restarts_the_schedule(At::sqlite("relay-store-retry")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_operators_retry_restarts_the_effects_schedule() {
    let Some(at) = At::postgres("relay_store_retry") else {
        return;
    };
    an_operators_retry_restarts_the_schedule(at.clone()).await;
    at.done();
}

/// Issue 48 item 12: the operator's changes follow one rule
/// (`store::change_relay`, which the `relays` command and `POST /relays`
/// both call), the same on both stores: a retry at a position whose
/// effect is not failed, a skip where nothing is parked, a rewind past the
/// last position and an unknown relay are refused, each in its words, and
/// change nothing; the others do what they say.
async fn operator_changes_follow_one_rule(at: At) {
    let (rx, store) = with_effects(&at, 3).await;
    let ((), _store) = blocking(store, |s| {
        let lease = Duration::from_secs(30);
        let effects = s.effects_after(0, 3).unwrap();
        let row = s
            .open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap();
        let parked = |i: usize, status| ParkedEffect {
            effect: effects[i].head(),
            status,
            attempts: u32::from(status == ParkedStatus::Failed),
            due: None,
            error: None,
            updated: t(),
        };
        let save = RelaySave {
            park: vec![
                parked(0, ParkedStatus::Failed),
                parked(1, ParkedStatus::Waiting),
            ],
            unpark: Vec::new(),
            position: 3,
            ..RelaySave::default()
        };
        assert!(s
            .save_relay("app", row.generation, "A", &save, SystemTime::now(), lease)
            .unwrap());
        let first = row.generation;
        let now = t() + Duration::from_secs(60);
        let mut change = |name: &str, change| {
            change_relay(s, name, change, now)
                .unwrap()
                .map(|done| done.to_string())
                .map_err(|refused| refused.to_string())
        };
        let refused = [
            (
                "app",
                RelayChange::Retry { position: Some(2) },
                "relay \"app\" has no failed effect at position 2",
            ),
            (
                "app",
                RelayChange::Skip { position: 3 },
                "relay \"app\" has no parked effect at position 3",
            ),
            (
                "app",
                RelayChange::Rewind { position: 4 },
                "position 4 is past the last outbox position 3",
            ),
            (
                "nobody",
                RelayChange::Retry { position: None },
                "no relay named \"nobody\" in this store",
            ),
        ];
        for (name, asked, error) in refused {
            assert_eq!(change(name, asked), Err(error.to_owned()), "{asked:?}");
        }
        assert_eq!(
            change("app", RelayChange::Retry { position: Some(1) }),
            Ok("1 failed effect(s) to be retried now".to_owned())
        );
        assert_eq!(
            change("app", RelayChange::Retry { position: None }),
            Ok("0 failed effect(s) to be retried now".to_owned())
        );
        assert_eq!(
            change("app", RelayChange::Skip { position: 2 }),
            Ok("the effect at position 2 skipped".to_owned())
        );
        assert_eq!(
            change("app", RelayChange::Rewind { position: 0 }),
            Ok("rewound to position 0".to_owned())
        );
        let row = s.relays().unwrap().remove(0);
        assert_eq!(row.position, 0);
        // The retry, the skip and the rewind each raised the generation;
        // the refusals did not.
        assert_eq!(row.generation, first + 3);
    })
    .await;
    rx.shutdown().await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_operator_changes_follow_one_rule() {
    operator_changes_follow_one_rule(At::lsm("relay-store-changes-lsm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_operator_changes_follow_one_rule() {
    operator_changes_follow_one_rule(At::sqlite("relay-store-changes")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_operator_changes_follow_one_rule() {
    let Some(at) = At::postgres("relay_store_changes") else {
        return;
    };
    operator_changes_follow_one_rule(at.clone()).await;
    at.done();
}

/// The skew of issue B: a machine whose clock runs 40 s ahead.
const SKEW: Duration = Duration::from_secs(40);

/// Issue B: leases are timed on the store's clock, whatever `now` a caller
/// passes. A caller 40 s ahead cannot take a relay whose holder's 3 s
/// lease is live; and when a holder 40 s ahead takes or renews a 1 s lease
/// and stops, another takes the relay once 1 s passed, not 41 s.
async fn leases_are_timed_on_the_stores_clock(at: At) {
    let (rx, store) = with_effects(&at, 1).await;
    let ((), _store) = blocking(store, |s| {
        let live = Duration::from_secs(3);
        let a = s
            .open_relay("live", 0, Some("A"), SystemTime::now(), live)
            .unwrap();
        assert_eq!(a.owner.as_deref(), Some("A"));
        let ahead = s
            .open_relay("live", 0, Some("B"), SystemTime::now() + SKEW, live)
            .unwrap();
        assert_eq!(
            (ahead.owner.as_deref(), ahead.generation),
            (Some("A"), a.generation),
            "a caller 40 s ahead took a live lease"
        );
        // Its save is refused too (it does not hold the relay).
        let save = RelaySave {
            position: 1,
            ..RelaySave::default()
        };
        assert!(!s
            .save_relay(
                "live",
                ahead.generation,
                "B",
                &save,
                SystemTime::now() + SKEW,
                live
            )
            .unwrap());

        let short = Duration::from_secs(1);
        let fast = s
            .open_relay("fast", 0, Some("F"), SystemTime::now() + SKEW, short)
            .unwrap();
        assert_eq!(fast.owner.as_deref(), Some("F"));
        // Renewed by a save from the same clock, then F stops.
        assert!(s
            .save_relay(
                "fast",
                fast.generation,
                "F",
                &save,
                SystemTime::now() + SKEW,
                short
            )
            .unwrap());
        let early = s
            .open_relay("fast", 0, Some("G"), SystemTime::now(), short)
            .unwrap();
        assert_eq!(
            early.owner.as_deref(),
            Some("F"),
            "taken before the lease ended"
        );
        outlive(short);
        let taken = s
            .open_relay("fast", 0, Some("G"), SystemTime::now(), short)
            .unwrap();
        assert_eq!(
            (taken.owner.as_deref(), taken.generation),
            (Some("G"), fast.generation + 1),
            "1 s after a holder 40 s ahead stopped, its lease still held the relay"
        );
    })
    .await;
    rx.shutdown().await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_leases_are_timed_on_the_stores_clock_not_the_callers() {
    leases_are_timed_on_the_stores_clock(At::lsm("relay-store-lease-lsm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_leases_are_timed_on_the_stores_clock_not_the_callers() {
    leases_are_timed_on_the_stores_clock(At::sqlite("relay-store-lease")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_are_timed_on_the_stores_clock_not_the_callers() {
    let Some(at) = At::postgres("relay_store_lease") else {
        return;
    };
    leases_are_timed_on_the_stores_clock(at.clone()).await;
    at.done();
}

/// Issue A: a store created when `relay_parked.attempts` was an INTEGER
/// (int4), which refused the relay's 64-bit count so that no save that
/// parked an effect went through, is widened to BIGINT when opened; the
/// save then parks the effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_store_with_32_bit_parked_attempts_is_widened_when_opened() {
    let Some(at) = At::postgres("relay_store_int4") else {
        return;
    };
    let At::Postgres(url, schema) = at.clone() else {
        unreachable!()
    };
    let column_type = {
        let (url, schema) = (url.clone(), schema.clone());
        move || {
            let schema = schema.clone();
            pg(&url, move |c| {
                c.query_one(
                    "SELECT data_type::text FROM information_schema.columns
                     WHERE table_schema = $1 AND table_name = 'relay_parked'
                     AND column_name = 'attempts'",
                    &[&schema],
                )
                .unwrap()
                .get::<_, String>(0)
            })
        }
    };
    // The store as the earlier version created it: the current tables,
    // the column narrowed back.
    {
        let (url, schema) = (url.clone(), schema.clone());
        // The synchronous client must not run on a runtime thread.
        std::thread::spawn(move || {
            snapshot_receiver::store::PostgresStore::connect_in_schema(&url, Some(&schema))
                .unwrap();
        })
        .join()
        .unwrap();
    }
    let narrow = format!("ALTER TABLE {schema}.relay_parked ALTER COLUMN attempts TYPE INTEGER");
    pg(&url, move |c| c.batch_execute(&narrow).unwrap());
    assert_eq!(column_type(), "integer");
    let (rx, store) = with_effects(&at, 1).await;
    assert_eq!(column_type(), "bigint", "not widened when opened");
    let (parked, _store) = blocking(store, |s| {
        let lease = Duration::from_secs(30);
        let effect = s.effects_after(0, 1).unwrap().remove(0);
        let row = s
            .open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap();
        let save = RelaySave {
            park: vec![ParkedEffect {
                effect: effect.head(),
                status: ParkedStatus::Retrying,
                attempts: u32::MAX,
                due: Some(t()),
                error: Some("HTTP 410 Gone".to_owned()),
                updated: t(),
            }],
            unpark: Vec::new(),
            position: 1,
            ..RelaySave::default()
        };
        let saved = s.save_relay("app", row.generation, "A", &save, SystemTime::now(), lease);
        assert!(saved.unwrap(), "the save was refused");
        s.parked("app")
            .unwrap()
            .iter()
            .map(|p| (p.effect.position, p.status, p.attempts))
            .collect::<Vec<_>>()
    })
    .await;
    assert_eq!(parked, [(1, ParkedStatus::Retrying, u32::MAX)]);
    rx.shutdown().await;
    at.done();
}

/// A lease let go (saved with a lease of zero, as a stopping relay does)
/// is free at once: the next run takes the relay in the same tick of the
/// store's clock (SQLite's counts milliseconds; a lapse counted only after
/// the lease's end left the relay to its old owner within that tick).
/// Twenty hand-overs in a row, each right after the release.
async fn a_released_lease_is_taken_at_once(at: At) {
    let (rx, store) = with_effects(&at, 1).await;
    let ((), _store) = blocking(store, |s| {
        let lease = Duration::from_secs(30);
        for i in 0..20 {
            let (owner, next) = if i % 2 == 0 { ("A", "B") } else { ("B", "A") };
            let row = s
                .open_relay("app", 0, Some(owner), SystemTime::now(), lease)
                .unwrap();
            assert_eq!(row.owner.as_deref(), Some(owner), "hand-over {i}");
            let release = RelaySave::default();
            let saved = s
                .save_relay(
                    "app",
                    row.generation,
                    owner,
                    &release,
                    SystemTime::now(),
                    Duration::ZERO,
                )
                .unwrap();
            assert!(saved, "hand-over {i}: the release was refused");
            let taken = s
                .open_relay("app", 0, Some(next), SystemTime::now(), lease)
                .unwrap();
            assert_eq!(
                taken.owner.as_deref(),
                Some(next),
                "hand-over {i}: {next} could not take the relay {owner} had just let go"
            );
            let back = RelaySave::default();
            assert!(s
                .save_relay(
                    "app",
                    taken.generation,
                    next,
                    &back,
                    SystemTime::now(),
                    Duration::ZERO
                )
                .unwrap());
        }
    })
    .await;
    rx.shutdown().await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_a_released_lease_is_taken_at_once() {
    a_released_lease_is_taken_at_once(At::lsm("relay-store-release-lsm")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_released_lease_is_taken_at_once() {
    a_released_lease_is_taken_at_once(At::sqlite("relay-store-release")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_released_lease_is_taken_at_once() {
    let Some(at) = At::postgres("relay_store_release") else {
        return;
    };
    a_released_lease_is_taken_at_once(at.clone()).await;
    at.done();
}

/// A state of exactly `bytes` bytes.
fn padded(bytes: usize) -> String {
    format!(r#"{{"p":"{}"}}"#, "x".repeat(bytes - r#"{"p":""}"#.len()))
}

/// Issue 48 item 1: a relay reads a round within bytes and parked states
/// back by position. `obj-1` gets states of 1,000, 2,000 and 3,000 bytes
/// from deliveries (kept as slices of their audit bodies) and one of
/// 4,000 from an authority (kept in its own column), positions 1 to 4.
/// `effects_within` stops before the state that passes the bytes, but
/// always gives the first; `effects_at` gives the effects asked for that
/// the outbox holds, in position order; `parked` gives heads with their
/// states' lengths, not the states.
async fn reads_within_bytes_and_parked_states_back(rx: Receiver) {
    for (v, bytes) in [(1u64, 1000), (2, 2000), (3, 3000)] {
        let body = crate::common::body(
            &format!("e-{v}"),
            "obj-1",
            Some(&v.to_string()),
            crate::common::T,
            &padded(bytes),
        );
        let receipt = rx.deliver(body.as_bytes()).await;
        assert_eq!(
            receipt.decision(),
            Some(snapshot_receiver::Decision::Applied),
            "{receipt:?}"
        );
    }
    let authority =
        snapshot_receiver::AuthoritativeSnapshot::new("obj-1", 4, &padded(4000), t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    let store = rx.outbox_store().await.unwrap();
    let ((), _store) = blocking(store, |s| {
        let within = |s: &mut dyn OutboxStore, after, limit, bytes| -> Vec<(u64, usize)> {
            s.effects_within(after, limit, bytes)
                .unwrap()
                .iter()
                .map(|e| (e.position, e.bytes()))
                .collect()
        };
        assert_eq!(within(s, 0, 10, 3000), [(1, 1000), (2, 2000)]);
        assert_eq!(within(s, 0, 10, 2999), [(1, 1000)]);
        assert_eq!(
            within(s, 0, 10, 10_000),
            [(1, 1000), (2, 2000), (3, 3000), (4, 4000)]
        );
        assert_eq!(within(s, 0, 1, usize::MAX), [(1, 1000)]);
        assert_eq!(within(s, 2, 10, 10), [(3, 3000)], "the first always");
        assert_eq!(within(s, 3, 10, 0), [(4, 4000)], "the first always");
        assert_eq!(within(s, 4, 10, usize::MAX), []);
        let all = s.effects_after(0, 10).unwrap();
        let at: Vec<(u64, String)> = s
            .effects_at(&[4, 2, 9])
            .unwrap()
            .iter()
            .map(|e| (e.position, e.state.compact()))
            .collect();
        assert_eq!(
            at,
            [(2, all[1].state.compact()), (4, all[3].state.compact())]
        );
        assert_eq!(at[1].1, padded(4000));
        let lease = Duration::from_secs(30);
        let row = s
            .open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap();
        let save = RelaySave {
            park: [1, 3]
                .into_iter()
                .map(|i| ParkedEffect::waiting(&all[i], t()))
                .collect(),
            unpark: Vec::new(),
            position: 4,
            ..RelaySave::default()
        };
        assert!(s
            .save_relay("app", row.generation, "A", &save, SystemTime::now(), lease)
            .unwrap());
        let heads: Vec<_> = s
            .parked("app")
            .unwrap()
            .into_iter()
            .map(|p| p.effect)
            .collect();
        assert_eq!(heads, [all[1].head(), all[3].head()]);
        assert_eq!(
            heads.iter().map(|h| h.bytes).collect::<Vec<_>>(),
            [2000, 4000]
        );
    })
    .await;
    rx.shutdown().await;
}

/// A receiver on `at` (or in memory) knowing `obj-1` at version 0.
fn obj_1(at: Option<&At>) -> Receiver {
    let b = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("obj-1", 0, r#"{"v":0}"#);
    match at {
        Some(at) => at.store(b),
        None => b,
    }
    .build()
    .unwrap()
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_a_relay_reads_within_bytes_and_parked_states_back() {
    let at = At::lsm("relay-store-bytes-lsm");
    reads_within_bytes_and_parked_states_back(obj_1(Some(&at))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_relay_reads_within_bytes_and_parked_states_back() {
    let at = At::sqlite("relay-store-bytes");
    reads_within_bytes_and_parked_states_back(obj_1(Some(&at))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_relay_reads_within_bytes_and_parked_states_back() {
    let Some(at) = At::postgres("relay_store_bytes") else {
        return;
    };
    reads_within_bytes_and_parked_states_back(obj_1(Some(&at))).await;
    at.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_relay_reads_within_bytes_and_parked_states_back() {
    reads_within_bytes_and_parked_states_back(obj_1(None)).await;
}

/// A read-only reader of the store at `at`.
fn reader(at: &At) -> snapshot_receiver::store::StoreReader {
    match at {
        At::Sqlite(path) => {
            snapshot_receiver::store::StoreReader::open(&format!("sqlite:{path}"), None)
        }
        At::Postgres(url, schema) => snapshot_receiver::store::StoreReader::open(url, Some(schema)),
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    }
    .unwrap()
}

/// Relay `app`'s backlog as the store reports it (through the relay
/// connection and the read-only reader, which must agree): backlogged,
/// since when, its parked heads' bytes.
fn backlog_of(store: &mut dyn OutboxStore, at: &At) -> (Option<bool>, Option<String>, Option<u64>) {
    let now = SystemTime::now();
    let ours = snapshot_receiver::store::relays_report(store, now, None).unwrap();
    let read = reader(at).relays(now, None).unwrap();
    let of = |r: snapshot_receiver::store::RelaysReport| {
        let s = r.relays.into_iter().find(|s| s.name == "app").unwrap();
        (s.backlogged, s.backlogged_since, s.parked_bytes)
    };
    let ours = of(ours);
    assert_eq!(
        ours,
        of(read),
        "the relay connection and the reader disagree"
    );
    ours
}

/// Issue 48 item 11: a relay's backlog is kept in its row with each save
/// (whether backlogged, since when, its parked heads' bytes). A store
/// created before that (the columns dropped again here) is read as it is
/// by the read-only reader, the backlog unknown; opened by a receiver, it
/// gains the columns, its relay's backlog unknown until the next save,
/// which records it; a later save clears it.
async fn a_store_without_the_relays_backlog_gains_it_when_opened(at: At) {
    let lease = Duration::from_secs(30);
    let (rx, store) = with_effects(&at, 1).await;
    let (generation, store) = blocking(store, move |s| {
        s.open_relay("app", 0, Some("A"), SystemTime::now(), lease)
            .unwrap()
            .generation
    })
    .await;
    drop(store);
    rx.shutdown().await;
    // The store as an earlier version created it.
    match &at {
        At::Sqlite(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch(
                "ALTER TABLE relays DROP COLUMN backlogged_since_ns;
                 ALTER TABLE relays DROP COLUMN parked_bytes;",
            )
            .unwrap();
        }
        At::Postgres(url, schema) => {
            let drop = format!(
                "ALTER TABLE {schema}.relays DROP COLUMN backlogged_since_ns, \
                 DROP COLUMN parked_bytes"
            );
            pg(url, move |c| c.batch_execute(&drop).unwrap());
        }
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    }
    // The synchronous client must not run on a runtime thread.
    let old = {
        let at = at.clone();
        tokio::task::spawn_blocking(move || reader(&at).relays(SystemTime::now(), None).unwrap())
            .await
            .unwrap()
    };
    let app = &old.relays[0];
    assert_eq!(
        (
            app.name.as_str(),
            app.position,
            app.backlogged,
            &app.backlogged_since,
            app.parked_bytes
        ),
        ("app", 0, None, &None, None),
        "an older store read as it is"
    );
    // Opened by a receiver: the columns are added, the backlog unknown.
    let (rx, store) = with_effects(&at, 0).await;
    let since = t() + Duration::from_nanos(123_456_789);
    let (seen, _store) = blocking(store, {
        let at = at.clone();
        move |s| {
            let row = s.relays().unwrap().remove(0);
            let unknown = (row.backlogged_since, row.parked_bytes, backlog_of(s, &at));
            let backlogged = RelaySave {
                position: 1,
                backlogged_since: Some(since),
                parked_bytes: 777,
                ..RelaySave::default()
            };
            assert!(s
                .save_relay(
                    "app",
                    generation,
                    "A",
                    &backlogged,
                    SystemTime::now(),
                    lease
                )
                .unwrap());
            let row = s.relays().unwrap().remove(0);
            let recorded = (row.backlogged_since, row.parked_bytes, backlog_of(s, &at));
            let cleared = RelaySave {
                position: 1,
                ..RelaySave::default()
            };
            assert!(s
                .save_relay("app", generation, "A", &cleared, SystemTime::now(), lease)
                .unwrap());
            (unknown, recorded, backlog_of(s, &at))
        }
    })
    .await;
    assert_eq!(
        seen.0,
        (None, None, (None, None, None)),
        "unknown when opened"
    );
    assert_eq!(
        seen.1,
        (
            Some(since),
            Some(777),
            (
                Some(true),
                Some("2024-01-01T08:00:00.123456789Z".to_owned()),
                Some(777)
            )
        ),
        "recorded by a save"
    );
    assert_eq!(seen.2, (Some(false), None, Some(0)), "cleared by a save");
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_store_without_the_relays_backlog_gains_it_when_opened() {
    a_store_without_the_relays_backlog_gains_it_when_opened(At::sqlite("relay-store-backlog"))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_store_without_the_relays_backlog_gains_it_when_opened() {
    let Some(at) = At::postgres("relay_store_backlog") else {
        return;
    };
    a_store_without_the_relays_backlog_gains_it_when_opened(at.clone()).await;
    at.done();
}

/// The CLI's `args` on the store at `at`; its standard output (it must
/// succeed).
fn cli_on(at: &At, args: &[&str]) -> String {
    let mut command = crate::common::cli();
    command.args(args);
    match at {
        At::Sqlite(path) => command.args(["--store", &format!("sqlite:{path}")]),
        At::Postgres(url, schema) => command.args(["--store", url, "--store-schema", schema]),
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    };
    let o = command.output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Issue 48 item 11, as the operator sees it offline: relay `app`, its
/// effect parked failed and its save recording the backlog, is shown
/// backlogged, since when and with its parked heads' bytes by `relays`
/// and `inspect`, in text and JSON. Then the store as an earlier version
/// left it (the columns dropped): `inspect` reads it as it is, the backlog
/// unknown (no line, no JSON key); `relays`, which opens the store for
/// writing, adds the columns.
async fn relays_and_inspect_show_a_stored_backlog(at: At) {
    let (rx, store) = with_effects(&at, 1).await;
    let (effect, _store) = blocking(store, |s| {
        let effect = s.effects_after(0, 1).unwrap().remove(0);
        let row = s
            .open_relay(
                "app",
                0,
                Some("A"),
                SystemTime::now(),
                Duration::from_secs(30),
            )
            .unwrap();
        let failed = ParkedEffect {
            effect: effect.head(),
            status: ParkedStatus::Failed,
            attempts: 1,
            due: None,
            error: Some("down".to_owned()),
            updated: t(),
        };
        let save = RelaySave {
            parked_bytes: failed.memory_bytes() as u64,
            park: vec![failed],
            position: 1,
            backlogged_since: Some(t() + Duration::from_millis(500)),
            ..RelaySave::default()
        };
        // Let go (a lease of zero): the relay is not running.
        assert!(s
            .save_relay(
                "app",
                row.generation,
                "A",
                &save,
                SystemTime::now(),
                Duration::ZERO
            )
            .unwrap());
        effect.id.to_string()
    })
    .await;
    rx.shutdown().await;
    let window = ["--history-retention", "1000000000"];
    let relay = format!(
        "relay app: position 1, 0 after it, 1 parked (1 failed): 1 not delivered, not running
  backlogged since 2024-01-01T08:00:00.5Z: its parked effects (265 bytes of heads) fill their \
part of the memory budget; its cursor stops until they are delivered, skipped or retried
  failed 1 obj-1 v1 ({effect}, 1 attempt(s)): down
"
    );
    let at2 = at.clone();
    let (relays, inspect, relays_json, inspect_json) = tokio::task::spawn_blocking(move || {
        (
            cli_on(&at2, &["relays", window[0], window[1]]),
            cli_on(&at2, &["inspect", window[0], window[1]]),
            cli_on(&at2, &["relays", "--format", "json"]),
            cli_on(&at2, &["inspect", "--format", "json"]),
        )
    })
    .await
    .unwrap();
    assert_eq!(relays, format!("last outbox position: 1\n{relay}"));
    assert!(
        inspect.ends_with(&format!("\n== relays (last outbox position 1) ==\n{relay}")),
        "{inspect}"
    );
    let relays_json: serde_json::Value = serde_json::from_str(&relays_json).unwrap();
    let inspect_json: serde_json::Value = serde_json::from_str(&inspect_json).unwrap();
    for app in [
        &relays_json["relays"][0],
        &inspect_json["relays"]["relays"][0],
    ] {
        assert_eq!(
            (
                &app["backlogged"],
                &app["backlogged_since"],
                &app["parked_bytes"]
            ),
            (
                &serde_json::json!(true),
                &serde_json::json!("2024-01-01T08:00:00.5Z"),
                &serde_json::json!(265)
            ),
            "{app}"
        );
    }
    // The store as an earlier version left it.
    let columns = |at: &At| -> Vec<String> {
        match at {
            At::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .prepare("SELECT name FROM pragma_table_info('relays') ORDER BY cid")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap(),
            At::Postgres(url, schema) => {
                let schema = schema.clone();
                pg(url, move |c| {
                    c.query(
                        "SELECT column_name::text FROM information_schema.columns
                         WHERE table_schema = $1 AND table_name = 'relays'
                         ORDER BY ordinal_position",
                        &[&schema],
                    )
                    .unwrap()
                    .iter()
                    .map(|r| r.get(0))
                    .collect()
                })
            }
            At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
        }
    };
    let at2 = at.clone();
    let (before, inspect, inspect_json, relays, after) = tokio::task::spawn_blocking(move || {
        match &at2 {
            At::Sqlite(path) => rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(
                    "ALTER TABLE relays DROP COLUMN backlogged_since_ns;
                     ALTER TABLE relays DROP COLUMN parked_bytes;",
                )
                .unwrap(),
            At::Postgres(url, schema) => {
                let drop = format!(
                    "ALTER TABLE {schema}.relays DROP COLUMN backlogged_since_ns, \
                     DROP COLUMN parked_bytes"
                );
                pg(url, move |c| c.batch_execute(&drop).unwrap());
            }
            At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
        }
        (
            columns(&at2),
            cli_on(&at2, &["inspect", window[0], window[1]]),
            cli_on(&at2, &["inspect", "--format", "json"]),
            cli_on(&at2, &["relays", window[0], window[1]]),
            columns(&at2),
        )
    })
    .await
    .unwrap();
    let old = [
        "name",
        "position",
        "generation",
        "owner",
        "lease_until_ns",
        "updated_ns",
    ];
    assert_eq!(before, old);
    let unknown = format!(
        "relay app: position 1, 0 after it, 1 parked (1 failed): 1 not delivered, not running
  failed 1 obj-1 v1 ({effect}, 1 attempt(s)): down
"
    );
    assert!(inspect.ends_with(&unknown), "{inspect}");
    let inspect_json: serde_json::Value = serde_json::from_str(&inspect_json).unwrap();
    let app = inspect_json["relays"]["relays"][0].as_object().unwrap();
    for key in ["backlogged", "backlogged_since", "parked_bytes"] {
        assert!(!app.contains_key(key), "{key} in {app:?}");
    }
    assert_eq!(relays, format!("last outbox position: 1\n{unknown}"));
    assert_eq!(
        after,
        [&old[..], &["backlogged_since_ns", "parked_bytes"]].concat(),
        "`relays` opened the store without adding the columns"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_relays_and_inspect_show_a_stored_backlog() {
    relays_and_inspect_show_a_stored_backlog(At::sqlite("relay-store-backlog-cli")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_relays_and_inspect_show_a_stored_backlog() {
    let Some(at) = At::postgres("relay_store_backlog_cli") else {
        return;
    };
    relays_and_inspect_show_a_stored_backlog(at.clone()).await;
    at.done();
}
