#!/usr/bin/env python3
"""Writes a replay fixture of N deliveries with ~250-byte bodies, for
measuring a store's bytes per delivery (docs/BENCHMARKS.md, *Store size*).

    python3 benches/store-size/stream.py 100000 > /tmp/stream.json
    snapshot-receiver replay /tmp/stream.json --store sqlite:/tmp/s.db \
        --now 2024-01-02T00:00:00Z > /dev/null
    # bytes per delivery = size of /tmp/s.db / N

The stream: 1,000 cards known at version 0; 70 % of the deliveries are new
events (each the next version of a random card, placed up to 64 positions
from its natural place, so some arrive late and are stale), 15 % exact
redeliveries of an earlier event and 15 % redeliveries re-encoded with other
spacing (the loadtest's default duplicate rate, 30 %). Seeded: the same N
gives the same bytes.
"""
import json
import random
import sys

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
OBJECTS = 1000
BODY = 250
rng = random.Random(1)
version = [0] * OBJECTS
events = []  # (sort key, body text)
distinct = []
new = N - 2 * (N * 15 // 100)
for i in range(new):
    o = rng.randrange(OBJECTS)
    version[o] += 1
    v = version[o]
    head = {
        "event_id": f"e-{o}-{v}",
        "object_id": f"card-{o}",
        "object_version": v,
        "occurred_at": "2024-01-01T12:00:00Z",
        "type": "card.snapshot",
    }
    state = {"stage": rng.choice(["queued", "ready", "review", "done"]), "label": f"card-{o}"}
    skeleton = json.dumps({**head, "state": {**state, "pad": ""}}, separators=(",", ":"))
    pad = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(max(0, BODY - len(skeleton))))
    doc = {**head, "state": {**state, "pad": pad}}
    key = i + rng.uniform(-64, 64)
    distinct.append((key, doc))
    events.append((key, json.dumps(doc, separators=(",", ":"))))
for j in range(N - new):
    key, doc = distinct[rng.randrange(len(distinct))]
    later = key + rng.uniform(1, 200)
    if j % 2 == 0:
        events.append((later, json.dumps(doc, separators=(",", ":"))))
    else:
        events.append((later, json.dumps(doc, separators=(", ", ": "))))
events.sort(key=lambda e: e[0])
out = sys.stdout
out.write('{"profile":"card","initial_state":{')
out.write(",".join(f'"card-{o}":{{"version":0,"state":{{"stage":"new"}}}}' for o in range(OBJECTS)))
out.write('},"deliveries":[\n')
out.write(",\n".join('{"raw":' + json.dumps(body) + "}" for _, body in events))
out.write("\n]}\n")
