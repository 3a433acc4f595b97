#!/usr/bin/env bash
# Runs the whole test suite N times in a row (default 20), stopping at the first failure, while
# another build keeps both cores busy beside it: a flaky test shows up here, not in CI.
#
#   scripts/repeat-tests.sh [N]
#
# The load is a release build of the workspace into its own target folder
# (target/repeat-load), cleaned and started again for as long as the runs go on; set
# LOAD=none to run without it. The count of passing runs is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}

bash scripts/services.sh
cargo test --workspace --no-run --quiet

load_pid=
if [ "${LOAD:-build}" != none ]; then
  (
    while true; do
      cargo clean --quiet --target-dir target/repeat-load --release 2>/dev/null || true
      cargo build --quiet --workspace --release --target-dir target/repeat-load >/dev/null 2>&1 || true
    done
  ) &
  load_pid=$!
fi
stop_load() {
  if [ -n "$load_pid" ]; then
    pkill -P "$load_pid" 2>/dev/null || true
    kill "$load_pid" 2>/dev/null || true
  fi
}
trap stop_load EXIT

logs=target/repeat-tests
mkdir -p "$logs"
passed=0
for i in $(seq 1 "$runs"); do
  started=$(date +%s)
  if cargo test --workspace >"$logs/run-$i.log" 2>&1; then
    passed=$((passed + 1))
    echo "run $i/$runs: passed ($(( $(date +%s) - started )) s)"
  else
    echo "run $i/$runs: FAILED after $(( $(date +%s) - started )) s; log: $logs/run-$i.log" >&2
    grep -E "^(test .* FAILED|thread '.*' .*panicked)" "$logs/run-$i.log" | head -20 >&2 || true
    echo "$passed of $runs runs passed before the failure" >&2
    exit 1
  fi
done
echo "$passed of $runs runs passed in a row"
