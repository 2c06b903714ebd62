#!/usr/bin/env bash
# What a calendar quota costs /check, and how many POST /report calls per second tollgate takes.
#
# Starts its own redis-server and three release-built tollgate instances on free loopback
# ports: one with a single token bucket, one with the same bucket plus a monthly quota on the
# same key parts (one script call decides both), one with a charge = "report" bucket whose
# admin listener takes the reports. Rounds are interleaved so each ratio compares runs taken
# minutes apart; medians are reported. Installs wrk and redis-server with apt-get if missing;
# everything started here is stopped by pid on exit.
#
#   bench/quota.sh                      # 3 rounds of 10 s runs
#   ROUNDS=1 DURATION=3 bench/quota.sh  # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
KEYS=${KEYS:-10000}
TOKEN=bench-admin-token-0123456789

. bench/lib.sh
require wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl
echo "building tollgate (release)" >&2
cargo build --release --quiet --bin tollgate
TOLLGATE=target/release/tollgate
start_redis

wait_http() { # url
  for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done
  echo "nothing answers $1" >&2; exit 1
}

# Nothing is ever denied: the bucket refills at 10^6/s, the quota is 10^9 a month.
BUCKET='[[limits]]
name = "per-key"
rate = 1000000
burst = 1000
key = ["path"]'
QUOTA='[[limits]]
name = "monthly"
quota = 1000000000
period = "month"
key = ["path"]'
REPORTED='[[limits]]
name = "tokens"
rate = 1000000
burst = 1000000
charge = "report"
key = ["path"]'

start_tollgate() { # name limits... ; sets PORT_<name> and ADMIN_<name>
  local name=$1; shift
  local port admin conf=$WORK/$name.toml
  port=$(free_port); admin=$(free_port)
  {
    printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n' "$port" "$admin"
    printf 'admin_token = "%s"\n\n' "$TOKEN"
    # A generous budget, failing closed: a store call that misses it shows as a non-2xx
    # answer below instead of passing for a decision.
    printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s/0"\ntimeout_ms = 1000\n' \
      "$REDIS_PORT"
    printf 'on_error = "deny"\n\n'
    for block in "$@"; do printf '%s\n\n' "$block"; done
  } >"$conf"
  RUST_LOG=warn "$TOLLGATE" --config "$conf" &
  PIDS+=($!)
  eval "PORT_$name=$port; ADMIN_$name=$admin"
  wait_http "http://127.0.0.1:$port/healthz"
}
start_tollgate bucket "$BUCKET"
start_tollgate quota "$BUCKET" "$QUOTA"
start_tollgate two "$BUCKET" "${BUCKET/per-key/second-bucket}"
start_tollgate report "$REPORTED"

wrk_rps() { # url script -> requests/s
  KEYS=$KEYS TOKEN=$TOKEN wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$2" "$1" \
    | tee -a "$WORK/wrk.log" | awk '/^Requests\/sec/ {print $2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }
join() { local IFS=/; echo "$*"; }

declare -a ONE BOTH TWO REPORTS
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  ONE+=("$(wrk_rps "http://127.0.0.1:$PORT_bucket/check" bench/random_key.lua)")
  BOTH+=("$(wrk_rps "http://127.0.0.1:$PORT_quota/check" bench/random_key.lua)")
  TWO+=("$(wrk_rps "http://127.0.0.1:$PORT_two/check" bench/random_key.lua)")
  REPORTS+=("$(wrk_rps "http://127.0.0.1:$ADMIN_report/report" bench/report.lua)")
done
FAILED=$(awk '/^non-200 answers/ {n += $3} END {print n + 0}' "$WORK/wrk.log")
NON2XX=$(awk '/Non-2xx/ {n += $5} END {print n + 0}' "$WORK/wrk.log")
m_one=$(printf '%s\n' "${ONE[@]}" | median)
m_both=$(printf '%s\n' "${BOTH[@]}" | median)
m_rep=$(printf '%s\n' "${REPORTS[@]}" | median)
m_two=$(printf '%s\n' "${TWO[@]}" | median)

cat <<EOT

## Quotas and reports — $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(redis-server --version | awk '{print $3}')
$ROUNDS interleaved rounds of ${DURATION} s, wrk $CONNS connections, $KEYS keys; medians, every round in brackets.

| figure | value |
| --- | --- |
| /check, one token bucket (req/s) | $m_one [$(join "${ONE[@]}")] |
| /check, the same bucket + a monthly quota, one script call (req/s) | $m_both [$(join "${BOTH[@]}")] |
| ratio bucket + quota ÷ bucket | $(ratio "$m_both" "$m_one") |
| /check, two token buckets, one script call (req/s), for reference | $m_two [$(join "${TWO[@]}")] |
| ratio bucket + quota ÷ two buckets | $(ratio "$m_both" "$m_two") |
| non-2xx /check answers (store calls over budget), all runs | $NON2XX |
| POST /report, one charge per call, admin listener (calls/s) | $m_rep [$(join "${REPORTS[@]}")] |
| /report answers other than 200 | $FAILED |
EOT
