#!/usr/bin/env bash
# Benchmarks /check against the targets of docs/benchmarks/redis-store.md and prints a table.
#
# Starts its own redis-server on a free loopback port and release-built tollgate instances
# with generated configs; installs wrk, redis-server/redis-tools (apt-get) and oha
# (cargo install) when missing. Every load is bounded in time; everything started here is
# stopped by pid on exit. The machine is usually small and shared, so each comparison is
# run in the same round, rounds are interleaved, and medians are reported.
#
#   bench/check.sh                      # 3 rounds of 10 s runs (about 12 minutes)
#   ROUNDS=1 DURATION=3 bench/check.sh  # a quick look
#   BIN=/path/to/other/tollgate SCALE_KEYS=1 CRITERION=0 bench/check.sh   # another build
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}     # seconds per load run
ROUNDS=${ROUNDS:-3}          # interleaved rounds; medians are reported
CONNS=${CONNS:-64}           # concurrent connections (and redis-benchmark clients)
KEYS=${KEYS:-10000}          # distinct keys for the throughput runs
FLOOD_RATE=${FLOOD_RATE:-100}    # tokens/s of the flooded key
SCALE_KEYS=${SCALE_KEYS:-"1 1000 100000 1000000"}

. bench/lib.sh

# --- tools -------------------------------------------------------------------------------
require wrk:wrk redis-server:redis-server redis-benchmark:redis-tools curl:curl
if ! command -v oha >/dev/null; then
  echo "installing oha with cargo (a few minutes, once)" >&2
  cargo install oha --locked --quiet
fi
echo "building tollgate and the bare handler (release)" >&2
cargo build --release --quiet --bin tollgate --example bare
TOLLGATE=${BIN:-target/release/tollgate}
BARE=target/release/examples/bare

# --- processes ---------------------------------------------------------------------------
wait_http() { # url
  for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "nothing answers $1" >&2; exit 1
}

start_redis
SHA=$(rcli SCRIPT LOAD "$(bucket_script)")

# Every limit allows everything in these runs (rate 1,000/s, burst 1,000,000; the key TTL is
# then 2,000 s, so buckets live through the run), except the flooded one.
limit() { # name key rate burst
  printf '[[limits]]\nname = "%s"\nrate = %s\nburst = %s\nkey = [%s]\n\n' "$1" "$4" "$3" "$2"
}
ALLOW='"path"'
start_tollgate() { # name backend limits... ; sets PORT_<name>
  local name=$1 backend=$2; shift 2
  local port admin conf=$WORK/$name.toml
  port=$(free_port); admin=$(free_port)
  {
    printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n\n' "$port" "$admin"
    printf '[store]\nbackend = "%s"\nurl = "redis://127.0.0.1:%s/0"\ntimeout_ms = 50\n' \
      "$backend" "$REDIS_PORT"
    printf 'max_buckets = 1000000\n\n'
    for block in "$@"; do printf '%s\n\n' "$block"; done
  } >"$conf"
  RUST_LOG=warn "$TOLLGATE" --config "$conf" &
  PIDS+=($!)
  eval "PID_$name=$!; PORT_$name=$port"
  wait_http "http://127.0.0.1:$port/healthz"
}

start_tollgate redis redis "$(limit per-key "$ALLOW" 1000000 1000)"
start_tollgate memory memory "$(limit per-key "$ALLOW" 1000000 1000)"
start_tollgate multi redis "$(limit a "$ALLOW" 1000000 1000)" "$(limit b "$ALLOW" 1000000 1000)" \
  "$(limit c "$ALLOW" 1000000 1000)"
start_tollgate flood redis "$(limit flood '"path"' "$FLOOD_RATE" "$FLOOD_RATE")"
PORT_bare=$(free_port)
"$BARE" "127.0.0.1:$PORT_bare" &
PIDS+=($!)
wait_http "http://127.0.0.1:$PORT_bare/check"

# --- measuring ---------------------------------------------------------------------------
wrk_rps() { # port [keys] -> requests/s (random keys in the path)
  KEYS=${2:-$KEYS} wrk -t1 -c"$CONNS" -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:$1/check" | tee -a "$WORK/wrk.log" | awk '/^Requests\/sec/ {print $2}'
}
rb_rps() { # keys -> requests/s of redis-benchmark running the same script, same spread
  rcli FLUSHALL >/dev/null
  timeout $((DURATION + 30)) redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c "$CONNS" \
    -n $((DURATION * 32000)) -r "$1" -q \
    evalsha "$SHA" 1 "tollgate:per-key:{/k__rand_int__}" 1000 1000000 1 0 2>/dev/null \
    | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | awk '{print $1}'
}
# Redis's own CPU seconds so far (INFO cpu, user + sys): checks per Redis core is the count of
# checks in a run divided by the CPU seconds Redis spent in it.
redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_sys:/ {s = $2} /^used_cpu_user:/ {u = $2} END {printf "%.6f", s + u}'; }
per_cpu() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {printf "%d", (b > a) ? n / (b - a) : 0}'; }
# Microseconds Redis spent in script calls since the last CONFIG RESETSTAT.
script_usec() { rcli INFO commandstats | tr -d '\r' | awk -F'[=,:]' '
  /^cmdstat_(evalsha|eval):/ {n += $5} END {print n + 0}'; }
script_calls() { rcli INFO commandstats | tr -d '\r' | awk -F'[=,:]' '
  /^cmdstat_(evalsha|eval):/ {n += $3} END {print n + 0}'; }
rss_kb() { ps -o rss= -p "$1" | tr -d ' '; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }
percentile() { # oha output, label (e.g. 99.00%) -> ms (oha prints ms or secs)
  awk -v p="$2" '$1 == p && $2 == "in" {printf "%.3f", ($4 == "secs") ? $3 * 1000 : $3}' "$1"
}

declare -a RB TG MEM BARE_R MULTI P50 P99 P999 US1 US3 CORE_RB CORE_TG
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  cpu0=$(redis_cpu)
  RB+=("$(rb_rps "$KEYS")")
  CORE_RB+=("$(per_cpu $((DURATION * 32000)) "$cpu0" "$(redis_cpu)")")
  rcli CONFIG RESETSTAT >/dev/null
  cpu0=$(redis_cpu)
  TG+=("$(wrk_rps "$PORT_redis")")
  checks=$(awk '/requests in/ {n = $1} END {print n}' "$WORK/wrk.log")
  CORE_TG+=("$(per_cpu "$checks" "$cpu0" "$(redis_cpu)")")
  US1+=("$(ratio "$(script_usec)" "$checks")")
  MEM+=("$(wrk_rps "$PORT_memory")")
  BARE_R+=("$(wrk_rps "$PORT_bare")")
  rcli CONFIG RESETSTAT >/dev/null
  MULTI+=("$(wrk_rps "$PORT_multi")")
  multi_calls=$(script_calls)
  multi_checks=$(awk '/requests in/ {n = $1} END {print n}' "$WORK/wrk.log")
  US3+=("$(ratio "$(script_usec)" "$multi_checks")")
  # Half of this round's throughput at the ceiling, at a fixed rate (latency-corrected).
  half=$(awk -v t="${TG[-1]}" 'BEGIN {printf "%d", t / 2}')
  oha -z "${DURATION}s" -q "$half" -c "$CONNS" --latency-correction --no-tui \
    --rand-regex-url "http://127.0.0.1:$PORT_redis/check/k[0-9]{4}" >"$WORK/oha.txt" 2>&1 || true
  P50+=("$(percentile "$WORK/oha.txt" 50.00%)")
  P99+=("$(percentile "$WORK/oha.txt" 99.00%)")
  P999+=("$(percentile "$WORK/oha.txt" 99.90%)")
done
OHA_RATE=$(awk -v t="$(printf '%s\n' "${TG[@]}" | median)" 'BEGIN {printf "%d", t / 2}')

# Flood: one key at many times its rate; how much reaches Redis, and how fast denials are.
# Checks that asked Redis, from the flooded instance's own count of store calls (one script
# call may carry several checks).
store_calls() { curl -s "http://127.0.0.1:$(grep admin_listen "$WORK/flood.toml" | grep -o '[0-9]*"$' | tr -d '"')/metrics" \
  | awk '/^tollgate_store_duration_seconds_count/ {print $2}'; }
FLOOD_STORE0=$(store_calls)
rcli CONFIG RESETSTAT >/dev/null
rcli INFO commandstats | tr -d '\r' | grep -E '^cmdstat_eval' >"$WORK/stats-before" || true
FLOOD_RPS=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" "http://127.0.0.1:$PORT_flood/check/victim" \
  | tee "$WORK/flood.log" | awk '/^Requests\/sec/ {print $2}')
FLOOD_CHECKS=$(awk '/requests in/ {print $1}' "$WORK/flood.log")
rcli INFO commandstats | tr -d '\r' | grep -E '^cmdstat_eval' >"$WORK/stats-after" || true
FLOOD_CALLS=$(script_calls)
FLOOD_ASKED=$(awk -v a="$FLOOD_STORE0" -v b="$(store_calls)" 'BEGIN {printf "%d", b - a}')
FLOOD_DENIED=$(curl -s "http://127.0.0.1:$(grep admin_listen "$WORK/flood.toml" | grep -o '[0-9]*"$' | tr -d '"')/metrics" \
  | awk '/^tollgate_checks_total\{result="denied"\}/ {print $2}')

# Scaling with the number of live buckets.
SCALE_ROWS=()
for n in $SCALE_KEYS; do
  rcli FLUSHALL >/dev/null
  empty=$(rcli INFO memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}')
  # Create the n buckets first, pipelined, exactly as tollgate's script call would.
  awk -v n="$n" -v sha="$SHA" 'BEGIN {
    for (i = 0; i < n; i++) {
      key = "tollgate:per-key:{/k" i "}"
      printf "*8\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n$4\r\n1000\r\n$7\r\n1000000\r\n$1\r\n1\r\n$1\r\n0\r\n", length(sha), sha, length(key), key
    }
  }' | rcli --pipe >/dev/null
  rss_before=$(rss_kb "$PID_redis")
  rps=$(wrk_rps "$PORT_redis" "$n")
  rss_after=$(rss_kb "$PID_redis")
  used=$(rcli INFO memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}')
  dbsize=$(rcli DBSIZE)
  per=$(awk -v u="$used" -v e="$empty" -v d="$dbsize" 'BEGIN {printf "%.0f", (d > 0) ? (u - e) / d : 0}')
  SCALE_ROWS+=("| $n | $rps | $dbsize | $per | $rss_before → $rss_after |")
done

# --- report ------------------------------------------------------------------------------
m_rb=$(printf '%s\n' "${RB[@]}" | median)
m_tg=$(printf '%s\n' "${TG[@]}" | median)
m_mem=$(printf '%s\n' "${MEM[@]}" | median)
m_bare=$(printf '%s\n' "${BARE_R[@]}" | median)
m_multi=$(printf '%s\n' "${MULTI[@]}" | median)
m_p50=$(printf '%s\n' "${P50[@]}" | median)
m_p99=$(printf '%s\n' "${P99[@]}" | median)
m_p999=$(printf '%s\n' "${P999[@]}" | median)
join() { local IFS=/; echo "$*"; }

cat <<EOF

## /check benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(redis-server --version | awk '{print $3}')
$ROUNDS interleaved rounds of ${DURATION} s, $CONNS connections, medians (every round in brackets).

| figure | value | target |
| --- | --- | --- |
| redis-benchmark EVALSHA, same script, $KEYS keys, $CONNS clients (req/s) | $m_rb [$(join "${RB[@]}")] | the ceiling |
| /check, Redis store, $KEYS keys, wrk $CONNS conns (req/s) | $m_tg [$(join "${TG[@]}")] | |
| ratio /check ÷ redis-benchmark | $(ratio "$m_tg" "$m_rb") | ≥ 0.90 |
| **checks per Redis core**: /check checks ÷ Redis CPU seconds (INFO cpu) | $(printf '%s\n' "${CORE_TG[@]}" | median) [$(join "${CORE_TG[@]}")] | |
| the same for redis-benchmark's script calls | $(printf '%s\n' "${CORE_RB[@]}" | median) [$(join "${CORE_RB[@]}")] | |
| latency at $OHA_RATE req/s fixed (oha, latency-corrected): p50 / p99 / p99.9 (ms) | $m_p50 / $m_p99 / $m_p999 [p99 $(join "${P99[@]}")] | p99 ≤ 1, p99.9 ≤ 3 |
| /check, memory store (req/s) | $m_mem [$(join "${MEM[@]}")] | |
| bare actix-web handler, same headers (req/s) | $m_bare [$(join "${BARE_R[@]}")] | |
| ratio memory ÷ bare | $(ratio "$m_mem" "$m_bare") | ≥ 0.80 |
| /check, 3 limits per request (req/s) | $m_multi [$(join "${MULTI[@]}")] | |
| ratio 3 limits ÷ 1 limit | $(ratio "$m_multi" "$m_tg") | ≥ 0.80 |
| Redis µs in scripts per check, 1 limit → 3 limits (commandstats usec ÷ checks) | $(printf '%s\n' "${US1[@]}" | median) → $(printf '%s\n' "${US3[@]}" | median) | |
| script calls per 3-limit check (last round; below 1 when checks share calls) | $(ratio "$multi_calls" "$multi_checks") ($multi_calls calls / $multi_checks checks) | ≤ 1.00 |
| flood: one key at rate $FLOOD_RATE/s, $CONNS conns: checks/s | $FLOOD_RPS ($(ratio "$FLOOD_RPS" "$FLOOD_RATE")× its rate) | ≥ 50× |
| flood: checks that asked Redis | $FLOOD_ASKED of $FLOOD_CHECKS checks ($(awk -v a="$FLOOD_ASKED" -v b="$FLOOD_CHECKS" 'BEGIN {printf "%.2f", 100 * a / b}')%), in $FLOOD_CALLS script calls | ≤ 5% |
| flood: denied checks/s ÷ ceiling | $(ratio "$FLOOD_RPS" "$m_rb") (denied: ${FLOOD_DENIED:-?}) | ≥ 3 |

Redis INFO commandstats around the flood:
\`\`\`
before: $(cat "$WORK/stats-before" 2>/dev/null | tr '\n' ' ')(CONFIG RESETSTAT just before: no script call counted)
after:  $(cat "$WORK/stats-after" | tr '\n' ' ')
\`\`\`

Scaling with live buckets (Redis store, wrk $CONNS conns, ${DURATION} s each):

| buckets | /check req/s | Redis keys | Redis bytes per bucket (target ≤ 100) | tollgate RSS KiB before → after |
| --- | --- | --- | --- | --- |
$(printf '%s\n' "${SCALE_ROWS[@]}")
EOF

# The in-process memory store (Criterion): ns per decision, 1 and 2 threads.
if [ "${CRITERION:-1}" = 1 ]; then
  echo
  echo "Memory store, one decision on an existing key (cargo bench --bench memory_store):"
  echo '```'
  cargo bench --quiet --bench memory_store -- --noplot 2>/dev/null \
    | grep -E '^memory_store|time:|thrpt:' | grep -v '%' || true
  echo '```'
fi
