#!/usr/bin/env bash
# ShouldRateLimit decided by an envoyproxy/ratelimit rule ([[envoy.rules]], matched by walking
# its tree) next to the same bucket as a tollgate limit ([[limits]] with a descriptor key), same
# Redis, runs alternated: what the tree walk costs on the hot path. Then the same rule with
# envoyproxy/ratelimit's metrics kept ([envoy.metrics], served on a Prometheus listener): its
# stats key fixed ("bench.k"), and with detailed_metric (a key per value: KEYS series).
# Each call is one descriptor (k, <random of KEYS>) in domain "bench", loaded by
# examples/grpc_load.rs; all allow all. Per run: calls/s, and tollgate's CPU per call.
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
DETAILED="$TREE
detailed_metric = true"

# grpc_calls ADMIN: gRPC calls answered so far.
grpc_calls() {
  curl -s "http://127.0.0.1:$1/metrics" | awk '/^tollgate_grpc_requests_total/ {s += $2} END {printf "%d", s}'
}

# run NAME RULES [metrics]: "calls/s CPU-µs-per-call" of one run against a fresh tollgate
# serving RULES, with envoyproxy/ratelimit's metrics kept when the third argument is given.
run() {
  local port admin grpc pid metrics="" t0 n0 t1 n1 rate
  port=$(free_port); admin=$(free_port); grpc=$(free_port)
  if [ -n "${3:-}" ]; then
    metrics=$(printf '[envoy.metrics]\nprometheus_listen = "127.0.0.1:%s"' "$(free_port)")
  fi
  cat >"$WORK/tollgate.toml" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
grpc_listen = "127.0.0.1:$grpc"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
max_buckets = 1000000
$2
$metrics
TOML
  RUST_LOG=warn target/release/tollgate --config "$WORK/tollgate.toml" &
  pid=$!
  for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$port/healthz" && break; sleep 0.1; done
  t0=$(ticks "$pid"); n0=$(grpc_calls "$admin")
  rate=$(target/release/examples/grpc_load "127.0.0.1:$grpc" "$STREAMS" "$DURATION" "$KEYS" \
    "$GRPC_CONNS" | awk '{print $2}')
  t1=$(ticks "$pid"); n1=$(grpc_calls "$admin")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  awk -v r="$rate" -v t="$(( t1 - t0 ))" -v n="$(( n1 - n0 ))" -v hz="$(getconf CLK_TCK)" \
    'BEGIN {printf "%s %.1f\n", r, t / hz * 1e6 / n}'
}

declare -a F T M D
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  F+=("$(run flat "$FLAT")")
  T+=("$(run tree "$TREE")")
  M+=("$(run metrics "$TREE" metrics)")
  D+=("$(run detailed "$DETAILED" metrics)")
done
# column N of each run's "calls/s cpu", median
med() { local n=$1; shift; printf '%s\n' "$@" | awk -v n="$n" '{print $n}' | median; }
col() { local n=$1; shift; printf '%s\n' "$@" | awk -v n="$n" '{printf "%s ", $n}'; }
printf '| rules | calls/s, median | per round | tollgate CPU µs per call, median | per round |\n'
printf '|---|---|---|---|---|\n'
row() {
  local name=$1; shift
  printf '| %s | %s | %s| %s | %s|\n' "$name" "$(med 1 "$@")" "$(col 1 "$@")" "$(med 2 "$@")" "$(col 2 "$@")"
}
row '[[limits]], descriptor key' "${F[@]}"
row '[[envoy.rules]], tree walk' "${T[@]}"
row 'tree walk, envoyproxy/ratelimit metrics on' "${M[@]}"
row 'tree walk, metrics on, detailed_metric' "${D[@]}"
awk -v t="$(med 1 "${T[@]}")" -v f="$(med 1 "${F[@]}")" 'BEGIN {printf "tree / flat %.2f\n", t / f}'
awk -v m="$(med 2 "${M[@]}")" -v d="$(med 2 "${D[@]}")" -v t="$(med 2 "${T[@]}")" \
  'BEGIN {printf "CPU per call, metrics on / off %.2f, detailed_metric / off %.2f\n", m / t, d / t}'
