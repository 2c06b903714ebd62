#!/usr/bin/env bash
# ShouldRateLimit decided by an envoyproxy/ratelimit rule ([[envoy.rules]], matched by walking
# its tree) next to the same bucket as a tollgate limit ([[limits]] with a descriptor key), same
# Redis, runs alternated: what the tree walk costs on the hot path. Each call is one descriptor
# (k, <random of KEYS>) in domain "bench", loaded by examples/grpc_load.rs; both allow all.
#
#   bench/envoy_rules.sh                       # 3 rounds of 10 s runs
#   ROUNDS=1 DURATION=3 bench/envoy_rules.sh   # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
STREAMS=${STREAMS:-64}
GRPC_CONNS=${GRPC_CONNS:-4}
KEYS=${KEYS:-10000}

. bench/lib.sh

require redis-server:redis-server curl:curl
echo "building tollgate and the gRPC load client (release)" >&2
cargo build --release --quiet --bin tollgate --example grpc_load
start_redis

FLAT='[[limits]]
name = "per-descriptor"
rate = 1000000
burst = 1000000
key = ["descriptor:k"]
[limits.match]
domains = ["bench"]'
TREE='[[envoy.rules]]
domain = "bench"
path = [{ key = "k" }]
rate_limit = { requests_per_unit = 1000000, unit = "second" }'

# run NAME RULES: calls/s of one run against a fresh tollgate serving RULES.
run() {
  local port admin grpc pid
  port=$(free_port); admin=$(free_port); grpc=$(free_port)
  cat >"$WORK/tollgate.toml" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
grpc_listen = "127.0.0.1:$grpc"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
max_buckets = 1000000
$2
TOML
  RUST_LOG=warn target/release/tollgate --config "$WORK/tollgate.toml" &
  pid=$!
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  target/release/examples/grpc_load "127.0.0.1:$grpc" "$STREAMS" "$DURATION" "$KEYS" "$GRPC_CONNS" \
    | awk '{print $2}'
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

declare -a F T
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  F+=("$(run flat "$FLAT")")
  T+=("$(run tree "$TREE")")
done
f=$(printf '%s\n' "${F[@]}" | median)
t=$(printf '%s\n' "${T[@]}" | median)
printf '| rules | calls/s, median | per round |\n|---|---|---|\n'
printf '| [[limits]], descriptor key | %s | %s |\n' "$f" "${F[*]}"
printf '| [[envoy.rules]], tree walk | %s | %s |\n' "$t" "${T[*]}"
awk -v t="$t" -v f="$f" 'BEGIN {printf "tree / flat %.2f\n", t / f}'
