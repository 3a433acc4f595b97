#!/usr/bin/env bash
# Hot-path benchmark: one `tools/call` of `echo` per request, Wharf against a bare axum handler
# (bench/baseline, the physical limit), in the same run on the same machine.
#
# The server runs pinned to CPU 0 and wrk to CPU 1 (`-t1 -c32 --latency`, bench/echo.lua).
# Each side is run ROUNDS times, alternating (wharf, axum, wharf, axum); the best throughput of
# each side is reported with that run's p50/p99, and the highest RSS seen over its runs. The
# table goes to stdout and to target/bench/echo.txt; raw wrk and server output to
# target/bench/raw/. Absolute numbers on these machines are noisy: read the ratio.
#
# usage: bench/run.sh [--quick] [--baseline-only] [--no-build]
#   --quick          DURATION=3, one round (smoke test)
#   --baseline-only  measure only the axum baseline (no wharf-cli build or run)
#   --no-build       use the binaries already in target/release
# environment: DURATION (s, default 10), ROUNDS (default 2), WARMUP (s, default 3),
#   CONNECTIONS (default 32), WHARF_PORT (default 18091), BASELINE_PORT (default 18090),
#   SERVER_CPU (default 0), CLIENT_CPU (default 1), WHARF_BIN (default target/release/wharf),
#   AUTH (unset: anonymous; `es256`: every request carries an ES256 JWT that Wharf verifies as
#   an OAuth resource server against bench/issuer's JWKS; the baseline gets the same header
#   and ignores it), ISSUER_PORT (default 18095), OBSERVE (set: instead of axum, the same
#   Wharf build three ways: `wharf` as is, `metrics` counting for --metrics-listen, `traced`
#   counting and exporting every request's spans over OTLP/HTTP to a sink on OTLP_PORT,
#   default 18096; the report gives each one's throughput over the plain run's), PROTECTED
#   (set: the baseline runs with --protected, behind the protections Wharf pays for on every
#   request; see bench/baseline/src/protected.rs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LUA="$ROOT/bench/echo.lua"
SCRIPT=run.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
OUT="$TARGET/bench"
RAW="$OUT/raw"

quick=0 baseline_only=0 build=1
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        --baseline-only) baseline_only=1 ;;
        --no-build) build=0 ;;
        -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done
if ((quick)); then
    DURATION=3
    ROUNDS=1
fi
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-3}
CONNECTIONS=${CONNECTIONS:-32}
WHARF_PORT=${WHARF_PORT:-18091}
BASELINE_PORT=${BASELINE_PORT:-18090}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}

# The same request as bench/echo.lua (keep the two in sync): used to wait for a server and to
# compare the two responses.
BODY='{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"4.1.0"}},"name":"echo","arguments":{"text":"hello from wrk"}}}'

# ---------------------------------------------------------------------------------------------
# Tools
for tool in taskset curl awk; do
    command -v "$tool" >/dev/null || die "'$tool' is required (Debian: apt-get install util-linux curl gawk)"
done
ensure_wrk

cpus=$(nproc)
((cpus >= 2)) || die "this benchmark needs 2 CPUs (server on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU); nproc says $cpus"

# ---------------------------------------------------------------------------------------------
# Build
AUTH=${AUTH:-}
ISSUER_PORT=${ISSUER_PORT:-18095}
[[ -z $AUTH || $AUTH == es256 ]] || die "AUTH must be unset or es256"
[[ -n ${OBSERVE:-} && -n ${PROTECTED:-} ]] && die "PROTECTED and OBSERVE do not go together: OBSERVE runs no axum side"
packages=(-p wharf-bench-baseline)
((baseline_only)) || packages=(-p wharf-cli "${packages[@]}")
[[ $AUTH == es256 ]] && packages+=(-p wharf-bench-issuer)
if ((build)); then
    log "building ${packages[*]} (release)"
    (cd "$ROOT" && cargo build --release "${packages[@]}") >&2 || die "cargo build failed"
fi
BASELINE_BIN="$TARGET/release/wharf-bench-baseline"
WHARF_BIN="${WHARF_BIN:-$TARGET/release/wharf}"
[[ -x $BASELINE_BIN ]] || die "$BASELINE_BIN is missing"
((baseline_only)) || [[ -x $WHARF_BIN ]] || die "$WHARF_BIN is missing"

mkdir -p "$RAW"

# ---------------------------------------------------------------------------------------------
# The authorization server, for AUTH=es256: it prints the token every request carries.
issuer_pid=""
export WHARF_TOKEN=""
if [[ $AUTH == es256 ]]; then
    "$TARGET/release/wharf-bench-issuer" --listen "127.0.0.1:$ISSUER_PORT" \
        --audience "http://127.0.0.1:$WHARF_PORT/mcp" >"$RAW/issuer.out" 2>&1 &
    issuer_pid=$!
    for _ in $(seq 1 100); do
        WHARF_TOKEN=$(head -n1 "$RAW/issuer.out" 2>/dev/null || true)
        [[ -n $WHARF_TOKEN ]] && break
        sleep 0.05
    done
    [[ -n $WHARF_TOKEN ]] || die "the issuer did not print a token (see $RAW/issuer.out)"
    log "AUTH=es256: every request carries an ES256 JWT (${#WHARF_TOKEN} bytes)"
fi

# ---------------------------------------------------------------------------------------------
# One measurement

server_pid=""
poll_pid=""
cleanup() {
    if [[ -n $poll_pid ]]; then kill "$poll_pid" 2>/dev/null || true; fi
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [[ -n $issuer_pid ]]; then kill "$issuer_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_of() { [[ $1 == axum ]] && echo "$BASELINE_PORT" || echo "$WHARF_PORT"; }

# What OBSERVE=1 adds to `wharf serve`: metrics on a second port, and for `traced` an OTLP
# exporter whose collector is a sink that answers 200 to everything.
OTLP_PORT=${OTLP_PORT:-18096}
observe_args() { # side
    case $1 in
        metrics | traced) echo "--metrics-listen 127.0.0.1:$((WHARF_PORT + 1))" ;;
    esac
}

start_server() { # side port logfile
    local side=$1 port=$2 logfile=$3
    if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$port/" 2>/dev/null; then
        die "something already answers on 127.0.0.1:$port; choose another port (WHARF_PORT, BASELINE_PORT)"
    fi
    # taskset execs the server, so $! is the server's own pid.
    if [[ $side == wharf && $AUTH == es256 ]]; then
        taskset -c "$SERVER_CPU" "$WHARF_BIN" serve --profile demo --listen "127.0.0.1:$port" \
            --oauth-issuer "http://127.0.0.1:$ISSUER_PORT" --oauth-resource "http://127.0.0.1:$port/mcp" \
            >"$logfile" 2>&1 &
    elif [[ $side == traced ]]; then
        # shellcheck disable=SC2046
        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT" \
            taskset -c "$SERVER_CPU" "$WHARF_BIN" serve --profile demo --anonymous --listen "127.0.0.1:$port" \
            $(observe_args "$side") >"$logfile" 2>&1 &
    elif [[ $side != axum ]]; then
        # shellcheck disable=SC2046
        taskset -c "$SERVER_CPU" "$WHARF_BIN" serve --profile demo --anonymous --listen "127.0.0.1:$port" \
            $(observe_args "$side") >"$logfile" 2>&1 &
    else
        taskset -c "$SERVER_CPU" "$BASELINE_BIN" --listen "127.0.0.1:$port" ${PROTECTED:+--protected} \
            >"$logfile" 2>&1 &
    fi
    server_pid=$!
}

probe() { # port -> prints "STATUS BODY"
    curl -s --max-time 2 -w '\n%{http_code}' -X POST "http://127.0.0.1:$1/mcp" \
        -H 'Content-Type: application/json' \
        -H 'Accept: application/json, text/event-stream' \
        -H 'MCP-Protocol-Version: 2026-07-28' \
        -H 'Mcp-Method: tools/call' \
        -H 'Mcp-Name: echo' \
        ${WHARF_TOKEN:+-H "Authorization: Bearer $WHARF_TOKEN"} \
        --data-binary "$BODY" 2>/dev/null || true
}

wait_ready() { # side port logfile responsefile
    local side=$1 port=$2 logfile=$3 respfile=$4 out status
    for _ in $(seq 1 100); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            cat "$logfile" >&2
            die "the $side server exited before answering (log: $logfile)"
        fi
        out=$(probe "$port")
        status=${out##*$'\n'}
        if [[ $status == 200 ]]; then
            out=${out%$'\n'*}
            # Wharf answers some JSON-RPC errors with 200: a benchmark of the error path is no use.
            [[ $out == '{"jsonrpc":"2.0","id":1,"result":{'* ]] \
                || die "the $side server answered the echo call with something other than a result: $out"
            printf '%s' "$out" >"$respfile"
            return 0
        elif [[ -n $status && $status != 000 ]]; then
            die "the $side server answered the echo call with HTTP $status: ${out%$'\n'*}"
        fi
        sleep 0.1
    done
    cat "$logfile" >&2
    die "the $side server did not answer a tools/call with 200 within 10 s (last status: ${status:-none}; log: $logfile)"
}

# Polls VmRSS every 200 ms and keeps the maximum (kB) in $2 until $3 exists.
poll_rss() {
    local pid=$1 out=$2 stop=$3 max=0 key value _
    taskset -p -c "$CLIENT_CPU" "$BASHPID" >/dev/null 2>&1 || true
    while [[ ! -e $stop ]]; do
        while read -r key value _; do
            if [[ $key == VmRSS: ]]; then
                ((value > max)) && max=$value
                break
            fi
        done 2>/dev/null <"/proc/$pid/status" || break
        echo "$max" >"$out"
        sleep 0.2
    done
}

status_kb() { # pid field
    awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0
}

stop_server() {
    local pid=$server_pid
    server_pid=""
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}


# Results, indexed by "side:round".
declare -A RPS P50 P99 RSS

run_one() { # side round
    local side=$1 round=$2 port logfile wrkout respfile rssfile stopfile hwm polled
    port=$(port_of "$side")
    logfile="$RAW/$side-$round.server.log"
    wrkout="$RAW/$side-$round.wrk.txt"
    respfile="$RAW/$side.response.json"
    rssfile="$RAW/$side-$round.rss"
    stopfile="$RAW/$side-$round.stop"
    rm -f "$rssfile" "$stopfile"

    log "round $round: $side on 127.0.0.1:$port (CPU $SERVER_CPU)"
    start_server "$side" "$port" "$logfile"
    wait_ready "$side" "$port" "$logfile" "$respfile"

    taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"${WARMUP}s" -s "$LUA" "http://127.0.0.1:$port/mcp" \
        >"$RAW/$side-$round.warmup.txt" 2>&1 || die "wrk warm-up failed against $side (see $RAW/$side-$round.warmup.txt)"

    poll_rss "$server_pid" "$rssfile" "$stopfile" &
    poll_pid=$!
    if ! taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$LUA" \
        "http://127.0.0.1:$port/mcp" >"$wrkout" 2>&1; then
        cat "$wrkout" >&2
        die "wrk failed against $side"
    fi
    touch "$stopfile"
    wait "$poll_pid" 2>/dev/null || true
    poll_pid=""

    kill -0 "$server_pid" 2>/dev/null || { cat "$logfile" >&2; die "the $side server died during the run"; }
    hwm=$(status_kb "$server_pid" VmHWM)
    polled=$(cat "$rssfile" 2>/dev/null || echo 0)
    stop_server
    rm -f "$stopfile"

    if grep -q 'Non-2xx or 3xx responses' "$wrkout"; then
        cat "$wrkout" >&2
        die "wrk saw non-2xx responses from $side (see $wrkout and $logfile)"
    fi
    if grep -q 'Socket errors' "$wrkout"; then
        log "warning: $side: $(grep 'Socket errors' "$wrkout" | sed 's/^ *//')"
    fi

    local rps p50 p99
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$wrkout")
    p50=$(awk '$1 == "50%" { print $2 }' "$wrkout")
    p99=$(awk '$1 == "99%" { print $2 }' "$wrkout")
    [[ -n $rps && -n $p50 && -n $p99 ]] || { cat "$wrkout" >&2; die "could not read wrk's output for $side"; }
    RPS[$side:$round]=$rps
    P50[$side:$round]=$(to_us "$p50")
    P99[$side:$round]=$(to_us "$p99")
    RSS[$side:$round]=$(( hwm > polled ? hwm : polled ))
    log "  $side: $rps req/s, p50 $p50, p99 $p99, VmHWM $hwm kB, max polled VmRSS $polled kB"
}

sides=(wharf axum)
((baseline_only)) && sides=(axum)
sink_pid=""
if [[ -n ${OBSERVE:-} ]]; then
    sides=(wharf metrics traced)
    # The collector the traced side exports to: accepts every batch, keeps nothing.
    taskset -c "$CLIENT_CPU" python3 -c '
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
' "$OTLP_PORT" &
    sink_pid=$!
    trap 'kill $sink_pid 2>/dev/null || true; cleanup' EXIT
fi

for round in $(seq 1 "$ROUNDS"); do
    for side in "${sides[@]}"; do
        run_one "$side" "$round"
    done
done

# ---------------------------------------------------------------------------------------------
# The two responses must have the same shape: Wharf's is the baseline's with `_meta` (its
# serverInfo) added as the last member of `result`.
shape="not compared (--baseline-only or OBSERVE)"
if ((!baseline_only)) && [[ -z ${OBSERVE:-} ]]; then
    base=$(cat "$RAW/axum.response.json")
    wharf=$(cat "$RAW/wharf.response.json")
    prefix=${base%'}}'}
    if [[ $wharf == "$prefix"',"_meta":{"io.modelcontextprotocol/serverInfo":{'*'}}}' ]]; then
        shape="identical apart from Wharf's result._meta.serverInfo"
    else
        shape="DIFFERENT (see $RAW/*.response.json)"
        log "warning: the responses differ in shape:"
        log "  axum:  $base"
        log "  wharf: $wharf"
    fi
fi

# ---------------------------------------------------------------------------------------------
# Report
best_round() { # side -> round with the highest req/s
    local side=$1 best="" r
    for r in $(seq 1 "$ROUNDS"); do
        if [[ -z $best ]] || awk -v a="${RPS[$side:$r]}" -v b="${RPS[$side:$best]}" 'BEGIN { exit !(a > b) }'; then
            best=$r
        fi
    done
    echo "$best"
}
max_rss() {
    local side=$1 max=0 r kb
    for r in $(seq 1 "$ROUNDS"); do
        kb=${RSS[$side:$r]}
        if ((kb > max)); then max=$kb; fi
    done
    echo "$max"
}

declare -A BEST
report() {
    local side b
    echo "MCP tools/call echo, POST /mcp${AUTH:+, with an $AUTH JWT}${PROTECTED:+, axum --protected}: server on CPU $SERVER_CPU, wrk -t1 -c$CONNECTIONS -d${DURATION}s on CPU $CLIENT_CPU"
    echo "best of $ROUNDS round(s) alternating; ${WARMUP}s warm-up each; $(date -u +%Y-%m-%dT%H:%MZ); $(uname -sr); $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
    echo
    printf '%-7s %12s %10s %10s %14s\n' side 'requests/s' 'p50 ms' 'p99 ms' 'peak RSS MiB'
    for side in "${sides[@]}"; do
        b=$(best_round "$side")
        BEST[$side]=${RPS[$side:$b]}
        awk -v s="$side" -v r="${RPS[$side:$b]}" -v p50="${P50[$side:$b]}" -v p99="${P99[$side:$b]}" -v kb="$(max_rss "$side")" \
            'BEGIN { printf "%-7s %12.0f %10.3f %10.3f %14.1f\n", s, r, p50 / 1000, p99 / 1000, kb / 1024 }'
    done
    echo
    if [[ -n ${OBSERVE:-} ]]; then
        awk -v w="${BEST[wharf]}" -v m="${BEST[metrics]}" -v t="${BEST[traced]}" \
            'BEGIN { printf "throughput metrics/off: %.3f\nthroughput traced/off: %.3f\n", m / w, t / w }'
    elif ((!baseline_only)); then
        awk -v w="${BEST[wharf]}" -v a="${BEST[axum]}" 'BEGIN { printf "throughput wharf/axum: %.3f\n", w / a }'
    fi
    echo "all rounds (req/s):$(for side in "${sides[@]}"; do for r in $(seq 1 "$ROUNDS"); do printf ' %s#%s=%.0f' "$side" "$r" "${RPS[$side:$r]}"; done; done)"
    echo "response shape: $shape"
    for side in "${sides[@]}"; do
        local lo="" hi="" r
        for r in $(seq 1 "$ROUNDS"); do
            lo=$(awk -v a="${RPS[$side:$r]}" -v b="${lo:-${RPS[$side:$r]}}" 'BEGIN { print (a < b ? a : b) }')
            hi=$(awk -v a="${RPS[$side:$r]}" -v b="${hi:-0}" 'BEGIN { print (a > b ? a : b) }')
        done
        awk -v s="$side" -v lo="$lo" -v hi="$hi" \
            'BEGIN { if (lo > 0 && hi / lo > 1.15) printf "warning: %s rounds differ by %.0f%%: something else was using the CPUs; run again\n", s, (hi / lo - 1) * 100 }'
    done
}
name="echo${AUTH:+-$AUTH}${OBSERVE:+-observe}${PROTECTED:+-protected}"
report | tee "$OUT/$name.txt"
log "wrote $OUT/$name.txt (raw output in $RAW)"
