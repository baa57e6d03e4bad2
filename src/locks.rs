//! The library's one way to take a std mutex outside the core (whose locks
//! are its sync facade's, for loom).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Locks `m`. A panic of another holder does not make the lock unusable:
/// every value the library keeps behind a std mutex (counters, times, a
/// list being appended to, a task handle) is whole between two statements,
/// so the next holder takes it as it is instead of propagating the panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard` (a guard of [`lock`]), and takes the guard
/// back the same way: a panic of another holder does not end the wait with
/// an error.
#[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}
