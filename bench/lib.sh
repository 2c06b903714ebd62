# Shared plumbing of the bench scripts (sourced, not run): installing missing tools, a
# scratch folder, processes stopped by pid on exit, free loopback ports, Redis.

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# require COMMAND:PACKAGE ...  installs, with apt-get, the packages whose command is missing.
require() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  echo "installing with apt-get: ${missing[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

WORK=$(mktemp -d)
PIDS=()
# Stops in the reverse order of start, each before the next: a tollgate draining after its
# Redis was gone would log store failures that the run never had.
cleanup() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_redis [SERVER]: a redis-server (or SERVER, e.g. valkey-server) on a free loopback
# port, no persistence; sets REDIS_PORT and REDIS_PID and waits until it answers.
start_redis() {
  REDIS_PORT=$(free_port)
  "${1:-redis-server}" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis-$REDIS_PORT.log" &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  for _ in $(seq 100); do
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && return 0
    sleep 0.1
  done
  echo "redis-server did not start" >&2
  exit 1
}

# rcli ARGS...: redis-cli against the Redis of start_redis.
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

# bucket_script [REV]: lua/token_bucket.lua as tollgate ships it, its files in BUCKET_SCRIPT's
# order (crates/tollgate-core/src/store/redis/script.rs); as of git revision REV when given (a
# revision from before lua/decide.lua kept its helpers in front of lua/token_bucket.lua).
bucket_script() {
  local f files="bounds token_bucket calendar stored groups global decide"
  if [ -n "${1:-}" ] && ! git cat-file -e "$1:lua/decide.lua" 2>/dev/null; then
    files="calendar bounds groups global token_bucket"
  fi
  for f in $files; do
    if [ -n "${1:-}" ]; then git show "$1:lua/$f.lua" 2>/dev/null || true; else cat "lua/$f.lua"; fi
  done
}

# median: the median of the numbers on stdin, one per line (the mean of the middle two when
# their count is even).
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# ticks PID: the CPU time (user + system, in clock ticks) process PID has used; 0 without one.
ticks() { if [ -n "$1" ]; then awk '{ print $14 + $15 }' "/proc/$1/stat"; else echo 0; fi; }

# start_otlp_receiver: an OTLP trace receiver (the tests' own, on Python's grpcio and
# opentelemetry-proto) on free loopback ports; sets OTLP_HTTP (host:port of OTLP/HTTP).
start_otlp_receiver() {
  python3 tests/support/otlp_receiver.py "$WORK/spans.jsonl" "$WORK/otlp-ports" &
  PIDS+=($!)
  for _ in $(seq 100); do
    if [ -f "$WORK/otlp-ports" ]; then
      OTLP_HTTP="127.0.0.1:$(cut -d' ' -f2 "$WORK/otlp-ports")"
      return 0
    fi
    sleep 0.1
  done
  echo "the OTLP receiver did not start (pip install grpcio opentelemetry-proto)" >&2; exit 1
}

# per_key_config PORT ADMIN BACKEND: a tollgate config on stdout with one limit keyed by the
# path that never denies (rate 1,000/s, burst 1,000,000), on the memory store or on the
# Redis of start_redis.
per_key_config() {
  cat <<TOML
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
[store]
backend = "$3"
url = "redis://127.0.0.1:${REDIS_PORT:-6379}/0"
timeout_ms = 1000
[[limits]]
name = "per-key"
rate = 1000
burst = 1000000
key = ["path"]
TOML
}

# start_per_key NAME BINARY BACKEND [TOML]: BINARY with per_key_config (and TOML appended),
# waited for until ready; sets PORT_<NAME> and PID_<NAME>.
start_per_key() {
  local port admin
  port=$(free_port); admin=$(free_port)
  { per_key_config "$port" "$admin" "$3"; printf '%s\n' "${4:-}"; } > "$WORK/$1.toml"
  RUST_LOG=warn "$2" --config "$WORK/$1.toml" &
  PIDS+=($!)
  printf -v "PID_$1" %s "$!"
  printf -v "PORT_$1" %s "$port"
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  echo "tollgate $1 did not get ready" >&2; exit 1
}

