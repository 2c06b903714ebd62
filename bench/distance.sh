#!/usr/bin/env bash
# Latency at a distance: tollgate on a Redis that is ONE_WAY µs away in each direction (a
# latency-injecting TCP proxy between them, examples/latency_proxy.rs), under 64 concurrent
# connections at half the saturating rate. For each distance (0 = no proxy, the reference):
#   1. the saturating rate: wrk -t1 -c64 for SAT_SECONDS (closed loop, 10,000 keys);
#   2. RUNS rounds of an open-loop load at half that rate (examples/paced_load.rs: each
#      connection on a fixed schedule; latency counted from when a request was due);
# and the medians of p50/p99 against the targets p50 <= RTT + 0.5 ms, p99 <= 2 RTT + 1 ms.
# The proxy reports how late it delivered (its threads wake late on a starved machine) and
# the load how many sends went out over 1 ms late: when these are large, the latencies
# measure the machine, not tollgate.
# Everything listens on 127.0.0.1 and stops on exit.
#
# Usage: bench/distance.sh [one-way µs ..., default "500 2000"]
#   env: RUNS (3), ROUND_SECONDS (10, per paced round), SAT_SECONDS (5), CONNECTIONS (64),
#        PACE (0.5: the share of the saturating rate the paced rounds send)
set -euo pipefail
cd "$(dirname "$0")/.."

DISTANCES="${*:-500 2000}"
RUNS="${RUNS:-3}"
SECONDS_PER_RUN="${ROUND_SECONDS:-10}"
SAT_SECONDS="${SAT_SECONDS:-5}"
CONNECTIONS="${CONNECTIONS:-64}"
PACE="${PACE:-0.5}"

. bench/lib.sh
require wrk:wrk redis-server:redis-server curl:curl

cargo build --release --quiet --bin tollgate --example latency_proxy --example paced_load
TOLLGATE="${BIN:-$PWD/target/release/tollgate}"   # BIN=: another build, for a before/after
PROXY="$PWD/target/release/examples/latency_proxy"
LOAD="$PWD/target/release/examples/paced_load"

start_redis

wait_ready() {
  for _ in $(seq 100); do
    [ "$(curl -s "http://127.0.0.1:$1/readyz" 2>/dev/null)" = ready ] && return 0
    sleep 0.1
  done
  echo "tollgate on $1 never became ready" >&2
  exit 1
}
median() { sort -n | sed -n "$(( (RUNS + 1) / 2 ))p"; }

# tollgate on the Redis at port $1, one limit that never denies, one bucket per path (10,000
# paths). A generous store budget and on_error = "deny": a slow call is measured, and a failed
# one counted, never admitted unseen. Sets TG_PORT, TG_ADMIN, TG_PID.
start_tollgate() {
  TG_PORT=$(free_port); TG_ADMIN=$(free_port)
  cat > "$WORK/tollgate-$TG_PORT.toml" <<TOML
listen = "127.0.0.1:$TG_PORT"
admin_listen = "127.0.0.1:$TG_ADMIN"
[store]
backend = "redis"
url = "redis://127.0.0.1:$1/0"
timeout_ms = 1000
on_error = "deny"
[[limits]]
name = "per-path"
rate = 1000000
burst = 1000000
key = ["path"]
TOML
  RUST_LOG=warn "$TOLLGATE" --config "$WORK/tollgate-$TG_PORT.toml" &
  TG_PID=$!
  PIDS+=("$TG_PID")
  wait_ready "$TG_ADMIN"
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC')" >&2
RESULTS="$WORK/results"; : > "$RESULTS"
for one_way in 0 $DISTANCES; do
  if [ "$one_way" = 0 ]; then
    port=$REDIS_PORT
  else
    "$PROXY" "$REDIS_PORT" "$one_way" > "$WORK/proxy-$one_way.out" &
    proxy_pid=$!
    PIDS+=("$proxy_pid")
    for _ in $(seq 100); do grep -q '^port ' "$WORK/proxy-$one_way.out" && break; sleep 0.1; done
    port=$(awk '/^port / { print $2; exit }' "$WORK/proxy-$one_way.out")
  fi
  start_tollgate "$port"
  url="http://127.0.0.1:$TG_PORT"
  wrk -t1 -c"$CONNECTIONS" -d2s -s bench/random_key.lua "$url" >/dev/null   # warm-up
  saturated=$(wrk -t1 -c"$CONNECTIONS" -d"${SAT_SECONDS}s" --latency -s bench/random_key.lua "$url" \
    | awk '/^Requests\/sec/ { printf "%.0f", $2 }')
  rate=$(awk -v s="$saturated" -v p="$PACE" 'BEGIN { printf "%d", s * p }')
  echo "one-way ${one_way} µs: saturating ${saturated}/s, paced at ${rate}/s" >&2
  : > "$WORK/paced-$one_way"
  [ "$one_way" = 0 ] && echo "late_us 0" > "$WORK/proxy-0.out"
  late_before=$(wc -l < "$WORK/proxy-$one_way.out")
  for run in $(seq "$RUNS"); do
    "$LOAD" "127.0.0.1:$TG_PORT" "$rate" "$SECONDS_PER_RUN" "$CONNECTIONS" >> "$WORK/paced-$one_way"
    echo "  round $run: $(tail -1 "$WORK/paced-$one_way")" >&2
  done
  # The proxy's worst lateness during the paced rounds (0 without a proxy).
  late=$(tail -n +"$late_before" "$WORK/proxy-$one_way.out" \
    | awk '/^late_us/ { if ($2 > m) m = $2 } END { printf "%.2f", m / 1000 }')
  errors=$(curl -fsS "http://127.0.0.1:$TG_ADMIN/metrics" \
    | awk '/^tollgate_checks_total\{result="error_(allowed|denied)"\}/ { n += $2 } END { print n + 0 }')
  col() { cut -d' ' -f"$1" "$WORK/paced-$one_way" | median; }
  spread() { cut -d' ' -f"$1" "$WORK/paced-$one_way" | sort -n | paste -sd/ -; }
  echo "$one_way $saturated $rate $(col 2) $(col 3) $(col 5) $(spread 3) $(spread 5) $(col 7) $(col 8) $late $errors" >> "$RESULTS"
  stop "$TG_PID"
  [ "$one_way" = 0 ] || stop "$proxy_pid"
done

echo
echo "$CONNECTIONS connections, paced at $PACE of the saturating rate, $RUNS rounds of ${SECONDS_PER_RUN} s (medians; p50 and p99 of every round after them), $(nproc) cores, $(date -u +%Y-%m-%d)"
echo
echo "| one-way | RTT | saturating req/s | paced req/s | p50 ms (rounds) | p99 ms (rounds) | target p50 / p99 ms | met | late sends | proxy late ms (max) | non-2xx | store errors |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
while read -r one_way saturated rate rps p50 p99 p50s p99s bad late_pct proxy_late errors; do
  awk -v ow="$one_way" -v sat="$saturated" -v rate="$rps" -v p50="$p50" -v p99="$p99" \
      -v p50s="$p50s" -v p99s="$p99s" -v bad="$bad" -v late="$late_pct" -v pl="$proxy_late" -v err="$errors" 'BEGIN {
    rtt = 2 * ow / 1000
    if (ow == 0) { target = "(reference)"; met = "" }
    else {
      t50 = rtt + 0.5; t99 = 2 * rtt + 1
      target = sprintf("%.1f / %.1f", t50, t99)
      met = (p50 <= t50 ? "p50 yes" : "p50 NO") ", " (p99 <= t99 ? "p99 yes" : "p99 NO")
    }
    printf "| %s µs | %.1f ms | %s | %s | %s (%s) | %s (%s) | %s | %s | %s%% | %s | %s | %s |\n",
      ow, rtt, sat, rate, p50, p50s, p99, p99s, target, met, late, pl, bad, err
  }'
done < "$RESULTS"
