//! The fuzz targets' corpora, replayed on every `cargo test`
//! through the targets' own checks (`fuzz/src/envelope.rs`,
//! `fuzz/src/engine.rs`, `fuzz/src/webhook.rs` with serve's verifier, with
//! the targets' own limits), without cargo-fuzz
//! or libFuzzer: the fuzz crate is a workspace of its own that links
//! libFuzzer, so its check modules are compiled into this suite from their
//! files. The envelope corpus also goes through a receiver configured with
//! the envelope target's limits, and every receipt is compared with the
//! target's model of the parser.

use crate::common::{body, t, T};
use envelope::Expect;
use snapshot_receiver::{Ack, Decision, HoldReason, ManualClock, Outcome, Receiver};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

// The fuzz targets' own code (they name each other as `super::`).
#[path = "../fuzz/src/engine.rs"]
pub(crate) mod engine;
#[path = "../fuzz/src/envelope.rs"]
pub(crate) mod envelope;
#[path = "../fuzz/src/json.rs"]
mod json;
// serve's webhook verifier, which the webhook target checks.
#[path = "../cli/src/cmd/serve/webhook.rs"]
#[allow(dead_code)]
mod verifier;
#[path = "../fuzz/src/webhook.rs"]
mod webhook;

/// The files of `fuzz/corpus/<target>`, sorted.
pub(crate) fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = crate::common::repo(&format!("fuzz/corpus/{target}"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Runs `check` on the bytes of every file; returns `file: panic message`
/// for each file whose check failed.
fn failures(files: &[PathBuf], mut check: impl FnMut(&[u8])) -> Vec<String> {
    let mut failed = Vec::new();
    for file in files {
        let bytes = std::fs::read(file).unwrap();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&bytes))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            failed.push(format!("{name}: {message}"));
        }
    }
    failed
}

/// What the envelope target's model says a body becomes, as one word.
fn class(bytes: &[u8]) -> String {
    match envelope::model(bytes, &envelope::limits()) {
        Expect::Reject(why) => format!("reject:{why}"),
        Expect::Malformed => "malformed".to_owned(),
        Expect::Event { .. } => "event".to_owned(),
    }
}

#[test]
fn every_envelope_corpus_input_passes_the_envelope_targets_checks() {
    let files = corpus("envelope");
    let failed = failures(&files, envelope::check);
    assert!(
        failed.is_empty(),
        "{} of {} envelope corpus inputs fail the target's checks:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    // The corpus reaches every branch of the model, the refusals included.
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for file in &files {
        *classes
            .entry(class(&std::fs::read(file).unwrap()))
            .or_default() += 1;
    }
    let seen: Vec<&str> = classes.keys().map(String::as_str).collect();
    assert_eq!(
        seen,
        [
            "event",
            "malformed",
            "reject:body_too_large",
            "reject:id_too_long",
            "reject:nul_in_id",
            "reject:too_deep"
        ],
        "{classes:?}"
    );
}

#[test]
fn every_engine_corpus_scenario_passes_the_engine_targets_checks() {
    let files = corpus("engine");
    // Every kept input decodes: libFuzzer's corpus minimization drops the
    // ones the target skips.
    let undecodable: Vec<_> = files
        .iter()
        .filter(|f| engine::decode(&std::fs::read(f).unwrap()).is_none())
        .collect();
    assert!(undecodable.is_empty(), "{undecodable:?}");
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let failed = failures(&files, |bytes| {
        let scenario = engine::decode(bytes).expect("decoded above");
        for (key, n) in engine::run(&scenario) {
            *totals.entry(key).or_default() += n;
        }
    });
    assert!(
        failed.is_empty(),
        "{} of {} engine corpus scenarios fail the target's checks:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    // The scenarios reach every decision and both retry reasons.
    let missing: Vec<&str> = [
        "decision.applied",
        "decision.duplicate",
        "decision.stale",
        "decision.equal",
        "decision.held",
        "decision.conflict",
        "retry.held_queue_full",
        "retry.parking_full",
        "reject.too_deep",
    ]
    .into_iter()
    .filter(|k| totals.get(*k).copied().unwrap_or(0) == 0)
    .collect();
    assert!(
        missing.is_empty(),
        "never reached: {missing:?} in {totals:?}"
    );
}

#[tokio::test]
async fn a_receiver_with_the_envelope_targets_limits_answers_every_corpus_input_as_the_model_says()
{
    let files = corpus("envelope");
    // The fixture's objects (corpus inputs name them) and one no input names.
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .limits(envelope::limits())
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#)
        .object("after-the-corpus", 0, "{}")
        .build()
        .unwrap();
    let mut wrong = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let identities = rx.context().registry().len();
        let r = rx.deliver(&bytes).await;
        let expect = envelope::model(&bytes, &envelope::limits());
        let agrees = match (&expect, &r.outcome) {
            (Expect::Reject(name), Outcome::Rejected(why)) => {
                why.as_str() == *name && rx.context().registry().len() == identities
            }
            (Expect::Malformed, Outcome::Decided(d)) => {
                matches!(d, Decision::Held(HoldReason::Malformed))
                    && r.ack() == Ack::Acknowledge
                    && rx.context().registry().len() == identities
            }
            (
                Expect::Event {
                    event_id,
                    object_id,
                    ..
                },
                Outcome::Decided(_),
            ) => {
                r.event_id.as_deref() == Some(event_id.as_str())
                    && r.object_id.as_deref() == Some(object_id.as_str())
                    && r.ack() == Ack::Acknowledge
                    && rx.context().registry().get(event_id).is_some()
            }
            // A full held queue (the fixture's objects get many events).
            (Expect::Event { .. }, Outcome::Retry(_)) => {
                rx.context().registry().len() == identities
            }
            _ => false,
        };
        if !agrees {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            wrong.push(format!(
                "{name}: model {expect:?}, receiver {:?}",
                r.outcome
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} inputs:\n{}",
        wrong.len(),
        files.len(),
        wrong.join("\n")
    );
    let r = rx
        .deliver(body("corpus-done", "after-the-corpus", Some("1"), T, "{}").as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Applied));
}

#[test]
fn every_webhook_corpus_input_passes_the_webhook_targets_checks() {
    let files = corpus("webhook");
    let failed = failures(&files, |bytes| {
        webhook::check(bytes);
    });
    assert!(
        failed.is_empty(),
        "{} of {} webhook corpus inputs fail the target's checks:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    let answers: BTreeMap<String, &str> = files
        .iter()
        .map(|f| {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            (name, webhook::check(&std::fs::read(f).unwrap()))
        })
        .collect();
    // Timestamps past what the clock holds (2^63 to 2^64 - 1) are refused,
    // not a panic; the last second it holds is merely out of tolerance.
    for (seed, answer) in [
        ("seed-timestamp-9223372036854775808", "bad_timestamp"),
        ("seed-timestamp-18446744073709551615", "bad_timestamp"),
        ("seed-timestamp-18446744073709551616", "bad_timestamp"),
        ("seed-timestamp-minus1", "bad_timestamp"),
        (
            "seed-timestamp-9223372036854775807",
            "timestamp_outside_tolerance",
        ),
        ("seed-at-tolerance-after", "ok"),
        ("seed-at-tolerance-before", "ok"),
        ("seed-past-tolerance-after", "timestamp_outside_tolerance"),
        ("seed-past-tolerance-before", "timestamp_outside_tolerance"),
        ("seed-spec-example", "ok"),
        ("seed-truncated-tag", "signature_mismatch"),
    ] {
        assert_eq!(answers.get(seed).copied(), Some(answer), "{seed}");
    }
    let seen: std::collections::BTreeSet<&str> = answers.values().copied().collect();
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [
            "bad_timestamp",
            "missing_signature",
            "ok",
            "signature_mismatch",
            "timestamp_outside_tolerance"
        ]
    );
}
