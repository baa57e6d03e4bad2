//! The invariants checked after every run:
//! - the run settled: every published message was acknowledged (or
//!   terminated) before the deadline, once the faults stopped;
//! - every message acknowledged to the broker is in the store: its event
//!   identity's receipt, or a variant, carries its fingerprint, and the
//!   decision of that very delivery was answered after its commit;
//! - no event replaced an object's state twice, and no replacement went to
//!   a version at or below the one before it (in commit order);
//! - when every delivery reached its worker in order (no delivery lost,
//!   delayed or overtaken in the run), the same holds in publish order:
//!   the consumer's in-order rules (owed messages, the take-over gate)
//!   keep each partition's decisions in stream order across crashes,
//!   pauses, lost leases and failed commits;
//! - the first committed decision of every delivery, every object's
//!   version, state, pause flag and held events, and the replacement count
//!   the store holds are exactly what the load test's check and its
//!   sequential model give ([`snapshot_receiver_loadgen::check`], one
//!   producer: each object's deliveries travel through one partition and
//!   are decided in stream order). The objects are read back through the
//!   core's `resume`, as a restarted receiver would read them;
//! - the outbox and its relays (docs/CONTRACT.md §10): the store's
//!   positions are 1, 2, 3, ... in commit order and, per object, rise with
//!   versions; every relay passed the last position with nothing parked,
//!   and its destination accepted every effect the store holds at least
//!   once (but those an operator skipped; a coalesced send counts for the
//!   effects it names), accepted nothing the store does not hold (the same
//!   id, object, version, state and position), got every re-send of an
//!   effect with the id of its first send, and accepted each object's
//!   effects for the first time in version order (but a skipped one that a
//!   rewind sent again); and, checked as the relays' writes reach the
//!   store (`world::relay`): a running relay's lease never lapses under it,
//!   a take-over raises the generation, and an effect parked after a
//!   refusal counts one attempt more than the refusals saved since its
//!   schedule (re)started.

use crate::world::World;
use crate::Fault;
use snapshot_receiver_core::engine::{resume, Context, Shard};
use snapshot_receiver_core::store::Store;
use snapshot_receiver_core::ManualClock;
use snapshot_receiver_core::ReplacementCounts;
use snapshot_receiver_loadgen::{check as model_check, Code, RunOutcome, Stream};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// `not sent`: a delivery with no committed answer (the check names it).
const NOT_ANSWERED: Code = 0;

/// The codes of `duplicate` answers start here (a duplicate's code is its
/// original's [`snapshot_receiver_loadgen::verdict_code`] plus this).
const DUPLICATE: Code = 32;

/// The invariants of a finished run; the failures, in words (empty: held).
pub fn check(world: &mut World<'_>, settled: bool) -> Vec<String> {
    let mut failures: Vec<String> = world.record.problems.clone();
    if !settled {
        let left: Vec<String> = world
            .partitions
            .iter()
            .enumerate()
            .flat_map(|(p, part)| {
                (1..=part.log.len() as u64)
                    .filter(|s| !part.acked.contains(s) && !part.terminated.contains(s))
                    .map(move |s| format!("p{p}/{s}"))
            })
            .take(10)
            .collect();
        if left.is_empty() && world.published == world.stream.len() {
            failures.push(format!(
                "not settled by {:?}: every message acknowledged, the relays not drained",
                world.cfg.deadline
            ));
        } else {
            failures.push(format!(
                "not settled by {:?}: {} of {} published, unacknowledged: {}",
                world.cfg.deadline,
                world.published,
                world.stream.len(),
                left.join(" ")
            ));
        }
    }
    // Acknowledged => recorded.
    for (i, &(p, seq)) in world.placed.iter().enumerate() {
        if seq == 0 || !world.partitions[p as usize].acked.contains(&seq) {
            continue;
        }
        let body = world.stream.body(i);
        let event = serde_event_id(body);
        let fp = world.stream_fingerprint(i);
        let recorded = match (&event, fp) {
            (Some(e), Some(fp)) => {
                world
                    .store
                    .get()
                    .receipt(e)
                    .is_some_and(|r| r.fingerprint == fp)
                    || world.store.get().has_variant(e, fp)
            }
            _ => false,
        };
        if !recorded {
            failures.push(format!(
                "delivery {i} (p{p}/{seq}, event {}) was acknowledged but its decision is not in the store",
                event.as_deref().unwrap_or("?")
            ));
        } else if world.record.codes[i].is_none() {
            failures.push(format!(
                "delivery {i} (p{p}/{seq}, event {}) was acknowledged but its decision was never answered after a commit",
                event.as_deref().unwrap_or("?")
            ));
        }
    }
    failures.extend(check_relays(world));
    // No event applied twice; no replacement from a stale version.
    let mut applied: BTreeMap<&str, usize> = BTreeMap::new();
    let mut top: BTreeMap<&str, u64> = BTreeMap::new();
    let mut event_replacements = 0;
    for r in world.store.get().replacements() {
        if let Some(e) = &r.cause_event {
            event_replacements += 1;
            let n = applied.entry(e).or_default();
            *n += 1;
            if *n == 2 {
                failures.push(format!(
                    "event {e} replaced the state of {} twice",
                    r.object_id
                ));
            }
        }
        let before = top.insert(&r.object_id, r.version);
        if before.is_some_and(|v| v >= r.version) {
            failures.push(format!(
                "{}: a replacement to version {} after version {}",
                r.object_id,
                r.version,
                before.unwrap_or(0)
            ));
        }
    }
    // The end state, read back as a restarted receiver reads it.
    let stream = world.stream;
    let ctx = Context::new(
        stream.config(world.cfg.shards),
        Arc::new(ManualClock::new(Stream::clock().now())),
    );
    let mut shards: Vec<Shard> = (0..world.cfg.shards).map(|_| Shard::new()).collect();
    let loaded = world.store.get().load(UNIX_EPOCH);
    let objects = match loaded.and_then(|l| resume(&ctx, &mut shards, l)) {
        Ok(()) => shards.iter().flat_map(Shard::objects).collect(),
        Err(e) => {
            failures.push(format!("the store does not load: {e}"));
            Vec::new()
        }
    };
    // A committed variant's pauses, as a restarted receiver reads the store.
    let resumed: BTreeMap<&str, bool> = objects.iter().map(|o| (&*o.object_id, o.paused)).collect();
    for o in world.record.running(|o| resumed.get(o).copied()) {
        if let Some((event, at)) = world.record.paused_by.get(&o) {
            failures.push(format!(
                "{o} is running in the store at the end, but the variant of {event} committed in the store's transaction {at} paused it"
            ));
        }
    }
    // In the order the deliveries were first decided (what the sequential
    // model must be given: arrival order, not publish order), those never
    // answered last.
    let mut placed = world.record.order.clone();
    placed.sort();
    let mut order: Vec<usize> = placed.into_iter().map(|(_, i)| i).collect();
    order.extend((0..stream.len()).filter(|i| world.record.codes[*i].is_none()));
    let codes: Vec<Code> = order
        .iter()
        .map(|&i| world.record.codes[i].unwrap_or(NOT_ANSWERED))
        .collect();
    let Some(decided) = stream.reordered(&order) else {
        failures.push("the answers are not one per delivery".to_owned());
        return failures;
    };
    let run = RunOutcome::decided(
        codes,
        1,
        objects,
        ReplacementCounts {
            event_replacements,
            authority_replacements: 0,
        },
    );
    // The consumer also keeps each partition's decisions in publish order
    // where it can: reported, not required (a delivery lost or overtaken on
    // its way to the worker is decided after newer ones). That order is each
    // object's: a batch's deliveries for objects of different shards are
    // decided side by side, and partitions are not ordered against each
    // other, which a variant naming another object than its original makes
    // visible. So the order judged is the decided one with each object's
    // first decisions put back in publish order (a duplicate, which changes
    // nothing, stays where it was answered).
    let named: Vec<Option<String>> = (0..stream.len())
        .map(|i| named_object(stream.body(i)))
        .collect();
    let mut object_order = order.clone();
    let mut by_object: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (k, &i) in order.iter().enumerate() {
        if world.record.codes[i].is_none_or(|c| c >= DUPLICATE) {
            continue;
        }
        by_object
            .entry(named[i].as_deref().unwrap_or(""))
            .or_default()
            .push(k);
    }
    for slots in by_object.into_values() {
        let mut published: Vec<usize> = slots.iter().map(|&k| order[k]).collect();
        published.sort_unstable();
        for (k, i) in slots.into_iter().zip(published) {
            object_order[k] = i;
        }
    }
    let Some(in_object_order) = stream.reordered(&object_order) else {
        failures.push("the deliveries are not one per object".to_owned());
        return failures;
    };
    let published = RunOutcome::decided(
        object_order
            .iter()
            .map(|&i| world.record.codes[i].unwrap_or(NOT_ANSWERED))
            .collect(),
        1,
        run.objects.clone(),
        run.counters,
    );
    world.publish_order = model_check(&in_object_order, stream.expectation(), &published).failures;
    // ... and must keep it when every delivery reached its worker in order.
    let in_order = [
        Fault::DeliveryDrop,
        Fault::DeliveryDelay,
        Fault::DeliveryReorder,
    ]
    .iter()
    .all(|f| !world.faults.contains_key(f));
    if in_order {
        failures.extend(
            world
                .publish_order
                .iter()
                .map(|f| format!("publish order (every delivery arrived in order): {f}")),
        );
    }
    let report = model_check(&decided, stream.expectation(), &run);
    failures.extend(report.failures);
    if report.failed as usize > 20 {
        failures.push(format!("... {} checks failed in all", report.failed));
    }
    failures
}

/// The outbox's and the relays' invariants.
fn check_relays(world: &World<'_>) -> Vec<String> {
    let mut failures = Vec::new();
    let store = world.store.get();
    let positions = store.positions();
    let last = positions.last().copied().unwrap_or(0);
    if let Some((i, p)) = positions
        .iter()
        .enumerate()
        .find(|(i, p)| **p != *i as u64 + 1)
    {
        failures.push(format!(
            "outbox: the effect committed {} has position {p} (positions must be 1, 2, 3, ... in commit order)",
            i + 1
        ));
    }
    // Per object, positions follow versions; each effect by id and by
    // (object, version).
    let mut top: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut by_id = BTreeMap::new();
    for (row, &position) in store.replacements().iter().zip(positions) {
        if let Some((p, v)) = top.insert(&row.object_id, (position, row.version)) {
            if v >= row.version {
                failures.push(format!(
                    "outbox: {} version {} at position {position}, after version {v} at position {p}",
                    row.object_id, row.version
                ));
            }
        }
        by_id.insert(
            snapshot_receiver_core::EffectId::from(row.key),
            (row, position),
        );
    }
    for (slot, dest) in world.relays.slots.iter().zip(&world.relays.destinations) {
        let name = &slot.name;
        match store.relay(name) {
            Some(row) if row.position >= last && store.parked_count(name) == 0 => {}
            Some(row) => failures.push(format!(
                "relay {name}: not drained by the end: cursor {} of {last}, {} parked",
                row.position,
                store.parked_count(name)
            )),
            None => failures.push(format!("relay {name}: never opened its row")),
        }
        let missing: Vec<String> = store
            .replacements()
            .iter()
            .zip(positions)
            .filter(|(row, _)| {
                let id = row.key.into();
                !dest.accepted.contains_key(&id) && !dest.skipped.contains_key(&id)
            })
            .map(|(row, p)| format!("{}@{} at {p}", row.object_id, row.version))
            .collect();
        if !missing.is_empty() {
            failures.push(format!(
                "relay {name}: {} of the {} effects the store holds never reached its destination: {}",
                missing.len(),
                by_id.len(),
                missing[..missing.len().min(5)].join(", ")
            ));
        }
        let mut first_version: BTreeMap<&str, u64> = BTreeMap::new();
        let mut first_sent: BTreeMap<(&str, u64), snapshot_receiver_core::EffectId> =
            BTreeMap::new();
        for got in &dest.received {
            let e = &got.effect;
            let first = *first_sent.entry((&e.object_id, e.version)).or_insert(e.id);
            if first != e.id {
                failures.push(format!(
                    "relay {name}: {}@{} re-sent as the effect of step {}, first sent as that of step {}",
                    e.object_id, e.version, e.id.seq, first.seq
                ));
            }
            let held = by_id.get(&e.id).is_some_and(|(row, _)| {
                row.object_id == e.object_id
                    && row.version == e.version
                    && row.state == e.state.as_str()
            });
            if got.accepted && !held {
                failures.push(format!(
                    "relay {name}: its destination accepted {}@{} (step {}, sent at position {}), which the store does not hold",
                    e.object_id, e.version, e.id.seq, e.position
                ));
            }
            // An effect an operator skipped goes again only when a rewind
            // reads it again, after its object's later ones: out of order
            // by the operator's hand.
            if got.first && !dest.skipped.contains_key(&e.id) {
                if let Some(v) = first_version.insert(&e.object_id, e.version) {
                    if v >= e.version {
                        failures.push(format!(
                            "relay {name}: {} version {} first accepted after version {v}",
                            e.object_id, e.version
                        ));
                    }
                }
            }
        }
    }
    // The rules checked as the relays' writes reached the store: a running
    // relay's lease never lapses under it, a take-over raises the
    // generation, an operator's retry restarts an effect's schedule.
    failures.extend(world.relays.violations.iter().cloned());
    failures
}

/// The `object_id` a generated body names.
fn named_object(body: &[u8]) -> Option<String> {
    snapshot_receiver_core::BodyParser::default()
        .parse(body)
        .ok()?
        .object_id()
        .map(str::to_owned)
}

/// The `event_id` of a generated body.
fn serde_event_id(body: &[u8]) -> Option<String> {
    snapshot_receiver_core::BodyParser::default()
        .parse(body)
        .ok()?
        .event_id()
        .map(str::to_owned)
}
