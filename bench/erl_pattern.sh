#!/usr/bin/env bash
# Checks per Redis core-second: tollgate's /check (coalesced script calls) against the
# commands envoyproxy/ratelimit sends per descriptor, INCRBY then EXPIRE: by default one
# request's commands go out together (a descriptor's pair in one round trip: -P 2), with
# REDIS_PIPELINE_WINDOW several requests' too (-P 8). Same Redis, same run.
# 10,000 keys, 64 connections; Redis CPU from INFO cpu around each load; rounds interleaved,
# medians.
#
#   bench/erl_pattern.sh                 # 3 rounds of 8 s
#   ROUNDS=1 DURATION=3 bench/erl_pattern.sh
#   BASE_BIN=/path/to/older/tollgate bench/erl_pattern.sh   # and that build's /check, same run
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-10000}

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-benchmark:redis-tools curl:curl
cargo build --release --quiet --bin tollgate
start_redis

redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }

start_per_key this target/release/tollgate redis
[ -z "${BASE_BIN:-}" ] || start_per_key base "$BASE_BIN" redis

# per_core N R0 R1: N operations over the Redis CPU seconds between R0 and R1.
per_core() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {printf "%.0f", n / (b - a)}'; }

# tollgate_checks PORT: checks per Redis core-second through the tollgate on PORT.
tollgate_checks() {
  local r0 r1 n
  rcli FLUSHALL >/dev/null
  r0=$(redis_cpu)
  KEYS=$KEYS wrk -t1 -c64 -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:$1/check" >"$WORK/wrk.out"
  r1=$(redis_cpu)
  n=$(awk '/ requests in / {print $1}' "$WORK/wrk.out")
  per_core "$n" "$r0" "$r1"
}

# erl PIPELINE: descriptors (one INCRBY and one EXPIRE each) per Redis core-second.
erl() {
  local r0 r1 n=$((DURATION * 40000))
  rcli FLUSHALL >/dev/null
  r0=$(redis_cpu)
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 64 -P "$1" -r "$KEYS" -n "$n" -q \
    incrby "erl:__rand_int__" 1 >/dev/null
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 64 -P "$1" -r "$KEYS" -n "$n" -q \
    expire "erl:__rand_int__" 60 >/dev/null
  r1=$(redis_cpu)
  per_core "$n" "$r0" "$r1"
}

: >"$WORK/check"; : >"$WORK/base"; : >"$WORK/p2"; : >"$WORK/p8"
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  tollgate_checks "$PORT_this" >>"$WORK/check"; echo >>"$WORK/check"
  if [ -n "${BASE_BIN:-}" ]; then
    tollgate_checks "$PORT_base" >>"$WORK/base"; echo >>"$WORK/base"
  fi
  erl 2 >>"$WORK/p2"; echo >>"$WORK/p2"
  erl 8 >>"$WORK/p8"; echo >>"$WORK/p8"
done
row() { printf '| %s | %s | %s |\n' "$1" "$(median <"$2")" "$(paste -sd' ' "$2")"; }
printf '| per Redis core-second | median | rounds |\n|---|---|---|\n'
row "tollgate /check (coalesced script calls)" "$WORK/check"
[ -z "${BASE_BIN:-}" ] || row "tollgate /check, BASE_BIN" "$WORK/base"
row "INCRBY + EXPIRE per descriptor, -P 2 (its default)" "$WORK/p2"
row "INCRBY + EXPIRE per descriptor, -P 8 (pipeline window)" "$WORK/p8"
