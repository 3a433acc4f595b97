#!/usr/bin/env bash
# Regenerates crates/wharf-cli/link/hot-symbols.txt: the functions `wharf serve` runs at
# startup and on its request paths, which the release link places together (lld's
# --symbol-ordering-file, see crates/wharf-cli/build.rs). The kernel maps a binary's code in
# large folios, so code that sits next to hot code stays resident although it never runs:
# grouping the hot code keeps the rest out of RSS.
#
# The list is taken with valgrind's callgrind (every function executed, not a sample) while
# the release binary starts and serves: first the demo profile (echo, the benchmark's path),
# then the import service on SQLite. Symbol names carry crate hashes that change with the
# toolchain and dependency versions: rerun this after upgrading either, and after changing the
# request path (a stale list only costs the gain, never correctness). CI runs
# scripts/check-symbols.sh, which fails when the binary no longer defines what the list names.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT="$ROOT/crates/wharf-cli/link/hot-symbols.txt"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; pkill -f "listen 127.0.0.1:18199" 2>/dev/null || true' EXIT
command -v valgrind >/dev/null || { echo "order-symbols: valgrind is required" >&2; exit 1; }

cd "$ROOT"
WHARF_NO_SYMBOL_ORDERING=1 cargo build --release -p wharf-cli >&2
BIN="$ROOT/target/release/wharf"

call() { # name args-json [token]
    curl -s -o /dev/null -X POST http://127.0.0.1:18199/mcp \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: tools/call' -H "Mcp-Name: $1" \
        ${3:+-H "Authorization: Bearer $3"} \
        --data-binary "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}},\"name\":\"$1\",\"arguments\":$2}}"
}

profile_run() { # name serve-args... ; then the calls run by the caller via $1
    local name=$1; shift
    valgrind --tool=callgrind --demangle=no --callgrind-out-file="$TMP/$name.cg" \
        "$BIN" serve --listen 127.0.0.1:18199 "$@" >"$TMP/$name.log" 2>&1 &
    for _ in $(seq 1 300); do curl -s -o /dev/null http://127.0.0.1:18199/healthz && break; sleep 0.1; done
}

stop_run() {
    pkill -TERM -f "listen 127.0.0.1:18199" || true
    for _ in $(seq 1 100); do pgrep -f "listen 127.0.0.1:18199" >/dev/null || break; sleep 0.1; done
}

profile_run demo --profile demo --anonymous
for _ in $(seq 1 30); do call echo '{"text":"hello from wrk"}'; done
stop_run

TOKEN=order-symbols-token-aaaa
profile_run import --store "sqlite://$TMP/order.db" --api-key "u=$TOKEN"
imp=$(curl -s -X POST http://127.0.0.1:18199/mcp -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
    -H 'Mcp-Method: tools/call' -H 'Mcp-Name: import_begin' -H "Authorization: Bearer $TOKEN" \
    --data-binary '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"name":"import_begin","arguments":{"dataset":"d","columns":[{"name":"id","type":"integer"}],"idempotency_key":"begin-1"}}}' \
    | grep -o '"import":"imp_[0-9a-f]*"' | head -1 | cut -d'"' -f4)
for i in $(seq 1 20); do call import_append_rows "{\"import\":\"$imp\",\"rows\":[{\"id\":$i}],\"idempotency_key\":\"k$i\"}" "$TOKEN"; done
call import_status "{\"import\":\"$imp\"}" "$TOKEN"
stop_run

# Names as the binary defines them, demo path first, each once.
nm --defined-only "$BIN" | awk '$2 ~ /^[tTwW]$/ { print $3 }' | sort -u >"$TMP/defined"
: >"$OUT.new"
for run in demo import; do
    grep -oE '^c?fn=\([0-9]+\) .*' "$TMP/$run.cg" | sed -E 's/^c?fn=\([0-9]+\) //' | sort -u \
        | comm -12 - "$TMP/defined" | grep -vxF -f "$OUT.new" >>"$OUT.new" || true
done
mv "$OUT.new" "$OUT"
echo "order-symbols: $(wc -l <"$OUT") functions in $OUT" >&2
