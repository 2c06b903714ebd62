#!/usr/bin/env bash
# What recording denials costs /check: deny floods against this tree's tollgate and one built
# from BASE (a commit without the recording), side by side, in interleaved rounds; prints
# medians and ratios (this tree / base) of CPU per check and of throughput per flood.
# Recording happens only on a denial, so a deny flood is its worst case (timeout_ms = 500: a
# loaded machine must not open the breaker):
#   - one key, memory store:          every check decided in memory and denied;
#   - 10,000 keys, memory store:      the summaries churn (a new key takes over a counter);
#   - one key, Redis store:           the deny cache answers the flood without Redis;
#   - 10,000 keys, Redis store:       deny cache and Redis.
#
#   BASE=<commit> bench/top.sh                       # 3 rounds of 10 s runs (about 9 minutes)
#   BASE=<commit> ROUNDS=1 DURATION=3 bench/top.sh   # a quick look
#   BASE_BIN=path/to/tollgate bench/top.sh           # compare with a binary already built
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DURATION=${DURATION:-10}   # seconds per load run
ROUNDS=${ROUNDS:-3}        # interleaved rounds; medians are reported
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}        # distinct keys of the many-keys floods

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl

echo "building this tree (release)" >&2
cargo build --release --quiet --bin tollgate
cp target/release/tollgate "$WORK/tollgate-new"
if [ -z "${BASE_BIN:-}" ]; then
  : "${BASE:?set BASE=<commit> (or BASE_BIN=<binary>) to compare with}"
  echo "building $BASE (release, dependencies shared with this tree's target/)" >&2
  git worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
  trap 'git -C "$ROOT" worktree remove --force "$WORK/base" 2>/dev/null || true; cleanup' EXIT
  (cd "$WORK/base" && cargo build --release --quiet --bin tollgate --target-dir "$ROOT/target")
  cp target/release/tollgate "$WORK/tollgate-base"
  # Leave this tree's binary in place for whoever runs cargo next.
  cargo build --release --quiet --bin tollgate
  BASE_BIN=$WORK/tollgate-base
fi

wait_http() { for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "nothing answers $1" >&2; exit 1; }

start_redis

start_tollgate() { # name binary backend ; sets PORT_<name> and ADMIN_<name>
  local name=$1 binary=$2 backend=$3 port admin conf=$WORK/$1.toml
  port=$(free_port); admin=$(free_port)
  cat >"$conf" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"

[store]
backend = "$backend"
url = "redis://127.0.0.1:$REDIS_PORT/0"
key_prefix = "$name"
timeout_ms = 500
max_buckets = 1000000

[[limits]]
name = "flood"
rate = "1/min"
burst = 1
key = ["path"]
TOML
  RUST_LOG=warn "$binary" --config "$conf" &
  PIDS+=($!)
  eval "PORT_$name=$port; ADMIN_$name=$admin; PID_$name=$!"
  wait_http "http://127.0.0.1:$port/healthz"
}

for backend in memory redis; do
  start_tollgate "base_$backend" "$BASE_BIN" "$backend"
  start_tollgate "new_$backend" "$WORK/tollgate-new" "$backend"
done

# CPU time of a process (user + system), in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK_US=$(awk -v hz="$(getconf CLK_TCK)" 'BEGIN {print 1000000 / hz}')

run() { # name one|many -> "requests/s CPU-µs-per-check" of that instance
  local port_var=PORT_$1 pid_var=PID_$1 before after
  before=$(cpu_ticks "${!pid_var}")
  if [ "$2" = one ]; then
    wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:${!port_var}/check/victim"
  else
    KEYS=$KEYS wrk -t1 -c"$CONNS" -d"${DURATION}s" -s bench/random_key.lua \
      "http://127.0.0.1:${!port_var}/check"
  fi >"$WORK/wrk.out"
  after=$(cpu_ticks "${!pid_var}")
  awk -v t=$((after - before)) -v us="$TICK_US" '
    /requests in/ {n = $1} /^Requests\/sec/ {r = $2}
    END {printf "%s %.2f\n", r, (n > 0) ? t * us / n : 0}' "$WORK/wrk.out"
}

declare -A R C
SCENARIOS="memory:one memory:many redis:one redis:many"
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for scenario in $SCENARIOS; do
    backend=${scenario%%:*} keys=${scenario#*:}
    # Alternate which build goes first, so neither always meets a warmer machine.
    if [ $((round % 2)) = 1 ]; then order="base new"; else order="new base"; fi
    for build in $order; do
      read -r rate cpu < <(run "${build}_$backend" "$keys")
      R[$build:$scenario]+="$rate "
      C[$build:$scenario]+="$cpu "
    done
  done
done

echo
# CPU per check is what recording adds; throughput swings with whatever else the machine runs.
echo "| deny flood | CPU µs/check, base | with recording | ratio | req/s, base | with recording | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for scenario in $SCENARIOS; do
  b=$(printf '%s\n' ${R[base:$scenario]} | median)
  n=$(printf '%s\n' ${R[new:$scenario]} | median)
  cb=$(printf '%s\n' ${C[base:$scenario]} | median)
  cn=$(printf '%s\n' ${C[new:$scenario]} | median)
  label="${scenario#*:} key(s), ${scenario%%:*} store"
  [ "${scenario#*:}" = many ] && label="$KEYS keys, ${scenario%%:*} store"
  [ "${scenario#*:}" = one ] && label="one key, ${scenario%%:*} store"
  printf '| %s | %.2f | %.2f | %s | %.0f | %.0f | %s |\n' "$label" "$cb" "$cn" \
    "$(awk -v a="$cn" -v b="$cb" 'BEGIN {printf "%.3f", a / b}')" "$b" "$n" \
    "$(awk -v a="$n" -v b="$b" 'BEGIN {printf "%.3f", a / b}')"
done
echo
echo "rounds: $ROUNDS x ${DURATION}s, wrk -t1 -c$CONNS; all runs:"
for key in "${!R[@]}"; do echo "  $key: req/s ${R[$key]}; CPU µs/check ${C[$key]}"; done | sort
for backend in memory redis; do
  admin_var="ADMIN_new_$backend"
  denied=$(curl -s "http://127.0.0.1:${!admin_var}/metrics" |
    awk '/^tollgate_checks_total\{result="(allowed|denied)"\}/ {split($1, a, "\""); v[a[2]] = $2}
         END {printf "%.3f", v["denied"] / (v["denied"] + v["allowed"])}')
  echo "share of checks denied, $backend store: $denied"
done
curl -s "http://127.0.0.1:$ADMIN_new_memory/v1/top?window=15m&n=3"; echo
