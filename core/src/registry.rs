//! The shared event-identity registry: the first record of every event
//! identity, with its semantic fingerprint and its decision, and the variants
//! recorded for it (docs/CONTRACT.md §3.1, §5).

// unsafe: an identity key is one heap block holding its length header and
// both ids, laid out and freed by hand (half the memory of two `Arc<str>`
// per identity, docs/BENCHMARKS.md); the unsafe code stays in that module.
mod filter;
#[allow(unsafe_code)]
mod key;

use crate::decision::{ConflictKind, Verdict};
use crate::sync::{AtomicU64, ConcurrentMap, Ordering};
pub use filter::{FilterStats, IdentityFilter};
use key::IdentityKey;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The default retention window for event identities: 24 hours (docs/CONTRACT.md §5).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The first record of one event identity. Never overwritten while it is
/// within the retention window.
///
/// Built on demand by [`Registry::get`]: the registry itself keeps each
/// record packed in one heap block (see `registry/key.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRecord {
    /// Semantic fingerprint of the first delivery's six envelope fields.
    pub fingerprint: u128,
    /// The object the first delivery named (a fresh copy of the stored id).
    pub object_id: Arc<str>,
    /// The decision the first delivery got; duplicates report it back.
    pub decision: Verdict,
    /// When the first delivery was recorded, on the receiver's clock, to the
    /// nanosecond (times before 1970 read back as the Unix epoch).
    pub first_seen: SystemTime,
}

/// `at` in nanoseconds since the Unix epoch: times before 1970 are clamped to
/// it; u64 nanoseconds reach the year 2554 and saturate beyond.
fn to_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The decision stored beside `key` as its [`Verdict::to_byte`] code.
fn verdict(code: u8) -> Verdict {
    // Only `Verdict::to_byte` codes are ever stored (see `claim`, `restore`).
    Verdict::from_byte(code).expect("the registry stores only Verdict::to_byte codes")
}

/// The public record for a stored key and its decision code.
fn record(key: &IdentityKey, code: u8) -> IdentityRecord {
    IdentityRecord {
        fingerprint: key.fingerprint(),
        object_id: Arc::from(key.object_id()),
        decision: verdict(code),
        first_seen: UNIX_EPOCH + Duration::from_nanos(key.first_seen_nanos()),
    }
}

/// The outcome of [`Registry::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No record existed (or it had expired): this delivery is now the first
    /// record, with the verdict `decide` returned.
    First(Verdict),
    /// A record with the same fingerprint exists: a duplicate of this
    /// verdict. For a variant already recorded (see
    /// [`Registry::record_variant`]) the verdict is
    /// `Verdict::Conflict(ConflictKind::EventVariant)`, which no first record
    /// ever has.
    Same(Verdict),
    /// A record with a different fingerprint exists and no variant with this
    /// fingerprint is recorded: this delivery is a new variant; the first
    /// record (untouched) names `first_object`. Nothing is recorded yet: the
    /// caller records the variant with [`Registry::record_variant`] once it
    /// knows it can hold it.
    Variant {
        /// The object named by the first record (a fresh copy of the stored
        /// id, allocated only for a variant).
        first_object: Arc<str>,
        /// The first record's semantic fingerprint: the store must hold
        /// exactly that first record when the variant commits
        /// ([`crate::write::Write::PauseIfStored`]).
        first_fingerprint: u128,
    },
    /// `decide` declined to record anything (for example a full held queue):
    /// the registry is unchanged.
    NotRecorded,
    /// Only from [`Registry::claim_checked`]: no record is in memory, but an
    /// identity of the same stripe was evicted since the caller's stamp
    /// ([`Registry::stamp`]), so the store may hold this one's record.
    /// Nothing was recorded and `decide` did not run: read the store again
    /// and claim again.
    Evicted,
}

/// How many eviction stamps the registry keeps: an eviction bumps the stamp
/// of its identity's stripe, and a claim checked against a stamp
/// ([`Registry::claim_checked`]) asks for a new read only when its stripe's
/// stamp moved. 16,384 stripes are 128 KiB; loom models use 4.
#[cfg(not(snapshot_receiver_loom))]
const STAMP_STRIPES: usize = 16_384;
#[cfg(snapshot_receiver_loom)]
const STAMP_STRIPES: usize = 4;

/// Shared registry of event identities; `Send + Sync`, shared by every actor.
///
/// Under the normal build it is a sharded [`dashmap`] map; under
/// `--cfg snapshot_receiver_loom` a loom mutex around a `HashMap` with the same
/// contract (see `sync.rs`).
pub struct Registry {
    /// Event identity → the first record's decision, as a
    /// [`Verdict::to_byte`] code. The key is an 8-byte pointer to one block
    /// holding the rest of the record (fingerprint, first-seen time, event
    /// and object ids), so a table slot is 9 bytes: at 1 M identities the
    /// table is half empty and each slot byte costs about two.
    records: ConcurrentMap<IdentityKey, u8>,
    /// Event identity → the variants recorded for it: each fingerprint other
    /// than the first record's that was decided (a `conflict` /
    /// `event_variant`), with when it was recorded (nanoseconds since the
    /// Unix epoch), oldest first. Variants are rare, so they live in this
    /// side map and an identity without one costs nothing more than its
    /// 9-byte slot in `records`.
    variants: ConcurrentMap<Box<str>, Vec<(u128, u64)>>,
    /// How many event identities have an entry in `variants`; never zero
    /// while one exists (it is raised before an entry is inserted, under
    /// that entry's lock). A new first record reads it to skip the look-up
    /// of variants to forget, so an identity without variants (nearly all)
    /// costs one atomic load there, not a lock of the variants map.
    variant_identities: AtomicU64,
    /// How long a record is trusted; after that it counts as absent.
    retention: Duration,
    /// Eviction stamps by stripe of event identity ([`STAMP_STRIPES`]):
    /// [`Registry::evict`] bumps its identity's stripe under that
    /// identity's lock, so a claim that misses under the same lock sees
    /// either the record or the bump.
    stamps: Box<[AtomicU64]>,
    /// The identities the store may hold that memory does not, when the
    /// receiver bounds its registry ([`Registry::track_stored`]).
    filter: OnceLock<Arc<IdentityFilter>>,
    /// The identity model's must-fail control (`controls.rs`): an evicted
    /// identity enters the filter only after it left memory.
    pub(crate) filter_late: crate::sync::Switch,
}

impl Registry {
    /// An empty registry that trusts records for `retention`.
    pub fn new(retention: Duration) -> Self {
        Self::with_capacity(retention, 0)
    }

    /// An empty registry that trusts records for `retention` and has room
    /// for `capacity` identities before its table grows (see
    /// [`crate::Config::identity_capacity`] for why that matters).
    pub fn with_capacity(retention: Duration, capacity: usize) -> Self {
        Self {
            records: ConcurrentMap::with_capacity(capacity),
            variants: ConcurrentMap::with_capacity(0),
            variant_identities: AtomicU64::new(0),
            retention,
            stamps: (0..STAMP_STRIPES).map(|_| AtomicU64::new(0)).collect(),
            filter: OnceLock::new(),
            filter_late: crate::sync::Switch::default(),
        }
    }

    /// The stripe of `event_id`'s eviction stamp.
    fn stripe(&self, event_id: &str) -> &AtomicU64 {
        let hash = xxhash_rust::xxh3::xxh3_64(event_id.as_bytes());
        &self.stamps[(hash % STAMP_STRIPES as u64) as usize]
    }

    /// The eviction stamp of `event_id`'s stripe: take it before looking
    /// for the identity in memory and in the store, and claim with
    /// [`Registry::claim_checked`], which tells whether an eviction since
    /// could have hidden a record from both looks.
    pub fn stamp(&self, event_id: &str) -> u64 {
        self.stripe(event_id).load(Ordering::SeqCst)
    }

    /// The retention window.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// Whether `key`'s record is at least `retention` old at `now`
    /// (nanoseconds since the Unix epoch).
    fn expired(&self, key: &IdentityKey, now: u64) -> bool {
        self.too_old(key.first_seen_nanos(), now)
    }

    /// Whether a record made at `first_seen` is at least `retention` old at
    /// `now` (both nanoseconds since the Unix epoch).
    fn too_old(&self, first_seen: u64, now: u64) -> bool {
        now.checked_sub(first_seen)
            .is_some_and(|age| Duration::from_nanos(age) >= self.retention)
    }

    /// The answer for a delivery with `fingerprint` when `first` (decision
    /// `code`) is the live first record: a duplicate of it, or a variant,
    /// which [`Registry::claim`] then looks up among the recorded variants.
    fn compare(first: &IdentityKey, code: u8, fingerprint: u128) -> Claim {
        if first.fingerprint() == fingerprint {
            Claim::Same(verdict(code))
        } else {
            Claim::Variant {
                first_object: Arc::from(first.object_id()),
                first_fingerprint: first.fingerprint(),
            }
        }
    }

    /// Whether a variant of `event_id` with `fingerprint` was recorded
    /// within retention at `now` (nanoseconds since the Unix epoch).
    fn known_variant(&self, event_id: &str, fingerprint: u128, now: u64) -> bool {
        self.variants
            .view(event_id, |_, list| {
                list.iter()
                    .any(|&(fp, seen)| fp == fingerprint && !self.too_old(seen, now))
            })
            .unwrap_or(false)
    }

    /// A variant answer becomes a duplicate of the recorded variant when
    /// this fingerprint was already recorded as one.
    fn or_known_variant(&self, claim: Claim, event_id: &str, fingerprint: u128, now: u64) -> Claim {
        match claim {
            Claim::Variant { .. } if self.known_variant(event_id, fingerprint, now) => {
                Claim::Same(Verdict::Conflict(ConflictKind::EventVariant))
            }
            other => other,
        }
    }

    /// The identity check of docs/CONTRACT.md §3.1, atomic per event identity.
    ///
    /// If no record within retention exists, `decide` runs **while this
    /// identity is locked** (so it must be short and must not touch the
    /// registry); the verdict it returns becomes the first record, replacing
    /// an expired one (whose variants are forgotten with it), or `None`
    /// leaves the registry unchanged. Two racing
    /// first deliveries therefore cannot both become the first record.
    ///
    /// A delivery whose fingerprint differs from the live first record's is
    /// looked up among the variants recorded for the identity: a known one is
    /// [`Claim::Same`] with `conflict (event_variant)`, an unknown one
    /// [`Claim::Variant`] (recorded only by [`Registry::record_variant`]).
    ///
    /// A live record is first looked for under a shared lock, so a duplicate
    /// allocates nothing and takes no exclusive lock; a variant allocates only
    /// its `first_object`. Only a miss builds the new record (one allocation
    /// of `32 + event_id.len() + object_id.len()` bytes) and takes the
    /// identity's exclusive lock.
    ///
    /// # Panics
    /// If `event_id` or `object_id` is 4 GiB or longer (`Limits` refuses such
    /// ids long before).
    pub fn claim(
        &self,
        event_id: &str,
        fingerprint: u128,
        object_id: &Arc<str>,
        now: SystemTime,
        decide: impl FnOnce() -> Option<Verdict>,
    ) -> Claim {
        self.claim_checked(event_id, fingerprint, object_id, now, None, decide)
    }

    /// [`Registry::claim`] for a receiver whose registry holds only some
    /// identities (docs/CONTRACT.md §9), the others being in the store:
    /// `stamp` is [`Registry::stamp`] of `event_id`, taken before the caller
    /// looked for the identity in memory and read it from the store (and
    /// put what the store held back with [`Registry::admit`]). When no
    /// record is in memory and the stripe's stamp is no longer `stamp`, an
    /// eviction may have removed the record between those looks and this
    /// claim: the answer is [`Claim::Evicted`], nothing is recorded and
    /// `decide` does not run. `None` is [`Registry::claim`].
    ///
    /// # Panics
    /// As [`Registry::claim`].
    pub fn claim_checked(
        &self,
        event_id: &str,
        fingerprint: u128,
        object_id: &Arc<str>,
        now: SystemTime,
        stamp: Option<u64>,
        decide: impl FnOnce() -> Option<Verdict>,
    ) -> Claim {
        let now = to_nanos(now);
        let known = self.records.view(event_id, |first, &code| {
            (!self.expired(first, now)).then(|| Self::compare(first, code, fingerprint))
        });
        if let Some(Some(claim)) = known {
            return self.or_known_variant(claim, event_id, fingerprint, now);
        }
        // Absent or expired under the shared lock: decide under the exclusive
        // one, where a racing first delivery may have got in meanwhile.
        let candidate = IdentityKey::new(event_id, object_id, fingerprint, now);
        let claim = self
            .records
            .upsert_with(candidate, |current| match current {
                Some((first, &code)) if !self.expired(first, now) => {
                    (None, Self::compare(first, code, fingerprint))
                }
                None if stamp.is_some_and(|s| s != self.stamp(event_id)) => (None, Claim::Evicted),
                _ => match decide() {
                    Some(decision) => {
                        self.forget_variants(event_id);
                        (Some(decision.to_byte()), Claim::First(decision))
                    }
                    None => (None, Claim::NotRecorded),
                },
            });
        self.or_known_variant(claim, event_id, fingerprint, now)
    }

    /// Forgets the variants recorded for `event_id` when it gets a new first
    /// record: they were variants of the record it replaces (expired, or
    /// purged while they were not), and a variant counts only while its own
    /// first record is live (docs/CONTRACT.md §5). Runs under the identity's
    /// lock in `records` (the only place a lock of `variants` is taken inside
    /// one of `records`; never the other way round), so no delivery can see
    /// the new record, and record a variant of it, before this is done.
    fn forget_variants(&self, event_id: &str) {
        if self.variant_identities.load(Ordering::SeqCst) == 0 {
            return;
        }
        if self.variants.remove_if(event_id, |_, _| true) {
            self.variant_identities.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Records `fingerprint` as a variant of `event_id` made at `now`, after
    /// [`Registry::claim`] answered [`Claim::Variant`] and the caller decided
    /// to hold it. Atomic per event identity: of two racing deliveries of one
    /// variant exactly one records it (`true`: it is the `conflict`); the
    /// other gets `false` and is a duplicate of that conflict. A variant
    /// record older than the retention window counts as absent and is
    /// replaced.
    pub fn record_variant(&self, event_id: &str, fingerprint: u128, now: SystemTime) -> bool {
        let now = to_nanos(now);
        self.variants.upsert_with(Box::from(event_id), |current| {
            let mut list: Vec<(u128, u64)> = current
                .map(|(_, list)| {
                    list.iter()
                        .copied()
                        .filter(|&(_, seen)| !self.too_old(seen, now))
                        .collect()
                })
                .unwrap_or_default();
            if list.iter().any(|&(fp, _)| fp == fingerprint) {
                return (None, false);
            }
            if current.is_none() {
                self.variant_identities.fetch_add(1, Ordering::SeqCst);
            }
            list.push((fingerprint, now));
            (Some(list), true)
        })
    }

    /// Removes the variant of `event_id` with `fingerprint`: used only to undo
    /// a step whose durable commit failed.
    pub(crate) fn remove_variant(&self, event_id: &str, fingerprint: u128) {
        self.variants.upsert_with(Box::from(event_id), |current| {
            let Some((_, list)) = current else {
                return (None, ());
            };
            let kept: Vec<(u128, u64)> = list
                .iter()
                .copied()
                .filter(|&(fp, _)| fp != fingerprint)
                .collect();
            // An emptied list stays until the next purge: harmless, and this
            // needs no second lock to remove the entry.
            ((kept.len() != list.len()).then_some(kept), ())
        });
    }

    /// Puts a stored variant back (on restart, or after a conflict showed
    /// that another process recorded it), keeping the earlier time if it is
    /// already known.
    pub(crate) fn restore_variant(&self, row: crate::write::VariantRow) {
        let (fingerprint, seen) = (row.fingerprint, to_nanos(row.first_seen));
        self.variants
            .upsert_with(Box::from(&*row.event_id), |current| {
                let mut list = current.map(|(_, l)| l.clone()).unwrap_or_default();
                match list.iter_mut().find(|(fp, _)| *fp == fingerprint) {
                    Some(known) if known.1 <= seen => return (None, ()),
                    Some(known) => known.1 = seen,
                    None => list.push((fingerprint, seen)),
                }
                if current.is_none() {
                    self.variant_identities.fetch_add(1, Ordering::SeqCst);
                }
                (Some(list), ())
            });
    }

    /// The fingerprints of the variants recorded for `event_id`, expired or
    /// not (until purged), in the order they were recorded.
    pub fn variants(&self, event_id: &str) -> Vec<u128> {
        self.variants
            .view(event_id, |_, list| list.iter().map(|&(fp, _)| fp).collect())
            .unwrap_or_default()
    }

    /// Removes the first record of `event_id` if it has `fingerprint`: used
    /// only to undo a step whose durable commit failed.
    pub(crate) fn remove_first(&self, event_id: &str, fingerprint: u128) {
        self.records
            .remove_if(event_id, |first, _| first.fingerprint() == fingerprint);
    }

    /// Puts a stored receipt back (on restart, or after a conflict showed
    /// that another process recorded it first), replacing any record of the
    /// same event id whole.
    pub(crate) fn restore(&self, receipt: crate::write::ReceiptRow) {
        let key = IdentityKey::new(
            &receipt.event_id,
            &receipt.object_id,
            receipt.fingerprint,
            to_nanos(receipt.first_seen),
        );
        let code = receipt.decision.to_byte();
        self.records.upsert_with(key, |_| (Some(code), ()));
    }

    /// Puts back a receipt read from the store for a delivery of its event
    /// identity (the record had left memory, or another process made it):
    /// it becomes the first record unless a live one is in memory, which
    /// stays (it is the one this process decided against). Variants are
    /// not touched: they stay in memory while within retention. Returns
    /// whether the record was put in.
    pub fn admit(&self, receipt: &crate::write::ReceiptRow, now: SystemTime) -> bool {
        let now = to_nanos(now);
        let key = IdentityKey::new(
            &receipt.event_id,
            &receipt.object_id,
            receipt.fingerprint,
            to_nanos(receipt.first_seen),
        );
        if self.expired(&key, now) {
            return false;
        }
        let code = receipt.decision.to_byte();
        self.records.upsert_with(key, |current| match current {
            Some((first, _)) if !self.expired(first, now) => (None, false),
            _ => (Some(code), true),
        })
    }

    /// Lets the first record of `event_id` leave memory if it is still the
    /// one with `fingerprint` first seen at `first_seen` (a record made
    /// since, after that one expired, stays), for a registry bounded by a
    /// receiver whose store keeps every record (docs/CONTRACT.md §9). Only
    /// for a committed record: the store must hold it, or a later delivery
    /// would find it nowhere. Under the identity's lock the record is put
    /// in the filter of stored identities ([`Registry::track_stored`]) and
    /// the stripe's stamp is bumped, so a [`Registry::claim_checked`] or a
    /// [`Registry::may_be_stored`] racing this sees the record, the bump or
    /// the filter's entry. Variants stay. Returns whether it was removed.
    pub fn evict(
        &self,
        event_id: &str,
        fingerprint: u128,
        first_seen: SystemTime,
        now: SystemTime,
    ) -> bool {
        let first_seen_ns = to_nanos(first_seen);
        let filter = self.filter.get();
        let late = self.filter_late.is_on();
        let removed = self.records.remove_if(event_id, |first, _| {
            let same =
                first.fingerprint() == fingerprint && first.first_seen_nanos() == first_seen_ns;
            if same {
                if let Some(f) = filter.filter(|_| !late) {
                    f.insert(event_id, first_seen, now);
                }
                self.stripe(event_id).fetch_add(1, Ordering::SeqCst);
            }
            same
        });
        if let Some(f) = filter.filter(|_| late && removed) {
            // The control only (never in a shipped build): an atomic
            // operation between the removal and the insert, so that loom
            // may switch threads there (as the filter's lock is).
            self.stripe(event_id).load(Ordering::SeqCst);
            f.insert(event_id, first_seen, now);
        }
        removed
    }

    /// From now on [`Registry::evict`] puts every identity it lets go of in
    /// `filter`, and [`Registry::may_be_stored`] asks it. Call once, before
    /// the first eviction; a second call is ignored and returns `false`.
    pub fn track_stored(&self, filter: Arc<IdentityFilter>) -> bool {
        self.filter.set(filter).is_ok()
    }

    /// The filter of stored identities, if [`Registry::track_stored`] set one.
    pub fn filter(&self) -> Option<&Arc<IdentityFilter>> {
        self.filter.get()
    }

    /// Whether the store may hold a receipt of `event_id` within the window
    /// at `now` that memory does not: `true` without a filter or before its
    /// start-up scan is done, `false` only when the filter certainly holds
    /// no such identity. Ask it after [`Registry::is_live`] said no.
    pub fn may_be_stored(&self, event_id: &str, now: SystemTime) -> bool {
        self.filter
            .get()
            .is_none_or(|f| f.may_contain(event_id, now))
    }

    /// Removes the records whose age on `now` is at least the retention
    /// window, first records and variants alike; returns how many were
    /// removed (each variant counts as one record).
    pub fn purge_expired(&self, now: SystemTime) -> usize {
        let now = to_nanos(now);
        let mut variants = 0;
        let emptied = self.variants.retain(|_, list| {
            let before = list.len();
            list.retain(|&(_, seen)| !self.too_old(seen, now));
            variants += before - list.len();
            !list.is_empty()
        });
        self.variant_identities
            .fetch_sub(emptied as u64, Ordering::SeqCst);
        self.records.retain(|first, _| !self.expired(first, now)) + variants
    }

    /// Whether a first record of `event_id` is in memory and within
    /// retention at `now`. Allocates nothing.
    pub fn is_live(&self, event_id: &str, now: SystemTime) -> bool {
        let now = to_nanos(now);
        self.records
            .view(event_id, |first, _| !self.expired(first, now))
            .unwrap_or(false)
    }

    /// The record for `event_id`, expired or not (until purged). Allocates
    /// the returned record's `object_id`.
    pub fn get(&self, event_id: &str) -> Option<IdentityRecord> {
        self.records
            .view(event_id, |first, &code| record(first, code))
    }

    /// The number of records held, expired ones included until purged.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;
    use crate::decision::{ConflictKind, HoldReason};

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A record's fingerprint, object, decision and first-seen time.
    fn fields(rec: &IdentityRecord) -> (u128, &str, Verdict, SystemTime) {
        (
            rec.fingerprint,
            &rec.object_id,
            rec.decision,
            rec.first_seen,
        )
    }

    #[test]
    fn the_retention_window_is_the_one_given_24_hours_by_default() {
        assert_eq!(DEFAULT_RETENTION, Duration::from_secs(86_400));
        let week = Duration::from_secs(7 * 86_400);
        assert_eq!(Registry::new(week).retention(), week);
        assert_eq!(Registry::with_capacity(week, 10).retention(), week);
        let reg = Registry::new(DEFAULT_RETENTION);
        assert!(reg.is_empty());
        let card: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &card, t(0), || Some(Verdict::Applied));
        assert_eq!((reg.len(), reg.is_empty()), (1, false));
    }

    #[test]
    fn first_record_wins_and_is_never_overwritten() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let b: Arc<str> = "card-8".into();
        assert_eq!(
            reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied)),
            Claim::First(Verdict::Applied)
        );
        assert_eq!(
            reg.claim("e-1", 1, &a, t(1), || unreachable!()),
            Claim::Same(Verdict::Applied)
        );
        assert_eq!(
            reg.claim("e-1", 2, &b, t(2), || unreachable!()),
            Claim::Variant {
                first_object: a.clone(),
                first_fingerprint: 1,
            }
        );
        let rec = reg.get("e-1").unwrap();
        assert_eq!((rec.fingerprint, rec.first_seen), (1, t(0)));
        assert_eq!(rec.object_id, a);
    }

    #[test]
    fn a_stored_record_is_a_9_byte_slot_and_one_block() {
        // The slot: the key's 8-byte pointer (alignment 1) and the decision
        // code; the rest is one block of 32 + ids bytes (see `key.rs`).
        assert_eq!(std::mem::size_of::<(IdentityKey, u8)>(), 9);
        assert_eq!(std::mem::align_of::<(IdentityKey, u8)>(), 1);
    }

    #[test]
    fn an_evicted_identity_is_maybe_stored_and_a_new_one_is_not_once_the_filter_is_ready() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        // Without a filter, every identity may be stored.
        assert!(reg.may_be_stored("e-9", t(1)));
        let filter = Arc::new(IdentityFilter::new(1_000, Duration::from_secs(100), 7));
        assert!(reg.track_stored(filter.clone()));
        assert!(!reg.track_stored(Arc::new(IdentityFilter::new(1, Duration::from_secs(1), 1))));
        // Before the start-up scan is done: still maybe.
        assert!(reg.may_be_stored("e-9", t(1)));
        filter.mark_ready();
        assert!(!reg.may_be_stored("e-9", t(1)));
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        // In memory only: not in the filter (is_live answers for it).
        assert!(!reg.may_be_stored("e-1", t(1)));
        // A refused eviction puts nothing in; an eviction does.
        assert!(!reg.evict("e-1", 2, t(0), t(1)));
        assert_eq!(filter.stats().inserted, 0);
        assert!(reg.evict("e-1", 1, t(0), t(1)));
        assert!(reg.may_be_stored("e-1", t(1)));
        assert!(!reg.may_be_stored("e-9", t(1)));
        assert_eq!(filter.stats().inserted, 1);
        // Past the window (100 s from t(0), slices of 100 s): ruled out.
        assert!(!reg.may_be_stored("e-1", t(200)));
    }

    #[test]
    fn an_evicted_record_is_admitted_back_and_a_stale_stamp_is_told() {
        use crate::write::ReceiptRow;
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let before = reg.stamp("e-1");
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Stale));
        // Another record of the same id (made after expiry) is not removed.
        assert!(!reg.evict("e-1", 1, t(1), t(1)));
        assert!(!reg.evict("e-1", 2, t(0), t(1)));
        assert_eq!(reg.stamp("e-1"), before);
        assert!(reg.evict("e-1", 1, t(0), t(1)));
        assert_eq!((reg.len(), reg.stamp("e-1")), (0, before + 1));
        assert!(!reg.is_live("e-1", t(5)));
        // A claim against the old stamp is told to look again, and records
        // nothing; against the new one it is a first record.
        assert_eq!(
            reg.claim_checked("e-1", 1, &a, t(5), Some(before), || unreachable!()),
            Claim::Evicted
        );
        assert!(reg.is_empty());
        let row = ReceiptRow {
            event_id: "e-1".into(),
            fingerprint: 1,
            object_id: a.clone(),
            decision: Verdict::Stale,
            first_seen: t(0),
            retention_cutoff: None,
        };
        assert!(reg.admit(&row, t(5)));
        assert!(reg.is_live("e-1", t(5)));
        // The stored record answers the duplicate with its first decision,
        // whatever the stamp says.
        assert_eq!(
            reg.claim_checked("e-1", 1, &a, t(6), Some(before), || unreachable!()),
            Claim::Same(Verdict::Stale)
        );
        // A live record in memory stays; an expired row is not admitted.
        let other = ReceiptRow {
            fingerprint: 9,
            ..row.clone()
        };
        assert!(!reg.admit(&other, t(6)));
        assert_eq!(reg.get("e-1").unwrap().fingerprint, 1);
        let old = ReceiptRow {
            event_id: "e-2".into(),
            ..row
        };
        assert!(!reg.admit(&old, t(100)));
        assert!(reg.get("e-2").is_none());
        assert_eq!(
            reg.claim_checked("e-2", 1, &a, t(100), Some(reg.stamp("e-2")), || {
                Some(Verdict::Applied)
            }),
            Claim::First(Verdict::Applied)
        );
    }

    #[test]
    fn declined_decision_records_nothing() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        assert_eq!(reg.claim("e-1", 1, &a, t(0), || None), Claim::NotRecorded);
        assert!(reg.is_empty());
    }

    #[test]
    fn retention_expires_and_purges() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || {
            Some(Verdict::Held(HoldReason::Paused))
        });
        reg.claim("e-2", 1, &a, t(50), || Some(Verdict::Stale));
        assert_eq!(reg.purge_expired(t(99)), 0);
        // At exactly the window's end the record is no longer trusted.
        assert_eq!(
            reg.claim("e-1", 9, &a, t(100), || Some(Verdict::Equal)),
            Claim::First(Verdict::Equal)
        );
        assert_eq!(reg.purge_expired(t(150)), 1);
        assert_eq!(reg.len(), 1);
        assert!(reg.get("e-2").is_none());
    }

    #[test]
    fn a_registry_made_with_room_holds_that_many_identities_without_growing() {
        let reg = Registry::with_capacity(Duration::from_secs(100), 50_000);
        let room = reg.records.capacity();
        assert!(room >= 50_000, "{room}");
        let a: Arc<str> = "card-7".into();
        for i in 0..50_000u32 {
            reg.claim(&format!("e-{i}"), u128::from(i), &a, t(0), || {
                Some(Verdict::Applied)
            });
        }
        assert_eq!((reg.len(), reg.records.capacity()), (50_000, room));
        assert!(Registry::new(Duration::from_secs(1)).records.capacity() < 1_000);
    }

    #[test]
    fn an_expired_record_stays_when_the_new_decision_is_declined() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        assert_eq!(reg.claim("e-1", 2, &a, t(200), || None), Claim::NotRecorded);
        let rec = reg.get("e-1").unwrap();
        assert_eq!((rec.fingerprint, rec.first_seen), (1, t(0)));
        assert_eq!(reg.len(), 1);
    }

    #[test]
    fn an_expired_record_is_replaced_whole() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let b: Arc<str> = "card-8".into();
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        assert_eq!(
            reg.claim("e-1", 2, &b, t(150), || Some(Verdict::Stale)),
            Claim::First(Verdict::Stale)
        );
        assert_eq!(
            fields(&reg.get("e-1").unwrap()),
            (2, "card-8", Verdict::Stale, t(150))
        );
        assert_eq!(reg.len(), 1);
        // The new record is live: the old content is now a variant.
        assert_eq!(
            reg.claim("e-1", 1, &a, t(151), || unreachable!()),
            Claim::Variant {
                first_object: b,
                first_fingerprint: 2,
            }
        );
    }

    #[test]
    fn a_new_first_record_forgets_the_variants_recorded_before_it() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let variant = Claim::Variant {
            first_object: a.clone(),
            first_fingerprint: 1,
        };
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        assert!(reg.record_variant("e-1", 2, t(90)));
        // t(150): the first record (t 0) expired, its variant (t 90) not.
        assert_eq!(
            reg.claim("e-1", 1, &a, t(150), || Some(Verdict::Equal)),
            Claim::First(Verdict::Equal)
        );
        assert!(reg.variants("e-1").is_empty());
        // Against the new record that content is a new variant.
        assert_eq!(reg.claim("e-1", 2, &a, t(151), || unreachable!()), variant);
        // A purge that removed the first record but not its variant: the
        // next first record forgets the orphan just the same.
        reg.claim("e-2", 1, &a, t(200), || Some(Verdict::Applied));
        assert!(reg.record_variant("e-2", 2, t(290)));
        assert_eq!(reg.purge_expired(t(300)), 2);
        assert_eq!((reg.get("e-2"), reg.variants("e-2")), (None, vec![2]));
        reg.claim("e-2", 1, &a, t(301), || Some(Verdict::Stale));
        assert!(reg.variants("e-2").is_empty());
        assert_eq!(reg.claim("e-2", 2, &a, t(302), || unreachable!()), variant);
        // Nothing is left to count: the look-up is skipped again.
        assert_eq!(reg.variant_identities.load(Ordering::SeqCst), 0);
        assert!(reg.record_variant("e-3", 2, t(303)));
        assert_eq!(reg.variant_identities.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn remove_first_removes_only_a_matching_fingerprint() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        reg.remove_first("e-1", 2);
        reg.remove_first("e-2", 1);
        assert_eq!(reg.len(), 1);
        reg.remove_first("e-1", 1);
        assert!(reg.is_empty());
        assert!(reg.get("e-1").is_none());
    }

    #[test]
    fn restore_inserts_and_replaces_the_whole_record() {
        use crate::decision::ConflictKind;
        use crate::write::ReceiptRow;
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        let row = |event: &str, fp, object: &str, decision, at| ReceiptRow {
            event_id: event.into(),
            fingerprint: fp,
            object_id: object.into(),
            decision,
            first_seen: t(at),
            retention_cutoff: None,
        };
        let variant = Verdict::Conflict(ConflictKind::EventVariant);
        reg.restore(row("e-1", 9, "card-99", variant, 5));
        reg.restore(row("e-2", 3, "", Verdict::Equal, 6));
        assert_eq!(reg.len(), 2);
        assert_eq!(
            fields(&reg.get("e-1").unwrap()),
            (9, "card-99", variant, t(5))
        );
        assert_eq!(&*reg.get("e-2").unwrap().object_id, "");
        assert_eq!(
            reg.claim("e-1", 9, &a, t(7), || unreachable!()),
            Claim::Same(variant)
        );
    }

    #[test]
    fn every_verdict_and_id_length_round_trips() {
        use crate::decision::ConflictKind;
        let reg = Registry::new(Duration::from_secs(100));
        let verdicts: Vec<Verdict> = [Verdict::Applied, Verdict::Stale, Verdict::Equal]
            .into_iter()
            .chain(ConflictKind::ALL.map(Verdict::Conflict))
            .chain(HoldReason::ALL.map(Verdict::Held))
            .collect();
        // Ids of 0..=256 bytes (the default `max_id_bytes`), non-ASCII past 3.
        let id = |n: usize| -> String {
            let mut s: String = "é".repeat(n / 2);
            s.push_str(&"x".repeat(n % 2));
            s
        };
        for n in 0..=256 {
            let event = id(n);
            let object: Arc<str> = id(256 - n).into();
            let verdict = verdicts[n % verdicts.len()];
            let at = t(n as u64);
            assert_eq!(
                reg.claim(&event, n as u128, &object, at, || Some(verdict)),
                Claim::First(verdict)
            );
            assert_eq!(
                reg.get(&event),
                Some(IdentityRecord {
                    fingerprint: n as u128,
                    object_id: object.clone(),
                    decision: verdict,
                    first_seen: at,
                })
            );
        }
        assert_eq!(reg.len(), 257);
        // Records 0..=150 are at least 100 s old at t(250).
        assert_eq!(reg.purge_expired(t(250)), 151);
        assert_eq!(reg.len(), 106);
        assert!(reg.get(&id(150)).is_none());
        assert!(reg.get(&id(151)).is_some());
    }

    #[test]
    fn a_recorded_variant_answers_as_a_duplicate_of_its_conflict() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let variant = Claim::Variant {
            first_object: a.clone(),
            first_fingerprint: 1,
        };
        let resent = Claim::Same(Verdict::Conflict(ConflictKind::EventVariant));
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        // Claiming records nothing: only `record_variant` does.
        assert_eq!(reg.claim("e-1", 2, &a, t(1), || unreachable!()), variant);
        assert_eq!(reg.claim("e-1", 2, &a, t(1), || unreachable!()), variant);
        assert!(reg.record_variant("e-1", 2, t(1)));
        assert!(!reg.record_variant("e-1", 2, t(2)));
        assert_eq!(reg.claim("e-1", 2, &a, t(3), || unreachable!()), resent);
        // A third content is a new variant; the first record is untouched.
        assert_eq!(reg.claim("e-1", 3, &a, t(4), || unreachable!()), variant);
        assert!(reg.record_variant("e-1", 3, t(4)));
        assert_eq!(reg.variants("e-1"), [2, 3]);
        assert_eq!(
            reg.claim("e-1", 1, &a, t(5), || unreachable!()),
            Claim::Same(Verdict::Applied)
        );
        assert_eq!((reg.len(), reg.get("e-1").unwrap().fingerprint), (1, 1));
    }

    #[test]
    fn variants_expire_with_retention_and_are_purged() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied));
        reg.claim("e-2", 1, &a, t(60), || Some(Verdict::Applied));
        assert!(reg.record_variant("e-1", 2, t(10)));
        assert!(reg.record_variant("e-2", 2, t(60)));
        // e-1's first record expires at t(100): the variant is not consulted.
        assert!(matches!(
            reg.claim("e-1", 2, &a, t(99), || unreachable!()),
            Claim::Same(_)
        ));
        // At exactly its window's end a variant counts as absent, and a new
        // record of it replaces it.
        assert!(reg.record_variant("e-1", 2, t(110)));
        assert_eq!(reg.variants("e-1"), [2]);
        // At t(170): e-1's first record (t 0) and e-2's first record (t 60)
        // expired; e-1's variant (t 110) and e-2's (t 60): one expired.
        assert_eq!(reg.purge_expired(t(170)), 3);
        assert_eq!(reg.variants("e-1"), [2]);
        assert!(reg.variants("e-2").is_empty());
        assert_eq!(reg.purge_expired(t(210)), 1);
        assert!(reg.variants("e-1").is_empty());
    }

    #[test]
    fn remove_variant_and_restore_variant() {
        use crate::write::VariantRow;
        let reg = Registry::new(Duration::from_secs(100));
        assert!(reg.record_variant("e-1", 2, t(1)));
        assert!(reg.record_variant("e-1", 3, t(2)));
        reg.remove_variant("e-1", 2);
        reg.remove_variant("e-9", 2);
        assert_eq!(reg.variants("e-1"), [3]);
        let row = |fp, at| VariantRow {
            event_id: "e-1".into(),
            fingerprint: fp,
            object_id: "card-7".into(),
            first_seen: t(at),
        };
        reg.restore_variant(row(2, 5));
        reg.restore_variant(row(3, 1));
        reg.restore_variant(row(3, 9));
        assert_eq!(reg.variants("e-1"), [3, 2]);
        // Restored at t(1) (the earlier time is kept): expired at t(101).
        assert!(reg.record_variant("e-1", 3, t(101)));
        assert!(!reg.record_variant("e-1", 2, t(101)));
    }

    #[test]
    fn racing_copies_of_one_variant_on_real_threads_record_it_once() {
        let reg = Registry::new(Duration::from_secs(100));
        let recorded = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (reg, recorded) = (&reg, &recorded);
                s.spawn(move || {
                    for i in 0..2_000 {
                        if reg.record_variant(&format!("e-{i}"), 7, t(1)) {
                            recorded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(recorded.into_inner(), 2_000);
    }

    #[test]
    fn racing_first_deliveries_on_real_threads_have_one_winner() {
        let reg = Registry::new(Duration::from_secs(100));
        let wins = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for k in 0..4u128 {
                let (reg, wins) = (&reg, &wins);
                s.spawn(move || {
                    let object: Arc<str> = format!("card-{k}").into();
                    for i in 0..2_000 {
                        let claim = reg.claim(&format!("e-{i}"), k % 2, &object, t(1), || {
                            Some(Verdict::Applied)
                        });
                        if matches!(claim, Claim::First(_)) {
                            wins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(wins.into_inner(), 2_000);
        assert_eq!(reg.len(), 2_000);
    }
}
