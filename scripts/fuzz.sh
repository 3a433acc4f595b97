#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ with cargo-afl (AFL++, stable Rust) for a fixed budget, and
# fails if any input made one crash. Crashing inputs are left in target/fuzz/out/<target>/
# default/crashes/ (reproduce: target/fuzz/release/<target> < that-file).
#
# usage: scripts/fuzz.sh [SECONDS per target, default 20] [TARGET…]
# environment: FUZZ_KEEP=1 merges what the run found into fuzz/corpus/<target>/ (minimized
#   with afl-cmin), to commit when it grew meaningfully.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_EACH=${1:-20}
shift || true
TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then
    TARGETS=(envelope headers cursor request_state uri_template)
fi
export CARGO_TARGET_DIR="$ROOT/target/fuzz"
OUT="$CARGO_TARGET_DIR/out"

log() { printf 'fuzz: %s\n' "$*" >&2; }

if ! command -v cargo-afl >/dev/null; then
    log "installing cargo-afl from crates.io"
    cargo install cargo-afl --locked --version 0.18.2
fi
# AFL++ for this toolchain, built once (cargo-afl refuses to build it again, and says so).
if ! out=$(cargo afl config --build 2>&1) && ! grep -q "already built" <<<"$out"; then
    echo "$out" >&2
    log "FATAL: AFL++ could not be built for this toolchain"
    exit 1
fi

cd "$ROOT/fuzz"
cargo afl build --release --locked
mkdir -p "$OUT"
failed=0
for t in "${TARGETS[@]}"; do
    rm -rf "${OUT:?}/$t"
    log "$t: ${SECONDS_EACH}s"
    # No UI, no CPU-governor or core_pattern checks (a CI machine's settings are not ours);
    # -V ends the run after the budget.
    # (AFL_NO_AFFINITY: a container's CPUs may not be the host's.)
    AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
        AFL_NO_AFFINITY=1 AFL_SHUFFLE_QUEUE=1 \
        cargo afl fuzz -i "corpus/$t" -o "$OUT/$t" -V "$SECONDS_EACH" \
        "$CARGO_TARGET_DIR/release/$t" >"$OUT/$t.log" 2>&1 \
        || { log "$t: afl-fuzz failed (see $OUT/$t.log)"; tail -20 "$OUT/$t.log" >&2; failed=1; continue; }
    stats="$OUT/$t/default/fuzzer_stats"
    execs=$(awk -F' *: *' '$1 == "execs_done" { print $2 }' "$stats")
    crashes=$(awk -F' *: *' '$1 == "saved_crashes" { print $2 }' "$stats")
    hangs=$(awk -F' *: *' '$1 == "saved_hangs" { print $2 }' "$stats")
    log "$t: $execs executions, $crashes crashes, $hangs hangs"
    if [[ "$crashes" != 0 || "$hangs" != 0 ]]; then
        log "$t: inputs in $OUT/$t/default/crashes/ and hangs/"
        failed=1
    fi
    if [[ "${FUZZ_KEEP:-0}" == 1 ]]; then
        # The shell afl-cmin (cargo-afl's default, the Python one, finds no coverage in these
        # targets' traces and keeps nothing).
        cmin=$(find "$HOME/.local/share/afl.rs" -name afl-cmin.bash -path "*$(cargo afl --version | awk '{print $2}')*" | head -1)
        rm -rf "$OUT/$t.min"
        AFL_PATH=$(dirname "$cmin") PATH="$(dirname "$cmin"):$PATH" \
            "$cmin" -i "$OUT/$t/default/queue" -o "$OUT/$t.min" -- "$CARGO_TARGET_DIR/release/$t" >/dev/null 2>&1
        # Named by content: AFL's names hold ':', which some file systems refuse.
        rm -f "corpus/$t"/*
        for f in "$OUT/$t.min"/*; do
            cp "$f" "corpus/$t/$(sha1sum "$f" | cut -c1-16)"
        done
        log "$t: corpus now holds $(ls "corpus/$t" | wc -l) inputs"
    fi
done
exit "$failed"
