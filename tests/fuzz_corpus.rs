//! The envelope fuzz target's minimized corpus (`fuzz/corpus/envelope`),
//! replayed through a receiver on every `cargo test`: the CI smoke run of the
//! fuzzing, without cargo-fuzz. Every input gets exactly one outcome, nothing
//! panics, and the receiver still decides a normal delivery afterwards.

use crate::common::{body, t, T};
use snapshot_receiver::{Ack, Decision, ManualClock, Outcome, Receiver};
use std::sync::Arc;

#[tokio::test]
async fn every_corpus_input_gets_one_outcome_and_the_receiver_keeps_working() {
    let dir = &crate::common::repo("fuzz/corpus/envelope");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the corpus is in the repository")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() > 100, "{} inputs", files.len());
    // The fixture's objects (corpus inputs name them) and one no input names.
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#)
        .object("after-the-corpus", 0, "{}")
        .build()
        .unwrap();
    let mut decided = 0;
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let identities = rx.context().registry().len();
        let r = rx.deliver(&bytes).await;
        match &r.outcome {
            Outcome::Decided(_) => {
                decided += 1;
                assert_eq!(r.ack(), Ack::Acknowledge);
            }
            Outcome::Rejected(_) | Outcome::Retry(_) => {
                assert_eq!(rx.context().registry().len(), identities, "{file:?}");
            }
        }
    }
    assert!(decided > 0);
    let r = rx
        .deliver(body("corpus-done", "after-the-corpus", Some("1"), T, "{}").as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Applied));
}
