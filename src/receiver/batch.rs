//! [`Receiver::deliver_batch`]: one mailbox message per shard and one
//! wake-up per call.

use super::{Command, Receiver};
use crate::{core::Delivery, Outcome, Receipt, RetryReason};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

impl Receiver {
    /// Decides many deliveries in one call and returns their receipts in the
    /// order of `bodies` (raw bytes of each body, transport metadata
    /// excluded), by the same rules as [`Receiver::deliver`]. The difference
    /// is cost: the bodies are parsed in the caller's task, each shard task
    /// gets one message with its part of the batch, and the caller is woken
    /// once, when the last receipt is in. Under load this removes most of the
    /// per-delivery channel and wake-up cost (see docs/BENCHMARKS.md).
    ///
    /// Ordering: deliveries in one batch that name the same object are
    /// decided in the order given, exactly as `deliver` calls in that order
    /// would be; deliveries for different objects run concurrently, as if
    /// sent by different producers. So when two bodies of one batch share an
    /// event id but name different objects, either may become the first
    /// record (the other is the variant), and a pause raised by a variant in
    /// this batch is only guaranteed to be seen by deliveries sent after this
    /// call returns.
    ///
    /// Never fails, like [`Receiver::deliver`]: every body gets a receipt
    /// (`reject` over a limit, `retry` when the receiver is stopping or the
    /// store failed, otherwise a recorded decision). An empty slice returns
    /// an empty vector at once.
    pub async fn deliver_batch<B: AsRef<[u8]>>(&self, bodies: &[B]) -> Vec<Receipt> {
        if bodies.is_empty() {
            return Vec::new();
        }

        let (done_tx, done_rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(bodies.len(), done_tx));
        let shards = self.inner.mailboxes.len();
        let mut parts: Vec<(Vec<Delivery>, Vec<usize>)> =
            (0..shards).map(|_| (Vec::new(), Vec::new())).collect();
        for (index, body) in bodies.iter().enumerate() {
            match self.context().parser().parse(body.as_ref()) {
                Ok(delivery) => {
                    let part = &mut parts[self.shard_for(delivery.object_id())];
                    part.0.push(delivery);
                    part.1.push(index);
                }
                Err(why) => {
                    // A reject is an answer to the sender, not a problem of ours.
                    tracing::info!(index, reason = %why, "delivery rejected");
                    batch.fill(&[index], vec![Receipt::rejected(why)]);
                }
            }
        }
        // The whole batch reserves its bytes until its answers leave; a
        // full queue answers every parsed delivery `retry` at once.
        let bytes = parts
            .iter()
            .flat_map(|(deliveries, _)| deliveries)
            .map(super::queued_bytes)
            .sum();
        let _queued = match self.inner.queued.reserve(bytes) {
            Ok(reservation) => Some(reservation),
            Err(why) => {
                for (deliveries, indices) in parts.iter_mut() {
                    let receipts = deliveries
                        .iter()
                        .map(|d| Receipt::retry(d, why.clone()))
                        .collect();
                    batch.fill(indices, receipts);
                    deliveries.clear();
                }
                None
            }
        };
        let parts: Vec<(usize, Vec<Delivery>, BatchPart)> = parts
            .into_iter()
            .enumerate()
            .filter(|(_, (deliveries, _))| !deliveries.is_empty())
            .map(|(shard, (deliveries, indices))| {
                (shard, deliveries, BatchPart::new(&batch, indices))
            })
            .collect();
        // From here on only the parts hold the batch: the last one answered
        // (or dropped) sends the receipts.
        drop(batch);
        for (shard, deliveries, part) in parts {
            let sent = self.inner.mailboxes[shard]
                .send(Command::DeliverMany(deliveries, part))
                .await;
            if let Err(mpsc::error::SendError(Command::DeliverMany(deliveries, mut part))) = sent {
                let why = || RetryReason::ShuttingDown;
                part.answer(
                    deliveries
                        .iter()
                        .map(|d| Receipt::retry(d, why()))
                        .collect(),
                );
            }
        }
        // Every part answers once, also when it is dropped unanswered, so
        // the sender is only lost if the whole batch was; then retry all.
        let answered = done_rx.await.unwrap_or_default();
        let mut receipts: Vec<Receipt> = answered
            .into_iter()
            .map(|r| r.unwrap_or_else(lost_receipt))
            .collect();
        receipts.resize_with(bodies.len(), lost_receipt);
        self.inner.metrics.record_all(&receipts);
        for receipt in &receipts {
            tracing::info!(
                event_id = receipt.event_id.as_deref(),
                object_id = receipt.object_id.as_deref(),
                decision = %receipt.decision().map_or_else(|| receipt.ack_meaning(), |d| d.to_string()),
                ack = receipt.ack().as_str(),
                "delivery recorded"
            );
        }
        receipts
    }
}

/// The receipts of one [`Receiver::deliver_batch`] call, filled in part by
/// part by the shard tasks; the fill that completes it sends them all to the
/// waiting caller.
struct BatchReply {
    /// A std mutex: held to store one part's receipts, never across an await.
    state: Mutex<BatchState>,
}

struct BatchState {
    /// One slot per body, in the caller's order.
    receipts: Vec<Option<Receipt>>,
    /// Slots not yet filled.
    missing: usize,
    /// Taken by the fill that completes the batch.
    done: Option<oneshot::Sender<Vec<Option<Receipt>>>>,
}

impl BatchReply {
    fn new(len: usize, done: oneshot::Sender<Vec<Option<Receipt>>>) -> Self {
        Self {
            state: Mutex::new(BatchState {
                receipts: (0..len).map(|_| None).collect(),
                missing: len,
                done: Some(done),
            }),
        }
    }

    /// Stores `receipts[k]` in slot `indices[k]` (slots already filled are
    /// left as they are); completing the batch sends it.
    fn fill(&self, indices: &[usize], receipts: Vec<Receipt>) {
        let finished = {
            let mut state = crate::locks::lock(&self.state);
            for (&index, receipt) in indices.iter().zip(receipts) {
                if state.receipts[index].is_none() {
                    state.receipts[index] = Some(receipt);
                    state.missing -= 1;
                }
            }
            if state.missing == 0 {
                state
                    .done
                    .take()
                    .map(|done| (done, std::mem::take(&mut state.receipts)))
            } else {
                None
            }
        };
        if let Some((done, receipts)) = finished {
            // The caller may have given up waiting; the steps are recorded anyway.
            let _ = done.send(receipts);
        }
    }
}

/// One shard's share of a [`BatchReply`]: the caller's positions of the
/// deliveries sent to that shard, in order. Answers exactly once: dropped
/// unanswered (a shard task that stopped abnormally), it fills its slots
/// with `retry`, so the caller is never left waiting.
pub(super) struct BatchPart {
    /// The batch, shared by its parts only.
    batch: Arc<BatchReply>,
    /// Positions in the caller's slice, one per delivery of the part.
    indices: Vec<usize>,
    /// Whether the slots are filled.
    answered: bool,
}

impl BatchPart {
    fn new(batch: &Arc<BatchReply>, indices: Vec<usize>) -> Self {
        Self {
            batch: batch.clone(),
            indices,
            answered: false,
        }
    }

    /// Fills the part's slots, one receipt per delivery in order (a missing
    /// receipt answers `retry`); only the first call counts.
    pub(super) fn answer(&mut self, mut receipts: Vec<Receipt>) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        receipts.resize_with(self.indices.len(), lost_receipt);
        self.batch.fill(&self.indices, receipts);
    }
}

impl Drop for BatchPart {
    fn drop(&mut self) {
        self.answer(Vec::new());
    }
}

/// The receipt of a delivery whose shard task stopped before answering: not
/// recorded as far as the caller can know, so redeliver.
pub(super) fn lost_receipt() -> Receipt {
    Receipt {
        event_id: None,
        object_id: None,
        outcome: Outcome::Retry(RetryReason::ShuttingDown),
        object: None,
        replacement: false,
        created: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_dropped_unanswered_answers_retry_and_the_batch_completes() {
        let (tx, mut rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(4, tx));
        let too_deep = |limit| Receipt::rejected(crate::RejectReason::TooDeep { limit });
        batch.fill(&[2], vec![too_deep(2)]);
        let mut first = BatchPart::new(&batch, vec![0, 3]);
        let second = BatchPart::new(&batch, vec![1]);
        drop(batch);
        first.answer(vec![too_deep(0), too_deep(3)]);
        // Answering twice changes nothing.
        first.answer(vec![lost_receipt(), lost_receipt()]);
        assert!(rx.try_recv().is_err(), "slot 1 is still open");
        drop(second);
        let receipts = rx.try_recv().expect("the last part sends the batch");
        let outcomes: Vec<Outcome> = receipts.into_iter().map(|r| r.unwrap().outcome).collect();
        let deep = |limit| Outcome::Rejected(crate::RejectReason::TooDeep { limit });
        assert_eq!(
            outcomes,
            [
                deep(0),
                Outcome::Retry(RetryReason::ShuttingDown),
                deep(2),
                deep(3)
            ]
        );
        drop(first);
    }

    #[test]
    fn a_short_answer_fills_the_rest_of_its_part_with_retry() {
        let (tx, mut rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(2, tx));
        let mut part = BatchPart::new(&batch, vec![1, 0]);
        drop(batch);
        part.answer(vec![Receipt::rejected(crate::RejectReason::TooDeep {
            limit: 1,
        })]);
        let receipts = rx.try_recv().expect("complete");
        let outcomes: Vec<Outcome> = receipts.into_iter().map(|r| r.unwrap().outcome).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Retry(RetryReason::ShuttingDown),
                Outcome::Rejected(crate::RejectReason::TooDeep { limit: 1 })
            ]
        );
    }
}
