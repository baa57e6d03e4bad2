//! Synchronisation facade: the only place of the core that names a
//! `std::sync` lock or atomic, `dashmap`, `fastbloom` or `loom` (.ci/run
//! checks it; `Arc` and the registry's one-time `OnceLock` are not
//! synchronisation the models explore). As tokio's `src/loom` does, it picks one whole implementation:
//! - `std.rs` (normally): std atomics, a std [`Mutex`] without poisoning,
//!   and a [`ConcurrentMap`] wrapping a `dashmap::DashMap`;
//! - `loom.rs` (built with `RUSTFLAGS="--cfg snapshot_receiver_loom"`, a
//!   project-specific flag, so tokio and other crates compile as usual): the
//!   same names from `loom`, and the identity map a loom `Mutex<HashMap>`
//!   with the same first-insert-wins contract, because dashmap's internal
//!   locks are invisible to loom and would hide the interleavings the models
//!   must explore;
//! - `racy.rs` (test-only: `--cfg snapshot_receiver_loom_broken` with the
//!   loom flag): replaces [`ConcurrentMap::upsert_with`] in the loom map by
//!   a deliberately racy check-then-insert, so that `loom-tests` can show its
//!   models catch a registry that lets two first deliveries both win. Never
//!   build a shipped binary with it.
//!
//! Every implementation offers the same items: `AtomicBool`, `AtomicU64`, `AtomicUsize`,
//! `Ordering`, `Mutex` (whose `lock` returns the guard: a panic while it was
//! held does not poison it for the next holder), `MutexGuard`,
//! `ConcurrentMap` and `Bloom` (the filter of stored identities: lock-free
//! normally, an exact set behind a loom mutex under loom), and [`Switch`], the
//! must-fail controls' flag (always off outside loom).

#[cfg(all(snapshot_receiver_loom_broken, not(snapshot_receiver_loom)))]
compile_error!("`snapshot_receiver_loom_broken` (loom-tests only) needs `snapshot_receiver_loom`");

#[cfg(not(snapshot_receiver_loom))]
mod std;
#[cfg(not(snapshot_receiver_loom))]
pub(crate) use self::std::*;

#[cfg(snapshot_receiver_loom)]
mod loom;
#[cfg(snapshot_receiver_loom)]
pub(crate) use self::loom::*;

#[cfg(snapshot_receiver_loom_broken)]
mod racy;

/// A must-fail control's on/off flag (see `controls.rs`). Under loom a std
/// atomic, set by a model before its threads start: a std atomic on purpose,
/// as reading it is not a point where loom switches threads, so a control
/// changes only the behaviour it names, not the interleavings explored.
#[cfg(snapshot_receiver_loom)]
#[derive(Default)]
pub(crate) struct Switch(::std::sync::atomic::AtomicBool);

#[cfg(snapshot_receiver_loom)]
impl Switch {
    /// Turns the control on.
    pub(crate) fn on(&self) {
        self.0.store(true, ::std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether it is on.
    pub(crate) fn is_on(&self) -> bool {
        self.0.load(::std::sync::atomic::Ordering::SeqCst)
    }
}

/// A must-fail control's flag outside the loom build: zero-sized, always
/// off, and nothing turns it on, so the code it guards is dropped.
#[cfg(not(snapshot_receiver_loom))]
#[derive(Default)]
pub(crate) struct Switch(());

#[cfg(not(snapshot_receiver_loom))]
impl Switch {
    /// Always `false`: controls exist only in the loom build.
    #[inline(always)]
    pub(crate) const fn is_on(&self) -> bool {
        false
    }
}
