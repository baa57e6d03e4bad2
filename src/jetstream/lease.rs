//! Partition leases in a JetStream key-value bucket.
//!
//! The bucket `sr-leases-<stream>` keeps one value per key (history 1) and
//! drops a key a lease-TTL after its last write (the bucket's `max_age`,
//! enforced by the server, so no two machines' clocks are compared):
//! - `m.<member>`: a member's heartbeat, rewritten every TTL/4;
//! - `p.<partition>`: the member that holds the partition, created only when
//!   absent (`create`), renewed only by compare-and-set on its revision
//!   (`update`), and deleted on release.
//!
//! Membership is learnt from a watch on `m.*`: a member is live while its
//! heartbeats keep arriving (measured on this process's monotonic clock). A
//! lease decides only who pulls a partition; two holders at once (an
//! expired lease whose holder still works) cost a duplicate delivery, which
//! the receiver and the database absorb.

use super::JetStreamError;
use crate::partition::{self, LeaseBook};
use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// This process's view of the lease bucket.
pub(crate) struct Leases {
    /// The bucket.
    kv: kv::Store,
    /// This member's name (a valid key token).
    member: String,
    /// How long a heartbeat or lease lives without renewal: the bucket's
    /// `max_age` (the value of whoever created the bucket wins).
    ttl: Duration,
    /// When each member was last heard of, fed by the watch task. A std
    /// mutex: touched briefly, never across an await.
    heard: Arc<Mutex<HashMap<String, Instant>>>,
    /// The partitions this member holds, with the revision of its lease key.
    held: LeaseBook,
    /// The watch task (aborted on drop).
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// A member name reduced to the characters a key may hold.
pub(crate) fn key_token(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Leases {
    /// Opens (or creates) the bucket of `stream`, starts watching heartbeats
    /// and announces `member`.
    pub(crate) async fn join(
        js: &jetstream::Context,
        stream: &str,
        member: &str,
        ttl: Duration,
    ) -> Result<Self, JetStreamError> {
        let bucket = format!("sr-leases-{}", key_token(stream));
        // The bucket's stream is made here rather than by `create_key_value`:
        // async-nats 0.51 first reads account fields that servers before 2.10
        // do not send (Debian's nats-server is 2.9). Same configuration as a
        // key-value bucket: one value per key, rollups, direct gets.
        let config = jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            description: Some(format!("snapshot-receiver partition leases of {stream}")),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            max_age: ttl,
            duplicate_window: ttl.min(Duration::from_secs(120)),
            storage: jetstream::stream::StorageType::Memory,
            discard: jetstream::stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            num_replicas: 1,
            ..Default::default()
        };
        if js.get_stream(&config.name).await.is_err() {
            js.get_or_create_stream(config)
                .await
                .map_err(|e| JetStreamError::request(format!("lease bucket {bucket}"), e))?;
        }
        let kv = js
            .get_key_value(&bucket)
            .await
            .map_err(|e| JetStreamError::request(format!("lease bucket {bucket}"), e))?;
        let ttl = kv
            .status()
            .await
            .map(|s| s.info.config.max_age)
            .ok()
            .filter(|d| !d.is_zero())
            .unwrap_or(ttl);
        let heard = Arc::new(Mutex::new(HashMap::new()));
        let mut watch = kv
            .watch("m.*")
            .await
            .map_err(|e| JetStreamError::request(format!("watch {bucket}"), e))?;
        let (feed, source) = (heard.clone(), kv.clone());
        let watch = tokio::spawn(async move {
            loop {
                while let Some(entry) = watch.next().await {
                    let Ok(entry) = entry else { continue };
                    let Some(name) = entry.key.strip_prefix("m.") else {
                        continue;
                    };
                    let mut heard = crate::locks::lock(&feed);
                    match entry.operation {
                        kv::Operation::Put => {
                            heard.insert(name.to_owned(), Instant::now());
                        }
                        kv::Operation::Delete | kv::Operation::Purge => {
                            heard.remove(name);
                        }
                    }
                }
                // The watch ended (a lost connection): watch again, or the
                // other members would look dead after a TTL.
                watch = loop {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    match source.watch("m.*").await {
                        Ok(w) => break w,
                        Err(e) => tracing::warn!(error = %e, "membership watch: retrying"),
                    }
                };
            }
        });
        let mut leases = Self {
            kv,
            member: key_token(member),
            ttl,
            heard,
            held: LeaseBook::default(),
            watch,
        };
        leases.heartbeat().await?;
        Ok(leases)
    }

    /// The lease TTL in force.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Rewrites this member's heartbeat.
    pub(crate) async fn heartbeat(&mut self) -> Result<(), JetStreamError> {
        self.kv
            .put(format!("m.{}", self.member), self.member.clone().into())
            .await
            .map_err(|e| JetStreamError::request("heartbeat", e))?;
        Ok(())
    }

    /// Live members, sorted: those heard within the TTL, and always this one.
    pub(crate) fn members(&self) -> Vec<String> {
        let heard = crate::locks::lock(&self.heard);
        partition::live_members(heard.iter(), &self.member, Instant::now(), self.ttl)
    }

    /// Whether partition `p` is meant for this member: the member at
    /// position `p mod n` of the sorted live members.
    pub(crate) fn meant_for_me(&self, p: u32, members: &[String]) -> bool {
        partition::meant_for(&self.member, p, members)
    }

    /// Tries to take each partition of `wanted`: creates its lease key when
    /// absent, or adopts a live lease that already names this member (a
    /// restart under the same name). Returns those taken; the others are held
    /// by another member. The requests run concurrently.
    pub(crate) async fn acquire(&mut self, wanted: &[u32]) -> Vec<u32> {
        let (kv, member) = (&self.kv, &self.member);
        let results = futures_util::future::join_all(
            wanted
                .iter()
                .map(|&p| async move { (p, try_acquire(kv, member, p).await) }),
        )
        .await;
        let mut taken = Vec::new();
        for (p, revision) in results {
            if let Some(revision) = revision {
                self.held.took(p, revision);
                taken.push(p);
            }
        }
        taken
    }

    /// Renews the leases on `partitions` concurrently; returns those that
    /// were lost (expired and taken, or not confirmed), which are no longer
    /// held.
    pub(crate) async fn renew(&mut self, partitions: &[u32]) -> Vec<u32> {
        let (kv, member, held) = (&self.kv, &self.member, &self.held);
        let results = futures_util::future::join_all(partitions.iter().filter_map(|&p| {
            let revision = held.revision(p)?;
            Some(async move {
                let renewed = kv
                    .update(format!("p.{p}"), member.clone().into(), revision)
                    .await;
                (p, renewed)
            })
        }))
        .await;
        let mut lost = Vec::new();
        for (p, renewed) in results {
            if let Err(e) = &renewed {
                tracing::warn!(partition = p, error = %e, "lease lost");
            }
            if self.held.renewed(p, renewed.ok()) {
                lost.push(p);
            }
        }
        lost
    }

    /// Gives partition `p` back (only if this member still holds it).
    pub(crate) async fn release(&mut self, p: u32) {
        if let Some(revision) = self.held.release(p) {
            if let Err(e) = self
                .kv
                .delete_expect_revision(format!("p.{p}"), Some(revision))
                .await
            {
                tracing::debug!(partition = p, error = %e, "lease release: already gone");
            }
        }
    }

    /// Removes this member's heartbeat, so that the others rebalance at once.
    pub(crate) async fn leave(&mut self) {
        let _ = self.kv.delete(format!("m.{}", self.member)).await;
    }
}

/// Creates the lease key of `p` for `member`, or adopts it when it already
/// names `member`; the new revision, or `None` when someone else holds it.
async fn try_acquire(kv: &kv::Store, member: &str, p: u32) -> Option<u64> {
    let key = format!("p.{p}");
    if let Ok(revision) = kv.create(&key, member.to_owned().into()).await {
        return Some(revision);
    }
    match kv.entry(&key).await {
        Ok(Some(e))
            if e.operation == kv::Operation::Put && partition::adoptable(&e.value, member) =>
        {
            kv.update(&key, member.to_owned().into(), e.revision)
                .await
                .ok()
        }
        _ => None,
    }
}
