#!/usr/bin/env bash
# Profiles the /check hot path: release-built tollgate runs under valgrind's callgrind (this
# kind of machine has no hardware counters for `perf`) for a short, light wrk load, once on the
# memory store and once on the Redis store; prints the functions costing the most
# instructions, self and inclusive. Slow under valgrind, so the load is small and bounded.
#
#   bench/profile.sh            # both stores, 8 s each
#   STORES=redis bench/profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8}
STORES=${STORES:-"memory redis"}
TOP=${TOP:-25}

. bench/lib.sh
require valgrind:valgrind wrk:wrk redis-server:redis-server curl:curl
cargo build --release --quiet --bin tollgate

start_redis

for store in $STORES; do
  port=$(free_port); admin=$(free_port)
  per_key_config "$port" "$admin" "$store" >"$WORK/$store.toml"
  RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$WORK/$store.out" \
    target/release/tollgate --config "$WORK/$store.toml" 2>"$WORK/$store.valgrind" &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 300); do curl -sf -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  KEYS=10000 wrk -t1 -c8 -d"${DURATION}s" -s bench/random_key.lua "http://127.0.0.1:$port/check" \
    | awk '/requests in/ {print "'"$store"': " $1 " checks under callgrind"}'
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  echo "== $store store: self cost (instructions) =="
  callgrind_annotate --inclusive=no "$WORK/$store.out" >"$WORK/self.txt" 2>/dev/null || true
  sed -n '/^Ir/,$p' "$WORK/self.txt" | head -n "$TOP" || true
  echo "== $store store: inclusive cost =="
  callgrind_annotate --inclusive=yes "$WORK/$store.out" >"$WORK/incl.txt" 2>/dev/null || true
  sed -n '/^Ir/,$p' "$WORK/incl.txt" | head -n "$TOP" || true
done
