#!/usr/bin/env bash
# Fails when crates/wharf-cli/link/hot-symbols.txt is stale: when the release binary no longer
# defines most of the functions the list names (they were renamed or moved, or a toolchain or
# dependency upgrade changed their mangled names), the link cannot group the hot code, and the
# echo benchmark's peak RSS grows by about 4 MiB (BENCHMARKS.md). Regenerate the list with
# `bash scripts/order-symbols.sh` and commit it.
#
# What this cannot see: a new function on the hot path that the list lacks (only a profile
# finds those); regenerate the list after changing the request path.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIST="$ROOT/crates/wharf-cli/link/hot-symbols.txt"
MIN_PERCENT=${MIN_PERCENT:-95}
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac

cd "$ROOT"
cargo build --release -p wharf-cli >&2
BIN="$TARGET/release/wharf"
total=$(sort -u "$LIST" | wc -l)
found=$(nm --defined-only "$BIN" | awk '{ print $3 }' | sort -u | comm -12 - <(sort -u "$LIST") | wc -l)
percent=$((found * 100 / total))
if [ "$percent" -lt "$MIN_PERCENT" ]; then
    echo "check-symbols: the release binary defines $found of the $total functions in $LIST ($percent %, at least $MIN_PERCENT % needed): the list is stale; run bash scripts/order-symbols.sh and commit it" >&2
    exit 1
fi
echo "check-symbols: $found of $total listed functions defined ($percent %)" >&2
