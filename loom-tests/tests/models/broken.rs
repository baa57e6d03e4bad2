//! The broken-registry suite (`--cfg snapshot_receiver_loom_broken`): the
//! registry's first insert becomes a check-then-insert (see
//! `ConcurrentMap::upsert_with` in the core crate's `core/src/sync.rs`).
//!
//! Every model whose correctness rests on the registry's atomic first insert
//! must now fail in some interleaving, and loom has to find it: the models in
//! which two shards claim one event identity at once (1b, 2b, 2c, 3, 9). The
//! models in which every claim of an identity is made by one shard (1a, 2a,
//! 2d, 4, 5, 6, 7) are serialised by that shard, so they still hold; they run
//! here too, to show which guarantee comes from routing and which from the
//! registry.
#![cfg(snapshot_receiver_loom_broken)]

/// Two actors, one event: with a racy registry both apply it.
#[test]
#[should_panic(expected = "exactly one delivery of e-201 applied")]
fn duplicate_two_actors_fails_with_racy_registry() {
    super::duplicate::two_actors();
}

/// A variant naming another object: with a racy registry both deliveries
/// become first records (the second overwriting the first) and nothing is
/// paused.
#[test]
#[should_panic(expected = "exactly one delivery of e-300 is the first record")]
fn variant_other_object_fails_with_racy_registry() {
    super::variant::other_object();
}

/// Two copies of one variant on two actors: with a racy registry both record
/// the variant, so both are conflicts and the object's variant is held twice.
#[test]
#[should_panic(expected = "exactly one copy of the e-202 variant is the conflict")]
fn variant_resent_two_actors_fails_with_racy_registry() {
    super::variant::resent_two_actors();
}

/// Both copies of a variant routed to card-7's shard: one at a time, so even
/// a racy registry answers the second copy.
#[test]
fn variant_resent_routed_holds_with_racy_registry() {
    super::variant::resent_routed();
}

/// The pause race: with a racy registry the variant goes unnoticed and no
/// object is paused.
#[test]
#[should_panic(expected = "exactly one delivery of e-300 is the first record")]
fn variant_pause_race_fails_with_racy_registry() {
    super::pause_race::model();
}

/// Same-object duplicates go to one shard, which takes them one at a time:
/// even a racy registry answers the second one correctly.
#[test]
fn duplicate_routed_holds_with_racy_registry() {
    super::duplicate::routed();
}

/// Same for an event and its variant naming the same object.
#[test]
fn variant_same_object_holds_with_racy_registry() {
    super::variant::same_object();
}

/// Two events for one object: one shard, and distinct identities.
#[test]
fn versions_7_and_8_hold_with_racy_registry() {
    super::versions::model();
}

/// The purge and the redelivery race on one identity, but only the
/// redelivery inserts; a purge between its check and its insert changes
/// nothing the version check does not already cover.
#[test]
fn purge_vs_redelivery_holds_with_racy_registry() {
    super::purge::model();
}

/// Reconciliation and both deliveries run on card-7's shard.
#[test]
fn reconcile_vs_held_delivery_holds_with_racy_registry() {
    super::reconcile::model();
}

/// The pipelined commit failure: one shard's driver makes every claim, and
/// the rollback removes its own records.
#[test]
fn pipelined_commit_failure_holds_with_racy_registry() {
    super::pipeline::model(super::pipeline::Answering::AfterCommit);
}

/// The evicted identity's duplicate and a delivery of it on another shard:
/// two shards claim e-2 at once, and a claim checks the eviction stamp on
/// its copy of the slot, outside the lock the eviction takes, so a racy
/// registry lets a second first record in.
#[test]
#[should_panic(expected = "one first record per event identity")]
fn evicted_duplicate_fails_with_racy_registry() {
    super::identities::model(super::identities::Rules::Shipped);
}
