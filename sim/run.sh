#!/usr/bin/env bash
# Runs the cluster simulation (sim/, docs/TESTING.md, "The cluster
# simulation"), in release mode:
#   1. a fixed range of seeds (10,000 unless --seeds N) on the shipped rules:
#      every seed must hold every invariant;
#   2. the must-fail controls (ack-before-commit, fence-ignores-revision,
#      redelivery-without-receipt, no-takeover-gate): each must be caught
#      within the same number of seeds; a control that passes fails the run;
#   3. one seed run by two separate processes: the traces must be the same
#      byte for byte (the run depends on nothing but the seed).
# Prints the seeds run and their time, the faults injected by kind, any
# failing seed (with the trace of the first), and the seed that caught each
# control. Arguments go to the simulator: --seeds N, --from S,
# --control-budget N; `bash sim/run.sh --seeds 1000000` is the long run
# before a release.
set -euo pipefail

cd "$(dirname "$0")/.."
target_root="${CARGO_TARGET_DIR:-$PWD/target}"

since() {
    awk -v a="$1" -v b="${EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'
}

start=${EPOCHREALTIME}
cargo build --release --locked --quiet -p snapshot-receiver-sim
echo "== cluster simulation: build $(since "${start}") s"
sim="${target_root}/release/snapshot-receiver-sim"

start=${EPOCHREALTIME}
"${sim}" "$@"
echo "== cluster simulation: seeds and controls $(since "${start}") s"

# The same seed in two processes (each with its own hash seeds): one trace.
first="$(mktemp)"
second="$(mktemp)"
trap 'rm -f "${first}" "${second}"' EXIT
"${sim}" --seed 27 --control fence-ignores-revision >"${first}" || true
"${sim}" --seed 27 --control fence-ignores-revision >"${second}" || true
if ! grep -q '^replayed: the same trace$' "${first}" || ! cmp -s "${first}" "${second}"; then
    echo "== cluster simulation: seed 27 did not replay the same trace in two processes" >&2
    diff "${first}" "${second}" | head -n 20 >&2 || true
    exit 1
fi
echo "== cluster simulation: seed 27 replayed bit for bit by two processes ($(grep -c '' "${first}") lines of output)"
