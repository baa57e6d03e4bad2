#!/usr/bin/env bash
# The relay measurements of docs/BENCHMARKS.md ("Effects leave once"), in
# one sitting, with `loadtest --relay` (release build, every feature):
#   1. what a running relay costs ingest: SQLite, batch 64, 64 producers,
#      without and with a relay (an in-process handler), in alternating
#      pairs; the ratio of each pair and their median;
#   2. forwarding rates on a catch-up over a filled outbox: HTTP to a sink
#      on loopback, and JetStream (skipped when NATS does not answer);
#   3. open loop at 1,000 deliveries/s with the HTTP relay: the time from a
#      delivery's answer to its effect's 2xx at the sink (p50, p99, max);
#   3b. the same at 10,000 deliveries/s for 30 s, with the in-process
#      handler and with the HTTP relay: whether the relay keeps up (the
#      rate reached, p99 answer to arrival against 100 ms), and the
#      sink's and the relay's CPU apart (the loopback sink runs in the
#      same process: the handler run is the relay without it);
#   4. the relay users write by hand (a step-number cursor, polled every
#      millisecond) beside ours, under the ingest of 1.: what each missed,
#      and its rate.
#
#   bash benches/relay.sh                 # about 10 minutes on 2 cores
#   PAIRS=5 DELIVERIES=200000 bash benches/relay.sh
#   BIN=path/to/snapshot-receiver bash benches/relay.sh   # a binary built before
#   ONLY=1 bash benches/relay.sh          # the pairs of 1. alone
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${PAIRS:-8}
n=${DELIVERIES:-100000}
nats=${SNAPSHOT_RECEIVER_NATS_URL:-nats://127.0.0.1:4222}
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked --quiet -p snapshot-receiver-cli --features full
fi
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/snapshot-receiver}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# One run of DELIVERIES on a new SQLite file; prints its JSON report.
run() {
  local deliveries=$1
  shift
  rm -f "$dir"/lt.db*
  "$bin" loadtest --objects 10000 --deliveries "$deliveries" --store "sqlite:$dir/lt.db" \
    --format json "$@"
}
# A field of a report: the path after the JSON, e.g. load.deliveries_per_s.
field() {
  python3 -c 'import json, sys
d = json.loads(sys.argv[1])
for k in sys.argv[2].split("."):
    d = d[k] if not k.isdigit() else d[int(k)]
print(d)' "$1" "$2"
}

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== 1. ingest without and with a relay (SQLite, batch 64, 64 producers, $n deliveries), $pairs pairs"
ratios=()
cpus=()
for i in $(seq "$pairs"); do
  without=$(run "$n" --producers 64 --batch 64)
  with=$(run "$n" --producers 64 --batch 64 --relay handler)
  a=$(field "$without" deliveries_per_s)
  b=$(field "$with" load.deliveries_per_s)
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')
  ca=$(field "$without" cpu_us_per_delivery)
  cb=$(field "$with" load.cpu_us_per_delivery)
  c=$(awk -v a="$ca" -v b="$cb" 'BEGIN { printf "%.3f", b / a }')
  ratios+=("$r")
  cpus+=("$c")
  echo "pair $i (load $(cut -d' ' -f1 /proc/loadavg)): without $(printf '%.0f' "$a")/s $ca us CPU" \
    "per delivery, with $(printf '%.0f' "$b")/s $cb us; with/without: rate $r, CPU $c;" \
    "relay: $(field "$with" relay.effects) effects, $(field "$with" relay.missed) missed," \
    "drained $(field "$with" relay.drain_seconds) s after the last answer"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
echo "median with/without: $median (the relay costs $(awk -v m="$median" 'BEGIN { printf "%.1f", (1 - m) * 100 }') % of ingest)"
echo "median CPU per delivery with/without: $(printf '%s\n' "${cpus[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')"
echo "spread with/without: rate $(printf '%s\n' "${ratios[@]}" | sort -n | sed -n '1p;$p' | paste -sd- ), CPU $(printf '%s\n' "${cpus[@]}" | sort -n | sed -n '1p;$p' | paste -sd- )"
[ -n "${ONLY:-}" ] && exit 0

echo "== 2. catch-up over the outbox of $n deliveries"
out=$(run "$n" --producers 64 --batch 64 --relay http --relay-catch-up)
echo "http: $(field "$out" relay.effects) effects in $(field "$out" relay.seconds) s:" \
  "$(printf '%.0f' "$(field "$out" relay.effects_per_s)") effects/s, $(field "$out" relay.missed) missed"
if "$bin" loadtest --objects 10 --deliveries 20 --store "sqlite:$dir/probe.db" \
     --relay jetstream --relay-nats "$nats" >/dev/null 2>&1; then
  out=$(run "$n" --producers 64 --batch 64 --relay jetstream --relay-catch-up --relay-nats "$nats")
  echo "jetstream: $(field "$out" relay.effects) effects in $(field "$out" relay.seconds) s:" \
    "$(printf '%.0f' "$(field "$out" relay.effects_per_s)") effects/s, $(field "$out" relay.missed) missed"
else
  echo "jetstream: skipped, no JetStream at $nats"
fi

echo "== 3. open loop at 1,000 deliveries/s for 30 s, HTTP relay"
out=$(run 30000 --producers 16 --batch 1 --rate 1000 --relay http)
echo "answer to arrival at the sink (ms): p50 $(field "$out" relay.answer_to_arrival_ms.0)," \
  "p99 $(field "$out" relay.answer_to_arrival_ms.1), max $(field "$out" relay.answer_to_arrival_ms.2);" \
  "$(field "$out" relay.missed) missed; acknowledgement p99 $(field "$out" load.latency_ns.p99) ns"

echo "== 3b. open loop at 10,000 deliveries/s for 30 s: the relay's ceiling under ingest"
for kind in handler http; do
  out=$(run 300000 --producers 64 --batch 1 --rate 10000 --relay "$kind")
  echo "$kind: $(printf '%.0f' "$(field "$out" load.deliveries_per_s)") deliveries/s reached," \
    "$(printf '%.1f' "$(field "$out" load.cpu_us_per_delivery)") us CPU per delivery;" \
    "answer to arrival (ms): p50 $(field "$out" relay.answer_to_arrival_ms.0)," \
    "p99 $(field "$out" relay.answer_to_arrival_ms.1), max $(field "$out" relay.answer_to_arrival_ms.2);" \
    "$(field "$out" relay.missed) missed, drained $(field "$out" relay.drain_seconds) s after the last answer"
done

echo "== 4. the hand-written relay (step-number cursor) beside ours, ingest as in 1."
for kind in poll handler; do
  out=$(run "$n" --producers 64 --batch 64 --relay "$kind")
  echo "$kind: $(field "$out" relay.effects) effects, $(field "$out" relay.missed) missed," \
    "$(printf '%.0f' "$(field "$out" relay.effects_per_s)") effects/s while ingesting" \
    "$(printf '%.0f' "$(field "$out" load.deliveries_per_s)") deliveries/s"
done
