#!/usr/bin/env bash
# Runs each cargo-fuzz (libFuzzer) target for a bounded time and prints what
# it found. Not part of CI (it needs cargo-fuzz); crashes found are kept as
# regression tests in the normal test suite instead.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     default: 60 s, all targets
#   MINIMIZE=1 fuzz/run.sh ...                       then minimize the corpus
#
# Needs: cargo install cargo-fuzz. The toolchain here is stable; cargo-fuzz
# passes nightly-only flags (-Zsanitizer=address), which RUSTC_BOOTSTRAP=1
# allows on a stable compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(envelope engine webhook)
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "cargo-fuzz not found: cargo install cargo-fuzz" >&2
    exit 1
fi
export RUSTC_BOOTSTRAP=1

found=0
summary=()
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
    log="fuzz/artifacts/$target.log"
    dict=()
    if [ -f "fuzz/$target.dict" ]; then
        dict=("-dict=fuzz/$target.dict")
    fi
    before=$(find "fuzz/artifacts/$target" -type f | wc -l)
    start=$(date +%s)
    echo "==> $target: fuzzing for ${seconds}s (log: $log)"
    status=0
    # -timeout: one input taking over 10 s is a finding (no unbounded work);
    # -rss_limit_mb: so is one going over 2 GiB (no unbounded allocation).
    cargo fuzz run "$target" -- -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "${dict[@]}" >"$log" 2>&1 || status=$?
    elapsed=$(( $(date +%s) - start ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    corpus=$(find "fuzz/corpus/$target" -type f | wc -l)
    new=$(( $(find "fuzz/artifacts/$target" -type f | wc -l) - before ))
    if [ "$status" -ne 0 ] || [ "$new" -ne 0 ]; then
        found=1
        result="FOUND (exit $status): $(ls "fuzz/artifacts/$target" | tr '\n' ' ')"
        grep -m1 -A4 -E "panicked|ERROR: libFuzzer|SUMMARY" "$log" || true
    else
        result="nothing found"
    fi
    line="$target: ${elapsed}s, ${runs:-?} executions, corpus ${corpus} inputs: $result"
    echo "$line"
    summary+=("$line")
    if [ "${MINIMIZE:-0}" = 1 ]; then
        echo "==> $target: minimizing the corpus"
        cargo fuzz cmin "$target" >>"$log" 2>&1
        echo "$target: corpus minimized to $(find "fuzz/corpus/$target" -type f | wc -l) inputs"
    fi
done

echo
echo "== fuzz summary =="
printf '%s\n' "${summary[@]}"
exit "$found"
