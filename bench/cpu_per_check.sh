#!/usr/bin/env bash
# tollgate's CPU time per check against the rate it is offered, on the Redis store over
# kept-alive connections: a check costs more when checks are few, since each one then wakes
# threads that a busy server finds awake. Paced loads (`examples/paced_load.rs`, 64
# connections, 10,000 keys) at each rate of RATES, then wrk at saturation; tollgate's user +
# system time from /proc divided by the checks answered, Redis's (INFO cpu) likewise.
#
# BASE_BIN=<another tollgate binary> measures it too, interleaved, for a before/after.
# TRACE_SAMPLING=<rate> adds this build with [tracing] on at that sampling rate (no caller
# sends a trace context: every check is a new root), exporting over OTLP/HTTP to a receiver
# on this machine (its CPU is not tollgate's), interleaved with the same build, tracing off.
#
#   bench/cpu_per_check.sh                       # RATES="2000 9500 30000", 5 s each, 3 rounds
#   BASE_BIN=/path/to/old/tollgate bench/cpu_per_check.sh
#   TRACE_SAMPLING=0.01 bench/cpu_per_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
RUNS=${RUNS:-3}
RATES=${RATES:-"2000 9500 30000"}

. bench/lib.sh
require wrk:wrk curl:curl redis-server:redis-server
cargo build --release --quiet --bin tollgate --example paced_load
start_redis

redis_cpu() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
# Script calls Redis has run so far (EVALSHA and EVAL): fewer than checks when calls batch.
script_calls() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" INFO commandstats | tr -d '\r' | awk -F'[:=,]' '
  /^cmdstat_(evalsha|eval):/ {s += $3} END {printf "%d", s}'; }

# The machine's idle CPU time so far, in seconds (all cores).
idle_s() { awk -v hz="$(getconf CLK_TCK)" '/^cpu / {printf "%.2f", ($5 + $6) / hz}' /proc/stat; }

# run NAME RATE|max -> "checks/s tollgate_us redis_us p50_ms load_tool_us idle_cores
# checks_per_call" (CPU µs per check; idle cores: the machine's idle time over the run's length)
run() {
  local pid_var="PID_$1" port_var="PORT_$1" t0 t1 r0 r1 n rps p50 i0 i1 c0 c1 tool=0
  t0=$(ticks "${!pid_var}"); r0=$(redis_cpu); i0=$(idle_s); c0=$(script_calls)
  if [ "$2" = max ]; then
    # wrk's own CPU time, from its rusage as a child of this python.
    tool=$(KEYS=10000 python3 -c '
import resource, subprocess, sys
with open(sys.argv[1], "w") as out:
    subprocess.run(sys.argv[2:], stdout=out, check=True)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime)' "$WORK/out" wrk -t1 -c64 -d"${DURATION}s" --latency \
      -s bench/random_key.lua "http://127.0.0.1:${!port_var}/check")
    n=$(awk '/ requests in / {print $1}' "$WORK/out")
    rps=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' "$WORK/out")
    p50=$(awk '/^ +50%/ {v = $2; if (v ~ /us$/) v = v / 1000; else if (v ~ /ms$/) v = v + 0; else v = v * 1000; print v}' "$WORK/out")
  else
    # sent rps p50 p90 p99 max non2xx late%
    read -r n rps p50 _ < <(target/release/examples/paced_load "127.0.0.1:${!port_var}" "$2" \
      "$DURATION" 64 10000 /check/k)
  fi
  t1=$(ticks "${!pid_var}"); r1=$(redis_cpu); i1=$(idle_s); c1=$(script_calls)
  awk -v t="$(( t1 - t0 ))" -v calls="$(( c1 - c0 ))" -v hz="$(getconf CLK_TCK)" -v r0="$r0" -v r1="$r1" -v n="$n" \
    -v rps="$rps" -v p50="$p50" -v tool="$tool" -v idle="$(awk -v a="$i0" -v b="$i1" 'BEGIN {print b - a}')" \
    -v secs="$DURATION" 'BEGIN {printf "%s %.1f %.1f %s %.1f %.2f %.2f\n", rps, t / hz * 1e6 / n,
      (r1 - r0) * 1e6 / n, p50, tool * 1e6 / n, idle / secs, (calls > 0) ? n / calls : 0}'
}

NAMES=now
start_per_key now target/release/tollgate redis
if [ -n "${BASE_BIN:-}" ]; then
  start_per_key base "$BASE_BIN" redis
  NAMES="base now"
fi
if [ -n "${TRACE_SAMPLING:-}" ]; then
  start_otlp_receiver
  start_per_key traced target/release/tollgate redis "$(printf '[tracing]\nenabled = true\nendpoint = "http://%s/v1/traces"\nsampling_rate = %s' "$OTLP_HTTP" "$TRACE_SAMPLING")"
  NAMES="$NAMES traced"
fi

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg); $RUNS rounds of ${DURATION} s, medians"
for round in $(seq "$RUNS"); do
  echo "round $round/$RUNS" >&2
  for rate in $RATES max; do
    for name in $NAMES; do
      run "$name" "$rate" >> "$WORK/$name.$rate"
    done
  done
done

echo
echo "| offered | tollgate | checks/s | tollgate CPU µs per check | Redis CPU µs per check | checks per script call | p50 ms |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for rate in $RATES max; do
  for name in $NAMES; do
    f="$WORK/$name.$rate"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$([ "$rate" = max ] && echo "saturating (wrk -c64)" || echo "$rate/s")" \
      "$name" "$(cut -d' ' -f1 "$f" | median)" "$(cut -d' ' -f2 "$f" | median)" \
      "$(cut -d' ' -f3 "$f" | median)" "$(cut -d' ' -f7 "$f" | median)" "$(cut -d' ' -f4 "$f" | median)"
  done
done
echo
echo "At saturation, where the machine's $(nproc) cores went (CPU µs per check, medians):"
for name in $NAMES; do
  f="$WORK/$name.max"
  echo "- $name: tollgate $(cut -d' ' -f2 "$f" | median), Redis $(cut -d' ' -f3 "$f" | median), wrk $(cut -d' ' -f5 "$f" | median); idle $(cut -d' ' -f6 "$f" | median) cores"
done
if [ -n "${TRACE_SAMPLING:-}" ]; then
  # Batches go every 5 s: the last one arrives after the run.
  sleep 6
  echo
  echo "Spans the receiver got from the traced instance: $(cat "$WORK/spans.jsonl" 2>/dev/null | wc -l)"
fi
