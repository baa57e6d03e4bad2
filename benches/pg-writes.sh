#!/usr/bin/env bash
# PostgreSQL: rows and WAL bytes per delivery, and one call per delivery
# against a hand-written one-transaction inbox (docs/BENCHMARKS.md, "Bytes
# written per delivery"), release build, 64 producers / connections:
#   1. `loadtest --store postgres://...` on an empty database, batch 64 and
#      one call per delivery: rows inserted, updated and deleted
#      (pg_stat_user_tables, the seeded objects taken off) and WAL bytes
#      (pg_stat_wal, the whole server's: run it on a quiet server) per
#      delivery;
#   2. PAIRS pairs of pgbench running benches/pg-writes/inbox.sql (a unique
#      insert and a conditional update in one transaction per delivery) for
#      SECONDS, then `loadtest --batch 1` on the same objects: the ratio of
#      the two rates, and pgbench's own WAL bytes per transaction.
#
#   bash benches/pg-writes.sh                     # about 3 minutes
#   PAIRS=4 OBJECTS=1000 DELIVERIES=100000 PG="-h 127.0.0.1 -U postgres" bash benches/pg-writes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pg=${PG:--h 127.0.0.1 -U postgres}
url=${PG_URL:-postgres://postgres@127.0.0.1:5432}
objects=${OBJECTS:-1000}
deliveries=${DELIVERIES:-100000}
pairs=${PAIRS:-4}
seconds=${SECONDS_EACH:-15}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release/snapshot-receiver}
[ -n "${BIN:-}" ] || cargo build --release --locked --quiet -p snapshot-receiver-cli --features full
q() { psql $pg -d "$1" -tAX -c "$2"; }
fresh() { q postgres "DROP DATABASE IF EXISTS $1" >/dev/null; q postgres "CREATE DATABASE $1" >/dev/null; }
wal() { q postgres "SELECT wal_bytes FROM pg_stat_wal"; }
rows() { q "$1" "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables"; }
rate() { grep -oE '^throughput: [0-9,]+' | tr -dc 0-9; }

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for batch in 64 1; do
  fresh lt_writes
  w0=$(wal)
  out=$("$bin" loadtest --objects "$objects" --deliveries "$deliveries" --producers 64 \
    --batch "$batch" --store "$url/lt_writes")
  w1=$(wal)
  sleep 1  # the backends' table counters reach the shared view on exit
  r=$(rows lt_writes)
  echo "$out" | grep -E '^(throughput|check)' | sed "s/^/batch $batch: /"
  awk -v w="$((w1 - w0))" -v r="$r" -v o="$objects" -v d="$deliveries" -v b="$batch" 'BEGIN {
    printf "batch %s: %.0f WAL bytes and %.2f rows per delivery\n", b, w / d, (r - o) / d }'
done

fresh lt_inbox
q lt_inbox "CREATE TABLE objects (object_id text PRIMARY KEY, version bigint NOT NULL, state text NOT NULL);
  CREATE TABLE inbox (event_id text PRIMARY KEY, object_id text NOT NULL, body text NOT NULL,
                      received_at timestamptz NOT NULL DEFAULT now());
  INSERT INTO objects SELECT 'card-' || i, 0, '{}' FROM generate_series(1, $objects) i;" >/dev/null
for i in $(seq "$pairs"); do
  w0=$(wal)
  tps=$(pgbench $pg -n -c 64 -j 2 -T "$seconds" -D objects="$objects" \
          -f benches/pg-writes/inbox.sql lt_inbox | grep -oE '^tps = [0-9.]+' | tr -dc 0-9.)
  w1=$(wal)
  fresh lt_writes
  ours=$("$bin" loadtest --objects "$objects" --deliveries "$deliveries" --producers 64 \
           --batch 1 --store "$url/lt_writes" | rate)
  awk -v t="$tps" -v o="$ours" -v w="$((w1 - w0))" -v s="$seconds" -v i="$i" 'BEGIN {
    printf "pair %s: inbox %.0f tps (%.0f WAL bytes each), loadtest one call %s/s: %.2fx\n",
           i, t, w / (t * s), o, o / t }'
done
q postgres "DROP DATABASE lt_writes" >/dev/null
q postgres "DROP DATABASE lt_inbox" >/dev/null
