//! The rules of consuming one partition of the JetStream source that need no
//! server: which partition a body travels in ([`partition_of`]), which live
//! member a partition is meant for ([`meant_for`]), which lease revision a
//! renewal is conditioned on ([`LeaseBook`]), until when a renewed lease
//! surely holds ([`Fence`]) and which arrived messages may be decided now
//! ([`InOrder`]: the owed messages and the take-over gate).
//!
//! The JetStream consumer (module `jetstream`, feature `jetstream`) calls
//! them with the server's answers and its monotonic clock
//! ([`std::time::Instant`]); the deterministic simulation of a cluster (the
//! `sim/` workspace member) calls the same code with its simulated broker
//! and clock ([`std::time::Duration`] since the start of a run). Nothing here
//! does IO or reads a clock: every time is an argument.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A point on a monotonic clock, as the rules here compare them:
/// [`Instant`] for a real process, [`Duration`] (time since the start of a
/// run) for a simulated one.
pub trait Moment: Copy + Ord {
    /// This moment `d` later.
    fn plus(self, d: Duration) -> Self;
    /// The time from `earlier` to this moment (zero when `earlier` is later).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for Duration {
    fn plus(self, d: Duration) -> Self {
        self + d
    }
    fn since(self, earlier: Self) -> Duration {
        self.saturating_sub(earlier)
    }
}

/// The partition of a delivery body: the stable hash of its `object_id`
/// (as the receiver itself reads it) modulo `partitions`; 0 for a body
/// without a readable `object_id` or one over the default limits.
pub fn partition_of(body: &[u8], partitions: u32) -> u32 {
    let object = reader().parse(body).ok();
    match object.as_ref().and_then(|d| d.object_id()) {
        Some(id) => crate::core::shard_of(id, partitions.max(1) as usize) as u32,
        None => 0,
    }
}

/// A parser with the default limits and the card profile.
pub(crate) fn reader() -> &'static crate::core::BodyParser {
    static READER: OnceLock<crate::core::BodyParser> = OnceLock::new();
    READER.get_or_init(crate::core::BodyParser::default)
}

/// Whether partition `p` is meant for `member`: the member at position
/// `p mod n` of the sorted live `members` (every partition, when none is
/// known).
pub fn meant_for(member: &str, p: u32, members: &[String]) -> bool {
    members.is_empty() || members[p as usize % members.len()] == member
}

/// The live members, sorted: those whose heartbeat was last heard (on this
/// process's clock) less than `ttl` before `now`, and always `me`.
pub fn live_members<'a, T: Moment + 'a>(
    heard: impl IntoIterator<Item = (&'a String, &'a T)>,
    me: &str,
    now: T,
    ttl: Duration,
) -> Vec<String> {
    let mut live: Vec<String> = heard
        .into_iter()
        .filter(|(_, at)| now.since(**at) < ttl)
        .map(|(m, _)| m.clone())
        .collect();
    if !live.iter().any(|m| m == me) {
        live.push(me.to_owned());
    }
    live.sort();
    live
}

/// Whether a lease key found holding `value` (a put, not a delete) may be
/// adopted by `member` (renewed on its revision): it names `member`, which
/// restarted under the same name while its lease still lived.
pub fn adoptable(value: &[u8], member: &str) -> bool {
    value == member.as_bytes()
}

/// The partitions a member holds, each with the revision of its lease key:
/// a renewal is a compare-and-set on that revision, so a lease that expired
/// and was taken by another member (a new revision) is lost, never renewed
/// over the new holder's.
#[derive(Clone, Debug, Default)]
pub struct LeaseBook {
    /// Partition → revision of its lease key as this member last wrote it.
    held: HashMap<u32, u64>,
}

impl LeaseBook {
    /// Partition `p`'s lease was written (created, adopted or renewed) at
    /// `revision`.
    pub fn took(&mut self, p: u32, revision: u64) {
        self.held.insert(p, revision);
    }

    /// The revision a renewal of `p` is conditioned on; `None` when `p` is
    /// not held.
    pub fn revision(&self, p: u32) -> Option<u64> {
        self.held.get(&p).copied()
    }

    /// The renewal of `p` answered: the new revision, or `None` when it was
    /// refused (the revision moved on: another member holds it now). Returns
    /// whether the lease was lost; a lost lease is no longer held.
    pub fn renewed(&mut self, p: u32, revision: Option<u64>) -> bool {
        match revision {
            Some(r) => {
                self.held.insert(p, r);
                false
            }
            None => {
                self.held.remove(&p);
                true
            }
        }
    }

    /// `p` is given back: the revision its deletion is conditioned on, if
    /// it was held.
    pub fn release(&mut self, p: u32) -> Option<u64> {
        self.held.remove(&p)
    }
}

/// How long before a fence's end a worker stops starting work: the margin
/// covers the time between the check and the work it allows starting.
pub const FENCE_MARGIN: Duration = Duration::from_millis(100);

/// Until when a partition's lease surely holds: the server drops a lease a
/// TTL after its last write, and that write came after the request was
/// sent, so a lease renewed by a request sent at `t` holds until at least
/// `t + TTL`. Another member can take the partition only after that. A
/// worker starts a pull, or decides anything, only before this time; what
/// it decides stays unacknowledged (so counted by the server) until
/// acknowledged, and a new holder waits for those (see [`InOrder`]). So two
/// members never decide messages of one partition at the same time, even
/// when a lease lapses under load while its holder is still working.
///
/// Shared between the lease loop (which extends it) and the partition's
/// worker (which checks it), hence the atomic.
#[derive(Debug)]
pub struct Fence<T> {
    /// The moment `until_ms` counts from.
    base: T,
    /// Milliseconds after `base` until which the lease holds.
    until_ms: AtomicU64,
}

impl<T: Moment> Fence<T> {
    /// A fence counting from `base`, not holding yet.
    pub fn new(base: T) -> Self {
        Self {
            base,
            until_ms: AtomicU64::new(0),
        }
    }

    /// The lease was written by a request sent at `sent` and lives `ttl`.
    pub fn extend(&self, sent: T, ttl: Duration) {
        let until = sent.since(self.base) + ttl;
        self.until_ms
            .fetch_max(until.as_millis() as u64, Ordering::AcqRel);
    }

    /// Whether, at `now`, the lease holds for [`FENCE_MARGIN`] more.
    pub fn holds(&self, now: T) -> bool {
        let now = (now.since(self.base) + FENCE_MARGIN).as_millis() as u64;
        now < self.until_ms.load(Ordering::Acquire)
    }
}

/// How often the server's count of unacknowledged messages is asked at
/// most, for the gate and for the owed messages each.
pub const INFO_INTERVAL: Duration = Duration::from_millis(100);

/// What keeps a partition's messages decided in stream order although many
/// are in flight. JetStream redelivers a message (after a negative
/// acknowledgement, or after the ack wait when its holder died) after newer
/// ones it handed out meanwhile, and several of them in no promised order;
/// so arrivals wait here, kept in progress, and a message is decided only
/// when no older message of its partition is still owed:
/// - one this worker handed back (`retry`) must come back first;
/// - a worker that has just taken its partition decides nothing until the
///   previous holder's last pull request has surely ended (it started while
///   that holder's lease held, so at most one pull expiry ago) and the
///   server's count of unacknowledged messages says every one of them is
///   here (or handed back by this worker): a killed holder's in-flight
///   messages, and those a previous holder handed back, come first; then
///   all that waits is decided in stream order.
///
/// `M` is the caller's message, `T` its clock's [`Moment`]. The caller asks
/// the server when [`InOrder::gate_due`] or [`InOrder::forget_due`] say so,
/// and hands the answer back.
#[derive(Debug)]
pub struct InOrder<M, T> {
    /// Stream sequences this worker handed back (`retry`) and has not seen
    /// again, with when.
    owed: BTreeMap<u64, T>,
    /// Arrived and not decided yet, by stream sequence, each with whether it
    /// was counted among the messages that waited.
    waiting: BTreeMap<u64, (M, bool)>,
    /// Whether the worker still waits for what previous holders left.
    gate: bool,
    /// When the gate may open at the earliest.
    gate_from: T,
    /// When the gate was last checked against the server.
    gate_checked: Option<T>,
    /// When the waiting messages were last reported in progress.
    progress_sent: T,
    /// When the server was last asked whether overdue owed messages are
    /// still unacknowledged.
    owed_checked: Option<T>,
}

/// Whether a partition a worker takes over is busy, from its consumer's
/// info: messages delivered and not acknowledged (`num_ack_pending`: a
/// previous holder's in flight, or handed back), or a pull request still
/// waiting (`num_waiting`: a previous holder's, which could still be handed
/// messages). A busy partition is taken with the gate closed
/// ([`InOrder::taking_over`]); the consumer asks the server, the
/// simulation its broker.
pub fn busy(ack_pending: usize, waiting: usize) -> bool {
    ack_pending > 0 || waiting > 0
}

impl<M, T: Moment> InOrder<M, T> {
    /// The ordering state of a worker that took its partition at `now` and
    /// pulls with `expires`. `busy`: the server said the partition has
    /// messages unacknowledged or a pull request waiting (or could not say):
    /// the gate is then closed until every unacknowledged message is here.
    pub fn taking_over(busy: bool, now: T, expires: Duration) -> Self {
        Self {
            owed: BTreeMap::new(),
            waiting: BTreeMap::new(),
            gate: busy,
            gate_from: now.plus(expires + Duration::from_millis(200)),
            gate_checked: None,
            progress_sent: now,
            owed_checked: None,
        }
    }

    /// Adds one arrival (a redelivery replaces the earlier copy, and is no
    /// longer owed).
    pub fn arrive(&mut self, stream_sequence: u64, message: M) {
        self.owed.remove(&stream_sequence);
        self.waiting.insert(stream_sequence, (message, false));
    }

    /// Whether the take-over gate is still closed.
    pub fn gated(&self) -> bool {
        self.gate
    }

    /// How many messages are owed (handed back and not seen again).
    pub fn owed(&self) -> usize {
        self.owed.len()
    }

    /// How many messages arrived and wait to be decided.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The messages waiting, in stream order.
    pub fn waiting_messages(&self) -> impl Iterator<Item = &M> {
        self.waiting.values().map(|(m, _)| m)
    }

    /// How many more messages a pull may ask for under `max_in_flight`
    /// (the server's `max_ack_pending`): the waiting and the owed messages
    /// count against it.
    pub fn room(&self, max_in_flight: usize) -> usize {
        max_in_flight
            .max(1)
            .saturating_sub(self.owed.len() + self.waiting.len())
    }

    /// Whether, with no `room`, everything in flight is here and should be
    /// decided before pulling again (nothing owed, the gate open).
    pub fn decide_first(&self, room: usize) -> bool {
        room == 0 && self.owed.is_empty() && !self.gate
    }

    /// Whether the gate is closed and the server should be asked now (at
    /// `now`) for the count of unacknowledged messages: not before the
    /// previous holder's last pull has surely ended, and at most every
    /// [`INFO_INTERVAL`]. Counts the question as asked.
    pub fn gate_due(&mut self, now: T) -> bool {
        if !self.gate || now < self.gate_from {
            return false;
        }
        ask(&mut self.gate_checked, now)
    }

    /// The server's count of unacknowledged messages, asked because
    /// [`InOrder::gate_due`]: the gate opens once every one of them is here
    /// or owed. Returns whether it opened.
    pub fn gate_answer(&mut self, pending: usize) -> bool {
        if self.gate && pending <= self.waiting.len() + self.owed.len() {
            self.gate = false;
            return true;
        }
        false
    }

    /// Takes out the messages that may be decided now, in stream order:
    /// nothing while gated, otherwise those older than every owed message.
    /// The others stay waiting; also returns how many of them waited for the
    /// first time.
    pub fn take_ready(&mut self) -> (Vec<M>, u64) {
        let limit = match (self.gate, self.owed.keys().next()) {
            (true, _) => 0,
            (false, Some(oldest)) => *oldest,
            (false, None) => u64::MAX,
        };
        let later = self.waiting.split_off(&limit);
        let ready: Vec<M> = std::mem::replace(&mut self.waiting, later)
            .into_values()
            .map(|(m, _)| m)
            .collect();
        let mut newly_waited = 0;
        for (_, waited) in self.waiting.values_mut().filter(|(_, w)| !*w) {
            *waited = true;
            newly_waited += 1;
        }
        (ready, newly_waited)
    }

    /// Whether the waiting messages should be reported in progress now (a
    /// quarter of `ack_wait` after the last report), so that the server does
    /// not redeliver them meanwhile. Counts the report as sent.
    pub fn progress_due(&mut self, now: T, ack_wait: Duration) -> bool {
        if !self.waiting.is_empty() && now.since(self.progress_sent) >= ack_wait / 4 {
            self.progress_sent = now;
            return true;
        }
        false
    }

    /// The message was handed back (`retry`) at `now`: it is owed, and
    /// nothing newer is decided until it came back.
    pub fn handed_back(&mut self, stream_sequence: u64, now: T) {
        self.owed.insert(stream_sequence, now);
    }

    /// The message was acknowledged or terminated: no longer owed.
    pub fn settled(&mut self, stream_sequence: u64) {
        self.owed.remove(&stream_sequence);
    }

    /// Whether an owed message is overdue at `now` (handed back more than
    /// `retry_delay + ack_wait + 1 s` ago) and the server should be asked
    /// (at most every [`INFO_INTERVAL`]) whether it is still unacknowledged.
    /// Time alone never forgets one: under load a handed-back message can
    /// come back long after its delay, and deciding newer messages before it
    /// would decide its object out of order. Counts the question as asked.
    pub fn forget_due(&mut self, now: T, retry_delay: Duration, ack_wait: Duration) -> bool {
        let overdue = retry_delay + ack_wait + Duration::from_secs(1);
        if !self.owed.values().any(|at| now.since(*at) >= overdue) {
            return false;
        }
        ask(&mut self.owed_checked, now)
    }

    /// The server's count of unacknowledged messages, asked because
    /// [`InOrder::forget_due`]: when it is no more than what waits here,
    /// another holder decided the owed messages while this one's lease was
    /// lapsing, and they are forgotten (waiting for them would stop the
    /// partition for good). Returns how many were forgotten.
    pub fn forget_answer(&mut self, pending: usize) -> usize {
        if pending <= self.waiting.len() {
            let forgotten = self.owed.len();
            self.owed.clear();
            return forgotten;
        }
        0
    }

    /// Every waiting message, taken out in stream order (the worker stops:
    /// they go back to the server for the next holder).
    pub fn take_waiting(&mut self) -> Vec<M> {
        std::mem::take(&mut self.waiting)
            .into_values()
            .map(|(m, _)| m)
            .collect()
    }
}

/// Whether a rate-limited question may be asked at `now` ([`INFO_INTERVAL`]
/// after the one `last` asked); records it as asked when it may.
fn ask<T: Moment>(last: &mut Option<T>, now: T) -> bool {
    if last.is_some_and(|at| now.since(at) < INFO_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_partition_is_busy_with_a_message_in_flight_or_a_pull_waiting() {
        assert!(!super::busy(0, 0));
        assert!(super::busy(1, 0));
        assert!(super::busy(0, 1));
        assert!(super::busy(3, 2));
    }

    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_fence_holds_until_the_ttl_after_the_renewal_was_sent_minus_the_margin() {
        let fence = Fence::new(ms(1_000));
        assert!(!fence.holds(ms(1_000)), "not holding before a renewal");
        fence.extend(ms(1_500), ms(4_000));
        assert!(fence.holds(ms(5_399)));
        assert!(!fence.holds(ms(5_400)), "the 100 ms margin");
        // An older renewal never shortens it.
        fence.extend(ms(1_200), ms(4_000));
        assert!(fence.holds(ms(5_399)));
    }

    #[test]
    fn a_lost_renewal_drops_the_lease_and_a_kept_one_moves_its_revision() {
        let mut book = LeaseBook::default();
        book.took(3, 17);
        assert_eq!(book.revision(3), Some(17));
        assert!(!book.renewed(3, Some(21)));
        assert_eq!(book.revision(3), Some(21));
        assert!(book.renewed(3, None));
        assert_eq!(book.revision(3), None);
        assert_eq!(book.release(3), None);
    }

    #[test]
    fn a_partition_goes_to_the_member_at_its_position_among_the_live_ones() {
        let heard: HashMap<String, Duration> =
            [("b".to_owned(), ms(9_000)), ("c".to_owned(), ms(1_000))].into();
        let live = live_members(&heard, "a", ms(10_000), ms(4_000));
        assert_eq!(live, ["a", "b"], "c was last heard 9 s ago");
        assert!(meant_for("a", 0, &live));
        assert!(meant_for("b", 1, &live));
        assert!(meant_for("a", 2, &live));
        assert!(meant_for("z", 5, &[]));
    }

    #[test]
    fn a_handed_back_message_holds_back_the_newer_ones_until_it_comes_back() {
        let mut order: InOrder<&str, Duration> = InOrder::taking_over(false, ms(0), ms(1_500));
        order.arrive(4, "m4");
        order.arrive(5, "m5");
        order.handed_back(3, ms(10));
        assert_eq!(order.take_ready(), (vec![], 2));
        assert_eq!(order.take_ready(), (vec![], 0), "counted once");
        assert_eq!(order.room(4), 1);
        order.arrive(3, "m3");
        assert_eq!(order.owed(), 0);
        assert_eq!(order.take_ready(), (vec!["m3", "m4", "m5"], 0));
    }

    #[test]
    fn a_handed_back_message_settled_after_all_no_longer_holds_back_the_newer_ones() {
        // A caller hands 3 back, then acknowledges or terminates it after
        // all (its negative acknowledgement failed, say): nothing is owed,
        // and the newer ones are decided without waiting for it.
        let mut order: InOrder<&str, Duration> = InOrder::taking_over(false, ms(0), ms(1_500));
        order.arrive(4, "m4");
        order.handed_back(3, ms(10));
        order.settled(3);
        assert_eq!((order.owed(), order.room(2)), (0, 1));
        assert_eq!(order.take_ready(), (vec!["m4"], 0));
    }

    #[test]
    fn the_gate_opens_once_every_unacknowledged_message_is_here_and_not_before_the_last_pull_ended()
    {
        let mut order: InOrder<&str, Duration> = InOrder::taking_over(true, ms(0), ms(1_500));
        order.arrive(8, "m8");
        assert!(
            !order.gate_due(ms(1_699)),
            "the previous holder's pull may run"
        );
        assert!(order.gate_due(ms(1_700)));
        assert!(!order.gate_due(ms(1_750)), "asked at most every 100 ms");
        assert!(
            !order.gate_answer(2),
            "one more unacknowledged message to come"
        );
        assert_eq!(order.take_ready(), (vec![], 1));
        order.arrive(7, "m7");
        assert!(order.gate_due(ms(1_800)));
        assert!(order.gate_answer(2));
        assert_eq!(order.take_ready(), (vec!["m7", "m8"], 0));
    }

    #[test]
    fn an_overdue_owed_message_is_forgotten_only_when_the_server_no_longer_counts_it() {
        let mut order: InOrder<&str, Duration> = InOrder::taking_over(false, ms(0), ms(1_500));
        order.handed_back(2, ms(0));
        order.arrive(3, "m3");
        let (retry, wait) = (ms(1_000), ms(10_000));
        assert!(!order.forget_due(ms(11_999), retry, wait));
        assert!(order.forget_due(ms(12_000), retry, wait));
        assert_eq!(order.forget_answer(2), 0, "still unacknowledged somewhere");
        assert!(order.forget_due(ms(12_100), retry, wait));
        assert_eq!(order.forget_answer(1), 1);
        assert_eq!(order.take_ready(), (vec!["m3"], 0));
    }

    #[test]
    fn a_worker_decides_before_pulling_only_when_nothing_has_room_nothing_is_owed_and_the_gate_is_open(
    ) {
        // Gated: what arrives waits, and the worker pulls for the previous
        // holder's messages even with no room.
        let mut order: InOrder<&str, Duration> = InOrder::taking_over(true, ms(0), ms(1_500));
        assert!(order.gated());
        order.arrive(5, "m5");
        order.arrive(6, "m6");
        assert_eq!((order.waiting(), order.owed(), order.room(2)), (2, 0, 0));
        assert!(!order.decide_first(0), "gated: pull for what is owed");
        assert!(order.gate_due(ms(1_700)));
        assert!(order.gate_answer(2));
        assert!(!order.gated());
        assert!(order.decide_first(0), "all in flight is here: decide");
        assert!(!order.decide_first(1), "room left: pull");
        assert_eq!(order.take_ready(), (vec!["m5", "m6"], 0));
        assert_eq!(order.waiting(), 0);
        // A handed-back message is owed: pull for it, room or not.
        order.handed_back(7, ms(2_000));
        order.arrive(8, "m8");
        assert_eq!((order.waiting(), order.owed(), order.room(2)), (1, 1, 0));
        assert!(!order.decide_first(0));
        assert_eq!(order.take_waiting(), ["m8"]);
        assert_eq!(order.waiting(), 0);
    }
}
