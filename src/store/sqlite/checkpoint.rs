//! Checkpoints off the committer's path: a thread with its own connection
//! copies the WAL into the file, so that a commit never waits for one.
//!
//! SQLite's own automatic checkpoint runs inside the `COMMIT` of whichever
//! connection takes the WAL past its interval: with one committer thread,
//! every shard waiting on that commit waited for the checkpoint too (its
//! page writes and the file's fsync). Here the writing connections run no
//! checkpoint: a WAL hook tells the [`Checkpointer`] how many frames the
//! WAL holds after each commit, and its thread runs
//! a `PASSIVE` checkpoint each time [`SqliteOptions::checkpoint_bytes`] of
//! frames were added since its last one: it copies what the WAL holds while
//! the committer goes on appending.
//!
//! Under steady commits a `PASSIVE` checkpoint never catches up with the
//! last frame, and SQLite starts the WAL over only once one has; a
//! `RESTART` checkpoint run beside back-to-back commits waits for the write
//! lock and does not get it (measured). So once a `PASSIVE` checkpoint
//! leaves the WAL at half of [`SqliteOptions::wal_bound_bytes`] or more,
//! the next commit waits, after it committed and before it is answered,
//! for a `RESTART`: it copies only the frames the `PASSIVE` one left (the
//! commits made meanwhile) and the commit after it writes the WAL from its
//! start again. A commit that leaves the WAL at the bound (the thread fell
//! behind) waits the same way: the WAL file stays within the bound plus one
//! group's frames. When the `RESTART` cannot finish (a reader holds a
//! snapshot longer than the busy timeout) the next wait comes one bound
//! later, so a long reader slows the committer once per bound of WAL, not
//! at every commit.
//!
//! [`SqliteOptions::checkpoint_bytes`]: super::SqliteOptions::checkpoint_bytes
//! [`SqliteOptions::wal_bound_bytes`]: super::SqliteOptions::wal_bound_bytes

use crate::locks::wait;
use crate::log_gate::LogGate;
use rusqlite::{Connection, OpenFlags};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// What the writing connections and the checkpoint thread share.
pub(super) struct Watch {
    /// The WAL's frame counts and the requests. A std mutex: held only to
    /// read or write a few numbers, by threads that never await.
    state: Mutex<State>,
    /// Wakes the checkpoint thread (a count crossed a line, or a request)
    /// and a committer waiting for a `RESTART`.
    wake: Condvar,
    /// Frames added since the last checkpoint that call for a `PASSIVE` one.
    interval: u64,
    /// Frames of WAL past which a commit waits for a `RESTART` (from half
    /// of it once a `PASSIVE` checkpoint copied the rest).
    bound: u64,
}

#[derive(Default)]
struct State {
    /// Frames in the WAL after the latest commit of a watched connection.
    frames: u64,
    /// Frames the WAL held when the last checkpoint started: the next one
    /// is due `interval` frames after it.
    checkpointed: u64,
    /// Frames at which a commit waits for a `RESTART`: the bound, lowered
    /// to the WAL's frames by a `PASSIVE` checkpoint that left half of it
    /// or more, moved up by one bound after a `RESTART` that could not
    /// finish.
    hold_at: u64,
    /// `RESTART`s asked for by waiting commits, and `RESTART`s done (or
    /// given up): a commit waits until `restarts_done` reaches its ask.
    restarts_asked: u64,
    restarts_done: u64,
    /// Set when the store closes: the thread ends.
    stop: bool,
}

impl Watch {
    /// Notes the WAL's frame count after a commit (the WAL hook); wakes the
    /// thread when a checkpoint is due.
    fn note(&self, frames: u64) {
        let mut s = crate::locks::lock(&self.state);
        if frames < s.frames {
            // The commit started the WAL over: every frame before it was
            // in the file.
            s.checkpointed = 0;
            s.hold_at = self.bound;
        }
        s.frames = frames;
        if frames >= s.checkpointed + self.interval {
            self.wake.notify_all();
        }
    }

    /// Whether the last commit left the WAL at the bound: then asks for a
    /// `RESTART` and waits until it is done or given up.
    pub(super) fn hold_at_bound(&self) {
        let mut s = crate::locks::lock(&self.state);
        if s.frames < s.hold_at || s.stop {
            return;
        }
        s.restarts_asked += 1;
        let ask = s.restarts_asked;
        self.wake.notify_all();
        while s.restarts_done < ask && !s.stop {
            s = wait(&self.wake, s);
        }
    }

    /// Installs the hook that reports `conn`'s commits to this watch; a
    /// connection with a WAL hook runs no automatic checkpoint.
    pub(super) fn watch(self: &Arc<Self>, conn: &mut Connection) -> rusqlite::Result<()> {
        let watch = self.clone();
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: i32| {
            watch.note(u64::try_from(frames).unwrap_or(0));
            Ok(())
        }))
    }
}

/// The checkpoint thread of one store; stopped and joined when dropped.
pub(super) struct Checkpointer {
    /// Shared with the writing connections' hooks.
    pub(super) watch: Arc<Watch>,
    /// The thread, joined on drop so that its connection is closed with
    /// the store's.
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Opens a connection of its own to `path` (`synchronous` as the
    /// store's: it decides whether a checkpoint fsyncs) and starts the
    /// thread; `interval` and `bound` in frames.
    pub(super) fn start(
        path: &str,
        synchronous: &str,
        connect: super::Connect,
        interval: u64,
        bound: u64,
    ) -> Result<Self, String> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .and_then(|conn| {
            connect.apply(&conn)?;
            conn.pragma_update(None, "synchronous", synchronous)?;
            Ok(conn)
        })
        .map_err(|e| e.to_string())?;
        let watch = Arc::new(Watch {
            state: Mutex::new(State {
                hold_at: bound,
                ..State::default()
            }),
            wake: Condvar::new(),
            interval: interval.max(1),
            bound: bound.max(2),
        });
        let shared = watch.clone();
        let thread = std::thread::Builder::new()
            .name("snapshot-receiver-checkpoint".to_owned())
            .spawn(move || run(&conn, &shared))
            .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
        Ok(Self {
            watch,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        {
            let mut s = crate::locks::lock(&self.watch.state);
            s.stop = true;
            self.watch.wake.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            // A panic of the thread was reported when it happened.
            let _ = thread.join();
        }
    }
}

/// What the thread does next.
enum Step {
    /// Copy the WAL into the file: `RESTART` when a waiting commit asked,
    /// else `PASSIVE`.
    Checkpoint {
        restart: bool,
    },
    Stop,
}

fn run(conn: &Connection, watch: &Watch) {
    loop {
        let step = {
            let mut s = crate::locks::lock(&watch.state);
            loop {
                if s.stop {
                    break Step::Stop;
                }
                if s.restarts_asked > s.restarts_done {
                    break Step::Checkpoint { restart: true };
                }
                if s.frames >= s.checkpointed + watch.interval {
                    s.checkpointed = s.frames;
                    break Step::Checkpoint { restart: false };
                }
                s = wait(&watch.wake, s);
            }
        };
        let Step::Checkpoint { restart } = step else {
            return;
        };
        if restart {
            let done = match checkpoint(conn, "RESTART") {
                Ok((busy, _, _)) => !busy,
                Err(e) => {
                    failed("RESTART", &e);
                    false
                }
            };
            let mut s = crate::locks::lock(&watch.state);
            if done {
                s.checkpointed = 0;
            } else {
                s.hold_at = s.frames + watch.bound;
            }
            s.restarts_done = s.restarts_asked;
            watch.wake.notify_all();
            continue;
        }
        match checkpoint(conn, "PASSIVE") {
            Ok((_, frames, _)) if frames >= watch.bound / 2 => {
                // A `RESTART` from this thread would wait for the write
                // lock, which back-to-back commits keep taking (measured:
                // it never got it in 400 commits): the next commit waits
                // for it instead, while it copies the frames this
                // checkpoint left.
                let mut s = crate::locks::lock(&watch.state);
                s.hold_at = s.hold_at.min(frames);
            }
            Ok(_) => {}
            Err(e) => failed("PASSIVE", &e),
        }
    }
}

/// `PRAGMA wal_checkpoint(mode)`: whether it was kept from finishing, the
/// WAL's frames, the frames now in the file.
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, u64, u64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        let count = |i| r.get::<_, i64>(i).map(|n| u64::try_from(n).unwrap_or(0));
        Ok((r.get::<_, i64>(0)? != 0, count(1)?, count(2)?))
    })
}

/// A checkpoint that failed: the next one copies what this one did not
/// (the WAL keeps every frame until one does), so this is a warning,
/// rate-limited.
fn failed(mode: &str, e: &rusqlite::Error) {
    static GATE: LogGate = LogGate::new();
    if let Some(suppressed) = GATE.admit(Instant::now()) {
        tracing::warn!(error = %e, mode, suppressed, "a WAL checkpoint failed: the WAL keeps its frames until the next one");
    }
}
