#!/usr/bin/env bash
# State benchmark: idempotent `import_append_rows` through Wharf on SQLite and on
# PostgreSQL, against a bare axum handler making the same inserts (the rows and an
# idempotency record) by hand with the same driver (bench/store-baseline), in the same run.
#
# Server pinned to CPU 0, wrk to CPU 1 (`-t$CONNECTIONS -c$CONNECTIONS`, bench/append.lua;
# PostgreSQL itself runs wherever the OS puts it, for both sides alike). Each connection
# appends to its own import, each request with a fresh idempotency key and ROWS rows. After
# each Wharf run the staged row counts are checked against the requests wrk saw answered.
# Results to stdout and target/bench/store.txt.
#
# usage: bench/store.sh [--quick] [--no-build]
# environment: DURATION (s, default 10), ROUNDS (default 2), WARMUP (s, default 2),
#   CONNECTIONS (default 8), ROWS (default 50), BACKENDS (default "sqlite postgres"),
#   PG_ADMIN_URL (default
#   postgres://postgres@127.0.0.1:5432/postgres; each run gets a fresh database wharf_bench
#   there, so neither side inherits the other's rows), PORT (default 18093), WHARF_BIN and
#   BASELINE_BIN (the binaries to compare, default the release builds; with --no-build, to
#   measure one build against another)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=store.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
OUT="$TARGET/bench"
RAW="$OUT/raw-store"
LUA="$ROOT/bench/append.lua"

quick=0 build=1
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --no-build) build=0 ;;
        -h | --help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (try --help)" ;;
    esac
done
((quick)) && { DURATION=3; ROUNDS=1; WARMUP=1; }
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-2}
CONNECTIONS=${CONNECTIONS:-8}
ROWS=${ROWS:-50}
BACKENDS=${BACKENDS:-sqlite postgres}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PG_URL="${PG_ADMIN_URL%/*}/wharf_bench"
PORT=${PORT:-18093}
TOKEN=bench-token-aaaaaaaaaaaaaaaa

for tool in taskset curl awk; do
    command -v "$tool" >/dev/null || die "'$tool' is required"
done
ensure_wrk
(($(nproc) >= 2)) || die "this benchmark needs 2 CPUs"
bash "$ROOT/scripts/services.sh"

if ((build)); then
    log "building wharf-cli and wharf-bench-store-baseline (release)"
    (cd "$ROOT" && cargo build --release -p wharf-cli -p wharf-bench-store-baseline) >&2 || die "cargo build failed"
fi
WHARF_BIN=${WHARF_BIN:-$TARGET/release/wharf}
BASELINE_BIN=${BASELINE_BIN:-$TARGET/release/wharf-bench-store-baseline}
[[ -x $WHARF_BIN && -x $BASELINE_BIN ]] || die "release binaries missing; run without --no-build"
rm -rf "$RAW"
mkdir -p "$RAW"

server_pid=""
cleanup() { [[ -z $server_pid ]] || { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; } || true; }
trap cleanup EXIT

rpc() { # method name params-json -> body
    curl -s --max-time 10 -X POST "http://127.0.0.1:$PORT/mcp" \
        -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \
        -H 'MCP-Protocol-Version: 2026-07-28' -H "Mcp-Method: $1" -H "Mcp-Name: $2" \
        -H "Authorization: Bearer $TOKEN" \
        --data-binary "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"$1\",\"params\":{\"_meta\":{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/clientCapabilities\":{}},\"name\":\"$2\",\"arguments\":$3}}"
}

wait_up() {
    for _ in $(seq 1 100); do
        curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$PORT/" && return 0
        kill -0 "$server_pid" 2>/dev/null || die "the server exited at startup (see $RAW)"
        sleep 0.1
    done
    die "the server did not start"
}

stop() {
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

declare -A RPS P50 P99

run_one() { # backend side round
    local backend=$1 side=$2 round=$3 db imports="" tag="$1-$2-$3"
    if [[ $backend == sqlite ]]; then
        db="sqlite://$RAW/$tag.db"
    else
        db=$PG_URL
        psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS wharf_bench" -c "CREATE DATABASE wharf_bench" >/dev/null \
            || die "cannot create the benchmark database at $PG_ADMIN_URL"
    fi
    if [[ $side == wharf ]]; then
        taskset -c 0 "$WHARF_BIN" serve --listen "127.0.0.1:$PORT" --store "$db" \
            --api-key "bench=$TOKEN" >"$RAW/$tag.log" 2>&1 &
    else
        [[ $backend == sqlite ]] && db="$db?mode=rwc"
        taskset -c 0 "$BASELINE_BIN" --listen "127.0.0.1:$PORT" --db "$db" >"$RAW/$tag.log" 2>&1 &
    fi
    server_pid=$!
    wait_up
    local i import begun
    for i in $(seq 1 "$CONNECTIONS"); do
        if [[ $side == wharf ]]; then
            begun=$(rpc tools/call import_begin "{\"dataset\":\"bench\",\"columns\":[{\"name\":\"id\",\"type\":\"integer\"},{\"name\":\"city\",\"type\":\"string\"},{\"name\":\"temp\",\"type\":\"number\"}],\"idempotency_key\":\"begin-$$-$i\"}")
            import=$(grep -o '"import":"imp_[0-9a-f]*"' <<<"$begun" | head -1 | cut -d'"' -f4)
            [[ -n $import ]] || die "import_begin failed: $begun"
        else
            import="imp_baseline_$i"
        fi
        imports+="${imports:+,}$import"
    done
    local env=(IMPORTS="$imports" TOKEN="$TOKEN" ROWS="$ROWS")
    env "${env[@]}" RUN="warm-$tag" taskset -c 1 wrk -t"$CONNECTIONS" -c"$CONNECTIONS" -d"${WARMUP}s" -s "$LUA" \
        "http://127.0.0.1:$PORT/mcp" >"$RAW/$tag.warmup.txt" 2>&1 || die "wrk warm-up failed ($RAW/$tag.warmup.txt)"
    env "${env[@]}" RUN="run-$tag" taskset -c 1 wrk -t"$CONNECTIONS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$LUA" \
        "http://127.0.0.1:$PORT/mcp" >"$RAW/$tag.wrk.txt" 2>&1 || { cat "$RAW/$tag.wrk.txt" >&2; die "wrk failed against $side on $backend"; }
    if [[ $side == wharf ]]; then
        # Every answered append must be in its import, once.
        local answered staged=0 status
        answered=$(( $(awk '/requests in/ { print $1 }' "$RAW/$tag.warmup.txt") + $(awk '/requests in/ { print $1 }' "$RAW/$tag.wrk.txt") ))
        for import in ${imports//,/ }; do
            status=$(rpc tools/call import_status "{\"import\":\"$import\"}")
            staged=$(( staged + $(grep -o '"stagedRows":[0-9]*' <<<"$status" | head -1 | cut -d: -f2) ))
            rpc tools/call import_abort "{\"import\":\"$import\"}" >/dev/null
        done
        (( staged >= answered * ROWS && staged <= (answered + 2 * CONNECTIONS) * ROWS )) \
            || die "staged rows $staged do not match $answered answered appends of $ROWS rows"
    fi
    stop
    [[ $backend == sqlite ]] && rm -f "$RAW/$tag.db"*
    RPS[$tag]=$(awk '/^Requests\/sec:/ { print $2 }' "$RAW/$tag.wrk.txt")
    P50[$tag]=$(to_us "$(awk '$1 == "50%" { print $2 }' "$RAW/$tag.wrk.txt")")
    P99[$tag]=$(to_us "$(awk '$1 == "99%" { print $2 }' "$RAW/$tag.wrk.txt")")
    log "$backend $side round $round: ${RPS[$tag]} req/s"
}

report=$(mktemp)
{
    echo "Idempotent import_append_rows, $ROWS rows per call, $CONNECTIONS connections, ${DURATION}s x $ROUNDS rounds (best round)"
    echo
    echo "| store | side | calls/s | rows/s | p50 ms | p99 ms |"
    echo "| --- | --- | ---: | ---: | ---: | ---: |"
} >"$report"
ratios=()
for backend in $BACKENDS; do
    [[ $backend == sqlite || $backend == postgres ]] || die "unknown backend in BACKENDS: $backend"
    for round in $(seq 1 "$ROUNDS"); do
        run_one "$backend" wharf "$round"
        run_one "$backend" baseline "$round"
    done
    for side in wharf baseline; do
        best=""
        for round in $(seq 1 "$ROUNDS"); do
            t="$backend-$side-$round"
            if [[ -z $best ]] || awk -v a="${RPS[$t]}" -v b="${RPS[$best]}" 'BEGIN { exit !(a > b) }'; then best=$t; fi
        done
        eval "best_$side=$best"
        awk -v s="$backend" -v side="$side" -v r="${RPS[$best]}" -v n="$ROWS" -v p50="${P50[$best]}" -v p99="${P99[$best]}" \
            'BEGIN { printf "| %s | %s | %.0f | %.0f | %.2f | %.2f |\n", s, side, r, r * n, p50 / 1000, p99 / 1000 }' >>"$report"
    done
    ratios+=("$backend $(awk -v a="${RPS[$best_wharf]}" -v b="${RPS[$best_baseline]}" 'BEGIN { printf "%.3f", a / b }')")
done
{
    echo
    for r in "${ratios[@]}"; do echo "ratio Wharf / baseline on ${r% *}: **${r#* }** (target >= 0.70)"; done
} >>"$report"
cp "$report" "$OUT/store.txt"
cat "$report"
