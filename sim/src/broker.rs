//! The simulated broker: JetStream's semantics as the consumer relies on
//! them (src/jetstream/), in memory.
//!
//! - one durable pull consumer per partition, explicit acks: a message
//!   handed out is pending until acknowledged or terminated; after the ack
//!   wait (reset by a progress report) or a negative acknowledgement's delay
//!   it is redelivered, before any new message, several in no promised order;
//!   no new message is handed out while `max_ack_pending` are pending;
//! - pull requests for up to `n` messages that end when served or when
//!   they expire; `num_ack_pending` and `num_waiting` as the consumer's info
//!   reports them;
//! - the lease bucket: keys with a revision (one counter per bucket) that
//!   expire a TTL after their last write; create (only when absent), update
//!   (compare-and-set on the revision), put, delete on a revision.
//!
//! Time is the world's: every call takes `now`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// One message handed out and not acknowledged yet.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// Times handed out (1: first delivery).
    pub delivered: u32,
    /// When its ack wait ends: the ack wait after it was handed out or last
    /// reported in progress.
    pub due: Duration,
    /// When a negative acknowledgement asked for it again: the server then
    /// queues it for redelivery, and a progress report of the same delivery
    /// arriving later does not take it off that queue.
    pub nak: Option<Duration>,
}

impl Pending {
    /// When it may be redelivered.
    pub fn redeliver_at(&self) -> Duration {
        self.nak.map_or(self.due, |n| n.min(self.due))
    }
}

/// A pull request waiting at the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pull {
    /// The world's id of the request.
    pub id: u64,
    /// Messages still to send it.
    pub want: usize,
    /// When it ends unserved.
    pub expires: Duration,
}

/// One partition's stream and its durable consumer.
#[derive(Default, Debug)]
pub struct Partition {
    /// The stream: per stream sequence (1-based, index + 1), the index of
    /// the delivery in the generated stream.
    pub log: Vec<usize>,
    /// The next stream sequence never handed out.
    pub next: u64,
    /// Handed out, not acknowledged.
    pub pending: BTreeMap<u64, Pending>,
    /// Acknowledged (the consumer's ack floor and above, kept whole).
    pub acked: BTreeSet<u64>,
    /// Terminated.
    pub terminated: BTreeSet<u64>,
    /// Pull requests waiting, oldest first.
    pub pulls: VecDeque<Pull>,
}

/// How a consumer answers one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckKind {
    /// Done: never delivered again.
    Ack,
    /// Redeliver after this delay.
    Nak(Duration),
    /// Still being worked on: restart the ack wait.
    Progress,
    /// Never deliver again (rejected).
    Term,
}

/// One message handed to a pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handed {
    /// The pull it answers.
    pub pull: u64,
    /// Its stream sequence.
    pub seq: u64,
    /// Times handed out, this one included.
    pub delivered: u32,
}

impl Partition {
    /// Appends a published message (delivery `index` of the stream); its
    /// stream sequence.
    pub fn publish(&mut self, index: usize) -> u64 {
        if self.next == 0 {
            self.next = 1;
        }
        self.log.push(index);
        self.log.len() as u64
    }

    /// The consumer's `num_ack_pending`.
    pub fn num_ack_pending(&self) -> usize {
        self.pending.len()
    }

    /// The consumer's `num_waiting`: pull requests not ended.
    pub fn num_waiting(&self) -> usize {
        self.pulls.len()
    }

    /// An acknowledgement of any kind arrives for `seq`. Returns whether it
    /// changed anything (a message not pending is left alone).
    pub fn ack(&mut self, seq: u64, kind: AckKind, now: Duration, ack_wait: Duration) -> bool {
        let Some(p) = self.pending.get_mut(&seq) else {
            return false;
        };
        match kind {
            AckKind::Ack => {
                self.pending.remove(&seq);
                self.acked.insert(seq);
            }
            AckKind::Term => {
                self.pending.remove(&seq);
                self.terminated.insert(seq);
            }
            AckKind::Nak(delay) => p.nak = Some(now + delay),
            AckKind::Progress => p.due = now + ack_wait,
        }
        true
    }

    /// Serves the waiting pulls at `now`: redeliveries first (`pick` chooses
    /// which of the due ones, as JetStream promises no order among them),
    /// then new messages while fewer than `max_ack_pending` are pending.
    /// Returns what was handed out and the pulls that were fully served.
    pub fn serve(
        &mut self,
        now: Duration,
        ack_wait: Duration,
        max_ack_pending: usize,
        mut pick: impl FnMut(usize) -> usize,
    ) -> (Vec<Handed>, Vec<u64>) {
        let mut handed = Vec::new();
        let mut served = Vec::new();
        while let Some(pull) = self.pulls.front_mut() {
            let due: Vec<u64> = self
                .pending
                .iter()
                .filter(|(_, p)| p.redeliver_at() <= now)
                .map(|(s, _)| *s)
                .collect();
            let seq = if !due.is_empty() {
                due[pick(due.len())]
            } else if self.next >= 1
                && (self.next as usize) <= self.log.len()
                && self.pending.len() < max_ack_pending
            {
                self.next += 1;
                self.next - 1
            } else {
                break;
            };
            let p = self.pending.entry(seq).or_insert(Pending {
                delivered: 0,
                due: now,
                nak: None,
            });
            p.delivered += 1;
            p.due = now + ack_wait;
            p.nak = None;
            handed.push(Handed {
                pull: pull.id,
                seq,
                delivered: p.delivered,
            });
            pull.want -= 1;
            if pull.want == 0 {
                served.push(pull.id);
                self.pulls.pop_front();
            }
        }
        (handed, served)
    }

    /// The earliest time a pending message becomes due for redelivery.
    pub fn next_due(&self) -> Option<Duration> {
        self.pending.values().map(Pending::redeliver_at).min()
    }

    /// Removes the pulls that expired by `now`; their ids.
    pub fn expire_pulls(&mut self, now: Duration) -> Vec<u64> {
        let expired: Vec<u64> = self
            .pulls
            .iter()
            .filter(|p| p.expires <= now)
            .map(|p| p.id)
            .collect();
        self.pulls.retain(|p| p.expires > now);
        expired
    }
}

/// One key of the lease bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The value (a member name).
    pub value: String,
    /// Its revision.
    pub revision: u64,
    /// When it was last written.
    pub written: Duration,
}

/// The lease bucket: keys that expire `ttl` after their last write.
#[derive(Debug)]
pub struct Kv {
    /// The bucket's last revision.
    revision: u64,
    /// The keys.
    keys: BTreeMap<String, Entry>,
    /// The bucket's `max_age`.
    pub ttl: Duration,
}

impl Kv {
    /// An empty bucket whose keys live `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            revision: 0,
            keys: BTreeMap::new(),
            ttl,
        }
    }

    /// The live entry of `key` at `now`.
    pub fn entry(&mut self, key: &str, now: Duration) -> Option<Entry> {
        self.expire(key, now);
        self.keys.get(key).cloned()
    }

    fn expire(&mut self, key: &str, now: Duration) {
        if self
            .keys
            .get(key)
            .is_some_and(|e| now >= e.written + self.ttl)
        {
            self.keys.remove(key);
        }
    }

    fn write(&mut self, key: &str, value: &str, now: Duration) -> u64 {
        self.revision += 1;
        self.keys.insert(
            key.to_owned(),
            Entry {
                value: value.to_owned(),
                revision: self.revision,
                written: now,
            },
        );
        self.revision
    }

    /// Creates `key` only if it has no live entry; its revision.
    pub fn create(&mut self, key: &str, value: &str, now: Duration) -> Option<u64> {
        self.expire(key, now);
        if self.keys.contains_key(key) {
            return None;
        }
        Some(self.write(key, value, now))
    }

    /// Writes `key` only if its live entry has `revision`; the new revision.
    pub fn update(&mut self, key: &str, value: &str, revision: u64, now: Duration) -> Option<u64> {
        self.expire(key, now);
        match self.keys.get(key) {
            Some(e) if e.revision == revision => Some(self.write(key, value, now)),
            _ => None,
        }
    }

    /// Writes `key` whatever it holds; the new revision.
    pub fn put(&mut self, key: &str, value: &str, now: Duration) -> u64 {
        self.write(key, value, now)
    }

    /// Deletes `key` if its live entry has `revision`.
    pub fn delete_expect_revision(&mut self, key: &str, revision: u64, now: Duration) -> bool {
        self.expire(key, now);
        if self.keys.get(key).is_some_and(|e| e.revision == revision) {
            self.keys.remove(key);
            return true;
        }
        false
    }

    /// Drops `key` at once, whatever its age (a lease expiring early).
    pub fn drop_key(&mut self, key: &str) -> bool {
        self.keys.remove(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_message_not_acknowledged_in_time_comes_back_before_new_ones() {
        let mut p = Partition::default();
        for i in 0..3 {
            p.publish(i);
        }
        p.pulls.push_back(Pull {
            id: 1,
            want: 1,
            expires: ms(1_000),
        });
        let (handed, served) = p.serve(ms(0), ms(500), 2, |_| 0);
        assert_eq!(
            handed,
            [Handed {
                pull: 1,
                seq: 1,
                delivered: 1
            }]
        );
        assert_eq!(served, [1]);
        p.pulls.push_back(Pull {
            id: 2,
            want: 2,
            expires: ms(2_000),
        });
        let (handed, _) = p.serve(ms(600), ms(500), 2, |_| 0);
        let got: Vec<(u64, u32)> = handed.iter().map(|h| (h.seq, h.delivered)).collect();
        assert_eq!(got, [(1, 2), (2, 1)], "the redelivery first, then new");
        assert_eq!(p.num_ack_pending(), 2);
        assert!(p.ack(1, AckKind::Ack, ms(700), ms(500)));
        assert!(!p.ack(1, AckKind::Ack, ms(700), ms(500)), "not pending");
    }

    #[test]
    fn a_progress_report_arriving_after_a_negative_acknowledgement_does_not_hold_the_redelivery() {
        let mut p = Partition::default();
        p.publish(0);
        p.pulls.push_back(Pull {
            id: 1,
            want: 1,
            expires: ms(1_000),
        });
        let _ = p.serve(ms(0), ms(6_000), 4, |_| 0);
        assert!(p.ack(1, AckKind::Nak(Duration::ZERO), ms(100), ms(6_000)));
        assert!(p.ack(1, AckKind::Progress, ms(110), ms(6_000)));
        assert_eq!(p.next_due(), Some(ms(100)));
        p.pulls.push_back(Pull {
            id: 2,
            want: 1,
            expires: ms(2_000),
        });
        let (handed, _) = p.serve(ms(120), ms(6_000), 4, |_| 0);
        assert_eq!(
            handed,
            [Handed {
                pull: 2,
                seq: 1,
                delivered: 2
            }]
        );
    }

    #[test]
    fn a_lease_is_renewed_only_on_its_revision_and_expires_a_ttl_after_its_last_write() {
        let mut kv = Kv::new(ms(4_000));
        let r = kv.create("p.0", "m0", ms(0)).unwrap();
        assert_eq!(kv.create("p.0", "m1", ms(1_000)), None);
        let r2 = kv.update("p.0", "m0", r, ms(2_000)).unwrap();
        assert_eq!(kv.update("p.0", "m0", r, ms(2_500)), None, "old revision");
        assert!(kv.entry("p.0", ms(5_999)).is_some());
        assert_eq!(kv.create("p.0", "m1", ms(6_000)), Some(r2 + 1));
    }
}
