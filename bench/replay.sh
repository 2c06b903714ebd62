#!/usr/bin/env bash
# `tollgate replay` throughput: log lines decided per second per core, on a simple config (one
# limit per client IP, memory store), for a generated nginx combined log and the same traffic as
# JSON lines. replay runs on one thread, so lines per CPU-second (user + system) is lines per
# second per core; the wall-clock rate is printed beside it.
#
#   LINES=5000000 CLIENTS=10000 ROUNDS=3 bench/replay.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh

LINES=${LINES:-5000000}
CLIENTS=${CLIENTS:-10000}
ROUNDS=${ROUNDS:-3}

require awk:gawk /usr/bin/time:time
cargo build --release --quiet --bin tollgate
BIN=target/release/tollgate

cat >"$WORK/simple.toml" <<'TOML'
[store]
backend = "memory"
max_buckets = 100000

[[limits]]
name = "per-ip"
rate = "10/s"
burst = 50
key = ["ip"]
TOML

# 20,000 requests per second of log time from CLIENTS addresses; one address in 100 sends ten
# times its share, so the limit denies some of the time.
awk -v n="$LINES" -v clients="$CLIENTS" -v json="$WORK/access.json" 'BEGIN {
  srand(7);
  split("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec", mon, " ");
  base = 1733270400;   # 2024-12-04T00:00:00Z
  for (i = 0; i < n; i++) {
    t = base + int(i / 20000);
    c = int(rand() * clients);
    if (rand() < 0.1) c = int(rand() * clients / 100);
    ip = sprintf("10.%d.%d.%d", int(c / 65536) % 256, int(c / 256) % 256, c % 256);
    s = t - base;
    stamp = sprintf("04/Dec/2024:%02d:%02d:%02d +0000", int(s / 3600), int(s / 60) % 60, s % 60);
    path = "/api/items/" (i % 1000);
    printf "%s - - [%s] \"GET %s HTTP/1.1\" 200 512 \"-\" \"bench/1.0\"\n", ip, stamp, path;
    printf "{\"time_local\":\"%s\",\"remote_addr\":\"%s\",\"request_method\":\"GET\",\"request_uri\":\"%s\",\"status\":200}\n", stamp, ip, path > json;
  }
}' >"$WORK/access.log"

run() { # FORMAT FILE: prints "cpu_seconds wall_seconds max_rss_kib" of one replay
  /usr/bin/time -f "%U %S %e %M" -o "$WORK/time" \
    "$BIN" replay --config "$WORK/simple.toml" --log-format "$1" --format json "$2" \
    >"$WORK/report.json"
  awk '{ print $1 + $2, $3, $4 }' "$WORK/time"
}

for format in combined json; do
  file=$WORK/access.log
  [ "$format" = json ] && file=$WORK/access.json
  : >"$WORK/per_core" && : >"$WORK/wall" && : >"$WORK/rss"
  for round in $(seq "$ROUNDS"); do
    read -r cpu wall rss < <(run "$format" "$file")
    awk -v n="$LINES" -v s="$cpu" 'BEGIN { printf "%.0f\n", n / (s > 0 ? s : 0.001) }' >>"$WORK/per_core"
    awk -v n="$LINES" -v s="$wall" 'BEGIN { printf "%.0f\n", n / (s > 0 ? s : 0.001) }' >>"$WORK/wall"
    echo "$rss" >>"$WORK/rss"
    echo "$format round $round: cpu ${cpu}s wall ${wall}s rss ${rss} KiB" >&2
  done
  denied=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["denied"], "of", r["requests"], "unparsed", r["unparsed"])' "$WORK/report.json")
  printf '%-9s %d lines: %s lines/s/core (median of %d; rounds: %s), wall %s lines/s, max RSS %s KiB; denied %s\n' \
    "$format" "$LINES" "$(median <"$WORK/per_core")" "$ROUNDS" "$(paste -sd' ' "$WORK/per_core")" \
    "$(median <"$WORK/wall")" "$(median <"$WORK/rss")" "$denied"
done
