//! `memtable DIR KEY VALUE`: the resident size a memtable takes per byte
//! fjall counts against its write buffer, for rows of KEY-byte keys and
//! VALUE-byte values (the receiver's `MEMTABLE_COST` in src/store/lsm).

use std::path::Path;

/// Counted memtable bytes filled before the resident size is read.
const FILL: u64 = 64 << 20;

/// The process's resident size, bytes (`/proc/self/statm`).
fn resident() -> Result<u64, String> {
    let statm = std::fs::read_to_string("/proc/self/statm").map_err(|e| e.to_string())?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .ok_or("cannot read /proc/self/statm")?;
    Ok(pages * 4096)
}

/// Fills one memtable (no flush) with distinct keys of `key` bytes and
/// values of `value` bytes up to [`FILL`] counted bytes, then prints the
/// resident bytes it added per counted byte.
pub fn run(dir: &Path, key: usize, value: usize) -> Result<(), String> {
    let keyspace = fjall::Config::new(dir)
        .cache_size(1 << 20)
        .max_write_buffer_size(4 << 30)
        .max_journaling_size(4 << 30)
        .open()
        .map_err(|e| e.to_string())?;
    let options = fjall::PartitionCreateOptions::default().max_memtable_size(2 << 30);
    let partition = keyspace
        .open_partition("rows", options)
        .map_err(|e| e.to_string())?;
    let before = resident()?;
    let body = vec![b'v'; value];
    let mut n = 0u64;
    while keyspace.write_buffer_size() < FILL {
        let mut batch = keyspace.batch();
        for _ in 0..1_000 {
            // Spread over the key space, as identities are.
            let mut k = format!("{:020}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).into_bytes();
            k.resize(key, b'k');
            batch.insert(&partition, k, body.clone());
            n += 1;
        }
        batch.commit().map_err(|e| e.to_string())?;
    }
    let added = resident()?.saturating_sub(before);
    let counted = keyspace.write_buffer_size();
    println!(
        "memtable: {key} B keys, {value} B values: {n} rows, {} MiB counted, {} MiB resident, {:.2} resident per counted byte",
        counted >> 20,
        added >> 20,
        added as f64 / counted as f64
    );
    Ok(())
}
