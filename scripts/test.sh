#!/usr/bin/env bash
# The test command: makes sure PostgreSQL and Redis answer (scripts/services.sh), then runs
# every test of the workspace. Each step stops the script when it fails, so the tests never
# look green without having run. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! bash scripts/services.sh; then
  echo "FATAL: scripts/services.sh failed: PostgreSQL and Redis are required; no test was run" >&2
  exit 1
fi
cargo test --workspace "$@"
