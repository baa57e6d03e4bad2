#!/usr/bin/env bash
# `serve` over HTTP against the axum embedding example (examples/http_receiver.rs),
# in memory and on SQLite, with wrk -t2 -c64 (docs/BENCHMARKS.md, "serve over HTTP").
#
# Both servers get the same unique signed bodies (benches/serve-http/requests.py);
# the example ignores the signature headers, serve checks every one
# (Standard Webhooks, HMAC-SHA256). Each run starts a fresh process on a fresh
# store; ROUNDS rounds alternate the order of the pair. Needs wrk (Debian package)
# and python3; builds the release binary and the example first.
#
#   benches/serve-http/run.sh            # DURATION=10 ROUNDS=2 COUNT=700000 OBJECTS=10000
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
COUNT=${COUNT:-700000}
OBJECTS=${OBJECTS:-10000}
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
PORT=${PORT:-38180}

command -v wrk >/dev/null || { echo "wrk not found: apt-get install -y wrk" >&2; exit 1; }
cargo build --release --quiet -p snapshot-receiver-cli --bin snapshot-receiver
cargo build --release --quiet --example http_receiver
work=$(mktemp -d "$PWD/target/serve-http.XXXXXX")
trap 'rm -rf "$work"' EXIT

open_port() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

# run LABEL MODE: one fresh server, one wrk run; prints "LABEL MODE rate".
run() {
    local label=$1 mode=$2 store=() path
    python3 benches/serve-http/requests.py "$work" "$COUNT" "$OBJECTS" "$SECRET"
    rm -f "$work"/*.db*
    case $label in
        example)
            [ "$mode" = sqlite ] && store=(--store "sqlite:$work/inbox.db")
            target/release/examples/http_receiver --listen "127.0.0.1:$PORT" \
                --fixture "$work/objects.json" "${store[@]}" 2>"$work/server.log" &
            path=/deliveries ;;
        serve)
            if [ "$mode" = sqlite ]; then store=(--store "sqlite:$work/inbox.db"); else store=(--store memory); fi
            target/release/snapshot-receiver serve --listen "127.0.0.1:$PORT" \
                --initial "$work/objects.json" "${store[@]}" --webhook-secret "$SECRET" \
                >"$work/server.out" 2>"$work/server.log" &
            path=/events ;;
    esac
    local pid=$!
    for _ in $(seq 1 200); do open_port && break; sleep 0.05; done
    REQUESTS="$work/requests.tsv" THREADS=2 \
        wrk -t2 -c64 -d"${DURATION}s" --latency -s benches/serve-http/post.lua "http://127.0.0.1:$PORT$path" \
        >"$work/wrk.txt"
    kill -INT "$pid"; wait "$pid" || true
    local rate sent bad
    rate=$(awk '/^Requests\/sec:/ {print $2}' "$work/wrk.txt")
    sent=$(awk '/^requests / {print $2}' "$work/wrk.txt" | tr -d ,)
    bad=$(awk '/^requests / {print $4}' "$work/wrk.txt" | tr -d ,)
    if [ "$bad" != 0 ] || [ "$sent" -ge "$COUNT" ]; then
        echo "invalid run ($label $mode): $(cat "$work/wrk.txt")" >&2; exit 1
    fi
    printf '%-8s %-7s %10s req/s  (%s requests, latency p50/p99: %s)\n' "$label" "$mode" "$rate" "$sent" \
        "$(awk '/^ +50%/ {a=$2} /^ +99%/ {b=$2} END {print a "/" b}' "$work/wrk.txt")"
}

for round in $(seq 1 "$ROUNDS"); do
    echo "-- round $round"
    for mode in memory sqlite; do
        if [ $((round % 2)) = 1 ]; then run example "$mode"; run serve "$mode"
        else run serve "$mode"; run example "$mode"; fi
    done
done
