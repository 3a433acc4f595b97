#!/usr/bin/env bash
# The test command: makes sure PostgreSQL and Redis answer (scripts/services.sh) and the
# Python SDK 1.x the legacy tests talk to is installed, then runs every test of the
# workspace. Each step stops the script when it fails, so the tests never look green without
# having run. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! bash scripts/services.sh; then
  echo "FATAL: scripts/services.sh failed: PostgreSQL and Redis are required; no test was run" >&2
  exit 1
fi
# A real legacy-only peer for the tests of the client's fallback: the Python SDK's last 1.x
# release (crates/wharf-cli/tests/legacy.rs runs its FastMCP server).
legacy_venv=target/pyvenv-legacy
if [ ! -x "$legacy_venv/bin/python" ]; then
  python3 -m venv "$legacy_venv"
fi
"$legacy_venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements-legacy.txt \
  || { echo "FATAL: could not install tests/python/requirements-legacy.txt into $legacy_venv" >&2; exit 1; }
cargo test --workspace "$@"
