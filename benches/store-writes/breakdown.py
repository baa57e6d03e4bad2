#!/usr/bin/env python3
"""Where a SQLite store's written bytes go, table by table and index by
index, for one `loadtest` run (docs/BENCHMARKS.md, *Bytes written per
delivery*).

    python3 benches/store-writes/breakdown.py BIN DB -- LOADTEST-ARGS...

Runs `BIN loadtest --store sqlite:DB LOADTEST-ARGS...` and, once the first
delivery is committed, holds a read transaction on DB until the run ends.
While a reader holds its snapshot SQLite can neither copy the WAL's newer
frames into the file nor start the WAL over, so every page the run's
commits write stays in the WAL, in commit order. At the end the script
reads the WAL's frames after the snapshot, names each frame's page by
SQLite's `dbstat` table (the B-tree it belongs to) and prints, per B-tree:
the WAL bytes per delivery, the pages per commit, and what a checkpoint
every 1,000 frames (SQLite's `wal_autocheckpoint` default) would have
copied into the file (each page once per checkpoint). The run itself
checkpoints nothing meanwhile, so its own `disk:` line is not the
figure to quote from this run: take that from a run without the reader.
Its rate is not either: each time the WAL passes the store's bound, a
commit waits the busy timeout (5 s) for a `RESTART` the reader prevents.

With SETUP_SQL set, that SQL runs on the new file before `loadtest`
opens it (a layout to try: `PRAGMA page_size = 1024`, or a table created
ahead of the receiver's own `CREATE TABLE IF NOT EXISTS`). CHECKPOINT_FRAMES
(default 1000) sets the checkpoint interval the copies are counted at.

The deliveries counted are the audit rows of kind `delivery` committed
after the snapshot; a commit racing the snapshot may shift one group from
one side to the other (well under 1 % of a run of 100,000).
"""
import collections
import os
import sqlite3
import struct
import subprocess
import sys
import time

CHECKPOINT_FRAMES = int(os.environ.get("CHECKPOINT_FRAMES", "1000"))


def wal_frames(path):
    """The WAL's valid frames, (page number, is a commit) in order, and its
    page size (reads the frame headers only)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return [], 0
    with f:
        head = f.read(32)
        if len(head) < 32:
            return [], 0
        page_size = struct.unpack(">I", head[8:12])[0]
        salts = head[16:24]
        frames, last_commit = [], 0
        at = 32
        while True:
            f.seek(at)
            h = f.read(24)
            if len(h) < 24 or h[8:16] != salts:
                break
            page, size_after = struct.unpack(">II", h[:8])
            frames.append((page, size_after != 0))
            if size_after:
                last_commit = len(frames)
            at += 24 + page_size
    return frames[:last_commit], page_size


def checkpoint_copies(window, names, every):
    """Pages copied into the file per B-tree by a checkpoint after each
    commit that takes the WAL to `every` frames or more: each page once,
    the distinct pages since the last checkpoint (the frames after the last
    one are counted as the next checkpoint would copy them)."""
    copied = collections.Counter()
    span, frames_in_span = set(), 0
    for page, commit in window:
        span.add(page)
        frames_in_span += 1
        if commit and frames_in_span >= every:
            for p in span:
                copied[names.get(p, "(other)")] += 1
            span, frames_in_span = set(), 0
    for p in span:
        copied[names.get(p, "(other)")] += 1
    return copied


def deliveries(conn):
    return conn.execute("SELECT count(*) FROM audit WHERE kind = 'delivery'").fetchone()[0]


def main():
    bin_, db = sys.argv[1], sys.argv[2]
    args = sys.argv[sys.argv.index("--") + 1 :]
    if os.environ.get("SETUP_SQL"):
        setup = sqlite3.connect(db)
        setup.executescript(os.environ["SETUP_SQL"] + "; PRAGMA journal_mode = WAL;")
        setup.close()
    run = subprocess.Popen(
        [bin_, "loadtest", "--store", f"sqlite:{db}", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    pin = None
    while run.poll() is None:
        try:
            conn = sqlite3.connect(db, isolation_level=None, timeout=5)
            conn.execute("BEGIN")
            if deliveries(conn) > 0:
                pin = conn
                break
            conn.execute("ROLLBACK")
            conn.close()
        except sqlite3.OperationalError:
            pass
        time.sleep(0.01)
    if pin is None:
        sys.exit("the run ended before its first delivery was committed")
    n0 = deliveries(pin)
    m0 = len(wal_frames(db + "-wal")[0])
    report = run.communicate()[0]
    if run.returncode != 0:
        sys.exit(f"loadtest failed ({run.returncode}):\n{report}")
    frames, page_size = wal_frames(db + "-wal")
    latest = sqlite3.connect(db)
    n = deliveries(latest) - n0
    names = dict(latest.execute("SELECT pageno, name FROM dbstat"))
    kept = collections.Counter()
    for name, size in latest.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
        kept[name] = size
    total_deliveries = deliveries(latest)
    latest.close()
    pin.execute("ROLLBACK")
    pin.close()

    window = frames[m0:]
    commits = sum(1 for _, c in window if c)
    wal = collections.Counter()
    for page, _ in window:
        wal[names.get(page, "(other)")] += 1
    copied = checkpoint_copies(window, names, CHECKPOINT_FRAMES)

    frame = page_size + 24
    print(
        f"{n} deliveries in {commits} commits ({n / max(commits, 1):.1f} per commit), "
        f"{len(window)} WAL frames of {page_size} B ({len(window) / max(commits, 1):.1f} per commit)"
    )
    print(f"{'B-tree':<32} {'WAL B/dlv':>10} {'pages/commit':>13} {'ckpt B/dlv':>11} {'kept B/dlv':>11}")
    rows = sorted(set(wal) | set(copied), key=lambda k: -(wal[k] + copied[k]))
    for name in rows:
        print(
            f"{name:<32} {wal[name] * frame / n:>10.0f} {wal[name] / max(commits, 1):>13.1f} "
            f"{copied[name] * page_size / n:>11.0f} {kept[name] / max(total_deliveries, 1):>11.0f}"
        )
    w = len(window) * frame / n
    c = sum(copied.values()) * page_size / n
    k = sum(kept.values()) / max(total_deliveries, 1)
    print(f"{'total':<32} {w:>10.0f} {'':>13} {c:>11.0f} {k:>11.0f}")
    print(f"WAL + checkpoint every {CHECKPOINT_FRAMES} frames: {w + c:.0f} B per delivery")
    others = []
    for every in (CHECKPOINT_FRAMES * 4, CHECKPOINT_FRAMES * 16):
        copies = sum(checkpoint_copies(window, names, every).values()) * page_size / n
        others.append(f"every {every} frames {w + copies:.0f} B")
    print("with checkpoints " + ", ".join(others))


if __name__ == "__main__":
    main()
