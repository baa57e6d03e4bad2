#!/usr/bin/env bash
# Every load-test measurement of docs/BENCHMARKS.md, in one go, on the
# machine at hand (about 10 minutes on 2 cores). Ratios are always taken
# within one `loadtest --target compare` process, round by round.
#
#   bash benches/run-all.sh              # 2,000,000 deliveries per run
#   DELIVERIES=500000 bash benches/run-all.sh
#
# The criterion benches are separate: `cargo bench --bench receiver`.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${DELIVERIES:-2000000}
cargo build --release --quiet --bin snapshot-receiver --example memory
bin=target/release/snapshot-receiver

echo "== machine"
nproc
uptime

echo "== closed loop: engine vs mutex vs receiver, same stream, 3 rounds each"
for producers in 4 16; do
  for batch in 1 64; do
    "$bin" loadtest --target compare --deliveries "$n" --producers "$producers" --batch "$batch" --rounds 3
  done
done

echo "== open loop at half the receiver's closed-loop rate (4 producers), batch 64 and batch 1"
for batch in 64 1; do
  max=$("$bin" loadtest --deliveries "$n" --batch "$batch" --format json |
    grep -o '"deliveries_per_s":[0-9.]*' | cut -d: -f2)
  half=$(awk -v m="$max" 'BEGIN { printf "%d", m / 2 }')
  echo "-- batch $batch: closed-loop maximum just measured $(awk -v m="$max" 'BEGIN { printf "%d", m }')/s; open loop at $half/s"
  "$bin" loadtest --deliveries "$n" --batch "$batch" --rate "$half"
done

echo "== cost growth: 1 k, 100 k and 1 M objects (receiver, 4 producers, batch 64)"
for objects in 1000 100000 1000000; do
  "$bin" loadtest --objects "$objects" --deliveries "$n" --batch 64 | grep -E '^(stream|throughput|check)'
done

echo "== durable path: 1,000 objects, 50,000 deliveries, 64 producers; in memory, SQLite (synchronous=FULL), PostgreSQL"
pg=${SNAPSHOT_RECEIVER_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
durable="--objects 1000 --deliveries 50000 --producers 64"
for batch in 1 64; do
  "$bin" loadtest $durable --batch "$batch" | grep -E '^(target|throughput|check)'
  dir=$(mktemp -d)
  "$bin" loadtest $durable --batch "$batch" --store "sqlite:$dir/lt.db" |
    grep -E '^(target|throughput|store|  CPU|check)'
  rm -rf "$dir"
  if command -v psql >/dev/null && psql "$pg" -qc 'SELECT 1' >/dev/null 2>&1; then
    # loadtest needs an empty store: a database of its own for each run.
    db="loadtest_$$_$batch"
    psql "$pg" -qc "CREATE DATABASE $db"
    "$bin" loadtest $durable --batch "$batch" --store "${pg%/*}/$db" |
      grep -E '^(target|throughput|store|  CPU|check)'
    psql "$pg" -qc "DROP DATABASE $db"
  else
    echo "-- PostgreSQL not reachable at $pg (set SNAPSHOT_RECEIVER_PG_URL): skipped"
  fi
done

echo "== memory per idle object and per remembered identity, 1,000,000 each"
target/release/examples/memory 1000000
