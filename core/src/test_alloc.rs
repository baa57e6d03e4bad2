//! The global allocator of the core's unit tests: the system allocator,
//! counting per thread the bytes allocated and not yet freed, so that a test
//! can show that an owner of raw memory frees exactly what it allocated.
//! Tests run on threads of their own, so one test's count is not disturbed
//! by the others.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// [`System`], counting into [`LIVE`].
struct Counting;

thread_local! {
    /// Bytes this thread allocated minus the bytes it freed. Const-initialised
    /// with no destructor: reading it never allocates and never fails.
    static LIVE: Cell<i64> = const { Cell::new(0) };
}

fn count(bytes: usize, sign: i64) {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    LIVE.with(|live| live.set(live.get() + sign * bytes));
}

// SAFETY: every call is forwarded to `System` unchanged; the counting only
// touches a thread-local integer.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout` are passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            count(layout.size(), 1);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            count(layout.size(), 1);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        count(layout.size(), -1);
        // SAFETY: `block` was allocated by `System` (through this allocator)
        // with `layout`, as the caller guarantees.
        unsafe { System.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(new_size, 1);
            count(layout.size(), -1);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes the calling thread has allocated and not freed since it started.
pub(crate) fn live_bytes() -> i64 {
    LIVE.with(Cell::get)
}
