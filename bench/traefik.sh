#!/usr/bin/env bash
# Throughput and latency through Traefik, with and without an auth hop:
#   direct : client -> Traefik -> backend
#   stub   : client -> Traefik (forwardAuth) -> an auth stub that always says 200 -> backend
#   checked: client -> Traefik (config/traefik/, forwardAuth) -> tollgate (Redis) -> backend
# One Traefik, the shipped static and dynamic files plus two entry points for the other paths;
# the backend and the stub are nginx. Each path runs RUNS times, interleaved; the table shows
# medians, including how many new TCP connections Traefik opened to the auth server per 1000
# requests to the stub (its own nginx's stub_status `accepts`): Traefik keeps only a few idle
# connections to an auth server and closes the rest after each burst. tollgate counts no
# accepts, and sockets in TIME-WAIT undercount them (most are gone without one), so its row
# shows none; the same Traefik client talks to both. For tollgate's rows, the CPU time it
# spent per check (user + system, from /proc).
#
# BASE_BIN=<another tollgate binary> adds a path through that one (same config, its own
# middleware and entry point), for a before/after in the same run.
#
# Usage: bench/traefik.sh [seconds per run, default 10] [connections, default 64]
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNECTIONS="${2:-64}"
RUNS="${RUNS:-3}"

. bench/lib.sh
require wrk:wrk nginx:nginx redis-server:redis-server curl:curl traefik:traefik

cargo build --release --quiet --bin tollgate
TOLLGATE="$PWD/target/release/tollgate"

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  exit 1
}

TOLLGATE_PORT=$(free_port); ADMIN_PORT=$(free_port)
BACKEND_PORT=$(free_port); STUB_AUTH_PORT=$(free_port)
DIRECT_PORT=$(free_port); STUB_PORT=$(free_port); CHECKED_PORT=$(free_port)
BASE_PORT=$(free_port); BASE_TOLLGATE_PORT=$(free_port); BASE_ADMIN_PORT=$(free_port)
start_redis

# The same tollgate as bench/nginx.sh: a limit that never denies, one EVALSHA per request.
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
TOLLGATE_PID=$!
PIDS+=("$TOLLGATE_PID")
wait_port "$TOLLGATE_PORT"
BASE_PID=
if [ -n "${BASE_BIN:-}" ]; then
  sed -e "s/:$TOLLGATE_PORT\"/:$BASE_TOLLGATE_PORT\"/" -e "s/:$ADMIN_PORT\"/:$BASE_ADMIN_PORT\"/" \
    "$WORK/tollgate.toml" > "$WORK/base.toml"
  RUST_LOG=warn "$BASE_BIN" --config "$WORK/base.toml" &
  BASE_PID=$!
  PIDS+=("$BASE_PID")
  wait_port "$BASE_TOLLGATE_PORT"
fi

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
# The stub in an nginx of its own, so that its stub_status counts only Traefik's connections.
mkdir -p "$WORK/stub"
STUB_STATUS_PORT=$(free_port)
cat > "$WORK/stub.conf" <<NGINX
daemon off;
worker_processes 1;
pid $WORK/stub/nginx.pid;
error_log $WORK/stub/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/stub/client_body;
  proxy_temp_path $WORK/stub/proxy;
  fastcgi_temp_path $WORK/stub/fastcgi;
  uwsgi_temp_path $WORK/stub/uwsgi;
  scgi_temp_path $WORK/stub/scgi;
  server { listen 127.0.0.1:$STUB_AUTH_PORT; location / { return 200; } }
  server { listen 127.0.0.1:$STUB_STATUS_PORT; location / { stub_status; } }
}
NGINX
nginx -p "$WORK" -e "$WORK/nginx-error.log" -c "$WORK/nginx.conf" &
PIDS+=($!)
nginx -p "$WORK/stub" -e "$WORK/stub/error.log" -c "$WORK/stub.conf" &
PIDS+=($!)
wait_port "$BACKEND_PORT"; wait_port "$STUB_STATUS_PORT"

# The shipped files, addresses templated, plus an entry point and a router per other path.
python3 - "$WORK" "$TOLLGATE_PORT" "$BACKEND_PORT" "$STUB_AUTH_PORT" "$DIRECT_PORT" "$STUB_PORT" "$CHECKED_PORT" \
  "$BASE_PORT" "$BASE_TOLLGATE_PORT" <<'PY'
import copy, sys, yaml
work, tollgate, backend, stub_auth, direct, stub, checked, base, base_tollgate = sys.argv[1:]
static = yaml.safe_load(open("config/traefik/traefik.yml"))
web = static["entryPoints"]["web"]
web["address"] = f"127.0.0.1:{checked}"
static["entryPoints"]["stub"] = dict(copy.deepcopy(web), address=f"127.0.0.1:{stub}")
static["entryPoints"]["direct"] = dict(copy.deepcopy(web), address=f"127.0.0.1:{direct}")
static["entryPoints"]["base"] = dict(copy.deepcopy(web), address=f"127.0.0.1:{base}")
static["providers"]["file"] = {"filename": f"{work}/dynamic.yml"}
dynamic = yaml.safe_load(open("config/traefik/dynamic.yml"))
http = dynamic["http"]
http["middlewares"]["tollgate"]["forwardAuth"]["address"] = f"http://127.0.0.1:{tollgate}/check"
http["services"]["app"]["loadBalancer"]["servers"] = [{"url": f"http://127.0.0.1:{backend}"}]
stub_mw = copy.deepcopy(http["middlewares"]["tollgate"])
stub_mw["forwardAuth"]["address"] = f"http://127.0.0.1:{stub_auth}/check"
http["middlewares"]["stub"] = stub_mw
base_mw = copy.deepcopy(http["middlewares"]["tollgate"])
base_mw["forwardAuth"]["address"] = f"http://127.0.0.1:{base_tollgate}/check"
http["middlewares"]["base"] = base_mw
app = http["routers"]["app"]
http["routers"]["stub"] = dict(copy.deepcopy(app), entryPoints=["stub"], middlewares=["stub"])
http["routers"]["base"] = dict(copy.deepcopy(app), entryPoints=["base"], middlewares=["base"])
direct_router = dict(copy.deepcopy(app), entryPoints=["direct"])
direct_router.pop("middlewares")
http["routers"]["direct"] = direct_router
yaml.safe_dump(static, open(f"{work}/traefik.yml", "w"))
yaml.safe_dump(dynamic, open(f"{work}/dynamic.yml", "w"))
PY
traefik --configFile="$WORK/traefik.yml" > "$WORK/traefik.log" 2>&1 &
PIDS+=($!)
for port in "$DIRECT_PORT" "$STUB_PORT" "$CHECKED_PORT" ${BASE_PID:+"$BASE_PORT"}; do
  wait_port "$port"
  for _ in $(seq 200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")" = 200 ] && break
    sleep 0.1
  done
done
if ! curl -fsS -D - -o /dev/null "http://127.0.0.1:$CHECKED_PORT/" >/dev/null \
   || [ "$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '/^tollgate_checks_total\{result="allowed"\}/ { print ($2 > 0) }')" != 1 ]; then
  echo "the checked path did not go through tollgate" >&2
  exit 1
fi

accepts() { curl -fsS "http://127.0.0.1:$STUB_STATUS_PORT/" | awk 'NR == 3 { print $1 }'; }


# One wrk run on port $1 ($2 = count: count the stub's accepts; else the pid of the tollgate
# behind it, or -): prints "req/s p50_ms p99_ms non-2xx stub-connections-per-1000-requests
# tollgate-cpu-us-per-request" ("-" where not measured).
measure() {
  local before=0 after=0 pid=
  [ "$2" = count ] && before=$(accepts)
  [ "$2" != count ] && [ "$2" != - ] && pid=$2
  local cpu_before; cpu_before=$(ticks "$pid")
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "http://127.0.0.1:$1/" > "$WORK/wrk.out"
  local cpu_after; cpu_after=$(ticks "$pid")
  [ "$2" = count ] && after=$(accepts)
  awk -v opened=$(( after - before - 1 )) -v count="$2" -v pid="$pid" -v hz="$(getconf CLK_TCK)" \
    -v cpu=$(( cpu_after - cpu_before )) '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    /^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
    / requests in / { n = $1 } /Non-2xx/ { bad = $NF }
    END { printf "%.0f %.2f %.2f %d %s %s\n", rps, p50, p99, bad,
      count == "count" ? sprintf("%.0f", opened * 1000 / n) : "-",
      pid != "" ? sprintf("%.1f", cpu / hz * 1e6 / n) : "-" }' "$WORK/wrk.out"
}
median() { sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"; }

DIRECT="$DIRECT_PORT -"; STUB="$STUB_PORT count"; CHECKED="$CHECKED_PORT $TOLLGATE_PID"
BASE="$BASE_PORT $BASE_PID"
PATHS="DIRECT STUB CHECKED${BASE_PID:+ BASE}"
for path in $PATHS; do
  wrk -t1 -c"$CONNECTIONS" -d2s "http://127.0.0.1:${!path% *}/" >/dev/null   # warm-up
  : > "$WORK/$path"
done
for run in $(seq "$RUNS"); do
  echo "run $run/$RUNS ..." >&2
  for path in $PATHS; do
    # shellcheck disable=SC2086
    measure ${!path} >> "$WORK/$path"
    sleep 1   # let the auth connections of this run settle before the next one counts
  done
done

errors=$(curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" \
  | awk '/^tollgate_checks_total\{result="error_(allowed|denied)"\}/ { n += $2 } END { print n + 0 }')
row() {
  printf '| %s | %s | %s | %s | %s | %s |\n' "$1" \
    "$(cut -d' ' -f1 "$WORK/$2" | median)" "$(cut -d' ' -f2 "$WORK/$2" | median)" \
    "$(cut -d' ' -f3 "$WORK/$2" | median)" "$(cut -d' ' -f5 "$WORK/$2" | median)" \
    "$(cut -d' ' -f6 "$WORK/$2" | median)"
}
rps() { cut -d' ' -f1 "$WORK/$1" | median; }
ratio() { awk -v a="$(rps "$1")" -v b="$(rps "$2")" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "wrk -t1 -c$CONNECTIONS -d${DURATION}s, median of $RUNS interleaved runs, $(nproc) cores, $(date -u +%Y-%m-%d), $(traefik version 2>/dev/null | awk '/^Version/ { print "Traefik " $2 }')"
echo
echo "| path | req/s | p50 ms | p99 ms | new connections to the stub per 1000 requests | tollgate CPU µs per check |"
echo "| --- | --- | --- | --- | --- | --- |"
row "client → Traefik → backend" DIRECT
row "client → Traefik forwardAuth → auth stub (empty 200) → backend" STUB
row "client → Traefik forwardAuth → tollgate (Redis) → backend" CHECKED
[ -n "$BASE_PID" ] && row "the same through BASE_BIN" BASE
echo
echo "checked/stub throughput: $(ratio CHECKED STUB); checked/direct: $(ratio CHECKED DIRECT)"
[ -n "$BASE_PID" ] && echo "BASE_BIN/stub throughput: $(ratio BASE STUB); checked/BASE_BIN: $(ratio CHECKED BASE)"
echo "store errors during the runs: $errors"
echo "non-2xx answers, $PATHS: $(for p in $PATHS; do awk '{ n += $4 } END { printf "%d ", n + 0 }' "$WORK/$p"; done)"
