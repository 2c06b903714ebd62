#!/usr/bin/env bash
# Where a check's Redis CPU goes, beside envoyproxy/ratelimit's commands: redis-server runs
# under valgrind's callgrind (instructions, not time: the same figures on a loaded machine)
# for each shape in turn, and the instructions are split by what Redis was doing.
#
# Shapes, each on 10,000 random keys:
#   batch     tollgate's batch form as /check coalesces it: BATCH one-bucket checks per
#             EVALSHA of lua/token_bucket.lua (default 11, the average measured through /check)
#   floor     the same calls to a script doing only TIME, one GET and one SET ... PXAT per
#             bucket, the least a read-modify-write bucket in this layout can cost
#   one, one-floor  the same two scripts, one check per call (the form without coalescing)
#   function, function-one  the same script loaded as a Redis function library (FCALL): its
#             helpers and constants made once at load instead of on every call (an experiment:
#             tollgate calls EVALSHA)
#   erl       INCRBY then EXPIRE per descriptor, 8 commands per round trip (its pipeline
#             window)
#
# Per check (per descriptor for erl), in instructions: the total; reading and parsing the
# requests; the commands once dispatched (for a script, those it runs with redis.call); the
# rest of the script call (the interpreter, arguments and replies turned into Lua values and
# back, Lua's allocator and collector), and of that the conversions between numbers and text
# (sprintf, strtod); everything else (the event loop, replies, the server's timer). A stripped
# redis-server exports no symbols for Lua's own internals, so they are not split further.
#
#   bench/redis_profile.sh              # 4,000 calls per shape
#   CALLS=1000 bench/redis_profile.sh   # a quick look
#   PROFILES=DIR bench/redis_profile.sh  # keeps the profiles (SHAPE.out.1) for callgrind_annotate
#   BASELINE=REV bench/redis_profile.sh  # also batch-before and one-before: the same two shapes
#                                        # with lua/ as of git revision REV, in the same run
#   SHAPES="batch one" bench/redis_profile.sh  # only these shapes
#   RATE=0.01 BURST=1000 bench/redis_profile.sh  # every check's bucket (rate 1000/s and burst
#             # 1,000,000 by default, full again within a millisecond: absent when checked)
#             # stays in debt for 100 s, so most checks read and refill a stored value
set -euo pipefail
cd "$(dirname "$0")/.."

CALLS=${CALLS:-4000}
BATCH=${BATCH:-11}
KEYS=${KEYS:-10000}
RATE=${RATE:-1000}
BURST=${BURST:-1000000}
SHAPES=${SHAPES:-batch floor one one-floor function function-one erl}
if [ -n "${BASELINE:-}" ]; then SHAPES="batch-before one-before $SHAPES"; fi

. bench/lib.sh
require valgrind:valgrind redis-server:redis-server redis-benchmark:redis-tools

# profile NAME COMMAND...: a fresh redis-server under callgrind; COMMAND runs against it
# (with $REDIS_PORT set) once to warm up and once more counted; the counted profile lands in
# $WORK/NAME.out.1.
profile() {
  local name=$1 pid
  shift
  REDIS_PORT=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.out" --collect-atstart=yes \
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$WORK" --logfile "$WORK/redis-$name.log" 2>"$WORK/$name.valgrind" &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 300); do
    [ "$(rcli PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
  "$@"
  callgrind_control -z "$pid" >/dev/null
  "$@"
  callgrind_control -d "$pid" >/dev/null
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

# checks VERB TARGET: CALLS * BATCH checks through `VERB TARGET` (evalsha SHA, or fcall
# FUNCTION): BATCH checks per call in the batch form, or (ONE=1) one per call.
checks() {
  local keys=() args=() i
  if [ "${ONE:-0}" = 1 ]; then
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 8 -r "$KEYS" -n "$((CALLS * BATCH))" -q \
      "$1" "$2" 1 "tollgate:per-key:{k__rand_int__}" "$RATE" "$BURST" 1 0 >/dev/null
    return
  fi
  for i in $(seq "$BATCH"); do
    keys+=("tollgate:per-key:{k__rand_int__}")
    args+=(1 "$RATE" "$BURST" 1 0)
  done
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 8 -r "$KEYS" -n "$CALLS" -q \
    "$1" "$2" "$BATCH" "${keys[@]}" '*' "${args[@]}" >/dev/null
}
# script_calls SCRIPT: the checks through EVALSHA of SCRIPT's text.
script_calls() { checks evalsha "$(rcli SCRIPT LOAD "$1")"; }
batch() { script_calls "$(bucket_script)"; }
one() { ONE=1 batch; }
# batch_before, one_before: the same with the scripts as of git revision $BASELINE.
batch_before() { script_calls "$(bucket_script "$BASELINE")"; }
one_before() { ONE=1 batch_before; }
# fcalls: the checks through FCALL of the same script loaded as a function library.
fcalls() {
  {
    echo '#!lua name=tollgate_profile'
    cat lua/bounds.lua lua/calendar.lua lua/stored.lua lua/groups.lua lua/global.lua
    echo "redis.register_function('tollgate_bucket', function(KEYS, ARGV)"
    cat lua/token_bucket.lua lua/decide.lua
    echo 'end)'
  } >"$WORK/library.lua"
  rcli -x FUNCTION LOAD REPLACE <"$WORK/library.lua" >/dev/null
  checks fcall tollgate_bucket
}
function_one() { ONE=1 fcalls; }
one_floor() { ONE=1 floor; }
floor() {
  # TIME once, then per bucket one GET and one SET ... PXAT of a constant, one reply: the least
  # a read-modify-write bucket in this layout can cost.
  cat >"$WORK/floor.lua" <<'LUA'
local t = redis.call('TIME')
local at = string.format('%d', t[1] * 1000 + 60000)
for i = 1, #KEYS do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], '1000000 1', 'PXAT', at)
end
return 1
LUA
  script_calls "$WORK/floor.lua"
}
erl() {
  local n=$((CALLS * BATCH))
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 8 -P 8 -r "$KEYS" -n "$n" -q \
    incrby "erl:__rand_int__" 1 >/dev/null
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -c 8 -P 8 -r "$KEYS" -n "$n" -q \
    expire "erl:__rand_int__" 60 >/dev/null
}

# inclusive FILE: "symbol instructions" lines, inclusive, for every function of the profile.
inclusive() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk '/^ *[0-9,]+ \(/ {
      n = $1; gsub(",", "", n)
      name = $0; sub(/^[^%]*%\) +/, "", name); sub(/ .*/, "", name); sub(/^[^:]*:/, "", name)
      print name, n
    }'
}

for shape in $SHAPES; do
  case $shape in
    batch | floor | one | erl) profile "$shape" "$shape" ;;
    batch-before) profile "$shape" batch_before ;;
    one-before) profile "$shape" one_before ;;
    one-floor) profile "$shape" one_floor ;;
    function) profile "$shape" fcalls ;;
    function-one) profile "$shape" function_one ;;
    *) echo "unknown shape: $shape" >&2; exit 2 ;;
  esac
done
if [ -n "${PROFILES:-}" ]; then
  mkdir -p "$PROFILES" && cp "$WORK"/*.out.1 "$PROFILES"/
fi

# The columns, per check: total; reading and parsing requests (outside the command); the
# commands themselves (for a script: those it runs with redis.call); the script's own work
# (the interpreter, converting arguments and replies), and of that the conversions between
# numbers and text (sprintf, strtod); everything else (the event loop, replies, the timer).
counted=$((CALLS * BATCH))
printf '| shape | instructions per check | parsing requests | commands | script | of which number <-> text | other |\n'
printf '|---|---|---|---|---|---|---|\n'
for shape in $SHAPES; do
  inclusive "$WORK/$shape.out.1" | awk -v shape="$shape" -v n="$counted" '
    {v[$1] = $2}
    END {
      total = v["main"]
      parse = v["readQueryFromClient"] - v["processCommand"]
      if (v["lua_pcall"]) {
        commands = v["scriptCall"]
        script = (v["luaCallFunction"] ? v["luaCallFunction"] : v["fcallCommand"]) - commands
        numbers = v["__sprintf_chk"] + v["strtod"]
      } else {
        commands = v["call"]
        script = 0
        numbers = 0
      }
      other = total - parse - commands - script
      printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", shape, total / n,
        parse / n, commands / n, script / n, numbers / n, other / n
    }'
done
