#!/usr/bin/env bash
# Latency and throughput through nginx, with and without tollgate in the path:
#   direct : client -> nginx -> backend
#   checked: client -> nginx (config/nginx/tollgate.conf) -> tollgate (Redis store) -> backend
# Both run in the same nginx, interleaved (direct, checked, direct, ...), RUNS times each;
# the table shows the median of each column. Everything listens on 127.0.0.1 and stops on exit.
#
# Usage: bench/nginx.sh [seconds per run, default 10] [connections, default 64]
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNECTIONS="${2:-64}"
RUNS=3

. bench/lib.sh
require wrk:wrk nginx:nginx redis-server:redis-server curl:curl

cargo build --release --quiet
TOLLGATE="$PWD/target/release/tollgate"

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

TOLLGATE_PORT=$(free_port); ADMIN_PORT=$(free_port)
BACKEND_PORT=$(free_port); DIRECT_PORT=$(free_port); CHECKED_PORT=$(free_port)
start_redis

# A limit that never denies, so every request takes the full path (one EVALSHA each). A
# generous store budget and on_error = "deny": on a small shared machine a slow Redis call is
# measured (or counted as a failure below), never skipped by failing open.
cat > "$WORK/tollgate.toml" <<TOML
listen = "127.0.0.1:$TOLLGATE_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
timeout_ms = 1000
on_error = "deny"
[[limits]]
name = "per-ip"
rate = 1000000
burst = 1000000
key = ["ip"]
TOML
RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate.toml" &
PIDS+=($!)
wait_port "$TOLLGATE_PORT"

# The shipped site, pointed at tollgate and at the backend; plus a direct proxy and the
# backend itself (a static 200) in the same nginx.
sed -e "s|server 127.0.0.1:8080;|server 127.0.0.1:$TOLLGATE_PORT;|" \
    -e "s|server 127.0.0.1:3000;|server 127.0.0.1:$BACKEND_PORT;|" \
    -e "s|listen 80;|listen 127.0.0.1:$CHECKED_PORT;|" \
    config/nginx/tollgate.conf > "$WORK/tollgate.conf"
cat > "$WORK/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/client_body;
  proxy_temp_path $WORK/proxy;
  fastcgi_temp_path $WORK/fastcgi;
  uwsgi_temp_path $WORK/uwsgi;
  scgi_temp_path $WORK/scgi;
  include $WORK/tollgate.conf;
  upstream direct_app { server 127.0.0.1:$BACKEND_PORT; keepalive 32; }
  server {
    listen 127.0.0.1:$DIRECT_PORT;
    location / {
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_pass http://direct_app;
    }
  }
  server {
    listen 127.0.0.1:$BACKEND_PORT;
    location / { return 200 "ok\n"; }
  }
}
NGINX
nginx -p "$WORK" -e "$WORK/error.log" -c "$WORK/nginx.conf" &
PIDS+=($!)
wait_port "$CHECKED_PORT"

# The checked path must really be checked: tollgate's quota header reaches the client.
if ! curl -fsS -D - -o /dev/null "http://127.0.0.1:$CHECKED_PORT/" | grep -qi '^ratelimit:'; then
  echo "the checked path did not go through tollgate" >&2
  exit 1
fi

# One wrk run: prints "req/s p50_ms p99_ms non-2xx".
measure() {
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "http://127.0.0.1:$1/" | awk '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    /^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
    /Non-2xx/ { bad = $NF }
    END { printf "%.0f %.2f %.2f %d\n", rps, p50, p99, bad }'
}
median() { sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"; }

wrk -t1 -c"$CONNECTIONS" -d2s "http://127.0.0.1:$DIRECT_PORT/" >/dev/null   # warm-up
wrk -t1 -c"$CONNECTIONS" -d2s "http://127.0.0.1:$CHECKED_PORT/" >/dev/null
: > "$WORK/direct"; : > "$WORK/checked"
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS ..." >&2
  measure "$DIRECT_PORT"  >> "$WORK/direct"
  measure "$CHECKED_PORT" >> "$WORK/checked"
done

errors=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" \
  | awk '/^tollgate_checks_total\{result="error_(allowed|denied)"\}/ { n += $2 } END { print n + 0 }')

row() {
  printf '| %s | %s | %s | %s |\n' "$1" \
    "$(cut -d' ' -f1 "$WORK/$2" | median)" \
    "$(cut -d' ' -f2 "$WORK/$2" | median)" \
    "$(cut -d' ' -f3 "$WORK/$2" | median)"
}
echo
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s, median of $RUNS interleaved runs, $(nproc) cores, $(date -u +%Y-%m-%d)"
echo
echo "| path | req/s | p50 ms | p99 ms |"
echo "| --- | --- | --- | --- |"
row "client → nginx → backend" direct
row "client → nginx → tollgate (Redis) → backend" checked
direct_rps=$(cut -d' ' -f1 "$WORK/direct" | median)
checked_rps=$(cut -d' ' -f1 "$WORK/checked" | median)
echo
echo "checked/direct throughput: $(awk -v a="$checked_rps" -v b="$direct_rps" 'BEGIN { printf "%.2f", a / b }')"
echo "store errors during the runs (answered 503 without Redis): $errors"
# nginx fails open when tollgate is slower than the auth timeouts: such requests skip the check.
echo "checks that timed out in nginx (failed open): $(grep -c 'timed out' "$WORK/error.log" || true)"
echo "non-2xx answers, direct / checked: $(awk '{ n += $4 } END { print n + 0 }' "$WORK/direct") / $(awk '{ n += $4 } END { print n + 0 }' "$WORK/checked")"
