//! An operator's changes to a relay in a durable store (docs/CONTRACT.md
//! §10), on SQLite and on PostgreSQL, through [`OutboxStore`] directly: a
//! skip, a retry or a rewind raises the relay's generation by exactly one
//! when it changed something (so that the relay's run reads its parked
//! effects again), and leaves it alone when there was nothing to change;
//! each says what it did.

use crate::common::t;
use crate::relay::At;
use snapshot_receiver::store::{OutboxStore, ParkedEffect, ParkedStatus, RelaySave};
use std::time::{Duration, SystemTime};

/// The generation of relay `name`.
fn generation(store: &mut dyn OutboxStore, name: &str) -> u64 {
    store
        .relays()
        .unwrap()
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no relay {name}"))
        .generation
}

/// `obj-1` versions 1 to 3 (positions 1 to 3); relay `app` parks 2
/// `failed` and 3 `waiting`. Then, each checked against the generation:
/// a skip of a position not parked (1) and a retry with nothing failed
/// left change nothing and say so; a skip of a parked one, a retry of a
/// failed one and a rewind each raise it by one; a rewind of a relay the
/// store does not have gives `None`.
async fn operator_changes_raise_the_generation_only_when_they_change_something(at: At) {
    let (rx, mut store) = crate::relay_store::with_effects(&at, 3).await;
    tokio::task::spawn_blocking(move || {
        let s = store.as_mut();
        let lease = Duration::from_secs(30);
        let now = SystemTime::now();
        let all = s.effects_after(0, 10).unwrap();
        assert_eq!(
            all.iter().map(|e| e.position).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        let row = s.open_relay("app", 0, Some("A"), now, lease).unwrap();
        let g = row.generation;
        let failed = ParkedEffect {
            status: ParkedStatus::Failed,
            attempts: 4,
            error: Some("HTTP 500".to_owned()),
            ..ParkedEffect::waiting(&all[1], t())
        };
        let save = RelaySave {
            park: vec![failed, ParkedEffect::waiting(&all[2], t())],
            unpark: Vec::new(),
            position: 3,
            ..RelaySave::default()
        };
        assert!(s.save_relay("app", g, "A", &save, now, lease).unwrap());
        assert_eq!(generation(s, "app"), g, "a save raised the generation");

        assert!(
            !s.skip("app", 1, now).unwrap(),
            "skipped a position not parked"
        );
        assert_eq!(
            generation(s, "app"),
            g,
            "a skip of nothing raised the generation"
        );
        assert_eq!(
            s.retry_failed("app", Some(3), now).unwrap(),
            0,
            "retried a waiting effect"
        );
        assert_eq!(
            generation(s, "app"),
            g,
            "a retry of nothing raised the generation"
        );

        assert_eq!(s.retry_failed("app", Some(2), now).unwrap(), 1);
        assert_eq!(
            generation(s, "app"),
            g + 1,
            "a retry did not raise the generation"
        );
        assert_eq!(
            s.retry_failed("app", None, now).unwrap(),
            0,
            "nothing failed is left"
        );
        assert_eq!(
            generation(s, "app"),
            g + 1,
            "a retry of nothing raised the generation"
        );

        assert!(
            s.skip("app", 3, now).unwrap(),
            "the parked position 3 was not skipped"
        );
        assert_eq!(
            generation(s, "app"),
            g + 2,
            "a skip did not raise the generation"
        );
        assert!(
            !s.skip("app", 3, now).unwrap(),
            "position 3 was skipped twice"
        );
        assert_eq!(
            generation(s, "app"),
            g + 2,
            "a second skip raised the generation"
        );
        assert_eq!(
            s.parked("app")
                .unwrap()
                .iter()
                .map(|p| (p.effect.position, p.status))
                .collect::<Vec<_>>(),
            [(2, ParkedStatus::Retrying)]
        );

        assert!(
            s.rewind("nobody", 1, now).unwrap().is_none(),
            "rewound a relay the store does not have"
        );
        let rewound = s
            .rewind("app", 2, now)
            .unwrap()
            .expect("relay app not rewound");
        assert_eq!((rewound.position, rewound.generation), (2, g + 3));
    })
    .await
    .unwrap();
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_operator_changes_raise_the_generation_only_when_they_change_something() {
    operator_changes_raise_the_generation_only_when_they_change_something(At::sqlite(
        "relay-operator-generation",
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_operator_changes_raise_the_generation_only_when_they_change_something() {
    let Some(at) = At::postgres("relay_operator_generation") else {
        return;
    };
    operator_changes_raise_the_generation_only_when_they_change_something(at.clone()).await;
    at.done();
}
