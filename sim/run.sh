#!/usr/bin/env bash
# Runs the cluster simulation (sim/, docs/TESTING.md, "The cluster
# simulation"), in release mode:
#   1. a fixed range of seeds (10,000 unless --seeds N) on the shipped rules:
#      every seed must hold every invariant;
#   2. the must-fail controls (ack-before-commit, fence-ignores-revision,
#      redelivery-without-receipt, no-takeover-gate, pause-after-answer,
#      relay-cursor-before-handler, relay-reads-by-step-number,
#      rewind-drops-parked, waiting-head-blocks, renewal-once-per-lease,
#      takeover-keeps-generation, retry-keeps-attempts,
#      stale-authority-applied, wrong-object-applied, reconciler-skips-store,
#      reconciler-on-wall-clock): each must be caught
#      within the same number of seeds; a control that passes fails the run;
#      the reconciler's four are also replayed at their pinned seeds (the
#      seeds sim/tests/sim.rs pins), each of which must fail;
#   3. seed 288 under a control, and seeds 1 to 300, run by two separate
#      processes: the traces must be the same byte for byte (a run depends
#      on nothing but its seed).
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

# The same seeds in two processes (each with its own hash seeds): the same
# traces, the control's failing seed among them.
first="$(mktemp)"
second="$(mktemp)"
trap 'rm -f "${first}" "${second}"' EXIT
# The reconciler's controls at their pinned seeds: each must fail there.
for pinned in stale-authority-applied:1 wrong-object-applied:1 reconciler-skips-store:1 \
    reconciler-on-wall-clock:19; do
    control="${pinned%:*}"
    seed="${pinned#*:}"
    if "${sim}" --seed "${seed}" --control "${control}" >"${first}"; then
        echo "== cluster simulation: control ${control} held at its pinned seed ${seed}" >&2
        exit 1
    fi
done
echo "== cluster simulation: the reconciler's controls fail at their pinned seeds"
"${sim}" --seed 288 --control fence-ignores-revision >"${first}" || true
"${sim}" --seed 288 --control fence-ignores-revision >"${second}" || true
if ! grep -q '^replayed: the same trace$' "${first}" || ! cmp -s "${first}" "${second}"; then
    echo "== cluster simulation: seed 288 did not replay the same trace in two processes" >&2
    diff "${first}" "${second}" | head -n 20 >&2 || true
    exit 1
fi
"${sim}" --trace-digest --seeds 300 >"${first}"
"${sim}" --trace-digest --seeds 300 >"${second}"
if ! cmp -s "${first}" "${second}"; then
    echo "== cluster simulation: seeds 1 to 300 gave other traces in another process:" >&2
    cat "${first}" "${second}" >&2
    exit 1
fi
echo "== cluster simulation: replayed bit for bit by two processes: seed 288 (fence-ignores-revision), $(cat "${first}")"
