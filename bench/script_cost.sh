#!/usr/bin/env bash
# What the token-bucket script costs Redis, against the floor of the commands it needs.
#
# Starts its own redis-server on a free loopback port and loads lua/token_bucket.lua, the
# floor script bench/floor.lua (TIME, HMGET, HSET, PEXPIRE per bucket, nothing else) and,
# with BASELINE=<git revision>, that revision's lua/token_bucket.lua for a before/after in the
# same run. Every figure is read from Redis itself around a redis-benchmark run of EVALSHA:
# `INFO commandstats` (usec_per_call, the wall time Redis spent in the call) and `INFO cpu`
# (used_cpu_sys + used_cpu_user, which also counts reading the request and writing the reply,
# and which a busy machine's preemption does not inflate). Runs are interleaved, round by
# round; medians are printed, every round in brackets.
#
# Sections (SECTIONS, default all three):
#   cost      µs per call for 1 and 3 buckets, script ÷ floor
#   memory    live keys and used_memory after 100k clients' checks, per expiry rule
#   coalesce  Redis CPU per check: one call per check vs 8 checks in one batch call, 64 clients
#
#   BASELINE=main bench/script_cost.sh
#   ROUNDS=1 CALLS=50000 SECTIONS=cost bench/script_cost.sh   # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}            # interleaved rounds; medians are reported
CALLS=${CALLS:-200000}         # EVALSHA calls per run
CLIENTS=${CLIENTS:-50}         # redis-benchmark connections for the cost section
KEYS=${KEYS:-10000}            # distinct buckets (redis-benchmark -r)
SECTIONS=${SECTIONS:-"cost memory coalesce"}
BASELINE=${BASELINE:-}

. bench/lib.sh
require redis-server:redis-server redis-benchmark:redis-tools

start_redis
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }
cpu_s() { rcli INFO cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
info_field() { rcli INFO "$1" | awk -F: -v k="$2" '$1 == k {gsub(/\r/, "", $2); print $2}'; }

declare -A SHA
SHA[script]=$(rcli SCRIPT LOAD "$(bucket_script)")
SHA[floor]=$(rcli SCRIPT LOAD "$(cat bench/floor.lua)")
SCRIPTS="floor script"
if [ -n "$BASELINE" ]; then
  # A revision from before lua/bounds.lua has no such file: its script stands alone.
  SHA[baseline]=$(rcli SCRIPT LOAD "$(bucket_script "$BASELINE")")
  SCRIPTS="floor baseline script"
fi

# evalsha_args BUCKETS RATE BURST: the EVALSHA tail for BUCKETS independent random buckets.
evalsha_args() {
  local n=$1 i
  echo -n "$n"
  for i in $(seq "$n"); do echo -n " b$i:{__rand_int__}"; done
  for i in $(seq "$n"); do echo -n " $2 $3 1 0"; done
}

# batch_args REQUESTS RATE BURST: the EVALSHA tail of the script's batch form, REQUESTS
# one-bucket requests on independent random buckets (what tollgate sends for checks that
# queued together).
batch_args() {
  local n=$1 i
  echo -n "$n"
  for i in $(seq "$n"); do echo -n " b$i:{__rand_int__}"; done
  echo -n " *"
  for i in $(seq "$n"); do echo -n " 1 $2 $3 1 0"; done
}

# run NAME BUCKETS CLIENTS RATE BURST [PIPELINE] [FORM] -> "usec_per_call cpu_us_per_call"
# (FORM: evalsha_args, or batch_args for BUCKETS one-bucket requests in one call)
run() {
  local sha=${SHA[$1]} a b usec
  rcli FLUSHALL >/dev/null
  rcli CONFIG RESETSTAT >/dev/null
  a=$(cpu_s)
  # shellcheck disable=SC2046  # split on purpose; no globbing (the batch marker is "*")
  set -f
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$3" -P "${6:-1}" -n "$CALLS" -r "$KEYS" -q \
    EVALSHA "$sha" $("${7:-evalsha_args}" "$2" "$4" "$5") >/dev/null
  set +f
  b=$(cpu_s)
  usec=$(rcli INFO commandstats | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  echo "$usec $(awk -v a="$a" -v b="$b" -v n="$CALLS" 'BEGIN {printf "%.2f", (b - a) / n * 1e6}')"
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(redis-server --version | cut -d' ' -f3)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- 1. µs per call, script ÷ floor --------------------------------------------------------
if [[ " $SECTIONS " == *" cost "* ]]; then
  # rate 1/s, burst 1,000: every call finds its bucket in Redis, part-drained, and is allowed.
  declare -A US CPU
  for round in $(seq "$ROUNDS"); do
    for n in 1 3; do
      for s in $SCRIPTS; do
        read -r usec cpu < <(run "$s" "$n" "$CLIENTS" 1 1000)
        US[$s$n]+="$usec "; CPU[$s$n]+="$cpu "
      done
    done
    echo "# round $round done" >&2
  done
  echo
  echo "## µs per call ($ROUNDS rounds of $CALLS calls, $CLIENTS clients, $KEYS keys per bucket)"
  echo
  echo "| script | buckets | commandstats µs per call | Redis CPU µs per call | ÷ floor (commandstats) | ÷ floor (CPU) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  declare -A M MC
  for n in 1 3; do
    for s in $SCRIPTS; do
      # shellcheck disable=SC2086
      M[$s$n]=$(printf '%s\n' ${US[$s$n]} | median)
      # shellcheck disable=SC2086
      MC[$s$n]=$(printf '%s\n' ${CPU[$s$n]} | median)
      echo "| $s | $n | ${M[$s$n]} [$(echo ${US[$s$n]} | tr ' ' /)] | ${MC[$s$n]} [$(echo ${CPU[$s$n]} | tr ' ' /)] | $(ratio "${M[$s$n]}" "${M[floor$n]}") | $(ratio "${MC[$s$n]}" "${MC[floor$n]}") |"
    done
  done
  echo
  for s in $SCRIPTS; do
    echo "- $s: 3 buckets ÷ 1 bucket = $(ratio "${M[${s}3]}" "${M[${s}1]}") (commandstats), $(ratio "${MC[${s}3]}" "${MC[${s}1]}") (CPU)"
  done
fi

# --- 2. live keys and memory per 100k clients ----------------------------------------------
if [[ " $SECTIONS " == *" memory "* ]]; then
  # 100,000 clients under the built-in default limit (20/s, burst 100), 3 checks each on
  # average, spread over the run; sampled halfway and at the end of the traffic.
  MEM_CALLS=${MEM_CALLS:-300000}
  mem_run() { # NAME -> "keys_mid bytes_mid keys_end bytes_end seconds"
    local sha=${SHA[$1]} base started mid
    rcli FLUSHALL >/dev/null
    sleep 0.2
    base=$(info_field memory used_memory)
    started=$(date +%s.%N)
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 50 -n "$MEM_CALLS" -r 100000 -q \
      EVALSHA "$sha" 1 'c:{__rand_int__}' 20 100 1 0 >/dev/null &
    local bench=$!
    sleep "${MEM_MID:-4}"
    mid="$(rcli DBSIZE) $(( $(info_field memory used_memory) - base ))"
    wait "$bench"
    echo "$mid $(rcli DBSIZE) $(( $(info_field memory used_memory) - base )) $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')"
  }
  MEMS="script"
  [ -n "$BASELINE" ] && MEMS="baseline script"
  echo
  echo "## Live buckets: 100,000 clients, limit 20/s burst 100, $MEM_CALLS checks (50 clients)"
  echo
  echo "| script | live keys halfway | used_memory halfway | live keys at the end | used_memory at the end | run (s) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for round in $(seq "${MEM_ROUNDS:-1}"); do
    for s in $MEMS; do
      read -r k1 b1 k2 b2 secs < <(mem_run "$s")
      echo "| $s | $k1 | $(awk -v b="$b1" 'BEGIN {printf "%.1f MB", b / 1e6}') | $k2 | $(awk -v b="$b2" 'BEGIN {printf "%.1f MB", b / 1e6}') | $secs |"
    done
  done
fi

# --- 4. coalescing: Redis CPU per check, one call per check vs a batch of 8 ---------------
if [[ " $SECTIONS " == *" coalesce "* ]]; then
  # 64 clients; 8 one-bucket checks in one call of the script's batch form (as tollgate sends
  # checks that queue together): one TIME, one request and one reply instead of eight, each
  # check still decided on its own. tollgate's multiplexed connection also writes queued
  # single calls together, so the fair comparison is 8 calls pipelined (-P 8): same
  # syscalls, eight script runs. "8 buckets per call" is one check with 8 limits, for scale.
  declare -A CO
  for round in $(seq "$ROUNDS"); do
    for shape in 1:1 1:8 8:1 8:batch; do
      n=${shape%:*}
      if [ "${shape#*:}" = batch ]; then
        read -r usec cpu < <(run script "$n" 64 1 1000 1 batch_args)
      else
        read -r usec cpu < <(run script "$n" 64 1 1000 "${shape#*:}")
      fi
      CO[$shape]+="$(awk -v c="$cpu" -v n="$n" 'BEGIN {printf "%.2f", c / n}') "
    done
  done
  # shellcheck disable=SC2086
  c1=$(printf '%s\n' ${CO[1:1]} | median); cp=$(printf '%s\n' ${CO[1:8]} | median)
  # shellcheck disable=SC2086
  c8=$(printf '%s\n' ${CO[8:1]} | median); cb=$(printf '%s\n' ${CO[8:batch]} | median)
  echo
  echo "## Coalescing, measured: Redis CPU (INFO cpu) per bucket decided, 64 clients"
  echo
  echo "| shape | Redis CPU µs per bucket |"
  echo "| --- | --- |"
  echo "| 1 check per call, one call per write | $c1 [$(echo ${CO[1:1]} | tr ' ' /)] |"
  echo "| 1 check per call, 8 calls pipelined | $cp [$(echo ${CO[1:8]} | tr ' ' /)] |"
  echo "| 8 checks per call (batch form) | $cb [$(echo ${CO[8:batch]} | tr ' ' /)] |"
  echo "| 1 check of 8 buckets per call | $c8 [$(echo ${CO[8:1]} | tr ' ' /)] |"
  echo
  pct_less() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f", (1 - a / b) * 100}'; }
  echo "- a batch of 8 vs one call per write: $(ratio "$cb" "$c1")× ($(pct_less "$cb" "$c1")% less CPU per check)"
  echo "- a batch of 8 vs 8 calls pipelined: $(ratio "$cb" "$cp")× ($(pct_less "$cb" "$cp")% less CPU per check)"
  echo "- 8 buckets in one check vs 8 calls pipelined: $(ratio "$c8" "$cp")× ($(pct_less "$c8" "$cp")% less CPU per bucket)"
fi
