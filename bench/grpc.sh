#!/usr/bin/env bash
# Envoy's rate limit service next to /check and Redis itself, same script, same run: one
# release-built tollgate serving both (one Redis bucket per call, random among KEYS keys),
# loaded in turn by examples/grpc_load.rs (gRPC), wrk (/check) and redis-benchmark (EVALSHA of
# lua/token_bucket.lua). Rounds are interleaved; medians are reported.
#
#   bench/grpc.sh                       # 3 rounds of 10 s runs
#   ROUNDS=1 DURATION=3 bench/grpc.sh   # a quick look
#   TOLLGATE=/path/to/tollgate bench/grpc.sh   # another build (the load tool is built here)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}           # HTTP connections, gRPC concurrent calls, redis-benchmark clients
GRPC_CONNS=${GRPC_CONNS:-4}  # HTTP/2 connections carrying the gRPC calls (Envoy pools few)
KEYS=${KEYS:-10000}

. bench/lib.sh

require wrk:wrk redis-server:redis-server redis-benchmark:redis-tools curl:curl
echo "building tollgate and the gRPC load client (release)" >&2
cargo build --release --quiet --bin tollgate --example grpc_load
TOLLGATE=${TOLLGATE:-target/release/tollgate}
LOAD=target/release/examples/grpc_load

start_redis
SHA=$(rcli SCRIPT LOAD "$(bucket_script)")

PORT=$(free_port); ADMIN=$(free_port); GRPC=$(free_port)
cat >"$WORK/tollgate.toml" <<EOF
listen = "127.0.0.1:$PORT"
admin_listen = "127.0.0.1:$ADMIN"
grpc_listen = "127.0.0.1:$GRPC"

[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
timeout_ms = 50
max_buckets = 1000000

# Both allow everything (rate 1,000/s, burst 1,000,000): every call is one script call.
[[limits]]
name = "per-key"
rate = 1000
burst = 1000000
key = ["path"]

[[limits]]
name = "per-descriptor"
rate = 1000
burst = 1000000
key = ["descriptor:k"]
EOF
RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate.toml" &
TOLLGATE_PID=$!
PIDS+=("$TOLLGATE_PID")
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$PORT/healthz" && break; sleep 0.1; done

# Checks tollgate answered so far (/check and gRPC alike).
checks() { curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^tollgate_checks_total/ {s += $2} END {printf "%d", s}'; }
# kernel_ticks PID: the system part of ticks PID.
kernel_ticks() { awk '{ print $15 }' "/proc/$1/stat"; }
# measured TAG CMD...: runs CMD, its output passed on; appends to $WORK/cpu.TAG the CPU time
# per answered call, in µs, of tollgate and of the load tool (from its rusage), and
# tollgate's kernel part.
measured() {
  local tag=$1 t0 c0 t1 c1 k0 k1
  shift
  t0=$(ticks "$TOLLGATE_PID"); c0=$(checks); k0=$(kernel_ticks "$TOLLGATE_PID")
  python3 -c '
import resource, subprocess, sys
subprocess.run(sys.argv[2:], check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "w").write(str(r.ru_utime + r.ru_stime))' "$WORK/client.s" "$@"
  t1=$(ticks "$TOLLGATE_PID"); c1=$(checks); k1=$(kernel_ticks "$TOLLGATE_PID")
  awk -v t="$(( t1 - t0 ))" -v k="$(( k1 - k0 ))" -v n="$(( c1 - c0 ))" \
    -v hz="$(getconf CLK_TCK)" -v client="$(cat "$WORK/client.s")" \
    'BEGIN {printf "%.1f %.1f %.1f\n", t / hz * 1e6 / n, client * 1e6 / n, k / hz * 1e6 / n}' \
    >>"$WORK/cpu.$tag"
}
grpc_rps() {
  measured grpc "$LOAD" "127.0.0.1:$GRPC" "$CONNS" "$DURATION" "$KEYS" "$GRPC_CONNS" \
    | tee -a "$WORK/grpc.log"
}
wrk_rps() {
  KEYS=$KEYS measured http wrk -t1 -c"$CONNS" -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:$PORT/check" | awk '/^Requests\/sec/ {print $2}'
}
rb_rps() {
  rcli FLUSHALL >/dev/null
  timeout $((DURATION + 30)) redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CONNS" \
    -n $((DURATION * 32000)) -r "$KEYS" -q \
    evalsha "$SHA" 1 "tollgate:per-key:{/k__rand_int__}" 1000 1000000 1 0 2>/dev/null \
    | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | awk '{print $1}'
}

declare -a RB HTTP GRPC_R P50 P99
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  RB+=("$(rb_rps)")
  HTTP+=("$(wrk_rps)")
  line=$(grpc_rps)
  GRPC_R+=("$(awk '{print $2}' <<<"$line")")
  P50+=("$(awk '{print $4}' <<<"$line")")
  P99+=("$(awk '{print $6}' <<<"$line")")
done

rb=$(printf '%s\n' "${RB[@]}" | median)
http=$(printf '%s\n' "${HTTP[@]}" | median)
grpc=$(printf '%s\n' "${GRPC_R[@]}" | median)
printf '\n| load (%s concurrent, %s keys) | calls/s, median | per round |\n|---|---|---|\n' "$CONNS" "$KEYS"
printf '| redis-benchmark, EVALSHA token_bucket.lua | %s | %s |\n' "$rb" "${RB[*]}"
printf '| /check over HTTP/1.1 (wrk) | %s | %s |\n' "$http" "${HTTP[*]}"
printf '| ShouldRateLimit over gRPC (%s HTTP/2 connections) | %s | %s |\n' "$GRPC_CONNS" "$grpc" "${GRPC_R[*]}"
printf '\ngRPC latency p50 / p99 ms per round: %s / %s\n' "${P50[*]}" "${P99[*]}"
awk -v g="$grpc" -v h="$http" -v r="$rb" 'BEGIN {printf "gRPC / HTTP %.2f, gRPC / redis-benchmark %.2f\n", g / h, g / r}'
echo "gRPC calls that failed: $(awk '{n += $10} END {print n + 0}' "$WORK/grpc.log")"
for tag in http grpc; do
  printf 'CPU per call, %s: tollgate %s µs (kernel %s), load tool %s µs (medians)\n' "$tag" \
    "$(awk '{print $1}' "$WORK/cpu.$tag" | median)" "$(awk '{print $3}' "$WORK/cpu.$tag" | median)" \
    "$(awk '{print $2}' "$WORK/cpu.$tag" | median)"
done
# Answers that on_error gave because a store call overran timeout_ms (a loaded machine).
curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^tollgate_checks_total/ {print "  " $0}'
curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^tollgate_grpc_requests_total/ {print "  " $0}'
