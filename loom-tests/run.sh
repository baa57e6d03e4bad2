#!/usr/bin/env bash
# Runs the loom suite twice, in release mode:
#   1. the models on the shipped registry and actor code
#      (--cfg snapshot_receiver_loom): every model must pass;
#   2. the same models on a deliberately racy registry
#      (--cfg snapshot_receiver_loom_broken as well): the models that rest on
#      the registry's atomic first insert must fail (#[should_panic]), the
#      others must still pass.
# A cfg reaches every crate of a build, so each run has its own target
# directory; the two builds then never evict each other.
#
# Every model explores all its interleavings except model 3 (three threads,
# 1.5 million interleavings in full) and model 11 (two shards publishing
# effects while a relay reads the outbox), which use the preemption bound below,
# and models 7 (the pipelined commit failure), 8 (an eviction while a
# delivery waits) and 9 (an evicted identity's duplicate racing a delivery
# of it on another shard, with and without a filter of stored identities:
# 9 and 9f), which fix their own bound (3, 3 and 4). Models 8, 9 and 9f
# have a must-fail control too (8c, 9c: eviction before the commit; 9g: the
# filter told of an eviction after the record left memory).
# Model 9 runs in the racy-registry run as well, where it must fail (two
# shards claim one identity); model 8 (one shard) and the controls do not.
# The first run also has the acknowledgement controls: model 7 with the
# shipped pipeline's test-only knob set so that it answers duplicates before
# their commit (7c), or answers the steps decided on top of a failed group
# as decided (7d), must fail (#[should_panic]), and so must model 10's
# control (10c: a variant's pause of another shard's object committed after
# the variant's answer; model 10 itself is exhaustive), and model 11's
# (11c: effects numbered by their step number, taken at decision time, as
# before outbox positions: a relay misses one), and model 12's (12c: a
# shard's driver stops at shutdown before the others went quiet, so a
# variant's pause queued for it later is never run; model 12 is exhaustive).
# Prints one line per model ("loom model ...": the interleavings explored,
# the bound, the time) and the time of each run.
set -euo pipefail

cd "$(dirname "$0")/.."

# Preemption bound of the bounded model (3, the variant pause race): 5
# explores 464,193 of its interleavings (times: README.md, *Model checking
# with loom*). The other models
# ignore it (exhaustive). Never set LOOM_EXHAUSTIVE here: that is the deep run.
export LOOM_MAX_PREEMPTIONS=5
unset LOOM_EXHAUSTIVE
target_root="${CARGO_TARGET_DIR:-$PWD/target}"
unset CARGO_TARGET_DIR

# The tests each run must pass, by the name `cargo test` prints ("test NAME
# ... ok", "test NAME - should panic ... ok"). A run that passes fewer or
# other tests fails the script: a lost cfg flag compiles no model at all
# (zero tests pass, which cargo calls a success), and a lost
# snapshot_receiver_loom_broken flag runs the shipped models instead of the
# must-fail controls.
shipped_models=(
    "cross_pause::control_pause_committed_after_the_variants_answer_is_caught - should panic"
    "cross_pause::variant_pauses_another_shards_object_while_it_decides"
    "duplicate::duplicate_routed"
    "duplicate::duplicate_two_actors"
    "eviction::control_eviction_before_the_commit_is_caught - should panic"
    "eviction::object_evicted_while_a_later_delivery_waits"
    "identities::control_identity_evicted_before_its_commit_is_caught - should panic"
    "identities::control_filter_told_after_the_eviction_is_caught - should panic"
    "identities::evicted_duplicate_races_a_delivery_on_another_shard"
    "identities::evicted_duplicate_races_a_delivery_on_another_shard_with_a_filter"
    "outbox::control_numbered_at_decision_time_is_caught - should panic"
    "outbox::two_shards_publish_while_a_relay_reads"
    "pause_race::variant_pause_race"
    "pipeline::control_duplicate_answered_before_its_commit_is_caught - should panic"
    "pipeline::control_step_on_top_of_a_failed_group_answered_is_caught - should panic"
    "pipeline::pipelined_commit_fails_under_a_later_step"
    "purge::purge_vs_redelivery"
    "reconcile::reconcile_vs_held_delivery"
    "shutdown::a_variant_pauses_an_object_of_a_shard_waiting_to_stop"
    "shutdown::control_a_driver_stopping_before_the_others_went_quiet_is_caught - should panic"
    "variant::variant_other_object"
    "variant::variant_resent_routed"
    "variant::variant_resent_two_actors"
    "variant::variant_same_object"
    "versions::versions_7_and_8"
)
racy_models=(
    "broken::duplicate_routed_holds_with_racy_registry"
    "broken::duplicate_two_actors_fails_with_racy_registry - should panic"
    "broken::evicted_duplicate_fails_with_racy_registry - should panic"
    "broken::pipelined_commit_failure_holds_with_racy_registry"
    "broken::purge_vs_redelivery_holds_with_racy_registry"
    "broken::reconcile_vs_held_delivery_holds_with_racy_registry"
    "broken::variant_other_object_fails_with_racy_registry - should panic"
    "broken::variant_pause_race_fails_with_racy_registry - should panic"
    "broken::variant_resent_routed_holds_with_racy_registry"
    "broken::variant_resent_two_actors_fails_with_racy_registry - should panic"
    "broken::variant_same_object_holds_with_racy_registry"
    "broken::versions_7_and_8_hold_with_racy_registry"
)

# The names of the tests a `cargo test --nocapture` log says passed. With
# --nocapture a test's own output lands between "test NAME ... " and its
# "ok", so the verdict may be on a later line.
passed_tests() {
    awk '
        /^test .* \.\.\. / {
            line = $0
            sub(/^test /, "", line)
            i = index(line, " ... ")
            pending = substr(line, 1, i - 1)
            if (substr(line, i + 5) == "ok") { print pending; pending = "" }
            next
        }
        /^ok$/ && pending != "" { print pending; pending = "" }
    ' "$1"
}

# Fails unless the tests that passed in log $1 are exactly the names that
# follow it.
check_passed() {
    local log="$1"
    shift
    local expected got
    expected="$(printf '%s\n' "$@" | sort)"
    got="$(passed_tests "${log}" | sort)"
    if [[ "${got}" != "${expected}" ]]; then
        echo "   expected exactly these $# tests to pass:"
        printf '     %s\n' "$@"
        echo "   passed ($(printf '%s' "${got}" | grep -c '' || true)):"
        printf '%s\n' "${got}" | sed '/^$/d; s/^/     /'
        return 1
    fi
    echo "   tests passed: $# of $# expected"
}

# Seconds elapsed since a ${EPOCHREALTIME} reading (bash 5), one decimal.
since() {
    awk -v a="$1" -v b="${EPOCHREALTIME}" 'BEGIN { printf "%.1f", b - a }'
}

run() {
    local name="$1" flags="$2" target="$3"
    shift 3
    local log start
    log="$(mktemp)"
    echo "== loom suite: ${name}"
    echo "   RUSTFLAGS=\"${flags}\" LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS}"
    echo "   CARGO_TARGET_DIR=${target} cargo test --release -p loom-tests -- --test-threads=1 --nocapture"
    start=${EPOCHREALTIME}
    # The build is timed apart from the models, so the models' time does not
    # depend on whether the dependencies were already built.
    RUSTFLAGS="${flags}" CARGO_TARGET_DIR="${target}" \
        cargo test --release -p loom-tests --no-run --quiet
    echo "   build: $(since "${start}") s"
    start=${EPOCHREALTIME}
    # One test thread: the per-model times are then the models' own.
    if ! RUSTFLAGS="${flags}" CARGO_TARGET_DIR="${target}" \
        cargo test --release -p loom-tests -- --test-threads=1 --nocapture \
        >"${log}" 2>&1; then
        cat "${log}"
        rm -f "${log}"
        echo "== loom suite ${name}: FAILED"
        return 1
    fi
    grep -oE 'loom model .*' "${log}" | sed 's/^/   /' || true
    grep -E '^test result: ' "${log}" | grep -v ' 0 passed; 0 failed' | sed 's/^/   /' || true
    if ! check_passed "${log}" "$@"; then
        rm -f "${log}"
        echo "== loom suite ${name}: FAILED (not the expected tests)"
        return 1
    fi
    rm -f "${log}"
    echo "   models: $(since "${start}") s"
}

total_start=${EPOCHREALTIME}
run "shipped registry" \
    "--cfg snapshot_receiver_loom" \
    "${target_root}/loom" \
    "${shipped_models[@]}"
run "racy registry (must be caught)" \
    "--cfg snapshot_receiver_loom --cfg snapshot_receiver_loom_broken" \
    "${target_root}/loom-broken" \
    "${racy_models[@]}"
echo "== loom suite: both runs passed in $(since "${total_start}") s (builds included)"
