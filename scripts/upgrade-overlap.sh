#!/usr/bin/env bash
# A rolling upgrade from the last release, under load, with its bound checked.
#
# The 0.1.0 release stores a bucket as a hash {tokens, ts}; this checkout stores it as one
# string "v1:<debt> <ts>", with the tokens instances borrowed after them (borrowing is on by
# default). The new scripts convert an old hash when they first write it; an old instance that
# meets a converted key gets WRONGTYPE and answers per its store.on_error, so it never reads
# held tokens as available. This script runs OLD and NEW tollgate on one Redis, the way a
# rolling upgrade does, and counts what they admitted:
#
#   1. old instances alone take load (the keys are hashes),
#   2. old and new instances take load together (the overlap),
#   3. new instances alone take load;
#
# then checks, per key, the admissions of every instance over the whole run (tollgate's own
# tollgate_limit_decisions_total, which counts the local fallback's admissions too) against
#
#   on_error = "deny":   burst + rate * t
#   on_error = "local":  burst + rate * t + sum over the instances that answered per on_error
#                        of (max(1, burst / N_i) + rate / N_i * t)
#
# t runs from before the first request to after the counters were read and found still, so it
# covers every admission. N_i is the fewest instances instance i counted (its heartbeat log):
# the local fallback of an instance is a bucket of its own, burst / N and rate / N (at least one
# token), started full the first time that instance falls back.
#
# One run per mode of MODES, each on a fresh redis-server and fresh instances. Builds the old
# binary from OLD_REF (default: the 0.1.0 release) in a temporary git worktree (or takes
# OLD_BIN) and the new one from this checkout (or takes NEW_BIN); installs redis-server and wrk
# with apt-get when missing. NEW_BORROW=true or false sets the new instances' store.borrow
# (default: theirs, on); it says when no new instance borrowed (keys held at their limit take
# no slices). Every
# process started here is stopped by pid on exit, and the temporary worktree (with its target
# directory, several GB) removed. Exits non-zero when a bound is broken, or when the run did
# not show the overlap it is meant to (keys not hashes after phase 1, no on_error answer from
# an old instance during phase 2).
#
#   scripts/upgrade-overlap.sh                        # both modes, about 2 x 45 s + builds
#   OLD_BIN=/path/to/old/tollgate MODES=local scripts/upgrade-overlap.sh
#   RATE=2000 BURST=4000 scripts/upgrade-overlap.sh   # keys below their limit: slices taken
#   MODES=allow scripts/upgrade-overlap.sh            # the control: must report BROKEN, exit 1
#
# MODES=allow is the control that shows the check can fail: an old instance then admits every
# check it cannot decide, unlimited, so the overlap admits far more than the bound.
set -euo pipefail
cd "$(dirname "$0")/.."

OLD_REF=${OLD_REF:-c135fad}    # the 0.1.0 release (its CHANGELOG commit): hash buckets
OLD_BIN=${OLD_BIN:-}
NEW_BIN=${NEW_BIN:-}
NEW_BORROW=${NEW_BORROW:-}     # the new instances' store.borrow: true, false, or theirs
MODES=${MODES:-"deny local"}   # store.on_error of every instance, one run each
OLD_INSTANCES=${OLD_INSTANCES:-2}
NEW_INSTANCES=${NEW_INSTANCES:-2}
KEYS=${KEYS:-3}                # keys, one limit each (at most 9)
RATE=${RATE:-50}               # tokens per second of every key
BURST=${BURST:-100}
ALONE=${ALONE:-5}              # seconds of load on old alone (phase 1) and new alone (phase 3)
OVERLAP=${OVERLAP:-25}         # seconds of load on both (phase 2)
CONNS=${CONNS:-2}              # wrk connections per instance

if [ "$KEYS" -lt 1 ] || [ "$KEYS" -gt 9 ]; then echo "KEYS must be 1 to 9" >&2; exit 2; fi
case "$NEW_BORROW" in "" | true | false) ;; *) echo "NEW_BORROW must be true or false" >&2; exit 2 ;; esac

. bench/lib.sh

# Stops every process started here, Redis last (as lib.sh's cleanup): between modes, and on exit
# before the old tree goes.
stop_all() {
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  PIDS=()
}
OLD_TREE=
# shellcheck disable=SC2317  # run by the EXIT trap
remove_old_tree() {
  if [ -n "$OLD_TREE" ] && [ -d "$OLD_TREE" ]; then
    git worktree remove --force "$OLD_TREE" 2>/dev/null || rm -rf "$OLD_TREE"
    git worktree prune
  fi
}
# The processes first, then the old tree (git's record of it too), then lib.sh's cleanup: $WORK.
trap 'stop_all; remove_old_tree; cleanup' EXIT

require redis-server:redis-server redis-cli:redis-tools wrk:wrk curl:curl python3:python3

# --- binaries ----------------------------------------------------------------------------
if [ -z "$OLD_BIN" ]; then
  OLD_TREE=$WORK/old
  echo "building the old tollgate from $OLD_REF ($(git rev-parse --short "$OLD_REF"))" >&2
  git worktree add --quiet --detach "$OLD_TREE" "$OLD_REF"
  (cd "$OLD_TREE" && cargo build --release --quiet --bin tollgate)
  OLD_BIN=$OLD_TREE/target/release/tollgate
fi
if [ -z "$NEW_BIN" ]; then
  echo "building the new tollgate from this checkout" >&2
  cargo build --release --quiet --bin tollgate
  NEW_BIN=target/release/tollgate
fi
echo "old: $("$OLD_BIN" --version)   new: $("$NEW_BIN" --version)" >&2

# --- instances ---------------------------------------------------------------------------
# A config of KEYS limits k1..kKEYS, each matching only the path /k<i> and keyed on it, so
# each limit has exactly one bucket and its counter counts that key. A generous store timeout:
# the machine may be slow, and only the upgrade should make a store call fail.
config() { # port admin on_error [borrow]: borrow only for the new release (0.1.0 has no key)
  printf 'listen = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n\n' "$1" "$2"
  printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s/0"\n' "$REDIS_PORT"
  printf 'timeout_ms = 1000\non_error = "%s"\n' "$3"
  if [ -n "${4:-}" ]; then printf 'borrow = %s\n' "$4"; fi
  printf '\n'
  local i
  for i in $(seq "$KEYS"); do
    printf '[[limits]]\nname = "k%s"\nrate = %s\nburst = %s\nkey = ["path"]\n' "$i" "$RATE" "$BURST"
    printf 'match = { path_prefix = "/k%s" }\n\n' "$i"
  done
}

declare -A PORT ADMIN LOG
OLDS=() NEWS=()
start_instance() { # name binary on_error [borrow]
  local port admin
  port=$(free_port); admin=$(free_port)
  config "$port" "$admin" "$3" "${4:-}" >"$WORK/$1.toml"
  # The heartbeat's log line says how many instances the local fallback splits a limit among
  # (logged by tollgate::lifecycle in 0.1.0).
  RUST_LOG=warn,tollgate::app::heartbeat=info,tollgate::lifecycle=info \
    "$2" --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  PORT[$1]=$port ADMIN[$1]=$admin LOG[$1]=$WORK/$1.log
  for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  echo "tollgate $1 did not get ready:" >&2; cat "$WORK/$1.log" >&2; exit 1
}

# Every request checks one of the keys, in turn.
cat >"$WORK/keys.lua" <<LUA
local n, keys = 0, $KEYS
request = function()
  n = n % keys + 1
  return wrk.format("GET", "/check/k" .. n)
end
LUA

load() { # seconds name...: wrk on each instance named, all at once, for that long
  local secs=$1 name pids=()
  shift
  for name in "$@"; do
    wrk -t1 -c"$CONNS" -d"${secs}s" -s "$WORK/keys.lua" "http://127.0.0.1:${PORT[$name]}" \
      >"$WORK/wrk-$PHASE-$name.txt" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}

# --- reading the counters ----------------------------------------------------------------
scrape() { # into FILE for each instance: $WORK/m-<name>
  local name
  for name in "${OLDS[@]}" "${NEWS[@]}"; do
    curl -fsS "http://127.0.0.1:${ADMIN[$name]}/metrics" >"$WORK/m-$name"
  done
}
# metric NAME METRIC [LABEL=VALUE...]: the sum of METRIC's samples in instance NAME's last
# scrape whose labels include every LABEL="VALUE".
metric() {
  local name=$1 metric=$2
  shift 2
  awk -v metric="$metric" -v want="$*" '
    index($1, metric "{") == 1 || $1 == metric {
      ok = 1
      n = split(want, w, " ")
      for (i = 1; i <= n; i++) {
        eq = index(w[i], "=")
        if (index($1, substr(w[i], 1, eq - 1) "=\"" substr(w[i], eq + 1) "\"") == 0) ok = 0
      }
      if (ok) s += $NF
    }
    END { printf "%d\n", s }' "$WORK/m-$name"
}
sum_metric() { # "names" METRIC [LABEL=VALUE...]: metric summed over the instances named
  local names=$1 total=0 name
  shift
  for name in $names; do total=$((total + $(metric "$name" "$@"))); done
  echo "$total"
}
# The whole admitted count of every instance, to see the counters still.
all_admitted() { sum_metric "${OLDS[*]} ${NEWS[*]}" tollgate_limit_decisions_total decision=allowed; }

# counts_after NAME LINE: the instance counts NAME logged after line LINE of its log, one a line.
counts_after() {
  awk -v from="$2" 'NR > from && /tollgate instance\(s\) share this store/ {
    for (i = 1; i < NF; i++) if ($(i + 1) == "tollgate" && $i ~ /^[0-9]+$/) print $i
  }' "${LOG[$1]}"
}
# fewest_counted NAME LINE: the fewest instances NAME counted from line LINE of its log on: the
# count it held then (the last one logged before, 1 if none) and every count logged since.
fewest_counted() {
  awk -v from="$2" '
    /tollgate instance\(s\) share this store/ {
      for (i = 1; i < NF; i++) if ($(i + 1) == "tollgate" && $i ~ /^[0-9]+$/) n = $i
      if (NR <= from) held = n
      else if (fewest == "" || n + 0 < fewest + 0) fewest = n
    }
    END { if (held == "") held = 1; if (fewest == "" || held + 0 < fewest + 0) fewest = held; print fewest }
  ' "${LOG[$1]}"
}

key_types() { # "hash 3" etc.: the TYPE of every bucket key in Redis
  local key
  for key in $(rcli --scan --pattern 'tollgate:k[1-9]:*'); do rcli TYPE "$key"; done |
    sort | uniq -c | awk '{printf "%s%s %s", sep, $2, $1; sep = ", "} END {if (!NR) printf "none"}'
}

now() { date +%s.%N; }

# --- one run -----------------------------------------------------------------------------
FAILED=0
run_mode() { # on_error
  local mode=$1 i name
  echo
  echo "== on_error = \"$mode\": $OLD_INSTANCES old + $NEW_INSTANCES new instances, $KEYS keys," \
    "rate $RATE/s, burst $BURST"
  start_redis
  OLDS=() NEWS=()
  for i in $(seq "$OLD_INSTANCES"); do start_instance "old$i" "$OLD_BIN" "$mode"; OLDS+=("old$i"); done
  for i in $(seq "$NEW_INSTANCES"); do
    start_instance "new$i" "$NEW_BIN" "$mode" "$NEW_BORROW"
    NEWS+=("new$i")
  done
  local everyone=("${OLDS[@]}" "${NEWS[@]}")
  if [ "$mode" = local ]; then
    # Let every heartbeat count everyone (one beat each 2 s) before the load starts.
    local total=${#everyone[@]} settled
    for _ in $(seq 100); do
      settled=1
      for name in "${everyone[@]}"; do
        [ "$(counts_after "$name" 0 | tail -n 1)" = "$total" ] || settled=0
      done
      [ "$settled" = 1 ] && break
      sleep 0.1
    done
    [ "$settled" = 1 ] || echo "warning: not every instance counted $total instances" >&2
  fi
  declare -A lines0
  for name in "${everyone[@]}"; do lines0[$name]=$(wc -l <"${LOG[$name]}"); done

  local t0 t1 types1 types2 types3 unready=0 samples=0
  t0=$(now)
  PHASE=1 load "$ALONE" "${OLDS[@]}"
  types1=$(key_types)
  PHASE=2 load "$OVERLAP" "${everyone[@]}" &
  local overlap_pid=$!
  # While both take load: how often an old instance's /readyz says it cannot decide.
  local stop_at
  stop_at=$(awk -v t="$(now)" -v d="$OVERLAP" 'BEGIN {printf "%d", t + d - 1}')
  while [ "$(date +%s)" -lt "$stop_at" ]; do
    for name in "${OLDS[@]}"; do
      samples=$((samples + 1))
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${ADMIN[$name]}/readyz")" = 200 ] ||
        unready=$((unready + 1))
    done
    sleep 0.5
  done
  wait "$overlap_pid"
  types2=$(key_types)
  PHASE=3 load "$ALONE" "${NEWS[@]}"
  # The last answers are in once two reads of the counters, a second apart, agree; t ends
  # after the last read, so it covers every admission counted.
  local before after
  scrape; after=$(all_admitted)
  while :; do
    sleep 1
    before=$after
    scrape; after=$(all_admitted)
    [ "$after" = "$before" ] && break
  done
  t1=$(now)
  types3=$(key_types)

  local t
  t=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f", b - a}')
  printf 't = %.3f s (old alone' "$t"
  echo " ${ALONE} s, both ${OVERLAP} s, new alone ${ALONE} s, then the counters read)"
  echo "bucket keys in Redis: after old alone: $types1; after both: $types2; after new alone: $types3"
  # Keys below their limit are full again, hence gone, within moments of a write: none left
  # is no proof either way (the WRONGTYPE count below is); strings would be.
  case "$types1" in
    "hash $KEYS") ;;
    none) echo "note: no bucket key after old alone (keys below their limit expire when full)" ;;
    *) echo "FAIL: the old instances did not leave $KEYS hashes: no overlap to test"; FAILED=1 ;;
  esac

  # Per instance: who fell back, and the fewest instances it counted.
  local extra=0 fallback n
  printf '%-6s %10s %10s %13s %15s %15s %8s\n' instance allowed denied store_errors \
    on_error_allow on_error_deny counted
  for name in "${everyone[@]}"; do
    n=-
    if [ "$mode" = local ]; then n=$(fewest_counted "$name" "${lines0[$name]}"); fi
    printf '%-6s %10s %10s %13s %15s %15s %8s\n' "$name" \
      "$(metric "$name" tollgate_checks_total result=allowed)" \
      "$(metric "$name" tollgate_checks_total result=denied)" \
      "$(metric "$name" tollgate_store_errors_total)" \
      "$(metric "$name" tollgate_checks_total result=error_allowed)" \
      "$(metric "$name" tollgate_checks_total result=error_denied)" "$n"
    fallback=$(($(metric "$name" tollgate_checks_total result=error_allowed) + \
      $(metric "$name" tollgate_checks_total result=error_denied)))
    if [ "$mode" = local ] && [ "$fallback" -gt 0 ]; then
      extra=$(awk -v e="$extra" -v b="$BURST" -v r="$RATE" -v n="$n" -v t="$t" \
        'BEGIN {s = b / n; if (s < 1) s = 1; printf "%.6f", e + s + r / n * t}')
    fi
  done
  local script_errors on_error breaker wrongtype
  script_errors=$(sum_metric "${OLDS[*]}" tollgate_store_errors_total kind=script)
  on_error=$(( $(sum_metric "${OLDS[*]}" tollgate_checks_total result=error_allowed) + \
    $(sum_metric "${OLDS[*]}" tollgate_checks_total result=error_denied) ))
  breaker=0 wrongtype=0
  for name in "${OLDS[@]}"; do
    breaker=$((breaker + $(grep -c 'circuit open' "${LOG[$name]}" || true)))
    wrongtype=$((wrongtype + $(grep -c 'circuit open.*WRONGTYPE\|WRONGTYPE.*circuit open' "${LOG[$name]}" || true)))
  done
  echo "old instances: $script_errors script errors, $on_error answers per on_error," \
    "circuit opened $breaker times ($wrongtype logged with WRONGTYPE)," \
    "/readyz not 200 in $unready of $samples samples during the overlap"
  grep -h -m 1 'circuit open' "${LOG[${OLDS[0]}]}" | sed 's/^/first in the log of '"${OLDS[0]}"': /' || true
  if [ "$on_error" -eq 0 ]; then
    echo "FAIL: no old instance answered per on_error: the overlap did not happen"; FAILED=1
  fi
  # What the new instances borrowed, used from slices and gave back.
  local borrowed used returned
  borrowed=$(sum_metric "${NEWS[*]}" tollgate_borrowed_tokens_total event=borrowed)
  used=$(sum_metric "${NEWS[*]}" tollgate_borrowed_tokens_total event=used)
  returned=$(sum_metric "${NEWS[*]}" tollgate_borrowed_tokens_total event=returned)
  echo "new instances (store.borrow ${NEW_BORROW:-default}): $borrowed tokens borrowed," \
    "$used admitted from slices, $returned returned"
  if [ "$NEW_BORROW" != false ] && [ "$borrowed" -eq 0 ]; then
    echo "note: no new instance borrowed (a key held at its limit takes no slice: near empty" \
      "a slice is 0); RATE=2000 BURST=4000 keeps the keys below it"
  fi

  # Admissions no limit counted: on_error = "allow" admits without deciding any limit (the
  # local fallback decides them, and counts them per limit). Each check here draws from one
  # limit, so these are each instance's admitted checks less its per-limit admissions; any of
  # them may have been any key's, so each key is charged all of them.
  local unattributed=0
  for name in "${everyone[@]}"; do
    unattributed=$((unattributed + $(metric "$name" tollgate_checks_total result=allowed) + \
      $(metric "$name" tollgate_checks_total result=error_allowed) - \
      $(metric "$name" tollgate_limit_decisions_total decision=allowed)))
  done

  # Per key: every instance's admissions against the bound.
  printf '%-4s %7s %7s %12s %9s %11s %s\n' key by_old by_new unattributed admitted bound verdict
  local k admitted by_old by_new bound verdict
  for k in $(seq "$KEYS"); do
    by_old=$(sum_metric "${OLDS[*]}" tollgate_limit_decisions_total limit="k$k" decision=allowed)
    by_new=$(sum_metric "${NEWS[*]}" tollgate_limit_decisions_total limit="k$k" decision=allowed)
    admitted=$((by_old + by_new + unattributed))
    bound=$(awk -v b="$BURST" -v r="$RATE" -v t="$t" -v e="$extra" 'BEGIN {printf "%.6f", b + r * t + e}')
    if awk -v a="$admitted" -v b="$bound" 'BEGIN {exit !(a <= b)}'; then
      verdict=ok
    else
      verdict="BROKEN"; FAILED=1
    fi
    printf '%-4s %7s %7s %12s %9s %11.1f %s\n' "/k$k" "$by_old" "$by_new" "$unattributed" \
      "$admitted" "$bound" "$verdict"
  done
  if [ "$mode" = local ]; then
    printf "bound = burst + rate * t + %.1f (the local fallbacks of the instances that used one)\n" "$extra"
  else
    echo "bound = burst + rate * t"
  fi
  stop_all
}

for mode in $MODES; do run_mode "$mode"; done
echo
if [ "$FAILED" = 0 ]; then echo "every bound held"; else echo "a bound was broken, or no overlap was seen"; fi
exit "$FAILED"
