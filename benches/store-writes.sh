#!/usr/bin/env bash
# Bytes written per delivery on SQLite (docs/BENCHMARKS.md, "Bytes written
# per delivery"), release build, 64 producers, batch 64:
#   1. for each load (objects / deliveries), PAIRS runs of `loadtest` on a
#      new file: its `disk:` line (write_bytes of /proc/self/io during the
#      run, the store's size at its end) beside throughput and CPU;
#   2. one more run per load under benches/store-writes/breakdown.py: the
#      WAL bytes, pages per commit, checkpoint copies and kept bytes of
#      each table and index (SQLite's dbstat), per delivery.
#
#   bash benches/store-writes.sh                      # several minutes on 2 cores
#   LOADS="1000/200000 1000000/2000000" PAIRS=2 bash benches/store-writes.sh
#   PAIRS runs are of one build: to compare two, run each build's binary in turn.
set -euo pipefail
cd "$(dirname "$0")/.."
loads=${LOADS:-1000/200000 100000/200000}
pairs=${PAIRS:-1}
cargo build --release --locked --quiet -p snapshot-receiver-cli --features full
bin=${CARGO_TARGET_DIR:-target}/release/snapshot-receiver
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for load in $loads; do
  objects=${load%/*}
  deliveries=${load#*/}
  args=(--objects "$objects" --deliveries "$deliveries" --producers 64 --batch 64)
  echo "== $objects objects / $deliveries deliveries"
  for i in $(seq "$pairs"); do
    rm -f "$dir"/lt.db*
    "$bin" loadtest "${args[@]}" --store "sqlite:$dir/lt.db" |
      grep -E '^(throughput|  disk|check)' | sed "s/^/run $i: /"
  done
  rm -f "$dir"/lt.db*
  python3 benches/store-writes/breakdown.py "$bin" "$dir/lt.db" -- "${args[@]}"
done
