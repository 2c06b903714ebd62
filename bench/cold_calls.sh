#!/usr/bin/env bash
# What a fresh borrowing instance's script calls cost Redis, in instructions: its calls are
# recorded once, then replayed in the same order into a redis-server under valgrind's callgrind,
# once with lua/ as it is and once as of git revision BASELINE. Instructions, not time: the
# figures do not move with the machine's load, which no A/B in time on a 2-core machine escapes.
#
# 1. Recording: a redis-server and a fresh tollgate borrowing on bench/lib.sh's per-key limit
#    (rungs 100 ms to 10 s); wrk sends the Zipf spread of bench/erl_pattern.sh (s = 1.1 over
#    100,000 keys, 64 connections) for 6 s, and MONITOR records CAPTURE s of it (default 3)
#    from AT s (default 0.5): the first seconds of an instance that has learnt nothing.
# 2. Replay: the recorded calls of the bucket script (not the overrides' polls), through
#    redis-cli --pipe, into a fresh redis-server under callgrind; a call's give-back names a
#    group of the recording's clock, so on replay it finds none and gives nothing back, alike
#    for both versions.
#
#   BASELINE=98b65e3 bench/cold_calls.sh
#   BASELINE=HEAD~1 MERGE="5 10" bench/cold_calls.sh   # also the same requests in batches of
#                                                      # 5 and 10: fewer calls, as many items
#   CALLS=FILE bench/cold_calls.sh     # replays FILE (kept from an earlier run: KEEP=FILE)
set -euo pipefail
cd "$(dirname "$0")/.."
AT=${AT:-0.5}
CAPTURE=${CAPTURE:-3}

. bench/lib.sh
require valgrind:valgrind wrk:wrk redis-server:redis-server redis-cli:redis-tools curl:curl

# record FILE: the bucket script's calls of a fresh instance, one per line: numkeys, keys and
# arguments, tab-separated.
record() {
  cargo build --release --quiet --bin tollgate
  start_redis
  TOLLGATE_STORE__BORROW_HORIZON_MS=100 TOLLGATE_STORE__BORROW_LONGEST_HORIZON_MS=10000 \
    start_per_key borrow target/release/tollgate redis "borrow = true"
  KEYS=100000 wrk -t1 -c64 -d6s -s bench/zipf_key.lua "http://127.0.0.1:$PORT_borrow/check" \
    >/dev/null &
  local load=$!
  sleep "$AT"
  timeout "$CAPTURE" redis-cli -h 127.0.0.1 -p "$REDIS_PORT" MONITOR >"$WORK/monitor" || true
  wait "$load"
  python3 - "$WORK/monitor" "$(bucket_script | sha1sum | cut -c1-40)" >"$1" <<'PY'
import re, sys
sha = sys.argv[2]
for line in open(sys.argv[1]):
    m = re.match(r'[\d.]+ \[\d+ [\d.:]+\] "EVALSHA" "(\w+)" (.*)$', line)
    if m and m.group(1) == sha:
        print('\t'.join(re.findall(r'"([^"]*)"', m.group(2))))
PY
}

# merge N FROM TO: FROM's requests, in order, in batches of N per call.
merge() {
  python3 - "$@" <<'PY'
import sys
size, out = int(sys.argv[1]), open(sys.argv[3], 'w')
def requests(line):
    a = line.rstrip('\n').split('\t')
    n = int(a[0]); keys, argv = a[1:1 + n], a[1 + n:]
    if argv[0] != '*':
        return [(keys, argv)]
    found, i, k = [], 1, 0
    while i < len(argv):
        m = int(argv[i]); found.append((keys[k:k + m], argv[i + 1:i + 1 + 4 * m]))
        k += m; i += 1 + 4 * m
    return found
batch = []
def flush():
    keys = [k for ks, _ in batch for k in ks]
    argv = batch[0][1] if len(batch) == 1 else ['*'] + [x for ks, av in batch for x in [str(len(ks))] + av]
    out.write('\t'.join([str(len(keys))] + keys + argv) + '\n'); batch.clear()
for line in open(sys.argv[2]):
    for request in requests(line):
        batch.append(request)
        if len(batch) == size: flush()
if batch: flush()
PY
}

# replay CALLS SCRIPT: instructions of a redis-server under callgrind serving CALLS with SCRIPT
# (from its first call to its last reply); prints "instructions calls".
replay() {
  local port pid sha
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$port" redis-server --port "$port" \
    --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" --logfile "$WORK/cg-$port.log" \
    2>"$WORK/cg-$port.valgrind" &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 300); do
    redis-cli -p "$port" PING >/dev/null 2>&1 && break
    sleep 0.2
  done
  sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat "$2")")
  python3 - "$1" "$sha" >"$WORK/calls.resp" <<'PY'
import sys
out = sys.stdout.buffer
for line in open(sys.argv[1]):
    words = [b'EVALSHA', sys.argv[2].encode()] + [w.encode() for w in line.rstrip('\n').split('\t')]
    out.write(b'*%d\r\n' % len(words))
    for w in words:
        out.write(b'$%d\r\n%s\r\n' % (len(w), w))
PY
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-cli -p "$port" --pipe <"$WORK/calls.resp" | grep -q 'errors: 0,' \
    || { echo "the replay met script errors" >&2; exit 1; }
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  echo "$(callgrind_annotate "$WORK/cg.$port.1" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}') $(wc -l <"$1")"
}

calls=${CALLS:-$WORK/calls}
[ -n "${CALLS:-}" ] || record "$calls"
[ -z "${KEEP:-}" ] || cp "$calls" "$KEEP"
bucket_script >"$WORK/script.lua"
[ -z "${BASELINE:-}" ] || bucket_script "$BASELINE" >"$WORK/baseline.lua"
items=$(awk -F'\t' '{n += $1} END {print n}' "$calls")

printf '| calls (%s requests) | lua/ | instructions | per call | per request |\n|---|---|---|---|---|\n' "$items"
row() {
  local result
  result=$(replay "$1" "$2")
  awk -v r="$result" -v items="$items" -v what="$3" -v lua="$4" 'BEGIN {
    split(r, f, " "); printf "| %s (%d) | %s | %.1fM | %.0f | %.0f |\n", what, f[2], lua,
      f[1] / 1e6, f[1] / f[2], f[1] / items }'
}
for version in script ${BASELINE:+baseline}; do
  label=$([ "$version" = script ] && echo "as checked out" || echo "$BASELINE")
  row "$calls" "$WORK/$version.lua" "recorded" "$label"
  for size in ${MERGE:-}; do
    merge "$size" "$calls" "$WORK/merged-$size"
    row "$WORK/merged-$size" "$WORK/$version.lua" "batches of $size" "$label"
  done
done
