#!/usr/bin/env bash
# Runs the whole test suite ROUNDS times in a row (default 3) with BURNERS CPU-burning
# processes beside it (default 2), to find tests that only pass on a quiet machine.
# Usage: scripts/test-under-load.sh [ROUNDS] [BURNERS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
burners="${2:-2}"

pids=()
stop_burners() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_burners EXIT
for _ in $(seq "$burners"); do
  yes >/dev/null &
  pids+=("$!")
done

cargo test --all-targets --no-run --quiet
cargo test --features e2e --test e2e --test fast --no-run --quiet
# Both tiers, as scripts/test.sh runs them.
all_tiers() {
  cargo test --all-targets --no-fail-fast &&
    cargo test --features e2e --no-fail-fast --test e2e &&
    cargo test --features e2e --no-fail-fast --test fast -- ::e2e::
}
failed=0
for round in $(seq "$rounds"); do
  started=$(date +%s)
  if all_tiers >"target/under-load-$round.log" 2>&1; then
    echo "round $round: green in $(( $(date +%s) - started )) s"
  else
    failed=$((failed + 1))
    echo "round $round: FAILED in $(( $(date +%s) - started )) s (target/under-load-$round.log)"
    grep -E '^(test .* FAILED|---- )' "target/under-load-$round.log" || true
  fi
done
echo "$((rounds - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
