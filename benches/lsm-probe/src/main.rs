//! The rows the receiver's durable path writes for each delivery, written
//! to SQLite the way the receiver's store writes them and to fjall, an
//! embedded log-structured (LSM) store, so that the store is chosen by
//! measured figures (docs/BENCHMARKS.md, "Bytes written per delivery").
//!
//! One writer commits groups of deliveries, each group one transaction (or
//! one fjall batch) made durable before the next (an fsync: SQLite
//! `synchronous=FULL`, fjall `PersistMode::SyncAll`). Per delivery:
//! - a new event identity: its object's row is read when the object is not
//!   in the working set, then a receipt (and its time-index entry), an
//!   audit row with the body, the object's new version and state, and a
//!   history row pointing at the state inside the audit body, with its
//!   outbox position;
//! - a redelivery: an audit row only, without the body when the bytes are
//!   the same (half of them), with it when re-encoded (the other half).
//!
//! Reported per delivery: deliveries per second, CPU (the whole process,
//! background threads included), bytes written (`write_bytes` of
//! `/proc/self/io` over the deliveries) and on disk at their end; then the
//! same once the store settled (SQLite's WAL checkpointed, fjall's
//! memtables flushed and its compactions done), and the rows' own bytes
//! (keys and values handed to the store); the process's peak RSS.
//!
//! ```text
//! lsm-probe sqlite|fjall DIR [--objects N] [--deliveries N] [--group N]
//!           [--working-set N] [--payload BYTES] [--pad x|random] [--seed N]
//! ```

mod memtable;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What one run does.
#[derive(Debug)]
struct Args {
    engine: Engine,
    dir: PathBuf,
    objects: u64,
    deliveries: u64,
    group: usize,
    working_set: u64,
    payload: usize,
    random_pad: bool,
    seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Engine {
    Sqlite,
    Fjall,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let engine = match it.next().as_deref() {
        Some("sqlite") => Engine::Sqlite,
        Some("fjall") => Engine::Fjall,
        other => {
            return Err(format!(
                "the first argument is sqlite or fjall, not {other:?}"
            ))
        }
    };
    let dir = PathBuf::from(it.next().ok_or("the second argument is a new directory")?);
    let mut args = Args {
        engine,
        dir,
        objects: 1_000,
        deliveries: 200_000,
        group: 64,
        working_set: 100_000,
        payload: 255,
        random_pad: false,
        seed: 1,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} {value:?}: not a whole number"))
        };
        match flag.as_str() {
            "--objects" => args.objects = number()?.max(1),
            "--deliveries" => args.deliveries = number()?,
            "--group" => args.group = usize::try_from(number()?.max(1)).unwrap_or(usize::MAX),
            "--working-set" => args.working_set = number()?,
            "--payload" => args.payload = usize::try_from(number()?).unwrap_or(usize::MAX),
            "--seed" => args.seed = number()?,
            "--pad" => {
                args.random_pad = match value.as_str() {
                    "x" => false,
                    "random" => true,
                    _ => return Err(format!("--pad {value:?}: x or random")),
                }
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(args)
}

/// SplitMix64: a seeded, dependency-free stream of numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One delivery's rows, as the store receives them.
enum Rows {
    /// A new event identity, applied.
    Applied {
        event_id: String,
        object_id: String,
        version: u64,
        body: Vec<u8>,
        /// Where the state sits in the body.
        state: std::ops::Range<usize>,
        /// Whether the object's row is read first (not in the working set).
        read_object: bool,
    },
    /// A redelivery: its audit row, with the body only when re-encoded.
    Duplicate {
        event_id: String,
        object_id: String,
        body: Option<Vec<u8>>,
    },
}

impl Rows {
    /// The rows' own bytes, whatever the store: every key and field at its
    /// plain width (ids and bodies as they are, times, versions and
    /// positions 8 bytes, the fingerprint 16, a state's place 4 + 4, an
    /// audit or history key 16, the decision and kind as text).
    fn own_bytes(&self) -> usize {
        match self {
            Rows::Applied {
                event_id,
                object_id,
                body,
                state,
                ..
            } => {
                let (e, o) = (event_id.len(), object_id.len());
                let receipt = e + 16 + o + "applied".len() + 8;
                let time_key = 8 + e;
                let audit =
                    16 + 8 + e + o + "delivery".len() + "applied".len() + 8 + 1 + body.len();
                let object = o + 8 + 1 + state.len();
                let history = 16 + 8 + o + 8 + e + 4 + 4 + 8;
                let position = 8 + 16;
                receipt + time_key + audit + object + history + position
            }
            Rows::Duplicate {
                event_id,
                object_id,
                body,
            } => {
                16 + 8
                    + event_id.len()
                    + object_id.len()
                    + "delivery".len()
                    + "duplicate".len()
                    + body.as_ref().map_or(8, Vec::len)
            }
        }
    }
}

/// The stream: 30 % redeliveries of one of the last 4,096 events, the
/// rest new versions of uniformly chosen objects, bodies as `loadtest`
/// writes them (`pad` of `x`, or random letters).
struct Stream {
    rng: Rng,
    args_objects: u64,
    payload: usize,
    random_pad: bool,
    working_set: u64,
    versions: Vec<u64>,
    last_touch: Vec<u64>,
    recent: Vec<(String, String, Vec<u8>)>,
    n: u64,
}

impl Stream {
    fn new(args: &Args) -> Self {
        let objects = usize::try_from(args.objects).unwrap_or(usize::MAX);
        Self {
            rng: Rng(args.seed),
            args_objects: args.objects,
            payload: args.payload,
            random_pad: args.random_pad,
            working_set: args.working_set,
            versions: vec![0; objects],
            last_touch: vec![u64::MAX; objects],
            recent: Vec::new(),
            n: 0,
        }
    }

    fn next(&mut self) -> Rows {
        self.n += 1;
        if !self.recent.is_empty() && self.rng.below(10) < 3 {
            let pick = self.rng.below(self.recent.len() as u64) as usize;
            let (event_id, object_id, body) = &self.recent[pick];
            let body = (self.rng.below(2) == 0).then(|| body.clone());
            return Rows::Duplicate {
                event_id: event_id.clone(),
                object_id: object_id.clone(),
                body,
            };
        }
        let object = self.rng.below(self.args_objects) as usize;
        self.versions[object] += 1;
        let version = self.versions[object];
        let touched = self.last_touch[object];
        let read_object = touched == u64::MAX || self.n - touched > self.working_set;
        self.last_touch[object] = self.n;
        let object_id = format!("card-{object}");
        let event_id = format!("e-{object}-{version}");
        let head = format!(
            "{{\"event_id\":\"{event_id}\",\"object_id\":\"{object_id}\",\"object_version\":{version},\
             \"occurred_at\":\"2024-01-01T00:00:00Z\",\"type\":\"card.snapshot\",\"state\":"
        );
        let state_head = format!("{{\"stage\":\"v{version}\",\"label\":\"{object_id}\",\"pad\":\"");
        let pad_len = self
            .payload
            .saturating_sub(head.len() + state_head.len() + 3);
        let pad: String = (0..pad_len)
            .map(|_| {
                if self.random_pad {
                    char::from(b'a' + self.rng.below(26) as u8)
                } else {
                    'x'
                }
            })
            .collect();
        let body = format!("{head}{state_head}{pad}\"}}}}").into_bytes();
        let state = head.len()..body.len() - 1;
        if self.recent.len() < 4096 {
            self.recent
                .push((event_id.clone(), object_id.clone(), body.clone()));
        } else {
            let slot = (self.n % 4096) as usize;
            self.recent[slot] = (event_id.clone(), object_id.clone(), body.clone());
        }
        Rows::Applied {
            event_id,
            object_id,
            version,
            body,
            state,
            read_object,
        }
    }
}

/// A store the probe writes to.
trait Sink {
    /// Every object at version 0 (before the measured deliveries).
    fn seed(&mut self, objects: u64) -> Result<(), String>;
    /// One group, durable when this returns.
    fn commit(&mut self, group: &[Rows], first_seq: u64, at_ns: u64) -> Result<(), String>;
    /// Everything committed moved to its final place: SQLite's WAL
    /// checkpointed into the file, fjall's memtables flushed and its
    /// compactions finished.
    fn settle(&mut self) -> Result<(), String>;
}

const SQLITE_SCHEMA: &str = "
PRAGMA page_size = 2048;
PRAGMA journal_mode = WAL;
PRAGMA synchronous = FULL;
PRAGMA wal_autocheckpoint = 8192;
CREATE TABLE receipts (event_id TEXT PRIMARY KEY, fingerprint BLOB NOT NULL, object_id TEXT NOT NULL,
    decision TEXT NOT NULL, first_seen_ns INTEGER NOT NULL);
CREATE INDEX receipts_first_seen ON receipts (first_seen_ns);
CREATE TABLE objects (object_id TEXT PRIMARY KEY, version TEXT NOT NULL, state TEXT NOT NULL,
    paused INTEGER NOT NULL);
CREATE TABLE audit (origin INTEGER NOT NULL, seq INTEGER NOT NULL, at_ns INTEGER NOT NULL,
    event_id TEXT, object_id TEXT, kind TEXT NOT NULL, decision TEXT, version TEXT,
    replacement INTEGER NOT NULL, detail TEXT, body BLOB, body_seq INTEGER, PRIMARY KEY (origin, seq));
CREATE INDEX audit_at ON audit (at_ns);
CREATE INDEX audit_body_seq ON audit (origin, body_seq) WHERE body_seq IS NOT NULL;
CREATE TABLE replacements (origin INTEGER NOT NULL, seq INTEGER NOT NULL, at_ns INTEGER NOT NULL,
    object_id TEXT NOT NULL, version TEXT NOT NULL, state TEXT NOT NULL, cause_event TEXT,
    state_at INTEGER, state_len INTEGER, position INTEGER, trace_context TEXT,
    PRIMARY KEY (origin, seq));
CREATE INDEX replacements_at ON replacements (at_ns);
CREATE UNIQUE INDEX replacements_position ON replacements (position);
";

struct Sqlite {
    conn: rusqlite::Connection,
    position: u64,
}

fn sql(e: rusqlite::Error) -> String {
    format!("SQLite: {e}")
}

impl Sqlite {
    fn open(dir: &Path) -> Result<Self, String> {
        let conn = rusqlite::Connection::open(dir.join("probe.db")).map_err(sql)?;
        conn.execute_batch(SQLITE_SCHEMA).map_err(sql)?;
        Ok(Self { conn, position: 0 })
    }
}

impl Sink for Sqlite {
    fn seed(&mut self, objects: u64) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(sql)?;
        {
            let mut st = tx
                .prepare("INSERT INTO objects VALUES (?1, ?2, ?3, 0)")
                .map_err(sql)?;
            for i in 0..objects {
                st.execute(rusqlite::params![
                    format!("card-{i}"),
                    format!("{:020}", 0),
                    format!("{{\"stage\":\"initial\",\"label\":\"card-{i}\"}}")
                ])
                .map_err(sql)?;
            }
        }
        tx.commit().map_err(sql)?;
        self.conn
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .map_err(sql)
    }

    fn commit(&mut self, group: &[Rows], first_seq: u64, at_ns: u64) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(sql)?;
        let at = at_ns as i64;
        for (i, rows) in group.iter().enumerate() {
            let seq = (first_seq + i as u64) as i64;
            match rows {
                Rows::Applied {
                    event_id,
                    object_id,
                    version,
                    body,
                    state,
                    read_object,
                } => {
                    if *read_object {
                        tx.prepare_cached("SELECT version FROM objects WHERE object_id = ?1")
                            .and_then(|mut st| st.query_row([object_id], |r| r.get::<_, String>(0)))
                            .map_err(sql)?;
                    }
                    let version = format!("{version:020}");
                    let state_text = std::str::from_utf8(&body[state.clone()]).unwrap_or("");
                    tx.prepare_cached("INSERT INTO receipts VALUES (?1, ?2, ?3, 'applied', ?4)")
                        .and_then(|mut st| {
                            st.execute(rusqlite::params![event_id, &[7u8; 16][..], object_id, at])
                        })
                        .map_err(sql)?;
                    tx.prepare_cached(
                        "INSERT INTO audit VALUES (1, ?1, ?2, ?3, ?4, 'delivery', 'applied', ?5, 1, NULL, ?6, NULL)",
                    )
                    .and_then(|mut st| {
                        st.execute(rusqlite::params![seq, at, event_id, object_id, version, body])
                    })
                    .map_err(sql)?;
                    tx.prepare_cached(
                        "UPDATE objects SET version = ?2, state = ?3 WHERE object_id = ?1",
                    )
                    .and_then(|mut st| {
                        st.execute(rusqlite::params![object_id, version, state_text])
                    })
                    .map_err(sql)?;
                    self.position += 1;
                    tx.prepare_cached(
                        "INSERT INTO replacements VALUES (1, ?1, ?2, ?3, ?4, '', ?5, ?6, ?7, ?8, NULL)",
                    )
                    .and_then(|mut st| {
                        st.execute(rusqlite::params![
                            seq,
                            at,
                            object_id,
                            version,
                            event_id,
                            state.start as i64,
                            state.len() as i64,
                            self.position as i64
                        ])
                    })
                    .map_err(sql)?;
                }
                Rows::Duplicate {
                    event_id,
                    object_id,
                    body,
                } => {
                    let body_seq = body.is_none().then_some(seq - 1);
                    tx.prepare_cached(
                        "INSERT INTO audit VALUES (1, ?1, ?2, ?3, ?4, 'delivery', 'duplicate', NULL, 0, NULL, ?5, ?6)",
                    )
                    .and_then(|mut st| {
                        st.execute(rusqlite::params![seq, at, event_id, object_id, body, body_seq])
                    })
                    .map_err(sql)?;
                }
            }
        }
        tx.commit().map_err(sql)?;
        Ok(())
    }

    fn settle(&mut self) -> Result<(), String> {
        self.conn
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .map_err(sql)
    }
}

struct Fjall {
    keyspace: fjall::Keyspace,
    receipts: fjall::PartitionHandle,
    receipts_time: fjall::PartitionHandle,
    objects: fjall::PartitionHandle,
    audit: fjall::PartitionHandle,
    history: fjall::PartitionHandle,
    positions: fjall::PartitionHandle,
    position: u64,
}

fn lsm(e: fjall::Error) -> String {
    format!("fjall: {e}")
}

impl Fjall {
    fn open(dir: &Path) -> Result<Self, String> {
        let keyspace = fjall::Config::new(dir.join("probe.fjall"))
            .open()
            .map_err(lsm)?;
        let part = |name: &str| {
            keyspace
                .open_partition(name, fjall::PartitionCreateOptions::default())
                .map_err(lsm)
        };
        Ok(Self {
            receipts: part("receipts")?,
            receipts_time: part("receipts_time")?,
            objects: part("objects")?,
            audit: part("audit")?,
            history: part("history")?,
            positions: part("positions")?,
            keyspace,
            position: 0,
        })
    }
}

/// `a` then `b`, big-endian: keys in numeric order.
fn key2(a: u64, b: u64) -> [u8; 16] {
    let mut k = [0; 16];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

/// Length-prefixed fields, one value.
fn fields(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
    for p in parts {
        v.extend_from_slice(&(p.len() as u32).to_le_bytes());
        v.extend_from_slice(p);
    }
    v
}

impl Sink for Fjall {
    fn seed(&mut self, objects: u64) -> Result<(), String> {
        let mut batch = self.keyspace.batch();
        for i in 0..objects {
            let state = format!("{{\"stage\":\"initial\",\"label\":\"card-{i}\"}}");
            batch.insert(
                &self.objects,
                format!("card-{i}").into_bytes(),
                fields(&[&0u64.to_be_bytes(), &[0], state.as_bytes()]),
            );
            if batch.len() >= 100_000 {
                batch.commit().map_err(lsm)?;
                batch = self.keyspace.batch();
            }
        }
        batch.commit().map_err(lsm)?;
        self.keyspace
            .persist(fjall::PersistMode::SyncAll)
            .map_err(lsm)
    }

    fn commit(&mut self, group: &[Rows], first_seq: u64, at_ns: u64) -> Result<(), String> {
        let mut batch = self.keyspace.batch();
        let at = at_ns.to_be_bytes();
        for (i, rows) in group.iter().enumerate() {
            let seq = first_seq + i as u64;
            let audit_key = key2(1, seq);
            match rows {
                Rows::Applied {
                    event_id,
                    object_id,
                    version,
                    body,
                    state,
                    read_object,
                } => {
                    if *read_object {
                        self.objects.get(object_id.as_bytes()).map_err(lsm)?;
                    }
                    let v = version.to_be_bytes();
                    let receipt = fields(&[&[7u8; 16], &at, b"applied", object_id.as_bytes()]);
                    let mut time_key = at.to_vec();
                    time_key.extend_from_slice(event_id.as_bytes());
                    let audit = fields(&[
                        &at,
                        event_id.as_bytes(),
                        object_id.as_bytes(),
                        b"delivery",
                        b"applied",
                        &v,
                        &[1],
                        body,
                    ]);
                    let object = fields(&[&v, &[0], &body[state.clone()]]);
                    self.position += 1;
                    let p = self.position.to_be_bytes();
                    let history = fields(&[
                        &at,
                        object_id.as_bytes(),
                        &v,
                        event_id.as_bytes(),
                        &(state.start as u32).to_le_bytes(),
                        &(state.len() as u32).to_le_bytes(),
                        &p,
                    ]);
                    batch.insert(&self.receipts, event_id.as_bytes(), receipt);
                    batch.insert(&self.receipts_time, time_key, []);
                    batch.insert(&self.audit, audit_key, audit);
                    batch.insert(&self.objects, object_id.as_bytes(), object);
                    batch.insert(&self.history, audit_key, history);
                    batch.insert(&self.positions, p, audit_key);
                }
                Rows::Duplicate {
                    event_id,
                    object_id,
                    body,
                } => {
                    let body_seq = (seq - 1).to_be_bytes();
                    let audit = fields(&[
                        &at,
                        event_id.as_bytes(),
                        object_id.as_bytes(),
                        b"delivery",
                        b"duplicate",
                        body.as_deref().unwrap_or(&body_seq),
                    ]);
                    batch.insert(&self.audit, audit_key, audit);
                }
            }
        }
        batch.commit().map_err(lsm)?;
        self.keyspace
            .persist(fjall::PersistMode::SyncAll)
            .map_err(lsm)?;
        Ok(())
    }

    fn settle(&mut self) -> Result<(), String> {
        for p in [
            &self.receipts,
            &self.receipts_time,
            &self.objects,
            &self.audit,
            &self.history,
            &self.positions,
        ] {
            p.rotate_memtable_and_wait().map_err(lsm)?;
        }
        // Compactions start after flushes: wait until none has run for a
        // second.
        let mut quiet = 0;
        let mut done = self.keyspace.compactions_completed();
        while quiet < 10 {
            std::thread::sleep(Duration::from_millis(100));
            let now = self.keyspace.compactions_completed();
            if self.keyspace.active_compactions() == 0 && now == done {
                quiet += 1;
            } else {
                quiet = 0;
                done = now;
            }
        }
        eprintln!(
            "fjall settled: {} flushes, {} compactions ({:.1} s), segments {:?}",
            self.keyspace.flushes_completed(),
            self.keyspace.compactions_completed(),
            self.keyspace.time_compacting().as_secs_f64(),
            [
                &self.receipts,
                &self.receipts_time,
                &self.objects,
                &self.audit,
                &self.history,
                &self.positions
            ]
            .map(fjall::PartitionHandle::segment_count)
        );
        self.keyspace
            .persist(fjall::PersistMode::SyncAll)
            .map_err(lsm)
    }
}

/// `write_bytes` of `/proc/self/io`: what this process caused to be
/// written to the disk.
fn written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes: "))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The process's peak resident set (`VmHWM`), MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// User plus system CPU of the whole process so far.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis: utime, stime are
    // the 12th and 13th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// Bytes the files under `dir` take on the disk (allocated blocks: a
/// preallocated journal counts as far as it is written).
fn kept(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => kept(&e.path()),
                Ok(m) => m.blocks() * 512,
                Err(_) => 0,
            })
            .sum()
    })
}

fn run(args: &Args) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    if kept(&args.dir) > 0 {
        return Err(format!(
            "{}: not empty; give a new directory",
            args.dir.display()
        ));
    }
    let mut sink: Box<dyn Sink> = match args.engine {
        Engine::Sqlite => Box::new(Sqlite::open(&args.dir)?),
        Engine::Fjall => Box::new(Fjall::open(&args.dir)?),
    };
    sink.seed(args.objects)?;
    let seeded = kept(&args.dir);
    let mut stream = Stream::new(args);
    let (w0, c0, t0) = (written(), cpu(), Instant::now());
    let mut own = 0;
    let mut seq = 1;
    let mut group = Vec::with_capacity(args.group);
    let mut left = args.deliveries;
    while left > 0 {
        group.clear();
        while group.len() < args.group && left > 0 {
            group.push(stream.next());
            left -= 1;
        }
        let at_ns = 1_700_000_000_000_000_000 + t0.elapsed().as_nanos() as u64;
        own += group.iter().map(Rows::own_bytes).sum::<usize>();
        sink.commit(&group, seq, at_ns)?;
        seq += group.len() as u64;
    }
    let (elapsed, cpu_used, bytes) = (t0.elapsed(), cpu() - c0, written() - w0);
    let during = kept(&args.dir).saturating_sub(seeded);
    sink.settle()?;
    let (settled_cpu, settled_bytes) = (cpu() - c0, written() - w0);
    drop(sink);
    let n = args.deliveries.max(1) as f64;
    let per = |x: f64| x / n;
    println!(
        "{:?}, {} objects, {} deliveries, group {}, working set {}, pad {}: \
         {:.0} deliveries/s, {:.1} us CPU per delivery, written {:.0} B per delivery, \
         on disk {:.0} B per delivery; settled: {:.1} us CPU, written {:.0} B, kept {:.0} B \
         per delivery (beyond {:.0} MiB of seeded objects); the rows' own bytes {:.0} B per delivery; \
         peak RSS {:.0} MiB",
        args.engine,
        args.objects,
        args.deliveries,
        args.group,
        args.working_set,
        if args.random_pad { "random" } else { "x" },
        n / elapsed.as_secs_f64(),
        per(cpu_used.as_secs_f64() * 1e6),
        per(bytes as f64),
        per(during as f64),
        per(settled_cpu.as_secs_f64() * 1e6),
        per(settled_bytes as f64),
        per(kept(&args.dir).saturating_sub(seeded) as f64),
        seeded as f64 / 1_048_576.0,
        per(own as f64),
        peak_rss_mib(),
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("memtable") {
        let number = |i: usize| args.get(i).and_then(|a| a.parse::<usize>().ok());
        let result = match (args.get(2), number(3), number(4)) {
            (Some(dir), Some(key), Some(value)) => memtable::run(Path::new(dir), key, value),
            _ => Err("memtable DIR KEY_BYTES VALUE_BYTES".to_owned()),
        };
        if let Err(e) = result {
            eprintln!("lsm-probe: {e}");
            std::process::exit(2);
        }
        return;
    }
    match parse_args().and_then(|args| run(&args)) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("lsm-probe: {e}");
            std::process::exit(2);
        }
    }
}
