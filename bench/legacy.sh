#!/usr/bin/env bash
# Legacy clients' hot path: one `tools/call` of `echo` per request in a 2025-11-25 session,
# against the same call from a stateless 2026-07-28 client, on the same server in the same run.
#
# The server (`wharf serve --profile demo`) runs pinned to CPU 0 and wrk to CPU 1
# (`-t1 -c32`). Each side runs ROUNDS times, alternating; the best throughput of each is
# reported with that run's p50/p99. Output: target/bench/legacy.txt; raw wrk output in
# target/bench/raw/.
#
# usage: bench/legacy.sh [--quick] [--no-build]
# environment: STORE (unset: sessions live in the process; a store URL: sessions live there,
#   as with several replicas, and every legacy request reads its session from it),
#   DURATION (s, default 10), ROUNDS (default 3), CONNECTIONS (default 32), PORT (default 18093)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=legacy.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
OUT="$TARGET/bench"
RAW="$OUT/raw"

build=1
for arg in "$@"; do
    case "$arg" in
        --quick) DURATION=3 ROUNDS=1 ;;
        --no-build) build=0 ;;
        -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (try --help)" ;;
    esac
done
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-32}
PORT=${PORT:-18093}
STORE=${STORE:-}
for tool in taskset curl awk; do
    command -v "$tool" >/dev/null || die "'$tool' is required"
done
ensure_wrk
((build)) && { (cd "$ROOT" && cargo build --release -p wharf-cli) >&2 || die "cargo build failed"; }
WHARF_BIN="$TARGET/release/wharf"
[[ -x $WHARF_BIN ]] || die "$WHARF_BIN is missing"
mkdir -p "$RAW"

store_args=()
[[ -n $STORE ]] && store_args=(--store "$STORE")
taskset -c 0 "$WHARF_BIN" serve --profile demo --anonymous --listen "127.0.0.1:$PORT" "${store_args[@]}" \
    >"$RAW/legacy-server.log" 2>&1 &
server_pid=$!
trap 'kill $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true' EXIT
URL="http://127.0.0.1:$PORT/mcp"
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null || die "the server did not come up (log: $RAW/legacy-server.log)"

# The session every legacy request belongs to.
WHARF_SESSION=$(curl -s -D - -o /dev/null "$URL" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' \
    --data-binary '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"wrk","version":"4.1.0"}}}' \
    | awk 'tolower($1) == "mcp-session-id:" { gsub("\r", "", $2); print $2 }')
[[ -n $WHARF_SESSION ]] || die "initialize opened no session"
export WHARF_SESSION
curl -sf -o /dev/null "$URL" -H 'Content-Type: application/json' -H "Mcp-Session-Id: $WHARF_SESSION" \
    --data-binary '{"jsonrpc":"2.0","method":"notifications/initialized"}' || die "notifications/initialized refused"
# Both sides must answer the call with a result.
legacy_answer=$(curl -s "$URL" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
    -H "Mcp-Session-Id: $WHARF_SESSION" -H 'MCP-Protocol-Version: 2025-11-25' \
    --data-binary '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hello from wrk"}}}')
[[ $legacy_answer == *'"result":{'*'hello from wrk'* ]] || die "the legacy call did not succeed: $legacy_answer"

run() { # side -> "rps p50 p99"
    local side=$1 lua out
    [[ $side == modern ]] && lua="$ROOT/bench/echo.lua" || lua="$ROOT/bench/legacy.lua"
    out="$RAW/legacy-$side-$(date +%s%N).txt"
    taskset -c 1 wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$lua" "http://127.0.0.1:$PORT" >"$out" \
        || die "$side: wrk failed ($out)"
    grep -q "Non-2xx" "$out" && die "$side: wrk saw non-2xx answers ($out)"
    awk '/Requests\/sec/ { rps = $2 } $1 == "50%" { p50 = $2 } $1 == "99%" { p99 = $2 } END { print rps, p50, p99 }' "$out"
}

# Warm-up, then alternate.
DURATION=2 run modern >/dev/null
DURATION=2 run legacy >/dev/null
best_modern="0 - -" best_legacy="0 - -"
for round in $(seq 1 "$ROUNDS"); do
    for side in modern legacy; do
        result=$(run "$side") || exit 1
        log "round $round $side: $result"
        if [[ $side == modern ]]; then
            awk -v a="$result" -v b="$best_modern" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] > y[1]) }' && best_modern=$result
        else
            awk -v a="$result" -v b="$best_legacy" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] > y[1]) }' && best_legacy=$result
        fi
    done
done
read -r m_rps m_p50 m_p99 <<<"$best_modern"
read -r l_rps l_p50 l_p99 <<<"$best_legacy"
ratio=$(awk -v l="$l_rps" -v m="$m_rps" 'BEGIN { printf "%.2f", l / m }')
{
    echo "echo tools/call, ${CONNECTIONS} connections, ${DURATION}s x ${ROUNDS} rounds, sessions: ${STORE:-in the process}"
    echo "| client | requests/s | p50 | p99 |"
    echo "| --- | --- | --- | --- |"
    echo "| stateless 2026-07-28 | $m_rps | $m_p50 | $m_p99 |"
    echo "| legacy 2025-11-25, in a session | $l_rps | $l_p50 | $l_p99 |"
    echo "legacy / stateless: $ratio"
} | tee "$OUT/legacy.txt"
