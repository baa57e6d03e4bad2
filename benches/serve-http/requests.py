#!/usr/bin/env python3
"""Writes the request file and the objects fixture for benches/serve-http/run.sh.

usage: requests.py OUT_DIR COUNT OBJECTS SECRET

- OUT_DIR/objects.json: a fixture whose initial_state has obj-0 .. obj-(OBJECTS-1)
  at version 0 (so every event names a known object);
- OUT_DIR/requests.tsv: COUNT lines `webhook-id TAB webhook-timestamp TAB
  webhook-signature TAB body`, one unique card.snapshot event each (event i
  names obj-(i % OBJECTS) at version i // OBJECTS + 1), signed now with
  SECRET (Standard Webhooks: HMAC-SHA256 over `id.timestamp.body`, keyed
  with the base64-decoded part of `whsec_...`).
"""
import base64
import hashlib
import hmac
import json
import sys
import time

out, count, objects, secret = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
key = base64.b64decode(secret.removeprefix("whsec_"))
with open(f"{out}/objects.json", "w") as f:
    json.dump({"initial_state": {f"obj-{o}": {"version": 0, "state": {}} for o in range(objects)},
               "deliveries": []}, f)
ts = str(int(time.time()))
with open(f"{out}/requests.tsv", "w") as f:
    for i in range(count):
        o, v = i % objects, i // objects + 1
        body = ('{"event_id":"ev-%d","object_id":"obj-%d","object_version":%d,'
                '"type":"card.snapshot","state":{"stage":"s%d","label":"bench %d"}}' % (i, o, v, v, i))
        mid = f"msg_{i}"
        tag = hmac.new(key, f"{mid}.{ts}.{body}".encode(), hashlib.sha256).digest()
        f.write(f"{mid}\t{ts}\tv1,{base64.b64encode(tag).decode()}\t{body}\n")
