//! [`IdentityKey`]: the first record of one event identity in a single heap
//! block, owned through an 8-byte pointer of alignment 1. This module holds
//! all of the registry's `unsafe` code.
//!
//! Why: the registry's hash table is at best 87.5 % and, just after it
//! doubles, 43.75 % full, so each byte of a slot costs up to 2.3 bytes per
//! identity. An inline record (a `Box<str>` key and a 48-byte record) made a
//! 64-byte slot plus the key's own allocation. Here the slot is the 8-byte
//! pointer plus the one-byte decision code the registry keeps beside it (9
//! bytes, as the pointer has alignment 1), and everything else lives in one
//! allocation of `32 + event id + object id` bytes: 48 bytes, a 64-byte malloc
//! chunk, for a 10-byte event id and a 6-byte object id.
//!
//! Block layout (byte offsets; integers little-endian, read unaligned):
//!
//! | offset        | bytes | field                                               |
//! |---------------|-------|-----------------------------------------------------|
//! | 0             | 16    | fingerprint (`u128`)                                |
//! | 16            | 8     | first seen, nanoseconds since the Unix epoch (`u64`) |
//! | 24            | 4     | event id length `e` (`u32`)                         |
//! | 28            | 4     | object id length `o` (`u32`)                        |
//! | 32            | `e`   | event id, UTF-8                                     |
//! | 32 + `e`      | `o`   | object id, UTF-8                                    |
//!
//! The block is written once, in [`IdentityKey::new`] (or copied whole by
//! `clone`), and never modified: a key is immutable, so replacing a record
//! means replacing the key.

use std::alloc::{self, Layout};
use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ptr::{self, NonNull};

/// Bytes before the event id.
const HEADER: usize = 32;
/// Offset of the fingerprint.
const FINGERPRINT: usize = 0;
/// Offset of the first-seen time.
const FIRST_SEEN: usize = 16;
/// Offset of the event id's length.
const EVENT_LEN: usize = 24;
/// Offset of the object id's length.
const OBJECT_LEN: usize = 28;

/// One event identity's first record: fingerprint, first-seen time, event id
/// and object id, in one heap block (see the module doc for the layout).
///
/// `Hash`, `Eq` and `Borrow<str>` go by the event id only, so a map keyed by
/// `IdentityKey` is looked up with a plain `&str` and holds one key per event
/// id.
#[repr(C, packed)]
pub(crate) struct IdentityKey {
    /// Start of the block: allocated by `new` or `clone` with
    /// `block_layout(size)`, initialised in full there, never written again,
    /// freed by `Drop`. `repr(packed)` gives the key alignment 1, so the
    /// registry's `(IdentityKey, u8)` slot is 9 bytes instead of 16.
    block: NonNull<u8>,
}

// SAFETY: an `IdentityKey` owns its block exclusively (no other pointer to it
// exists; `clone` makes a new block) and the block is never written after
// construction, so it can move to another thread like a `Box<[u8]>`.
unsafe impl Send for IdentityKey {}
// SAFETY: through `&IdentityKey` the block is only read, and it is immutable,
// so shared access from several threads cannot race.
unsafe impl Sync for IdentityKey {}

/// The layout of a block of `size` bytes. Alignment 1: every field is read
/// byte-wise.
///
/// # Panics
/// If `size` exceeds `isize::MAX` (ids are bounded by `Limits` far below).
fn block_layout(size: usize) -> Layout {
    Layout::from_size_align(size, 1).expect("identity block larger than isize::MAX bytes")
}

/// The length of an id as the block stores it.
///
/// # Panics
/// If the id is 4 GiB or longer (ids are bounded by `Limits` far below).
fn stored_len(id: &str) -> [u8; 4] {
    u32::try_from(id.len())
        .expect("identity ids are shorter than 4 GiB")
        .to_le_bytes()
}

impl IdentityKey {
    /// A key for `event_id`'s first record: `fingerprint`, first seen at
    /// `first_seen_nanos` (nanoseconds since the Unix epoch), naming
    /// `object_id`. Allocates one block of `32 + event_id.len() +
    /// object_id.len()` bytes.
    ///
    /// # Panics
    /// If either id is 4 GiB or longer.
    pub(crate) fn new(
        event_id: &str,
        object_id: &str,
        fingerprint: u128,
        first_seen_nanos: u64,
    ) -> Self {
        let mut header = [0u8; HEADER];
        header[FINGERPRINT..FIRST_SEEN].copy_from_slice(&fingerprint.to_le_bytes());
        header[FIRST_SEEN..EVENT_LEN].copy_from_slice(&first_seen_nanos.to_le_bytes());
        header[EVENT_LEN..OBJECT_LEN].copy_from_slice(&stored_len(event_id));
        header[OBJECT_LEN..HEADER].copy_from_slice(&stored_len(object_id));
        let size = HEADER + event_id.len() + object_id.len();
        let block = allocate(size);
        // SAFETY: `block` was just allocated for `size` bytes and nothing else
        // points to it; the three copies fill the disjoint ranges
        // [0, 32), [32, 32 + e) and [32 + e, size), which cover the block
        // exactly, so every byte is initialised; the sources are a local
        // array and two `&str`s, none of which overlaps a fresh allocation.
        unsafe {
            let at = block.as_ptr();
            ptr::copy_nonoverlapping(header.as_ptr(), at, HEADER);
            ptr::copy_nonoverlapping(event_id.as_ptr(), at.add(HEADER), event_id.len());
            ptr::copy_nonoverlapping(
                object_id.as_ptr(),
                at.add(HEADER + event_id.len()),
                object_id.len(),
            );
        }
        Self { block }
    }

    /// The whole block: the header, then the event id and object id bytes.
    fn bytes(&self) -> &[u8] {
        let block = self.block;
        // SAFETY: the block is at least `HEADER` bytes, fully initialised by
        // `new`/`clone`, never written afterwards, and freed only by `drop`,
        // which cannot run while `&self` is borrowed; `[u8; HEADER]` has
        // alignment 1.
        let header: &[u8; HEADER] = unsafe { &*block.as_ptr().cast::<[u8; HEADER]>() };
        let size = HEADER + len_at(header, EVENT_LEN) + len_at(header, OBJECT_LEN);
        // SAFETY: as above; `size` is the size the block was allocated with
        // (its two stored lengths plus the header), so the slice covers
        // exactly the block's initialised bytes.
        unsafe { std::slice::from_raw_parts(block.as_ptr(), size) }
    }

    /// `N` header bytes from offset `at`.
    fn field<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.bytes()[at..at + N]);
        out
    }

    /// The event id.
    pub(crate) fn event_id(&self) -> &str {
        let bytes = self.bytes();
        let end = HEADER + len_at(bytes, EVENT_LEN);
        // SAFETY: these bytes were copied from a `&str` of exactly this
        // length (in `new`, or from such a block in `clone`), so they are
        // valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(&bytes[HEADER..end]) }
    }

    /// The object the first record names.
    pub(crate) fn object_id(&self) -> &str {
        let bytes = self.bytes();
        let start = HEADER + len_at(bytes, EVENT_LEN);
        // SAFETY: these bytes were copied from the object id `&str`, which
        // starts right after the event id and runs to the end of the block,
        // so they are valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(&bytes[start..]) }
    }

    /// The first record's semantic fingerprint.
    pub(crate) fn fingerprint(&self) -> u128 {
        u128::from_le_bytes(self.field(FINGERPRINT))
    }

    /// When the first record was made, in nanoseconds since the Unix epoch.
    pub(crate) fn first_seen_nanos(&self) -> u64 {
        u64::from_le_bytes(self.field(FIRST_SEEN))
    }

    /// The block's size in bytes (what the allocator was asked for).
    #[cfg(test)]
    fn block_size(&self) -> usize {
        self.bytes().len()
    }
}

/// The id length stored at `at` in a block's header.
fn len_at(header: &[u8], at: usize) -> usize {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&header[at..at + 4]);
    // u32 → usize: lossless on the 32- and 64-bit targets Rust std supports.
    u32::from_le_bytes(raw) as usize
}

/// A fresh, uninitialised block of `size` (> 0) bytes; aborts through
/// `handle_alloc_error` if the allocator fails, like `Box` does.
fn allocate(size: usize) -> NonNull<u8> {
    let layout = block_layout(size);
    debug_assert!(size >= HEADER);
    // SAFETY: `layout` has a non-zero size (at least the 32-byte header).
    let raw = unsafe { alloc::alloc(layout) };
    NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout))
}

impl Drop for IdentityKey {
    fn drop(&mut self) {
        let layout = block_layout(self.bytes().len());
        // SAFETY: the block was allocated with the global allocator with this
        // very layout (same size, alignment 1) by `new`/`clone`, is owned by
        // this key alone, and is freed only here, once.
        unsafe { alloc::dealloc(self.block.as_ptr(), layout) }
    }
}

impl Clone for IdentityKey {
    /// A deep copy: a new block with the same bytes.
    fn clone(&self) -> Self {
        let bytes = self.bytes();
        let block = allocate(bytes.len());
        // SAFETY: `block` was just allocated for `bytes.len()` bytes and is
        // distinct from `self`'s block; copying them all initialises it.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), block.as_ptr(), bytes.len()) };
        Self { block }
    }
}

impl Hash for IdentityKey {
    /// Hashes the event id exactly as `str` does, as `Borrow<str>` requires.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.event_id().hash(state);
    }
}

impl PartialEq for IdentityKey {
    /// Keys are equal when their event ids are (whatever their records say).
    fn eq(&self, other: &Self) -> bool {
        self.event_id() == other.event_id()
    }
}

impl Eq for IdentityKey {}

impl Borrow<str> for IdentityKey {
    fn borrow(&self) -> &str {
        self.event_id()
    }
}

impl fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityKey")
            .field("event_id", &self.event_id())
            .field("object_id", &self.object_id())
            .field("fingerprint", &self.fingerprint())
            .field("first_seen_nanos", &self.first_seen_nanos())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    /// An id of exactly `len` bytes mixing 1-, 2-, 3- and 4-byte characters.
    fn id(len: usize) -> String {
        let mut s = String::with_capacity(len);
        for c in ['é', 'x', '✓', '🦀'].into_iter().cycle() {
            if s.len() + c.len_utf8() > len {
                break;
            }
            s.push(c);
        }
        while s.len() < len {
            s.push('a');
        }
        s
    }

    #[test]
    fn a_key_and_its_clone_each_free_their_block_when_dropped() {
        use crate::test_alloc::live_bytes;
        let before = live_bytes();
        let key = IdentityKey::new("e-1", "card-7", 1, 2);
        let copy = key.clone();
        // Two blocks of 32 + 3 + 6 bytes.
        assert_eq!(live_bytes() - before, 82);
        drop(key);
        assert_eq!(live_bytes() - before, 41);
        drop(copy);
        assert_eq!(live_bytes() - before, 0);
    }

    #[test]
    fn the_key_is_8_bytes_with_alignment_1() {
        assert_eq!(std::mem::size_of::<IdentityKey>(), 8);
        assert_eq!(std::mem::align_of::<IdentityKey>(), 1);
        // The registry's slot: key + decision code.
        assert_eq!(std::mem::size_of::<(IdentityKey, u8)>(), 9);
    }

    #[test]
    fn every_field_reads_back_for_ids_of_0_to_256_bytes() {
        for e in 0..=256 {
            for o in [0, 1, 6, 37, 256] {
                let (event, object) = (id(e), id(o));
                assert_eq!((event.len(), object.len()), (e, o));
                let fp = (u128::MAX / 257) * e as u128 + o as u128;
                let nanos = u64::MAX - e as u64;
                let key = IdentityKey::new(&event, &object, fp, nanos);
                assert_eq!(key.event_id(), event);
                assert_eq!(key.object_id(), object);
                assert_eq!(key.fingerprint(), fp);
                assert_eq!(key.first_seen_nanos(), nanos);
                assert_eq!(key.block_size(), HEADER + e + o);
            }
        }
    }

    #[test]
    fn extreme_header_values_round_trip() {
        for (fp, nanos) in [(0, 0), (u128::MAX, u64::MAX), (1 << 127, 1 << 63)] {
            let key = IdentityKey::new("e-1", "card-7", fp, nanos);
            assert_eq!((key.fingerprint(), key.first_seen_nanos()), (fp, nanos));
        }
    }

    #[test]
    fn non_ascii_and_nul_ids_keep_their_bytes() {
        let key = IdentityKey::new("e-ééé\0🦀", "cärd-\u{301}7", 5, 6);
        assert_eq!(key.event_id(), "e-ééé\0🦀");
        assert_eq!(key.object_id(), "cärd-\u{301}7");
    }

    #[test]
    fn clone_is_a_deep_copy_that_outlives_the_original() {
        let original = IdentityKey::new("e-201", "card-7", 42, 7);
        let copy = original.clone();
        let (a, b) = (original.block, copy.block);
        assert_ne!(a, b);
        drop(original);
        assert_eq!(copy.event_id(), "e-201");
        assert_eq!(copy.object_id(), "card-7");
        assert_eq!((copy.fingerprint(), copy.first_seen_nanos()), (42, 7));
    }

    #[test]
    fn hash_and_eq_go_by_the_event_id_like_str() {
        let a = IdentityKey::new("e-1", "card-7", 1, 1);
        let b = IdentityKey::new("e-1", "card-8", 2, 2);
        let c = IdentityKey::new("e-2", "card-7", 1, 1);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let std_state = std::collections::hash_map::RandomState::new();
        let ahash_state = ahash::RandomState::new();
        for key in [&a, &c] {
            let s: &str = key.borrow();
            assert_eq!(std_state.hash_one(key), std_state.hash_one(s));
            assert_eq!(ahash_state.hash_one(key), ahash_state.hash_one(s));
        }
        assert!(format!("{a:?}").contains("card-7"));
    }

    #[test]
    fn a_map_of_keys_looks_up_by_str_and_replaces_whole_keys() {
        let mut map: HashMap<IdentityKey, u8> = HashMap::new();
        for e in 0..=256 {
            map.insert(IdentityKey::new(&id(e), "card-1", e as u128, 0), 0);
        }
        assert_eq!(map.len(), 257);
        assert_eq!(
            map.get_key_value(id(40).as_str()).unwrap().0.fingerprint(),
            40
        );
        // Replacing: remove then insert, as the loom facade does.
        let (old, _) = map.remove_entry(id(40).as_str()).unwrap();
        drop(old);
        map.insert(IdentityKey::new(&id(40), "card-2", 99, 1), 3);
        let (key, code) = map.get_key_value(id(40).as_str()).unwrap();
        assert_eq!(
            (key.object_id(), key.fingerprint(), *code),
            ("card-2", 99, 3)
        );
        map.retain(|k, _| k.fingerprint() % 2 == 0);
        assert_eq!(map.len(), 128);
    }
}
