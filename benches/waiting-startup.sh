#!/usr/bin/env bash
# The start-up on many waiting bodies of docs/BENCHMARKS.md (release build,
# every feature): `fill` writes HELD held events of BYTES bytes each on
# 1,000 paused objects into a new SQLite file, then `serve` starts on it:
# the time from its start to its first 200 on /readyz, its peak resident
# size (VmHWM) and the waiting part it reports at /metrics; then one
# authority for obj-0 (its held bodies read back and decided again) and
# the time of that answer.
#
#   bash benches/waiting-startup.sh                  # about a minute
#   HELD=1000000 BYTES=250 bash benches/waiting-startup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
held=${HELD:-100000}
bytes=${BYTES:-1000}
port=${PORT:-18931}
token=waiting-startup-token
cargo build --release --locked --quiet -p snapshot-receiver-cli --features full
bin=${CARGO_TARGET_DIR:-target}/release/snapshot-receiver
dir=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

"$bin" fill --store "sqlite:$dir/held.db" --objects 1000 --receipts 0 \
  --held "$held" --held-bytes "$bytes"
echo "store: $(du -sh "$dir" | cut -f1)"

start=$(date +%s%N)
SNAPSHOT_RECEIVER_OPERATOR_TOKEN=$token "$bin" serve --store "sqlite:$dir/held.db" \
  --listen "127.0.0.1:$port" > "$dir/serve.out" 2> "$dir/serve.err" &
pid=$!
until curl -fs "http://127.0.0.1:$port/readyz" > /dev/null 2>&1; do
  kill -0 "$pid" 2> /dev/null || { cat "$dir/serve.err"; exit 1; }
  sleep 0.005
done
ready=$(( ($(date +%s%N) - start) / 1000000 ))
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
waiting=$(curl -fs "http://127.0.0.1:$port/metrics" |
  awk '/^snapshot_receiver_memory_bytes\{.*part="waiting".*kind="used"/ {print $2}')
echo "ready after ${ready} ms, peak resident $(( hwm / 1024 )) MiB, waiting part ${waiting} bytes"

t0=$(date +%s%N)
curl -fs -X POST "http://127.0.0.1:$port/reconcile" \
  -H "Authorization: Bearer $token" -H 'content-type: application/json' \
  -d '{"object_id":"obj-0","version":1,"state":{"v":1}}' > "$dir/reconcile.json"
took=$(( ($(date +%s%N) - t0) / 1000000 ))
decided=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print(len(r.get("reevaluated", r.get("held", []))))' "$dir/reconcile.json")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
echo "obj-0 reconciled in ${took} ms: ${decided} held events decided again; peak resident $(( hwm / 1024 )) MiB"
