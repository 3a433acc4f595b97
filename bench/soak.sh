#!/usr/bin/env bash
# Soak test (not in CI): one `wharf serve` (import service, SQLite unless STORE says
# otherwise) under SOAK_SECS (default 1800) of mixed load from bench/soak: writes with
# deletions confirmed over MRTR, paged reads, report calls cut off mid-stream, listen
# streams opened and dropped. Resident memory and open descriptors are sampled every 10 s;
# they must stay flat. Output: stdout and target/bench/soak.txt.
#
# usage: bench/soak.sh [--no-build]
# environment: SOAK_SECS, STORE (default a fresh SQLite file), PORT (default 18097)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=soak.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
cd "$ROOT"
[ "${1:-}" = --no-build ] || cargo build --release -p wharf-cli -p wharf-bench-soak
PORT=${PORT:-18097}
dir=$(mktemp -d)
STORE=${STORE:-sqlite://$dir/wharf.db}
TOKEN=soak-token-0123456789
WHARF_LOG=warn "$TARGET/release/wharf" serve --store "$STORE" --api-key "soak=$TOKEN" \
    --listen "127.0.0.1:$PORT" > "$dir/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do
    curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && break
    sleep 0.05
done
mkdir -p target/bench
db=${STORE#sqlite://}
[ "$db" != "$STORE" ] || db=
WHARF_URL="http://127.0.0.1:$PORT/mcp" SOAK_TOKEN=$TOKEN SOAK_PID=$pid SOAK_DB=$db \
    "$TARGET/release/wharf-bench-soak" | tee target/bench/soak.txt
kill -0 "$pid" || { echo "soak: the server died; its log: $dir/server.log" >&2; exit 1; }
echo "server log: $dir/server.log (warnings and errors only)"
