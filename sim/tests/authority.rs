//! The reconciler against a faulty authority (issue 47): on every seed,
//! every object needing an authority converges within the bound once the
//! authority answers, and no fetch breaks the queue's limits; each control
//! is caught.

use snapshot_receiver_sim::authority::{run_authority, AuthorityControl};

#[test]
fn every_object_converges_within_the_bound_once_the_authority_answers() {
    let (mut opened, mut fetches) = (0, 0);
    for seed in 1..=300 {
        let r = run_authority(seed, AuthorityControl::None);
        assert!(r.failures.is_empty(), "seed {seed}: {:#?}", r.failures);
        assert!(r.slowest <= r.bound, "seed {seed}: {r:?}");
        opened += u32::from(r.breaker_opened);
        fetches += r.fetches;
    }
    // The faults were reached: the breaker opened on some seeds, and
    // objects were fetched more than once.
    assert!(opened >= 30, "the breaker opened on {opened} seeds of 300");
    assert!(fetches > 300 * 5, "{fetches} fetches");
}

#[test]
fn a_seed_replays_exactly() {
    let a = run_authority(17, AuthorityControl::None);
    let b = run_authority(17, AuthorityControl::None);
    assert_eq!(
        (a.fetches, a.slowest, a.healthy_at),
        (b.fetches, b.slowest, b.healthy_at)
    );
}

#[test]
fn dropped_needs_are_caught_by_convergence() {
    let r = run_authority(1, AuthorityControl::NeedsDropped);
    assert!(
        r.failures.iter().any(|f| f.contains("did not converge")),
        "{:#?}",
        r.failures
    );
}

#[test]
fn a_wrong_object_applied_is_caught() {
    let caught = (1..=50).find(|seed| {
        run_authority(*seed, AuthorityControl::WrongObjectApplied)
            .failures
            .iter()
            .any(|f| f.contains("a bad answer changed an object"))
    });
    assert!(caught.is_some(), "no seed of 50 caught it");
}
