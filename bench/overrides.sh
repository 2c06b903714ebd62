#!/usr/bin/env bash
# Runtime overrides at the cap: INSTANCES tollgate instances share one Redis whose limit holds
# ENTRIES runtime overrides (10,000, the cap); checks run against every instance while an
# operator changes one override every EVERY seconds (a DELETE of one, then a PUT of it back,
# each through another instance). Reports what the checks saw (answers per on_error, store
# errors, against a same-length phase without changes; every check goes to Redis) and, first,
# what a change costs Redis with no checks running: the time of the change's script and of
# every instance's catch-up, from Redis's own log of command durations.
#
# With a second binary (OLD=path/to/tollgate), runs the same scenario with it first: a
# same-run baseline. Starts its own redis-server on a free loopback port; everything started
# here is stopped by pid on exit.
#
#   bench/overrides.sh                              # this tree, 10 instances, 30 s phases
#   OLD=/path/to/old/tollgate bench/overrides.sh    # and a baseline binary first
set -euo pipefail
cd "$(dirname "$0")/.."

INSTANCES=${INSTANCES:-10}
ENTRIES=${ENTRIES:-10000}
DURATION=${DURATION:-30}
EVERY=${EVERY:-1}
COST_CHANGES=${COST_CHANGES:-10}
TOKEN=bench-admin-token-0123456789
HASH='tollgate:{tollgate:overrides}:limit:capped'
VERSIONS='tollgate:{tollgate:overrides}:versions'

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl
echo "building tollgate (release)" >&2
cargo build --release --quiet --bin tollgate
start_redis

# seed: ENTRIES overrides written straight into Redis, as any release reads them.
seed() {
  rcli FLUSHALL >/dev/null
  for i in $(seq "$ENTRIES"); do
    printf "HSET %s seed-%d '{\"k\":[\"seed-%d\"],\"b\":50}'\n" "$HASH" "$i" "$i"
  done | rcli >/dev/null
  rcli HSET "$VERSIONS" capped 1 >/dev/null
}

config() { # port admin
  cat <<TOML
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$2"
admin_token = "$TOKEN"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
timeout_ms = 50
on_error = "allow"
# Every check goes to Redis, denied or not.
deny_cache = false
[[limits]]
name = "capped"
rate = 1000
burst = 1000
key = ["header:x-api-key"]
TOML
}

# metric ADMIN_PORT PREFIX: the sum of the samples whose line starts with PREFIX.
metric() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk -v p="$2" 'index($0, p) == 1 { s += $NF } END { printf "%d", s }'
}

# change I: the I-th override change through the I-th instance, at the cap: a DELETE of a
# seeded entry, then a PUT of it back with other numbers and a TTL. A change the instance
# could not make (a store timeout: 503) is counted in FAILED.
FAILED=0
change() {
  local i=$1 a=${ADMINS[$(($1 % ${#ADMINS[@]}))]} code
  local url="http://127.0.0.1:$a/v1/overrides/capped?key=seed-$((i / 2 + 1))"
  if [ $((i % 2)) = 0 ]; then
    code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "Authorization: Bearer $TOKEN" "$url")
  else
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H "Authorization: Bearer $TOKEN" \
      -H 'Content-Type: application/json' -d '{"burst": 3, "ttl_s": 600}' "$url")
  fi
  case "$code" in 2??) ;; *) FAILED=$((FAILED + 1)) ;; esac
}

# cost LABEL: Redis time of the override scripts for COST_CHANGES changes, no checks running:
# every command is logged with its duration (SLOWLOG at 0 µs); the change itself and every
# instance's catch-up carry the limit's entry hash among their keys, the polls only the
# version hash.
cost() {
  rcli CONFIG SET slowlog-log-slower-than 0 >/dev/null
  rcli CONFIG SET slowlog-max-len 1000000 >/dev/null
  # One change first, unmeasured: the seeded limit has no log yet, so every instance reads it
  # whole once at its first catch-up, as after an upgrade.
  change 1
  sleep 1
  rcli SLOWLOG RESET >/dev/null
  local started=$SECONDS i
  FAILED=0
  for i in $(seq 2 $((COST_CHANGES + 1))); do change "$i"; sleep "$EVERY"; done
  echo "$1: $FAILED of $COST_CHANGES changes refused (store errors)"
  local elapsed=$((SECONDS - started))
  rcli --json SLOWLOG GET -1 | python3 -c '
import json, sys
label, changes, elapsed = sys.argv[1], int(sys.argv[2]), max(int(sys.argv[3]), 1)
entry_us = poll_us = calls = worst = whole = 0
for _id, _at, us, args, *_ in json.load(sys.stdin):
    if args[0].upper() not in ("EVAL", "EVALSHA"):
        continue  # run by a script: its time is counted in the script
    text = " ".join(args)
    if ":limit:capped" in text:
        entry_us += us; calls += 1; worst = max(worst, us)
        whole += us >= 1000  # a read of the whole limit (a change or a catch-up takes µs)
    elif "overrides}:versions" in text:
        poll_us += us
print(f"{label}: {changes} changes: {calls} override script calls (changes and catch-ups), "
      f"{entry_us / changes / 1000:.2f} ms of Redis per change, slowest call {worst / 1000:.2f} ms, "
      f"{whole} calls of 1 ms or more; "
      f"polls {poll_us / elapsed / 1000:.2f} ms of Redis per second")
' "$1" "$COST_CHANGES" "$elapsed"
  rcli CONFIG SET slowlog-log-slower-than 10000 >/dev/null
  rcli SLOWLOG RESET >/dev/null
}

# phase LABEL CHANGES: DURATION seconds of checks (one wrk connection per instance), with an
# override change every EVERY seconds when CHANGES is 1.
phase() {
  local label=$1 changes=$2 errors0=0 errors1=0 store0=0 store1=0 made=0 pids=() a p
  for a in "${ADMINS[@]}"; do
    errors0=$((errors0 + $(metric "$a" 'tollgate_checks_total{result="error_')))
    store0=$((store0 + $(metric "$a" 'tollgate_store_errors_total')))
  done
  for p in "${PORTS[@]}"; do
    wrk -t1 -c1 -d"${DURATION}s" -H 'x-api-key: seed-7' "http://127.0.0.1:$p/check" \
      > "$WORK/wrk-$p.txt" &
    pids+=($!)
  done
  FAILED=0
  if [ "$changes" = 1 ]; then
    local end=$((SECONDS + DURATION))
    while [ "$SECONDS" -lt "$end" ]; do change "$made"; made=$((made + 1)); sleep "$EVERY"; done
  fi
  wait "${pids[@]}"
  for a in "${ADMINS[@]}"; do
    errors1=$((errors1 + $(metric "$a" 'tollgate_checks_total{result="error_')))
    store1=$((store1 + $(metric "$a" 'tollgate_store_errors_total')))
  done
  local checks
  checks=$(cat "$WORK"/wrk-*.txt | awk '/requests in/ { s += $1 } END { print s }')
  echo "$label: $checks checks, $((errors1 - errors0)) answered per on_error," \
    "$((store1 - store0)) store errors, $made override changes ($FAILED refused)"
}

run() { # label binary
  local label=$1 binary=$2 port admin i
  seed
  PORTS=(); ADMINS=(); local started=()
  for i in $(seq "$INSTANCES"); do
    port=$(free_port); admin=$(free_port)
    config "$port" "$admin" > "$WORK/$label-$i.toml"
    RUST_LOG=error "$binary" --config "$WORK/$label-$i.toml" &
    PIDS+=($!); started+=($!)
    PORTS+=("$port"); ADMINS+=("$admin")
  done
  for admin in "${ADMINS[@]}"; do
    for _ in $(seq 300); do
      [ "$(curl -s -H "Authorization: Bearer $TOKEN" "http://127.0.0.1:$admin/v1/overrides/capped" \
        | grep -o '"seed-' | wc -l)" -ge "$ENTRIES" ] && break
      sleep 0.2
    done
  done
  cost "$label"
  phase "$label, checks, no changes" 0
  phase "$label, checks, a change every ${EVERY}s" 1
  for i in "${started[@]}"; do kill "$i"; wait "$i" 2>/dev/null || true; done
}

echo "$INSTANCES instances, $ENTRIES overrides in the limit, ${DURATION}s phases," \
  "$(nproc) cores, $(redis-server --version | grep -o 'v=[0-9.]*')"
if [ -n "${OLD:-}" ]; then run baseline "$OLD"; fi
run "this tree" target/release/tollgate
