#!/usr/bin/env bash
# What replicas share, against real `wharf serve` processes (bench/replicas/src/main.rs):
#   fanout   three replicas on one store: commit through one, resources/updated heard on a
#            listen stream of another; baseline: the store's bare channel in the same run
#   streams  STREAMS idle listen streams on one replica: resident memory per stream, and
#            tools/list latency while they are open; baseline: a bare axum SSE endpoint
# Results go to stdout and target/bench/replicas.txt. Absolute numbers on these machines are
# noisy: read them beside their baseline.
#
# usage: bench/replicas.sh [fanout|streams|all] [--no-build]
# environment: STORE (default postgres://postgres@127.0.0.1:5432/test; redis://… for Redis),
#   SAMPLES (fan-out samples, default 300), STREAMS (default 10000), SERVER_CPU (default 0),
#   WHARF_BIN, BASELINE_BIN
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SCRIPT=replicas.sh
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
cd "$ROOT"
what=${1:-all}
build=1
for arg in "$@"; do [ "$arg" = --no-build ] && build=0; done
[ "$what" = --no-build ] && what=all
if ((build)); then
    cargo build --release -p wharf-cli -p wharf-bench-baseline -p wharf-bench-replicas
fi
# Each stream is a connection on both sides.
ulimit -n "$(ulimit -Hn)"
out="$ROOT/target/bench/replicas.txt"
mkdir -p "$(dirname "$out")"
: > "$out"
# The binaries of this build, wherever CARGO_TARGET_DIR put them.
export WHARF_BIN=${WHARF_BIN:-$TARGET/release/wharf}
export BASELINE_BIN=${BASELINE_BIN:-$TARGET/release/wharf-bench-baseline}
run() { "$TARGET/release/wharf-bench-replicas" "$1" | tee -a "$out"; }
case "$what" in
    fanout) run fanout ;;
    streams) run streams ;;
    all) run fanout; run streams ;;
    *) echo "replicas.sh: unknown benchmark $what (fanout, streams or all)" >&2; exit 2 ;;
esac
