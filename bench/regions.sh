#!/usr/bin/env bash
# One limit across regions (docs/regions.md), measured on loopback: a home (tollgate with
# [home], its own Redis) and three regions (tollgate with [region], each its own Redis),
# every region reaching the home through a latency proxy (examples/latency_proxy.rs,
# ONE_WAY_MS each way). Four measurements:
#
#   1. bound and utilisation: examples/regions_load.rs paces one tenant in the three regions,
#      80/15/5 of twice the limit for a third of the run, then all of it in the third region:
#      the worst excess of any window over burst + rate x W, the utilisation (admitted / rate
#      x W) in each phase, and the seconds after the shift until a second admits 0.9 of rate;
#   2. per-region limits (each region its own copy of the limit, scope "local"), the same
#      traffic: what they admit over burst + rate x W (the over-admission users get today);
#   3. a check's latency (examples/paced_load.rs, p50/p99 of RUNS interleaved rounds at
#      LAT_RATE/s over 64 connections): in a region whose home is ONE_WAY_MS away, against
#      the same check of a local limit on the region's store alone, and against one shared
#      store reached at ONE_WAY_MS (the proxy between tollgate and Redis);
#   4. the home's memory and CPU per tracked key: three regions whose keys all want more
#      than their floor report HOME_KEYS keys between them, each region going through its
#      keys in turn; the home's resident memory and its Redis's used_memory before and after,
#      and its CPU per key reported.
#
#   bench/regions.sh              # 60 s, rate 100/s, burst 100, floors 0.02 each
#   bench/regions.sh 90 50 50     # 90 s, rate 50/s, burst 50
#   env: ONE_WAY_MS (100), FLOOR (0.02), HOME_TTL (3: the home's rlqs.assignment_ttl_s),
#        REPORT_MS (200: the regions' report_every_ms), RUNS (3), LAT_SECONDS (10),
#        LAT_RATE (200), HOME_KEYS (100000), HOME_SECONDS (60), HOME_PASSES (3: times each
#        key is checked), BORROW (0; 1: part 1's regions borrow), PARTS ("1 2 3 4": which
#        measurements)
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_RUN="${1:-60}"
RATE="${2:-100}"
BURST="${3:-100}"
ONE_WAY_MS="${ONE_WAY_MS:-100}"
FLOOR="${FLOOR:-0.02}"
HOME_TTL="${HOME_TTL:-3}"
REPORT_MS="${REPORT_MS:-200}"
PARTS="${PARTS:-1 2 3 4}"
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
RUNS="${RUNS:-3}"
LAT_SECONDS="${LAT_SECONDS:-10}"
LAT_RATE="${LAT_RATE:-200}"
HOME_KEYS="${HOME_KEYS:-100000}"
HOME_SECONDS="${HOME_SECONDS:-60}"
HOME_PASSES="${HOME_PASSES:-3}"
# BORROW=1: the regions' global limit of part 1 borrows (borrow = true on it).
REGION_BORROW=""
[ "${BORROW:-0}" = 1 ] && REGION_BORROW=$'\nborrow = true'

. bench/lib.sh
require redis-server:redis-server curl:curl

echo "building tollgate and the loads (release)" >&2
cargo build --release --quiet --bin tollgate --example regions_load --example latency_proxy \
  --example paced_load
TOLLGATE="$PWD/target/release/tollgate"
LOAD="$PWD/target/release/examples/regions_load"
PACED="$PWD/target/release/examples/paced_load"
PROXY="$PWD/target/release/examples/latency_proxy"
echo "$0 $*: ONE_WAY_MS=$ONE_WAY_MS FLOOR=$FLOOR HOME_TTL=$HOME_TTL REPORT_MS=$REPORT_MS PARTS=\"$PARTS\" RUNS=$RUNS LAT_SECONDS=$LAT_SECONDS LAT_RATE=$LAT_RATE HOME_KEYS=$HOME_KEYS HOME_SECONDS=$HOME_SECONDS HOME_PASSES=$HOME_PASSES BORROW=${BORROW:-0}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u '+%Y-%m-%d %H:%M UTC'), $(redis-server --version | cut -d' ' -f3)"

wait_ready() {
  for _ in $(seq 200); do
    [ "$(curl -s "http://127.0.0.1:$1/readyz" 2>/dev/null)" = ready ] && return 0
    sleep 0.1
  done
  echo "tollgate on $1 never became ready" >&2
  exit 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# proxy UPSTREAM: a latency proxy ONE_WAY_MS each way to port UPSTREAM; sets PROXY_PORT.
proxy() {
  local out="$WORK/proxy-$1-$RANDOM"
  "$PROXY" "$1" "$((ONE_WAY_MS * 1000))" > "$out" &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q '^port ' "$out" && break; sleep 0.1; done
  PROXY_PORT=$(awk '/^port / { print $2; exit }' "$out")
}

# tollgate NAME TOML: starts tollgate on TOML (listen and admin_listen added); sets TG_PORT,
# TG_ADMIN, TG_PID.
tollgate() {
  TG_PORT=$(free_port); TG_ADMIN=$(free_port)
  { echo "listen = \"127.0.0.1:$TG_PORT\""; echo "admin_listen = \"127.0.0.1:$TG_ADMIN\""; echo "$2"; } \
    > "$WORK/$1.toml"
  RUST_LOG=warn "$TOLLGATE" --config "$WORK/$1.toml" &
  TG_PID=$!
  PIDS+=("$TG_PID")
  wait_ready "$TG_ADMIN"
}

store() { printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s/0"\ntimeout_ms = 1000\n' "$1"; }
limit() { # limit NAME KEY SCOPE RATE BURST
  printf '[[limits]]\nname = "%s"\nrate = %s\nburst = %s\nkey = ["%s"]\nscope = "%s"\n' "$1" "$4" "$5" "$2" "$3"
}
region() { printf '[region]\nname = "%s"\nhome = "127.0.0.1:%s"\nfloor = %s\nreport_every_ms = %s\n' "$1" "$2" "$FLOOR" "$REPORT_MS"; }

# The home, and a proxy to it per region.
start_redis; HOME_REDIS=$REDIS_PORT
HOME_GRPC=$(free_port)
tollgate home "grpc_listen = \"127.0.0.1:$HOME_GRPC\"
$(store "$HOME_REDIS")
$(limit per-tenant header:x-tenant global "$RATE" "$BURST")
$(limit per-path path global 50 50)
$(limit many path global 1 20)
[rlqs]
assignment_ttl_s = $HOME_TTL
[home]
regions = { eu-west = $FLOOR, us-east = $FLOOR, ap-south = $FLOOR }"
HOME_PID=$TG_PID; HOME_ADMIN=$TG_ADMIN
REGION_NAMES=(eu-west us-east ap-south)
REGION_REDIS=(); LINKS=()
for name in "${REGION_NAMES[@]}"; do
  start_redis; REGION_REDIS+=("$REDIS_PORT")
  proxy "$HOME_GRPC"; LINKS+=("$PROXY_PORT")
done

# 1. Bound and utilisation.
if part 1; then
REGION_PIDS=(); ADDRS=(); REGION_ADMINS=()
for i in 0 1 2; do
  tollgate "region-$i" "$(store "${REGION_REDIS[$i]}")
$(limit per-tenant header:x-tenant global "$RATE" "$BURST")$REGION_BORROW
$(region "${REGION_NAMES[$i]}" "${LINKS[$i]}")"
  REGION_PIDS+=("$TG_PID"); ADDRS+=("127.0.0.1:$TG_PORT"); REGION_ADMINS+=("$TG_ADMIN")
done
echo "1. one limit across regions: $SECONDS_RUN s, rate $RATE/s, burst $BURST, floors $FLOOR, $ONE_WAY_MS ms each way to the home" >&2
"$LOAD" "$(IFS=,; echo "${ADDRS[*]}")" "$RATE" "$BURST" "$SECONDS_RUN" 5 "${SETTLE:-10}" | tee "$WORK/global"
# Tokens each region admitted from borrowed slices (0 without BORROW=1).
for admin in "${REGION_ADMINS[@]}"; do
  curl -s "http://127.0.0.1:$admin/metrics" | awk '/^tollgate_borrowed_tokens_total\{event="used"\}/ { print $2 + 0 }'
done | paste -sd' ' - | sed 's/^/borrowed_used /' | tee -a "$WORK/global"
for pid in "${REGION_PIDS[@]}"; do stop "$pid"; done
fi

# 2. Per-region limits on the same traffic (fresh stores).
if part 2; then
for port in "${REGION_REDIS[@]}"; do redis-cli -h 127.0.0.1 -p "$port" FLUSHALL >/dev/null; done
REGION_PIDS=(); ADDRS=()
for i in 0 1 2; do
  tollgate "local-$i" "$(store "${REGION_REDIS[$i]}")
$(limit per-tenant header:x-tenant local "$RATE" "$BURST")"
  REGION_PIDS+=("$TG_PID"); ADDRS+=("127.0.0.1:$TG_PORT")
done
echo "2. per-region limits, the same traffic" >&2
"$LOAD" "$(IFS=,; echo "${ADDRS[*]}")" "$RATE" "$BURST" "$SECONDS_RUN" 5 "${SETTLE:-10}" | tee "$WORK/local"
for pid in "${REGION_PIDS[@]}"; do stop "$pid"; done
fi

# 3. A check's latency: a region (its home ONE_WAY_MS away), the region's store alone, one
# shared store ONE_WAY_MS away. 20 path keys at LAT_RATE/s: each wants more than its floor.
if part 3; then
for port in "${REGION_REDIS[@]}"; do redis-cli -h 127.0.0.1 -p "$port" FLUSHALL >/dev/null; done
proxy "${REGION_REDIS[1]}"; FAR_REDIS=$PROXY_PORT
tollgate lat-region "$(store "${REGION_REDIS[0]}")
$(limit per-path path global 50 50)
$(region eu-west "${LINKS[0]}")"
LAT_REGION=$TG_PORT
tollgate lat-local "$(store "${REGION_REDIS[2]}")
$(limit per-path path local 50 50)"
LAT_LOCAL=$TG_PORT
tollgate lat-shared "$(store "$FAR_REDIS")
$(limit per-path path local 50 50)"
LAT_SHARED=$TG_PORT
echo "3. a check's p50/p99 (ms), $RUNS rounds of $LAT_SECONDS s at $LAT_RATE/s, 64 connections, 20 keys" >&2
for kind in region local shared; do : > "$WORK/lat-$kind"; done
for run in $(seq "$RUNS"); do
  for kind in local region shared; do
    case $kind in region) port=$LAT_REGION ;; local) port=$LAT_LOCAL ;; shared) port=$LAT_SHARED ;; esac
    "$PACED" "127.0.0.1:$port" "$LAT_RATE" "$LAT_SECONDS" 64 20 /check/k >> "$WORK/lat-$kind"
    echo "  round $run $kind: $(tail -1 "$WORK/lat-$kind")" >&2
    sleep 1
  done
done
fi

# 4. The home's memory and CPU per tracked key: HOME_KEYS keys spread over the three regions
# (a stream tracks at most 65,536), every key wanting more than its floor (burst 20, floor
# 0.02: 0.4 of a token, every check denied). Each region goes through its keys in turn
# (paced_load's `cycle`), HOME_PASSES times in HOME_SECONDS: every key is checked, so every
# key is reported (at most 1,024 a report, the rest carried), and a pool lives at home some
# seconds after its last report, so the last pass keeps them all.
if part 4; then
echo "4. the home at $HOME_KEYS tracked keys, $HOME_PASSES passes in $HOME_SECONDS s" >&2
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$1/status"; }
used() { redis-cli -h 127.0.0.1 -p "$HOME_REDIS" INFO memory | awk -F: '/^used_memory:/ { print $2 + 0 }'; }
reports() { curl -s "http://127.0.0.1:$HOME_ADMIN/metrics" | awk '/^tollgate_rlqs_reports_total / { print $2 + 0 }'; }
rss0=$(rss "$HOME_PID"); used0=$(used); ticks0=$(ticks "$HOME_PID"); reports0=$(reports)
KEY_PIDS=(); KEY_PORTS=(); LOAD_PIDS=()
per_region=$(( (HOME_KEYS + 2) / 3 ))
for i in 0 1 2; do
  tollgate "keys-$i" "$(store "${REGION_REDIS[$i]}")
$(limit many path global 1 20)
$(region "${REGION_NAMES[$i]}" "${LINKS[$i]}")"
  KEY_PIDS+=("$TG_PID"); KEY_PORTS+=("$TG_PORT")
done
for i in 0 1 2; do
  "$PACED" "127.0.0.1:${KEY_PORTS[$i]}" "$(( per_region * HOME_PASSES / HOME_SECONDS ))" \
    "$HOME_SECONDS" 32 "$per_region" "/check/r$i-" cycle > "$WORK/keys-$i" &
  LOAD_PIDS+=($!)
done
# The pools the home holds, each second (its Redis: one key a pool).
peak=0
while kill -0 "${LOAD_PIDS[0]}" 2>/dev/null || kill -0 "${LOAD_PIDS[1]}" 2>/dev/null \
    || kill -0 "${LOAD_PIDS[2]}" 2>/dev/null; do
  n=$(redis-cli -h 127.0.0.1 -p "$HOME_REDIS" DBSIZE)
  [ "$n" -gt "$peak" ] && peak=$n
  sleep 1
done
wait "${LOAD_PIDS[@]}" 2>/dev/null || true
for i in 0 1 2; do echo "  region $i: $(cat "$WORK/keys-$i")" >&2; done
sleep 1
metrics=$(curl -s "http://127.0.0.1:$HOME_ADMIN/metrics")
buckets=$(echo "$metrics" | awk '/^tollgate_rlqs_buckets / { print $2 + 0 }')
streams=$(echo "$metrics" | awk '/^tollgate_rlqs_streams / { print $2 + 0 }')
# Every pool is one key of the home's Redis (the limits' buckets stay empty there).
tracked=$(redis-cli -h 127.0.0.1 -p "$HOME_REDIS" DBSIZE)
[ "$tracked" -gt "$peak" ] && peak=$tracked
rss1=$(rss "$HOME_PID"); used1=$(used); ticks1=$(ticks "$HOME_PID"); reports1=$(reports)
hz=$(getconf CLK_TCK)
fi

echo
echo "## Results ($(date -u +%Y-%m-%d), $(nproc) cores, rate $RATE/s, burst $BURST, floors $FLOOR x 3, the home's TTL $HOME_TTL s, $ONE_WAY_MS ms each way to the home)"
echo
awk '{ v[$1] = $2 } END {
  printf "| design | worst window over burst + rate x W | utilisation 80/15/5 | utilisation after the shift | seconds to 0.9 after the shift |\n| --- | --- | --- | --- | --- |\n"
}' /dev/null
for kind in global local; do
  [ -f "$WORK/$kind" ] || continue
  awk -v kind="$kind" '{ v[$1] = $2 } END {
    name = (kind == "global") ? "one global limit (scope = \"global\")" : "per-region limits (today)"
    printf "| %s | %s | %s | %s | %s |\n", name, v["excess"], v["skewed"], v["shifted"], v["followed"]
  }' "$WORK/$kind"
done
echo
[ -f "$WORK/global" ] && echo "Admitted per second after the shift, as a fraction of rate (global): $(awk '/^after_shift/ { $1 = ""; print }' "$WORK/global")"
if part 3; then
echo
echo "| check | p50 ms (rounds) | p99 ms (rounds) |"
echo "| --- | --- | --- |"
for kind in local region shared; do
  p50=$(cut -d' ' -f3 "$WORK/lat-$kind" | median); p99=$(cut -d' ' -f5 "$WORK/lat-$kind" | median)
  echo "| $kind | $p50 ($(cut -d' ' -f3 "$WORK/lat-$kind" | paste -sd/ -)) | $p99 ($(cut -d' ' -f5 "$WORK/lat-$kind" | paste -sd/ -)) |"
done
fi
part 4 || exit 0
echo
echo "home: $streams region streams tracking $buckets bucket ids at the end; at most $peak pools in its store during the run"
awk -v k="$tracked" -v r0="$rss0" -v r1="$rss1" -v u0="$used0" -v u1="$used1" -v t0="$ticks0" \
    -v t1="$ticks1" -v hz="$hz" -v n0="$reports0" -v n1="$reports1" 'BEGIN {
  n = n1 - n0
  printf "home: %d pools in its store; resident memory +%.0f bytes per key (%d -> %d KiB); Redis used_memory +%.0f bytes per key; CPU %.1f µs per key reported (%d key reports, %.1f s of CPU)\n",
    k, (r1 - r0) * 1024 / (k > 0 ? k : 1), r0, r1, (u1 - u0) / (k > 0 ? k : 1),
    (n > 0 ? (t1 - t0) / hz * 1e6 / n : 0), n, (t1 - t0) / hz
}'
