#!/usr/bin/env bash
# The durable path's rows written to SQLite (as the receiver's store writes
# them) and to fjall, an embedded log-structured store: bytes written and
# kept per delivery, rate and CPU (docs/BENCHMARKS.md, "Bytes written per
# delivery"). Its own workspace: the main build never compiles fjall.
#
#   bash benches/lsm-probe/run.sh          # about 15 minutes on 2 cores
#   LOADS="1000/200000/1234" PADS=x bash benches/lsm-probe/run.sh
#   target/release/snapshot-receiver-lsm-probe memtable NEW_DIR 16 0
#     (after a run: a memtable's resident bytes per byte fjall counts, for
#     16-byte keys without values; the receiver's MEMTABLE_COST)
#
# A load is objects/deliveries/group: the group is the deliveries per
# commit the receiver's own store reached at that load (`loadtest --store`'s
# `store:` line, mean), 64 producers, batch 64.
set -euo pipefail
cd "$(dirname "$0")"
loads=${LOADS:-1000/200000/1234 1000000/2000000/806}
pads=${PADS:-x random}
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release --locked --quiet
bin=${CARGO_TARGET_DIR:-target}/release/snapshot-receiver-lsm-probe
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for load in $loads; do
  IFS=/ read -r objects deliveries group <<<"$load"
  for pad in $pads; do
    for engine in sqlite fjall; do
      "$bin" "$engine" "$dir/$engine" --objects "$objects" --deliveries "$deliveries" \
        --group "$group" --pad "$pad"
      rm -rf "${dir:?}/$engine"
    done
  done
done
