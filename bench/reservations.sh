#!/usr/bin/env bash
# Reservations, measured on one Redis in one run:
#
# 1. The in-flight overshoot, before and after: CLIENTS (64) clients each send a request,
#    hold it for HOLD_S (2) seconds, then report its true cost COST (1,000 tokens), and
#    start again, for WINDOW_S (60) seconds, against a budget of BUDGET (10,000) tokens a
#    minute (burst 10,000). "report" charges after the response (`charge = "report"` alone);
#    "reserve" takes `reserve = COST` at the check and settles it by id. Prints the tokens
#    admitted in the window next to the bound, burst + rate × window.
# 2. What a check costs: wrk at saturation on /check, 10,000 keys, against a plain bucket
#    (`charge = "request"`) and a reserving limit; checks/s and Redis CPU per check. Then the
#    Redis CPU of a settle, against a plain report.
#
#   bench/reservations.sh                  # the whole run, about 3 minutes
#   WINDOW_S=20 DURATION=3 bench/reservations.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CLIENTS=${CLIENTS:-64}
HOLD_S=${HOLD_S:-2}
COST=${COST:-1000}
BUDGET=${BUDGET:-10000}
WINDOW_S=${WINDOW_S:-60}
DURATION=${DURATION:-5}
RUNS=${RUNS:-3}
TOKEN=bench-admin-token-0123456789

. bench/lib.sh
require wrk:wrk redis-server:redis-server
cargo build --release --quiet --bin tollgate
start_redis

redis_cpu() { rcli INFO cpu | tr -d '\r' | awk -F: '
  /^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }

# start NAME LIMIT_TOML: a tollgate on the Redis; sets PORT_NAME, ADMIN_NAME.
start() {
  local port admin
  port=$(free_port); admin=$(free_port)
  cat >"$WORK/$1.toml" <<TOML
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
admin_token = "$TOKEN"
[store]
backend = "redis"
url = "redis://127.0.0.1:$REDIS_PORT/0"
timeout_ms = 1000
$2
TOML
  target/release/tollgate --config "$WORK/$1.toml" 2>"$WORK/$1.log" &
  PIDS+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  printf -v "PORT_$1" %s "$port"
  printf -v "ADMIN_$1" %s "$admin"
}

budget() {
  cat <<TOML
[[limits]]
name = "tokens"
rate = "$BUDGET/m"
burst = $BUDGET
charge = "report"
key = ["header:x-api-key"]
$1
TOML
}
start report "$(budget "")"
start reserve "$(budget "reserve = $COST")"

# overshoot NAME: tokens admitted in the window (each admitted request costs COST).
overshoot() {
  local port_var="PORT_$1" admin_var="ADMIN_$1"
  rcli FLUSHALL >/dev/null
  python3 - "${!port_var}" "${!admin_var}" "$1" <<PY
import http.client, json, sys, threading, time
port, admin, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
clients, hold, cost, window = $CLIENTS, $HOLD_S, $COST, $WINDOW_S
admitted = [0]
lock = threading.Lock()
end = time.monotonic() + window
def call(port, method, path, body=None, headers={}):
    # A connection per call: a client that waits seconds between calls finds a kept-alive
    # one closed by the server.
    connection = http.client.HTTPConnection("127.0.0.1", port)
    connection.request(method, path, body, headers)
    answer = connection.getresponse(); answer.read()
    connection.close()
    return answer
def client():
    while time.monotonic() < end:
        answer = call(port, "GET", "/check", headers={"X-Api-Key": "acme"})
        if answer.status != 200:
            time.sleep(min(float(answer.getheader("Retry-After", "1")), max(end - time.monotonic(), 0)))
            continue
        with lock:
            admitted[0] += 1
        time.sleep(hold)
        if mode == "reserve":
            body = {"reservation": answer.getheader("X-Tollgate-Reservation"), "cost": cost}
        else:
            body = {"limit": "tokens", "key": ["acme"], "cost": cost}
        done = call(admin, "POST", "/report", json.dumps(body),
                    {"Authorization": "Bearer $TOKEN", "Content-Type": "application/json"})
        assert done.status == 200, done.status
threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(admitted[0] * cost)
PY
}

echo "# 1. in-flight overshoot: $CLIENTS clients, ${HOLD_S} s each, cost $COST, budget $BUDGET/min, ${WINDOW_S} s"
bound=$(( BUDGET + BUDGET * WINDOW_S / 60 ))
for mode in report reserve; do
  printf '%-8s admitted %s tokens (bound %s)\n' "$mode" "$(overshoot "$mode")" "$bound"
done

big() {
  cat <<TOML
[[limits]]
name = "plain"
rate = 1000000
burst = 1000000000
key = ["path"]
$1
TOML
}
start plain "$(big "")"
start reserving "$(big "charge = \"report\"
reserve = 1")"
start reported "$(big "charge = \"report\"")"

# saturate NAME: "checks/s redis_us_per_check" for wrk on /check, 10,000 keys.
saturate() {
  local port_var="PORT_$1" r0 r1 n
  rcli FLUSHALL >/dev/null
  r0=$(redis_cpu)
  KEYS=10000 wrk -t1 -c64 -d"${DURATION}s" -s bench/random_key.lua \
    "http://127.0.0.1:${!port_var}/check" >"$WORK/wrk.out"
  r1=$(redis_cpu)
  n=$(awk '/ requests in / {print $1}' "$WORK/wrk.out")
  awk -v n="$n" -v d="$DURATION" -v r0="$r0" -v r1="$r1" \
    'BEGIN {printf "%.0f %.2f\n", n / d, (r1 - r0) * 1e6 / n}'
}

echo "# 2. /check at saturation, 10,000 keys, ${DURATION} s x $RUNS, medians"
for name in plain reserving; do
  : >"$WORK/$name.rps"; : >"$WORK/$name.cpu"
done
for _ in $(seq "$RUNS"); do
  for name in plain reserving; do
    read -r rps cpu < <(saturate "$name")
    echo "$rps" >>"$WORK/$name.rps"; echo "$cpu" >>"$WORK/$name.cpu"
  done
done
for name in plain reserving; do
  printf '%-10s %s checks/s  Redis %s µs/check\n' "$name" \
    "$(median <"$WORK/$name.rps")" "$(median <"$WORK/$name.cpu")"
done

# settle_cost: Redis CPU per settle and per plain report, 5,000 each over one connection.
echo "# 3. Redis CPU per settle and per plain report (5,000 each)"
rcli FLUSHALL >/dev/null
python3 - "$PORT_reserving" "$ADMIN_reserving" "$ADMIN_reported" "$REDIS_PORT" <<PY
import http.client, json, subprocess, sys
port, admin, reported, redis = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def cpu():
    out = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", redis, "INFO", "cpu"],
                         capture_output=True, text=True, check=True).stdout
    return sum(float(l.split(":")[1]) for l in out.splitlines()
               if l.startswith(("used_cpu_sys:", "used_cpu_user:")))
check = http.client.HTTPConnection("127.0.0.1", port)
ids = []
for i in range(5000):
    check.request("GET", f"/check/k{i % 1000}")
    answer = check.getresponse(); answer.read()
    ids.append(answer.getheader("X-Tollgate-Reservation"))
headers = {"Authorization": "Bearer $TOKEN", "Content-Type": "application/json"}
def send(port, bodies):
    report = http.client.HTTPConnection("127.0.0.1", port)
    before = cpu()
    for body in bodies:
        report.request("POST", "/report", json.dumps(body), headers)
        answer = report.getresponse(); answer.read()
        assert answer.status == 200, answer.status
    return (cpu() - before) * 1e6 / len(bodies)
settle = send(admin, [{"reservation": i, "cost": 1} for i in ids])
charge = send(reported, [{"limit": "plain", "key": [f"/k{i % 1000}"], "cost": 1} for i in range(5000)])
print(f"settle {settle:.1f} µs/call  plain report {charge:.1f} µs/call (INFO cpu includes redis-cli's own connections)")
PY
