#!/usr/bin/env bash
# The echo benchmark counted in instructions instead of seconds: each side (Wharf, the bare
# axum baseline) runs under valgrind's callgrind while wrk sends bench/echo.lua's `tools/call`,
# once for SHORT and once for LONG seconds; the difference in instructions over the difference
# in calls is the cost of one call, startup and shutdown cancelling out. Unlike req/s, the count
# repeats within about 2 % whatever else the machine is doing, so it shows what a change to the
# request path costs. The ratio printed is baseline / Wharf, comparable to bench/run.sh's
# throughput ratio (on these machines the two have tracked each other closely). A third side,
# `protected`, is the baseline run with `--protected`: the same handler behind the protections
# Wharf pays for on every request (header-read timer and head limits, connection cap,
# header size, Host/Origin, body limit and timeout, depth check, call deadline, schema check);
# Wharf against it is what Wharf's own code costs.
#
# usage: bench/instructions.sh [--no-build]
# environment: SHORT (s, default 2), LONG (s, default 6), PORT (default 18291),
#   WHARF_BIN (default target/release/wharf), BASELINE_BIN, SERVER_CPU (0), CLIENT_CPU (1)
set -euo pipefail
# `count` runs in a command substitution: errors in it must stop it too.
shopt -s inherit_errexit
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=instructions.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
SHORT=${SHORT:-2}
LONG=${LONG:-6}
PORT=${PORT:-18291}
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}

build=1
for arg in "$@"; do
    case "$arg" in
        --no-build) build=0 ;;
        -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (try --help)" ;;
    esac
done
command -v valgrind >/dev/null || die "valgrind is required (Debian: apt-get install valgrind)"
ensure_wrk
if ((build)); then
    (cd "$ROOT" && cargo build --release -p wharf-cli -p wharf-bench-baseline) >&2 || die "cargo build failed"
fi
WHARF_BIN=${WHARF_BIN:-$TARGET/release/wharf}
BASELINE_BIN=${BASELINE_BIN:-$TARGET/release/wharf-bench-baseline}
[[ -x $WHARF_BIN && -x $BASELINE_BIN ]] || die "$WHARF_BIN or $BASELINE_BIN is missing"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

count() { # side seconds -> prints "CALLS INSTRUCTIONS"; run in a subshell of its own
    local side=$1 secs=$2 out="$TMP/$1.$2.cg" calls
    server_pid=""
    # Whatever stops this count stops its server too.
    trap '[[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null' EXIT
    if curl -s --max-time 2 -o /dev/null "http://127.0.0.1:$PORT/"; then
        die "something already answers on 127.0.0.1:$PORT (set PORT)"
    fi
    # One worker on each side: the baseline takes one when pinned to one CPU.
    local cmd=("$BASELINE_BIN" --listen "127.0.0.1:$PORT")
    [[ $side == protected ]] && cmd+=(--protected)
    [[ $side == wharf ]] && cmd=("$WHARF_BIN" serve --profile demo --anonymous --workers 1 --listen "127.0.0.1:$PORT")
    taskset -c "$SERVER_CPU" valgrind --tool=callgrind --callgrind-out-file="$out" "${cmd[@]}" \
        >"$TMP/$side.log" 2>&1 &
    server_pid=$!
    local up=0
    for _ in $(seq 1 300); do
        curl -s --max-time 2 -o /dev/null -X POST "http://127.0.0.1:$PORT/mcp" && { up=1; break; }
        sleep 0.1
    done
    ((up)) || { cat "$TMP/$side.log" >&2; die "$side did not come up on 127.0.0.1:$PORT"; }
    WRK_CHECK_ANSWERS=1 taskset -c "$CLIENT_CPU" wrk -t1 -c4 -d"${secs}s" -s "$ROOT/bench/echo.lua" \
        "http://127.0.0.1:$PORT/mcp" >"$TMP/$side.wrk" \
        || { cat "$TMP/$side.wrk" >&2; die "$side: wrk failed"; }
    if grep -qE "Non-2xx|Socket errors" "$TMP/$side.wrk"; then
        cat "$TMP/$side.wrk" >&2
        die "$side: wrk saw failed requests"
    fi
    calls=$(awk '/requests in/ { print $1 }' "$TMP/$side.wrk")
    kill -TERM "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    [[ -n $calls && -s $out ]] || die "no count for $side"
    echo "$calls $(awk '/^summary:/ { print $2 }' "$out")"
}

declare -A PER
for side in wharf axum protected; do
    short=$(count "$side" "$SHORT")
    long=$(count "$side" "$LONG")
    read -r n1 i1 <<<"$short"
    read -r n2 i2 <<<"$long"
    ((n2 > n1)) || die "$side: the long run served no more calls than the short one"
    PER[$side]=$(((i2 - i1) / (n2 - n1)))
    log "$side: $n1 then $n2 calls: ${PER[$side]} instructions per call"
done
ratio() { awk -v a="$1" -v w="$2" 'BEGIN { printf "%.3f", a / w }'; }
printf 'instructions per echo call: wharf %d, axum %d, protected axum %d; axum/wharf %s, protected/wharf %s\n' \
    "${PER[wharf]}" "${PER[axum]}" "${PER[protected]}" \
    "$(ratio "${PER[axum]}" "${PER[wharf]}")" "$(ratio "${PER[protected]}" "${PER[wharf]}")"
