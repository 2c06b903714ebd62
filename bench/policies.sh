#!/usr/bin/env bash
# What policies cost: 100,000 per-key overrides (load and SIGHUP reload time, RSS, /check
# throughput against the same limit without overrides) and exempt checks against allowed
# ones, on the memory store, everything in the same run, rounds interleaved, medians.
#
#   bench/policies.sh                      # 3 rounds of 10 s runs (about 3 minutes)
#   ROUNDS=1 DURATION=3 bench/policies.sh  # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}     # seconds per load run
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}          # distinct keys per load run; all of them overridden
OVERRIDES=${OVERRIDES:-100000}

. bench/lib.sh

require wrk:wrk curl:curl
echo "building tollgate (release)" >&2
cargo build --release --quiet --bin tollgate
TOLLGATE=target/release/tollgate

# --- configs -----------------------------------------------------------------------------
# Keys are the check path (/check/k<n> -> "/k<n>"), as in bench/check.sh. The overrides file
# gives every key a load run uses (and 90,000 more) its own numbers, so every check of the
# "overrides" instance finds an entry.
awk -v n="$OVERRIDES" 'BEGIN {
  for (i = 0; i < n; i++) printf "[[overrides]]\nkey = [\"/k%d\"]\nrate = \"%d/min\"\nburst = %d\n", i, 60000000 + i, 1000000 + i
}' >"$WORK/keys.toml"
# Every limit allows everything in these runs (rate 1,000,000/s, burst 1,000,000).
limit() { # extra lines
  printf '[[limits]]\nname = "per-key"\nrate = 1000000\nburst = 1000000\nkey = ["path"]\n%s\n' "$1"
}
write_config() { # name port admin body
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n\n[store]\nbackend = "memory"\nmax_buckets = 1000000\n\n%s\n' \
    "$2" "$3" "$4" >"$WORK/$1.toml"
}
now_ms() { date +%s%3N; }
wait_http() { # url -> waits until it answers
  for _ in $(seq 2000); do curl -sf -o /dev/null "$1" && return 0; sleep 0.005; done
  echo "nothing answers $1" >&2; exit 1
}
start() { # name body ; sets PORT_<name>, ADMIN_<name>, PID_<name>, LOAD_MS_<name>
  local port admin started
  port=$(free_port); admin=$(free_port)
  write_config "$1" "$port" "$admin" "$2"
  started=$(now_ms)
  RUST_LOG=warn "$TOLLGATE" --config "$WORK/$1.toml" &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$port/healthz"
  eval "PID_$1=$!; PORT_$1=$port; ADMIN_$1=$admin; LOAD_MS_$1=$(( $(now_ms) - started ))"
}

start plain "$(limit '')"
start overrides "$(limit "overrides_file = \"$WORK/keys.toml\"")"
start exempt "$(limit '')
[[exempt]]
name = \"bench\"
path_prefix = \"/exempt\""

VALIDATE_MS=$( { s=$(now_ms); "$TOLLGATE" validate --config "$WORK/overrides.toml" >/dev/null; echo $(( $(now_ms) - s )); } )

reload_ms() { # name -> ms from SIGHUP until the reload is counted
  local admin pid before started
  admin=$(eval echo "\$ADMIN_$1"); pid=$(eval echo "\$PID_$1")
  count() { curl -s "http://127.0.0.1:$admin/metrics" | awk '/^tollgate_config_reloads_total\{result="success"\}/ {print $2}'; }
  before=$(count)
  started=$(now_ms)
  kill -HUP "$pid"
  while [ "$(count)" = "$before" ]; do sleep 0.005; done
  echo $(( $(now_ms) - started ))
}
rss_kb() { ps -o rss= -p "$1" | tr -d ' '; }
wrk_rps() { # port [prefix]
  KEYS=$KEYS PREFIX=${2:-/check/k} wrk -t1 -c"$CONNS" -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:$1/check" | awk '/^Requests\/sec/ {print $2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", (b > 0) ? a / b : 0}'; }
join() { local IFS=/; echo "$*"; }

declare -a RELOAD_PLAIN RELOAD_OVR PLAIN OVR ALLOWED EXEMPT
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  RELOAD_PLAIN+=("$(reload_ms plain)")
  RELOAD_OVR+=("$(reload_ms overrides)")
  # Alternate which instance goes first, so neither always gets the warmer machine.
  if [ $((round % 2)) = 1 ]; then
    PLAIN+=("$(wrk_rps "$PORT_plain")"); OVR+=("$(wrk_rps "$PORT_overrides")")
  else
    OVR+=("$(wrk_rps "$PORT_overrides")"); PLAIN+=("$(wrk_rps "$PORT_plain")")
  fi
  ALLOWED+=("$(wrk_rps "$PORT_exempt")")
  EXEMPT+=("$(wrk_rps "$PORT_exempt" /check/exempt/k)")
done
# Every check of the overrides run must have been decided under an override: the headers say.
SAMPLE=$(curl -s -D - -o /dev/null "http://127.0.0.1:$PORT_overrides/check/k7" | tr -d '\r' | grep -i '^ratelimit-policy')
EXEMPTED=$(curl -s "http://127.0.0.1:$ADMIN_exempt/metrics" | awk '/^tollgate_exempt_total/ {print $2}')

m_plain=$(printf '%s\n' "${PLAIN[@]}" | median)
m_ovr=$(printf '%s\n' "${OVR[@]}" | median)
m_allowed=$(printf '%s\n' "${ALLOWED[@]}" | median)
m_exempt=$(printf '%s\n' "${EXEMPT[@]}" | median)
cat <<REPORT

## Policies benchmark — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo))
Memory store, $ROUNDS interleaved rounds of ${DURATION} s, wrk $CONNS conns, $KEYS keys per run, medians [every round].

| figure | value | target |
| --- | --- | --- |
| overrides file | $OVERRIDES entries, $(du -k "$WORK/keys.toml" | cut -f1) KiB | |
| start until /healthz answers: without / with overrides (ms) | $LOAD_MS_plain / $LOAD_MS_overrides | < 1000 |
| \`tollgate validate\` of the config with overrides (ms, whole process) | $VALIDATE_MS | < 1000 |
| SIGHUP until the reload is counted: without / with overrides (ms) | $(printf '%s\n' "${RELOAD_PLAIN[@]}" | median) / $(printf '%s\n' "${RELOAD_OVR[@]}" | median) [$(join "${RELOAD_OVR[@]}")] | < 1000 |
| RSS after the runs: without / with overrides (KiB) | $(rss_kb "$PID_plain") / $(rss_kb "$PID_overrides") | |
| /check req/s without overrides | $m_plain [$(join "${PLAIN[@]}")] | |
| /check req/s with $OVERRIDES overrides (every check overridden) | $m_ovr [$(join "${OVR[@]}")] | |
| ratio with ÷ without | $(ratio "$m_ovr" "$m_plain") | ≥ 0.95 |
| allowed checks/s (same instance as the exempt run) | $m_allowed [$(join "${ALLOWED[@]}")] | |
| exempt checks/s | $m_exempt [$(join "${EXEMPT[@]}")] | |
| ratio exempt ÷ allowed | $(ratio "$m_exempt" "$m_allowed") | |

Sample answer under an override: \`$SAMPLE\`; exempt checks counted: ${EXEMPTED:-?}.
REPORT
