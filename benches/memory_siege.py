#!/usr/bin/env python3
"""Memory under large states: a `serve` process against N signed events, each
giving a different object a state of about 1 MiB, then (optionally) a
restart; prints the server's resident size before, at its peak and after.

Usage (from the repository's top folder, after a release build of the
`serve` feature; docs/BENCHMARKS.md, *Memory in bytes*, has the figures):

    python3 benches/memory_siege.py BINARY [--class large] [--events 3000]
        [--create] [--memory-budget 512MiB] [--restart]

`--class large` (the default) gives every event a state of about 1 MiB for
an object of its own: with `--create` the profile has
`create_on_first_snapshot`, so every event creates its object (the working
set fills); without it every object is unknown and every event is parked
(the waiting bodies fill). The small hostile classes send bodies of a few
hundred bytes: `unknown` (parked for unknown objects), and, on 100 objects
created first, `missing-version`, `bad-type` (an unsupported type),
`variant` (1,000 event ids each sent again with another state) and
`malformed` (not JSON). The resident size is read at every quarter of the
run, so a class that stays flat after warm-up shows it. The server
records in a SQLite file in a temporary folder that is removed at the end.
Only the Python standard library is used.
"""

import argparse
import base64
import hashlib
import hmac
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

SECRET = "whsec_" + base64.b64encode(b"memory-siege-secret-0123456789").decode()


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def sign(msg_id, ts, body):
    key = base64.b64decode(SECRET[len("whsec_"):])
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def start(binary, store, args):
    cmd = [binary, "serve", "--listen", "127.0.0.1:0", "--store", f"sqlite:{store}",
           "--shutdown-delay", "0"] + args
    env = dict(os.environ, SNAPSHOT_RECEIVER_WEBHOOK_SECRET=SECRET)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                            text=True)
    first = proc.stdout.readline().strip()
    addr = first.split()[-1].replace("http://", "").rstrip("/")
    host, port = addr.rsplit(":", 1)
    return proc, host, int(port)


def envelope(event_id, object_id, version, state, kind="card.snapshot"):
    e = {"event_id": event_id, "object_id": object_id,
         "occurred_at": "2099-01-01T00:00:00Z", "type": kind, "state": state}
    if version is not None:
        e["object_version"] = version
    return json.dumps(e).encode()


def body_of(cls, n, state_bytes):
    """The n-th body of a class, and the id it is signed under."""
    if cls == "large":
        return f"siege-{n}", envelope(f"siege-{n}", f"big-{n}", 1, {"pad": "x" * state_bytes})
    if cls == "unknown":
        return f"u-{n}", envelope(f"u-{n}", f"unknown-{n}", 1, {"n": n})
    if cls == "missing-version":
        return f"m-{n}", envelope(f"m-{n}", f"k-{n % 100}", None, {"n": n})
    if cls == "bad-type":
        return f"t-{n}", envelope(f"t-{n}", f"k-{n % 100}", 2, {"n": n}, "card.unknown")
    if cls == "variant":
        # 1,000 event ids: the first round records them, later ones are variants.
        return f"v-{n % 1000}", envelope(f"v-{n % 1000}", f"k-{n % 100}", 2, {"n": n})
    if cls == "malformed":
        return f"x-{n}", f"{{not json {n}".encode()
    raise SystemExit(f"unknown class {cls}")


def post(conn, cls, n, state_bytes):
    event_id, body = body_of(cls, n, state_bytes)
    return post_body(conn, event_id, body)


def post_body(conn, event_id, body):
    ts = str(int(time.time()))
    conn.request("POST", "/events", body, {
        "content-type": "application/json", "webhook-id": event_id,
        "webhook-timestamp": ts, "webhook-signature": sign(event_id, ts, body)})
    reply = conn.getresponse()
    reply.read()
    return reply.status


def main():
    p = argparse.ArgumentParser()
    p.add_argument("binary")
    p.add_argument("--class", dest="cls", default="large",
                   choices=["large", "unknown", "missing-version", "bad-type", "variant",
                            "malformed"])
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--state-bytes", type=int, default=1_040_000)
    p.add_argument("--memory-budget", default=None)
    p.add_argument("--create", action="store_true")
    p.add_argument("--restart", action="store_true")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "siege.db")
        args = []
        if a.memory_budget:
            args += ["--memory-budget", a.memory_budget]
        create = a.create or a.cls in ("missing-version", "bad-type", "variant", "malformed")
        if create:
            profile = os.path.join(tmp, "profile.json")
            with open(profile, "w") as f:
                json.dump({"name": "card-create", "event_id": "/event_id",
                           "object_id": "/object_id", "version": "/object_version",
                           "occurred_at": "/occurred_at", "type": "/type", "state": "/state",
                           "types": ["card.snapshot"], "create_on_first_snapshot": True}, f)
            args += ["--profile-file", profile]
        proc, host, port = start(a.binary, store, args)
        before = rss_kib(proc.pid)
        conn = http.client.HTTPConnection(host, port, timeout=60)
        if create and a.cls != "large":
            for k in range(100):
                post_body(conn, f"k-{k}", envelope(f"k-{k}", f"k-{k}", 1, {"k": k}))
        statuses = {}
        quarters = []
        t0 = time.time()
        for n in range(a.events):
            s = post(conn, a.cls, n, a.state_bytes)
            statuses[s] = statuses.get(s, 0) + 1
            if (n + 1) % max(1, a.events // 4) == 0:
                quarters.append(round(rss_kib(proc.pid) / 1024, 1))
        elapsed = time.time() - t0
        after = rss_kib(proc.pid)
        peak = rss_kib(proc.pid, "VmHWM")
        conn.close()
        proc.terminate()
        proc.wait(timeout=60)
        print(f"class {a.cls}: {a.events} events in {elapsed:.1f} s; "
              f"answers: {dict(sorted(statuses.items()))}")
        print(f"rss MiB at each quarter: {quarters}")
        print(f"rss MiB: start {before / 1024:.1f}, end {after / 1024:.1f}, "
              f"peak {peak / 1024:.1f}")
        if a.restart:
            proc, host, port = start(a.binary, store, args)
            time.sleep(1)
            print(f"restart rss MiB: {rss_kib(proc.pid) / 1024:.1f}, "
                  f"peak {rss_kib(proc.pid, 'VmHWM') / 1024:.1f}")
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
