//! Authorities equal to the object and forced authorities (issue 13, items 5
//! and 6; docs/CONTRACT.md §4).

use crate::common::{body, receiver, t, T};
use crate::store::temp_db;
use crate::variants::{briefs, replay_json};
use snapshot_receiver::{
    core::{ReevaluationOutcome, ReplacementCounts},
    AuditEntry, AuthoritativeSnapshot, Cause, Clock, ConflictKind, Decision, ManualClock, Receiver,
    ReconcileError, Verdict,
};
use std::sync::Arc;

const CHART: &str = r#"{"stage":"ready","label":"Chart"}"#;

fn count(path: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn an_authority_equal_to_the_object_replaces_nothing_run_after_run() {
    let path = temp_db("equal-authority");
    let store = format!("sqlite:{}", path.display());
    let memory = replay_json(&["replay", "fixtures/equal-authority.json", "--history"]);
    for run in [1, 2] {
        let lines = replay_json(&[
            "replay",
            "fixtures/equal-authority.json",
            "--history",
            "--store",
            &store,
        ]);
        assert_eq!(
            briefs(&lines),
            [
                "- card-8 authority v3 paused=false repl=false -",
                "- card-8 authority v3 paused=false repl=false -",
            ],
            "run {run}"
        );
        let last = lines.last().unwrap();
        assert_eq!(
            last["replacements"],
            serde_json::json!({"event": 0, "authority": 0})
        );
        assert_eq!(last["history"], serde_json::json!({}));
        assert_eq!(briefs(&lines), briefs(&memory));
    }
    // Nothing replaced: the object keeps its own text of the state, not the
    // first authority's (other key order).
    let out = crate::common::cli()
        .args([
            "replay",
            "fixtures/equal-authority.json",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let kept = r#""version":3,"state":{"stage":"ready","label":"Chart"},"paused":false"#;
    let reconcile = |l: &&str| l.contains(r#""phase":"reconcile""#);
    assert_eq!(
        text.lines()
            .filter(reconcile)
            .filter(|l| l.contains(kept))
            .count(),
        2
    );
    // Four authority steps audited, none a replacement, no effect written.
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM audit WHERE kind = 'authority' AND replacement = 0"
        ),
        4
    );
    assert_eq!(
        count(&path, "SELECT count(*) FROM audit WHERE replacement = 1"),
        0
    );
    assert_eq!(count(&path, "SELECT count(*) FROM replacements"), 0);
}

#[tokio::test]
async fn an_equal_authority_still_clears_the_pause_and_decides_held_events() {
    let rx = receiver();
    let first = body("e-1", "card-8", Some("3"), T, CHART);
    let variant = body("e-1", "card-8", Some("3"), T, r#"{"stage":"x"}"#);
    let next = body(
        "e-2",
        "card-8",
        Some("4"),
        T,
        r#"{"stage":"review","label":"Chart"}"#,
    );
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Equal)
    );
    assert_eq!(
        rx.deliver(variant.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert_eq!(
        rx.deliver(next.as_bytes()).await.decision(),
        Some(Decision::Held(snapshot_receiver::HoldReason::Paused))
    );
    // The resync: same version, same state (other key order).
    let resync =
        AuthoritativeSnapshot::new("card-8", 3, r#"{"label":"Chart","stage":"ready"}"#, t())
            .unwrap();
    let report = rx.reconcile(resync).await.unwrap();
    assert_eq!(
        (
            report.replacement,
            report.previous_version,
            report.forced.is_none()
        ),
        (false, Some(3), true)
    );
    let outcomes: Vec<ReevaluationOutcome> = report.reevaluated.iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            ReevaluationOutcome::Unresolved(Verdict::Conflict(ConflictKind::EventVariant)),
            ReevaluationOutcome::Decided(Verdict::Applied, true),
        ]
    );
    let card = rx.object("card-8").await.unwrap();
    assert_eq!(
        (card.version, card.state.compact().as_str(), card.paused),
        (4, r#"{"stage":"review","label":"Chart"}"#, false)
    );
    assert_eq!(
        rx.counters().await,
        ReplacementCounts {
            event_replacements: 1,
            authority_replacements: 0
        }
    );
    // One effect: e-2's. The authority made none.
    let history: Vec<(u64, Cause)> = rx
        .history("card-8")
        .await
        .into_iter()
        .map(|r| (r.version, r.cause))
        .collect();
    assert_eq!(history, [(4, Cause::Event("e-2".into()))]);
    let metrics = rx.metrics();
    assert_eq!(
        (metrics["authority.applied"], metrics["authority.unchanged"]),
        (0, 1)
    );
    let audited = rx
        .audit_for_object("card-8")
        .await
        .into_iter()
        .find_map(|r| match r.entry {
            AuditEntry::Authority {
                replacement,
                ref forced,
                previous,
                ..
            } => Some((replacement, forced.is_none(), previous)),
            _ => None,
        });
    assert_eq!(audited, Some((false, true, Some(3))));
}

#[tokio::test]
async fn the_same_version_with_another_state_still_replaces() {
    let rx = receiver();
    let blocked = r#"{"stage":"blocked","label":"Chart"}"#;
    let report = rx
        .reconcile(AuthoritativeSnapshot::new("card-8", 3, blocked, t()).unwrap())
        .await
        .unwrap();
    assert!(report.replacement);
    assert_eq!(rx.object("card-8").await.unwrap().state.compact(), blocked);
    assert_eq!(rx.counters().await.authority_replacements, 1);
    assert_eq!(rx.history("card-8").await.len(), 1);
    assert_eq!(rx.metrics()["authority.applied"], 1);
}

/// card-7 at v5, deleted at v6, then re-created upstream at v1 and v2.
async fn recreated() -> Receiver {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("card-7", 5, r#"{"stage":"done","label":"Map"}"#)
        .build()
        .unwrap();
    let delete = r#"{"event_id":"e-706","object_id":"card-7","object_version":6,"occurred_at":"2024-01-01T08:00:00Z","type":"card.deleted","state":null}"#;
    assert_eq!(
        rx.deliver(delete.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    for (id, v) in [("e-711", "1"), ("e-712", "2")] {
        let b = body(
            id,
            "card-7",
            Some(v),
            T,
            r#"{"stage":"queued","label":"Map again"}"#,
        );
        assert_eq!(
            rx.deliver(b.as_bytes()).await.decision(),
            Some(Decision::Stale)
        );
    }
    rx
}

const REVIEW: &str = r#"{"stage":"review","label":"Map again"}"#;

#[tokio::test]
async fn a_forced_authority_replaces_a_tombstone_and_later_events_follow_it() {
    let rx = recreated().await;
    let authority = AuthoritativeSnapshot::new("card-7", 3, REVIEW, t()).unwrap();
    // Unforced: refused as before.
    assert_eq!(
        rx.reconcile(authority.clone()).await.unwrap_err(),
        ReconcileError::AuthorityOlder {
            object_id: "card-7".into(),
            offered: 3,
            current: 6
        }
    );
    assert!(rx.object("card-7").await.unwrap().deleted());
    // Forced: replaces the tombstone, and says what it replaced.
    let report = rx.reconcile(authority.forced(true)).await.unwrap();
    let over = report.forced.expect("recorded as forced");
    assert_eq!(
        (
            over.version,
            over.state.compact().as_str(),
            report.previous_version
        ),
        (6, "null", Some(6))
    );
    assert!(report.replacement);
    let card = rx.object("card-7").await.unwrap();
    assert_eq!((card.version, card.state.compact().as_str()), (3, REVIEW));
    // Later events are decided against v3.
    let v4 = body(
        "e-714",
        "card-7",
        Some("4"),
        T,
        r#"{"stage":"done","label":"Map again"}"#,
    );
    assert_eq!(
        rx.deliver(v4.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let redelivered_v2 = body("e-713", "card-7", Some("2"), T, REVIEW);
    assert_eq!(
        rx.deliver(redelivered_v2.as_bytes()).await.decision(),
        Some(Decision::Stale)
    );
    // The history and the audit trail mark the override.
    let history: Vec<String> = rx
        .history("card-7")
        .await
        .into_iter()
        .map(|r| {
            let forced = r.forced.map_or_else(String::new, |o| {
                format!(" forced over v{} {}", o.version, o.state)
            });
            format!("v{} {}{forced}", r.version, r.state)
        })
        .collect();
    assert_eq!(
        history,
        [
            "v6 null".to_owned(),
            format!("v3 {REVIEW} forced over v6 null"),
            r#"v4 {"stage":"done","label":"Map again"}"#.to_owned(),
        ]
    );
    let authorities: Vec<String> = rx
        .audit_for_object("card-7")
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            AuditEntry::Authority {
                version, forced, ..
            } => Some(format!(
                "authority v{version} forced over {:?}",
                forced.map(|o| (o.version, o.state.compact()))
            )),
            AuditEntry::AuthorityRefused { version, current } => {
                Some(format!("refused v{version} below v{current}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        authorities,
        [
            "refused v3 below v6",
            "authority v3 forced over Some((6, \"null\"))"
        ]
    );
    assert_eq!(
        rx.counters().await,
        ReplacementCounts {
            event_replacements: 2,
            authority_replacements: 1
        }
    );
}

#[tokio::test]
async fn force_changes_nothing_for_an_authority_that_is_not_older() {
    let rx = receiver();
    let newer = AuthoritativeSnapshot::new("card-7", 11, r#"{"n":11}"#, t())
        .unwrap()
        .forced(true);
    let report = rx.reconcile(newer).await.unwrap();
    assert_eq!((report.replacement, report.forced.is_none()), (true, true));
    let equal = AuthoritativeSnapshot::new("card-7", 11, r#"{"n":11}"#, t())
        .unwrap()
        .forced(true);
    let report = rx.reconcile(equal).await.unwrap();
    assert_eq!((report.replacement, report.forced.is_none()), (false, true));
    assert_eq!(rx.counters().await.authority_replacements, 1);
}

#[test]
fn the_recreated_object_fixture_forces_its_authority_and_the_store_keeps_what_it_replaced() {
    let path = temp_db("recreated");
    let store = format!("sqlite:{}", path.display());
    let lines = replay_json(&[
        "replay",
        "fixtures/recreated-object.json",
        "--history",
        "--store",
        &store,
    ]);
    assert_eq!(
        briefs(&lines),
        [
            "e-706 card-7 applied v6 paused=false repl=true acknowledge",
            "e-711 card-7 stale v6 paused=false repl=false acknowledge",
            "e-712 card-7 stale v6 paused=false repl=false acknowledge",
            "- card-7 authority_refused (authority for `card-7` has version 3, older than the object's version 6; refused, the object is unchanged) v6 paused=false repl=false -",
            "- card-7 authority (forced over version 6) v3 paused=false repl=true -",
        ]
    );
    let last = lines.last().unwrap();
    assert_eq!(
        last["history"]["card-7"],
        serde_json::json!([
            {"seq": 1, "version": 6, "state": null, "cause": "e-706"},
            {"seq": 5, "version": 3, "state": {"stage": "review", "label": "Map again"},
             "cause": "authority", "forced_over": {"version": 6, "state": null}},
        ])
    );
    // The stored audit row of the forced authority keeps what it replaced.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let row: (String, Option<String>, String, i64, Vec<u8>) = conn
        .query_row(
            "SELECT version, decision, detail, replacement, body FROM audit WHERE kind = 'authority'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(
        row,
        (
            "00000000000000000003".to_owned(),
            Some("forced".to_owned()),
            "forced over version 6, state null; as of 2024-01-01T09:10:00Z".to_owned(),
            1,
            b"null".to_vec()
        )
    );
    // The next run decides v4 against the forced v3.
    let next = replay_json(&[
        "replay",
        "fixtures/recreated-object-next.json",
        "--store",
        &store,
    ]);
    assert_eq!(
        briefs(&next),
        ["e-714 card-7 applied v4 paused=false repl=true acknowledge"]
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM objects WHERE version = '00000000000000000004'"
        ),
        1
    );
}

#[test]
fn on_postgres_a_forced_authority_and_an_equal_one_commit_like_on_sqlite() {
    use crate::durability::{drop_schema, pg, pg_url};
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_fc2_forced_{}", std::process::id());
    drop_schema(&url, &schema);
    let store = ["--store", url.as_str(), "--store-schema", schema.as_str()];
    let lines = replay_json(&[&["replay", "fixtures/recreated-object.json"][..], &store].concat());
    assert_eq!(
        briefs(&lines)[3..],
        [
            "- card-7 authority_refused (authority for `card-7` has version 3, older than the object's version 6; refused, the object is unchanged) v6 paused=false repl=false -",
            "- card-7 authority (forced over version 6) v3 paused=false repl=true -",
        ]
    );
    let next = replay_json(
        &[
            &["replay", "fixtures/recreated-object-next.json"][..],
            &store,
        ]
        .concat(),
    );
    assert_eq!(
        briefs(&next),
        ["e-714 card-7 applied v4 paused=false repl=true acknowledge"]
    );
    // The same store, an authority equal to card-8: no replacement row.
    let equal = replay_json(&[&["replay", "fixtures/equal-authority.json"][..], &store].concat());
    assert_eq!(
        briefs(&equal),
        [
            "- card-8 authority v3 paused=false repl=false -",
            "- card-8 authority v3 paused=false repl=false -",
        ]
    );
    let sql = format!(
        "SELECT (SELECT version FROM {schema}.objects WHERE object_id = 'card-7'),
                (SELECT count(*) FROM {schema}.replacements WHERE object_id = 'card-8'),
                (SELECT count(*) FROM {schema}.audit WHERE kind = 'authority' AND decision = 'forced')"
    );
    let row: (String, i64, i64) = pg(&url, move |c| {
        let r = c.query_one(&sql, &[]).unwrap();
        (r.get(0), r.get(1), r.get(2))
    });
    assert_eq!(row, ("00000000000000000004".to_owned(), 0, 1));
    drop_schema(&url, &schema);
}
