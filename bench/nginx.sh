#!/usr/bin/env bash
# Latency and throughput through nginx, with and without tollgate in the path:
#   direct : client -> nginx -> backend
#   stub   : client -> nginx (the shipped config) -> an auth stub that always says 200 -> backend
#   checked: client -> nginx (config/nginx/tollgate.conf) -> tollgate (Redis store) -> backend
#   denied : the same as checked, on a path whose limit is drained: nearly every request is
#            refused (the flood a limited client sends)
# Each path runs RUNS times, interleaved (direct, stub, checked, denied, direct, ...); the
# table shows the median of each column, including how many TCP connections the clients
# opened per 1000 requests (nginx's stub_status `accepts`; wrk reconnects whenever nginx
# closes a connection). Everything listens on 127.0.0.1 and stops on exit.
#
# Usage: bench/nginx.sh [seconds per run, default 10] [connections, default 64]
# NGINX_SITE=file runs another site config in place of config/nginx/tollgate.conf (the same
# addresses to template), e.g. an older one, for a before/after comparison in one script.
# BIN=file runs another tollgate build in place of this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNECTIONS="${2:-64}"
RUNS="${RUNS:-3}"
SITE="${NGINX_SITE:-config/nginx/tollgate.conf}"

. bench/lib.sh
require wrk:wrk nginx:nginx redis-server:redis-server curl:curl

cargo build --release --quiet
TOLLGATE="${BIN:-$PWD/target/release/tollgate}"

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
STATUS_PORT=$(free_port)
STUB_PORT=$(free_port); STUB_AUTH_PORT=$(free_port); STUB_STATUS_PORT=$(free_port)
start_redis

# A limit that never denies, so every request takes the full path (one EVALSHA each), and
# one that is drained at once for everything under /deny/. A generous store budget and
# on_error = "deny": on a small shared machine a slow Redis call is measured (or counted as a
# failure below), never skipped by failing open.
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
[[limits]]
name = "drained"
rate = 0.001
burst = 1
key = ["const:all"]
[limits.match]
path_prefix = "/deny/"
TOML
RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate.toml" &
PIDS+=($!)
wait_port "$TOLLGATE_PORT"

# The shipped site (auth at $1, listening on $2) as "$WORK/$3.conf".
site() {
  sed -e "s|server 127.0.0.1:8080;|server 127.0.0.1:$1;|" \
      -e "s|server 127.0.0.1:3000;|server 127.0.0.1:$BACKEND_PORT;|" \
      -e "s|listen 80;|listen 127.0.0.1:$2;|" \
      -e "s|include /etc/nginx/tollgate-plans/\*.map;||" \
      "$SITE" > "$WORK/$3.conf"
}
# The main config of nginx instance $1 (its files under "$WORK/$1"), with stub_status on
# port $2 and the http-context lines on stdin.
nginx_main() {
  mkdir -p "$WORK/$1"
  cat <<NGINX
daemon off;
worker_processes 1;
pid $WORK/$1/nginx.pid;
error_log $WORK/$1/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/$1/client_body;
  proxy_temp_path $WORK/$1/proxy;
  fastcgi_temp_path $WORK/$1/fastcgi;
  uwsgi_temp_path $WORK/$1/uwsgi;
  scgi_temp_path $WORK/$1/scgi;
  server { listen 127.0.0.1:$2; location / { stub_status; } }
$(cat)
}
NGINX
}
# One nginx (main): the shipped site on tollgate and a direct proxy. Another (stub): the
# shipped site on an auth stub. A third (back): the backend (a static 200) and the stub (an
# empty 200), so the front ones count only their clients' connections.
site "$TOLLGATE_PORT" "$CHECKED_PORT" tollgate
nginx_main main "$STATUS_PORT" > "$WORK/nginx.conf" <<NGINX
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
NGINX
site "$STUB_AUTH_PORT" "$STUB_PORT" stub-site
nginx_main stub "$STUB_STATUS_PORT" > "$WORK/stub.conf" <<NGINX
  include $WORK/stub-site.conf;
NGINX
nginx_main back "$(free_port)" > "$WORK/back.conf" <<NGINX
  server { listen 127.0.0.1:$BACKEND_PORT; location / { return 200 "ok\n"; } }
  server { listen 127.0.0.1:$STUB_AUTH_PORT; location / { return 200; } }
NGINX
for instance in back:back main:nginx stub:stub; do
  nginx -p "$WORK/${instance%%:*}" -e "$WORK/${instance%%:*}/error.log" \
    -c "$WORK/${instance#*:}.conf" &
  PIDS+=($!)
done
wait_port "$BACKEND_PORT"; wait_port "$CHECKED_PORT"; wait_port "$STUB_PORT"

# The checked path must really be checked: tollgate's quota header reaches the client.
if ! curl -fsS -D - -o /dev/null "http://127.0.0.1:$CHECKED_PORT/" | grep -qi '^ratelimit:'; then
  echo "the checked path did not go through tollgate" >&2
  exit 1
fi

accepts() { curl -fsS "http://127.0.0.1:$1/" | awk 'NR == 3 { print $1 }'; }

# One wrk run on URL $1, nginx's stub_status on port $2: prints
# "req/s p50_ms p99_ms non-2xx connections-per-1000-requests".
measure() {
  local before after
  before=$(accepts "$2")
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "$1" > "$WORK/wrk.out"
  after=$(accepts "$2")
  awk -v opened=$(( after - before - 1 )) '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    /^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
    / requests in / { n = $1 } /Non-2xx/ { bad = $NF }
    END { printf "%.0f %.2f %.2f %d %.1f\n", rps, p50, p99, bad, opened * 1000 / n }' "$WORK/wrk.out"
}
median() { sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"; }

DIRECT="http://127.0.0.1:$DIRECT_PORT/ $STATUS_PORT"
STUB="http://127.0.0.1:$STUB_PORT/ $STUB_STATUS_PORT"
CHECKED="http://127.0.0.1:$CHECKED_PORT/ $STATUS_PORT"
DENIED="http://127.0.0.1:$CHECKED_PORT/deny/ $STATUS_PORT"
for path in DIRECT STUB CHECKED DENIED; do
  wrk -t1 -c"$CONNECTIONS" -d2s "${!path% *}" >/dev/null   # warm-up
  : > "$WORK/$path"
done
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS ..." >&2
  for path in DIRECT STUB CHECKED DENIED; do
    # shellcheck disable=SC2086
    measure ${!path} >> "$WORK/$path"
  done
done

errors=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" \
  | awk '/^tollgate_checks_total\{result="error_(allowed|denied)"\}/ { n += $2 } END { print n + 0 }')

row() {
  printf '| %s | %s | %s | %s | %s |\n' "$1" \
    "$(cut -d' ' -f1 "$WORK/$2" | median)" \
    "$(cut -d' ' -f2 "$WORK/$2" | median)" \
    "$(cut -d' ' -f3 "$WORK/$2" | median)" \
    "$(cut -d' ' -f5 "$WORK/$2" | median)"
}
rps() { cut -d' ' -f1 "$WORK/$1" | median; }
ratio() { awk -v a="$(rps "$1")" -v b="$(rps "$2")" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s, median of $RUNS interleaved runs, $(nproc) cores, $(date -u +%Y-%m-%d), site $SITE"
echo
echo "| path | req/s | p50 ms | p99 ms | client connections per 1000 requests |"
echo "| --- | --- | --- | --- | --- |"
row "client → nginx → backend" DIRECT
row "client → nginx → auth stub (empty 200) → backend" STUB
row "client → nginx → tollgate (Redis) → backend" CHECKED
row "client → nginx → tollgate (Redis), denied" DENIED
echo
echo "checked/direct throughput: $(ratio CHECKED DIRECT); checked/stub: $(ratio CHECKED STUB); denied/checked: $(ratio DENIED CHECKED)"
echo "store errors during the runs (answered 503 without Redis): $errors"
# nginx fails open when tollgate is slower than the auth timeouts: such requests skip the check.
echo "checks that timed out in nginx (failed open): $(grep -c 'timed out' "$WORK/main/error.log" || true)"
echo "nginx error log lines 'auth request unexpected status': $(grep -c 'auth request unexpected status' "$WORK/main/error.log" || true)"
echo "non-2xx answers, direct / stub / checked: $(for p in DIRECT STUB CHECKED; do awk '{ n += $4 } END { printf "%d ", n + 0 }' "$WORK/$p"; done)"
