#!/usr/bin/env bash
# Checks per Redis core-second: tollgate's /check (coalesced script calls) against the
# commands envoyproxy/ratelimit sends per descriptor, INCRBY then EXPIRE: by default one
# request's commands go out together (a descriptor's pair in one round trip: -P 2), with
# REDIS_PIPELINE_WINDOW several requests' too (-P 8). Same Redis, same run.
# 10,000 keys, 64 connections; Redis CPU from INFO cpu around each load; rounds interleaved,
# medians.
#
# BORROW=1 adds borrowed tokens (limits[].borrow = true, store.borrow_horizon_ms =
# $HORIZON_MS, default 100, and store.borrow_longest_horizon_ms = $LONGEST_MS, default 10000:
# slower keys borrow on horizons ten times longer, up to that) in three shapes: 10,000 uniform
# keys, a Zipf spread (s = 1.1) over 100,000 keys, and one hot key at 5,000 checks/s; each
# against the same tollgate without borrowing and ERL's pair over as many keys, with the script
# calls and the buckets Redis decided per check. The borrowing instance runs each shape for
# $WARMUP s (default 20) before it is measured: its counts of each key's demand are state that
# a longer rung needs time to fill, as in service. On the Zipf spread it also compares the
# borrowing /check's throughput with redis-benchmark running the same script (one plain check
# per call, uniform over as many keys: redis-benchmark draws no Zipf spread).
# COLD=1 measures a fresh start instead: the borrowing instance is started anew before each
# measured run, with no warm-up, on a Redis just flushed (use DURATION=6: its first six seconds).
# COALESCE_MS=N has every tollgate gather a worker's checks for N ms before their call
# (store.coalesce_window_ms), as ERL's -P 8 stands for its pipeline window.
#
#   bench/erl_pattern.sh                 # 3 rounds of 8 s
#   ROUNDS=1 DURATION=3 bench/erl_pattern.sh
#   BASE_BIN=/path/to/older/tollgate bench/erl_pattern.sh   # and that build's /check, same run
#   BORROW=1 HORIZON_MS=100 bench/erl_pattern.sh
#   BORROW=1 LONGEST_MS=100 bench/erl_pattern.sh             # one horizon for every key
#   BORROW=1 COLD=1 SHAPES=zipf DURATION=6 bench/erl_pattern.sh  # a fresh instance's first 6 s
#   BORROW=1 BORROW_BIN=/path/to/other/tollgate bench/erl_pattern.sh  # that build borrows
#   BORROW=1 COALESCE_MS=1 bench/erl_pattern.sh                # calls gathered for 1 ms
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8}
WARMUP=${WARMUP:-20}  # with BORROW=1: seconds of each shape before the borrowing one is measured
SHAPES=${SHAPES:-uniform zipf hot}   # with BORROW=1: which shapes, of uniform, zipf, hot
ROUNDS=${ROUNDS:-3}
KEYS=${KEYS:-10000}
export TOLLGATE_STORE__COALESCE_WINDOW_MS=${COALESCE_MS:-0}

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-benchmark:redis-tools curl:curl
cargo build --release --quiet --bin tollgate
start_redis

redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }

start_per_key this target/release/tollgate redis "borrow = false"  # borrowing is on by default
[ -z "${BASE_BIN:-}" ] || start_per_key base "$BASE_BIN" redis
start_borrowing() {
  TOLLGATE_STORE__BORROW_HORIZON_MS=${HORIZON_MS:-100} \
    TOLLGATE_STORE__BORROW_LONGEST_HORIZON_MS=${LONGEST_MS:-10000} \
    start_per_key borrow "${BORROW_BIN:-target/release/tollgate}" redis "borrow = true"
}
[ -z "${BORROW:-}" ] || start_borrowing

# per_core N R0 R1: N operations over the Redis CPU seconds between R0 and R1.
per_core() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {printf "%.0f", n / (b - a)}'; }

# served REGEX: calls Redis has served of the commands whose names match REGEX.
served() { rcli INFO commandstats | tr -d '\r' | awk -F'[=,:]' -v re="^cmdstat_($1)$" '
  $1 ~ re {s += $3} END {print s + 0}'; }
# script_calls: EVALSHA and EVAL calls; bucket_reads: GET calls (the script reads each bucket
# it decides once).
script_calls() { served 'evalsha|eval'; }
bucket_reads() { served get; }

# tollgate_checks PORT [SCRIPT KEYS]: checks per Redis core-second through the tollgate on
# PORT, with the wrk script SCRIPT (default bench/random_key.lua) over KEYS keys; the script
# calls per check go to $WORK/calls, the buckets the script decided per check to $WORK/reads.
tollgate_checks() {
  local r0 r1 c0 c1 g0 g1 n
  rcli FLUSHALL >/dev/null
  r0=$(redis_cpu); c0=$(script_calls); g0=$(bucket_reads)
  KEYS=${3:-$KEYS} wrk -t1 -c64 -d"${DURATION}s" -s "${2:-bench/random_key.lua}" \
    "http://127.0.0.1:$1/check" >"$WORK/wrk.out"
  r1=$(redis_cpu); c1=$(script_calls); g1=$(bucket_reads)
  n=$(awk '/ requests in / {print $1}' "$WORK/wrk.out")
  awk '/^Requests\/sec/ {print $2}' "$WORK/wrk.out" >>"$WORK/rps"
  awk -v c="$((c1 - c0))" -v n="$n" 'BEGIN {printf "%.3f\n", c / n}' >>"$WORK/calls"
  awk -v g="$((g1 - g0))" -v n="$n" 'BEGIN {printf "%.3f\n", g / n}' >>"$WORK/reads"
  per_core "$n" "$r0" "$r1"
}

# script_rps KEYS: requests per second of redis-benchmark calling the token bucket script, as
# tollgate's check of one never-denying bucket would, over KEYS keys (64 clients).
script_rps() {
  local sha
  sha=$(rcli SCRIPT LOAD "$(bucket_script)")
  rcli FLUSHALL >/dev/null
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 64 -r "$1" -n $((DURATION * 32000)) -q \
    evalsha "$sha" 1 "tollgate:per-key:{/z__rand_int__}" 1000 1000000 1 0 2>/dev/null \
    | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | awk '{print $1}'
}

# erl PIPELINE [KEYS]: descriptors (one INCRBY and one EXPIRE each) per Redis core-second.
erl() {
  local r0 r1 n=$((DURATION * 40000))
  rcli FLUSHALL >/dev/null
  r0=$(redis_cpu)
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 64 -P "$1" -r "${2:-$KEYS}" -n "$n" -q \
    incrby "erl:__rand_int__" 1 >/dev/null
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 64 -P "$1" -r "${2:-$KEYS}" -n "$n" -q \
    expire "erl:__rand_int__" 60 >/dev/null
  r1=$(redis_cpu)
  per_core "$n" "$r0" "$r1"
}

: >"$WORK/check"; : >"$WORK/base"; : >"$WORK/p2"; : >"$WORK/p8"
if [ -n "${BORROW:-}" ]; then
  # shape NAME SCRIPT KEYS: one round of a shape, without and with borrowing, and ERL's pair
  # over as many keys; ratios against ERL in the same round.
  shape() {
    local plain borrowed p2 p8
    : >"$WORK/calls"; : >"$WORK/rps"; : >"$WORK/reads"
    plain=$(tollgate_checks "$PORT_this" "$2" "$3")
    if [ -n "${COLD:-}" ]; then
      # A fresh instance: nothing learnt of any key.
      kill "$PID_borrow"; wait "$PID_borrow" 2>/dev/null || true
      start_borrowing
    else
      # The borrowing instance's counts of each key's demand are its state: run the shape
      # unmeasured first, long enough for the longest rung to fill, as in service.
      KEYS=$3 wrk -t1 -c64 -d"${WARMUP}s" -s "$2" "http://127.0.0.1:$PORT_borrow/check" >/dev/null
    fi
    borrowed=$(tollgate_checks "$PORT_borrow" "$2" "$3")
    p2=$(erl 2 "$3"); p8=$(erl 8 "$3")
    echo "$plain" >>"$WORK/$1.plain"; echo "$borrowed" >>"$WORK/$1.borrow"
    echo "$p2" >>"$WORK/$1.p2"; echo "$p8" >>"$WORK/$1.p8"
    sed -n 2p "$WORK/calls" >>"$WORK/$1.calls"
    sed -n 2p "$WORK/reads" >>"$WORK/$1.reads"
    if [ "$1" = zipf ]; then
      sed -n 2p "$WORK/rps" >>"$WORK/zipf.rps"
      script_rps "$3" >>"$WORK/zipf.rb"
    fi
    awk -v b="$borrowed" -v p="$p8" 'BEGIN {printf "%.2f\n", b / p}' >>"$WORK/$1.r8"
    awk -v b="$borrowed" -v p="$p2" 'BEGIN {printf "%.2f\n", b / p}' >>"$WORK/$1.r2"
  }
  for round in $(seq "$ROUNDS"); do
    echo "borrow round $round/$ROUNDS" >&2
    for name in $SHAPES; do
      case $name in
        uniform) shape uniform bench/random_key.lua 10000 ;;
        zipf) shape zipf bench/zipf_key.lua 100000 ;;
        hot) RATE=5000 CONNS=64 shape hot bench/hot_key.lua 1 ;;
      esac
    done
  done
  printf '| shape (horizons %s to %s ms) | tollgate | borrow | ERL -P 2 | ERL -P 8 | borrow / -P 2 | borrow / -P 8 | script calls per check, borrow | buckets Redis decided per check, borrow |\n' "${HORIZON_MS:-100}" "${LONGEST_MS:-10000}"
  printf '|---|---|---|---|---|---|---|---|---|\n'
  for name in $SHAPES; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" \
      "$(median <"$WORK/$name.plain")" "$(median <"$WORK/$name.borrow")" \
      "$(median <"$WORK/$name.p2")" "$(median <"$WORK/$name.p8")" \
      "$(median <"$WORK/$name.r2")" "$(median <"$WORK/$name.r8")" "$(median <"$WORK/$name.calls")" \
      "$(median <"$WORK/$name.reads")"
  done
  if [[ " $SHAPES " == *" zipf "* ]]; then
    printf '\n| Zipf spread, borrowing | /check req/s | redis-benchmark EVALSHA req/s | ratio |\n|---|---|---|---|\n'
    printf '| %s rounds | %s | %s | %s |\n' "$ROUNDS" "$(median <"$WORK/zipf.rps")" \
      "$(median <"$WORK/zipf.rb")" "$(paste "$WORK/zipf.rps" "$WORK/zipf.rb" \
        | awk '{printf "%.2f\n", $1 / $2}' | median)"
  fi
  for name in $SHAPES; do
    echo "$name rounds: borrow $(paste -sd' ' "$WORK/$name.borrow"); /-P8 $(paste -sd' ' "$WORK/$name.r8"); /-P2 $(paste -sd' ' "$WORK/$name.r2")" >&2
  done
  exit 0
fi
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  tollgate_checks "$PORT_this" >>"$WORK/check"; echo >>"$WORK/check"
  if [ -n "${BASE_BIN:-}" ]; then
    tollgate_checks "$PORT_base" >>"$WORK/base"; echo >>"$WORK/base"
  fi
  erl 2 >>"$WORK/p2"; echo >>"$WORK/p2"
  erl 8 >>"$WORK/p8"; echo >>"$WORK/p8"
done
row() { printf '| %s | %s | %s |\n' "$1" "$(median <"$2")" "$(paste -sd' ' "$2")"; }
printf '| per Redis core-second | median | rounds |\n|---|---|---|\n'
row "tollgate /check (coalesced script calls)" "$WORK/check"
[ -z "${BASE_BIN:-}" ] || row "tollgate /check, BASE_BIN" "$WORK/base"
row "INCRBY + EXPIRE per descriptor, -P 2 (its default)" "$WORK/p2"
row "INCRBY + EXPIRE per descriptor, -P 8 (pipeline window)" "$WORK/p8"
