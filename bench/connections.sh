#!/usr/bin/env bash
# What a check on a fresh TCP connection costs tollgate, against one on a kept-alive
# connection: wrk sends `/check` with and without `Connection: close` (a new connection per
# check, as Traefik's forwardAuth mostly does), and tollgate's own CPU time (user + system,
# from /proc) is divided by the checks answered. The memory store, so that only HTTP and the
# connection are measured. With `perf` installed (and allowed), also where that CPU goes in
# the close runs: kernel or user space, tollgate's code or libc.
#
# BASE_BIN=<another tollgate binary> runs the same against it, interleaved, for a
# before/after in the same run.
#
#   bench/connections.sh                 # RUNS=3 rounds of 5 s per mode
#   BASE_BIN=/path/to/old/tollgate bench/connections.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-5}
RUNS=${RUNS:-3}
CONNECTIONS=${CONNECTIONS:-16}

. bench/lib.sh
require wrk:wrk curl:curl
cargo build --release --quiet --bin tollgate


# run NAME MODE -> "req/s cpu_us_per_check"
run() {
  local pid_var="PID_$1" port_var="PORT_$1" header=() before after
  [ "$2" = close ] && header=(-H "Connection: close")
  before=$(ticks "${!pid_var}")
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "${header[@]}" "http://127.0.0.1:${!port_var}/check/k" > "$WORK/wrk.out"
  after=$(ticks "${!pid_var}")
  awk -v cpu=$(( after - before )) -v hz="$(getconf CLK_TCK)" '
    / requests in / { n = $1 } /^Requests\/sec/ { rps = $2 }
    END { printf "%.0f %.1f\n", rps, cpu / hz * 1e6 / n }' "$WORK/wrk.out"
}

NAMES=now
start_per_key now target/release/tollgate memory
if [ -n "${BASE_BIN:-}" ]; then
  start_per_key base "$BASE_BIN" memory
  NAMES="base now"
fi

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, wrk -t1 -c$CONNECTIONS -d${DURATION}s, load average $(cut -d' ' -f1 /proc/loadavg)"
for round in $(seq "$RUNS"); do
  for name in $NAMES; do
    for mode in keep close; do
      run "$name" "$mode" >> "$WORK/$name.$mode"
    done
  done
done

echo
echo "| tollgate | mode | req/s | CPU µs per check | rounds (req/s / µs) |"
echo "| --- | --- | --- | --- | --- |"
for name in $NAMES; do
  for mode in keep close; do
    f="$WORK/$name.$mode"
    printf '| %s | %s | %s | %s | %s |\n' "$name" "$mode" \
      "$(cut -d' ' -f1 "$f" | median)" "$(cut -d' ' -f2 "$f" | median)" \
      "$(awk '{printf("%s%s/%s", (NR > 1 ? ", " : ""), $1, $2)}' "$f")"
  done
  k=$(cut -d' ' -f2 "$WORK/$name.keep" | median); c=$(cut -d' ' -f2 "$WORK/$name.close" | median)
  echo "$name: a fresh connection adds $(awk -v c="$c" -v k="$k" 'BEGIN {printf "%.1f", c - k}') µs of tollgate CPU per check"
done

# Where the close-mode CPU goes, by thread and by kernel/user space.
if command -v perf >/dev/null && perf record -o "$WORK/probe.data" -e cpu-clock true >/dev/null 2>&1; then
  echo
  echo "perf, close mode, share of tollgate's samples (now):"
  perf record -F 2000 -e cpu-clock -p "$PID_now" -o "$WORK/close.data" -- sleep "$((DURATION + 1))" >/dev/null 2>&1 &
  perf_pid=$!
  sleep 0.5
  wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -H "Connection: close" "http://127.0.0.1:$PORT_now/check/k" >/dev/null
  wait "$perf_pid" || true
  perf report -i "$WORK/close.data" --sort comm,dso --stdio 2>/dev/null | grep '%' | head -8
fi
