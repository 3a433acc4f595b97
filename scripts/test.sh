#!/usr/bin/env bash
# The test command: makes sure PostgreSQL and Redis answer (scripts/services.sh), that the
# Python SDKs the tests talk to (1.x for the legacy tests, 2.x for OAuth and `wharf check`),
# Chromium, chromedriver and tesseract (the consent-page and login tests), tmux and GNOME
# Keyring (the interactive and keyring tests of the command) are installed, then runs every test of the workspace. Each step
# stops the script when it fails, so the tests never look green without having run. Extra
# arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! bash scripts/services.sh; then
  echo "FATAL: scripts/services.sh failed: PostgreSQL and Redis are required; no test was run" >&2
  exit 1
fi
# A real legacy-only peer for the tests of the client's fallback: the Python SDK's last 1.x
# release (crates/wharf-cli/tests/e2e/legacy.rs runs its FastMCP server).
legacy_venv=target/pyvenv-legacy
if [ ! -x "$legacy_venv/bin/python" ]; then
  python3 -m venv "$legacy_venv"
fi
"$legacy_venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements-legacy.txt \
  || { echo "FATAL: could not install tests/python/requirements-legacy.txt into $legacy_venv" >&2; exit 1; }
# The Python SDK 2.x, whose OAuth client crates/wharf-cli/tests/e2e/sdk_oauth.rs drives.
sdk_venv=target/pyvenv
if [ ! -x "$sdk_venv/bin/python" ]; then
  python3 -m venv "$sdk_venv"
fi
"$sdk_venv/bin/pip" install --quiet --disable-pip-version-check -r tests/python/requirements.txt \
  || { echo "FATAL: could not install tests/python/requirements.txt into $sdk_venv" >&2; exit 1; }
# An upstream OpenID provider for the authorization server's delegated sign-in
# (crates/wharf-cli/tests/e2e/sdk_oauth.rs): the oidc-provider package from npm, run by Node.
command -v node >/dev/null || { echo "FATAL: node is required (the upstream OpenID provider of the tests)" >&2; exit 1; }
oidc_dir=target/node-oidc
if [ ! -f "$oidc_dir/node_modules/oidc-provider/package.json" ]; then
  mkdir -p "$oidc_dir"
  (cd "$oidc_dir" && { [ -f package.json ] || npm init -y >/dev/null; } \
    && npm install --no-audit --no-fund --silent oidc-provider@9.13.3) \
    || { echo "FATAL: could not install oidc-provider into $oidc_dir" >&2; exit 1; }
fi
# A real browser for the consent pages and `wharf login` (headless Chromium through
# chromedriver), OCR for its screenshots, tmux, GNOME Keyring and Prometheus, from Debian's
# packages.
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
[ -x /usr/bin/tesseract ] || missing+=(tesseract-ocr)
# A terminal for the interactive runs of `wharf call`, and a desktop's D-Bus session with
# GNOME Keyring for `wharf login`'s keyring (crates/wharf-cli/tests/e2e/command.rs).
[ -x /usr/bin/tmux ] || missing+=(tmux)
[ -x /usr/bin/dbus-daemon ] || missing+=(dbus-daemon)
[ -x /usr/bin/dbus-send ] || missing+=(dbus-bin)
[ -x /usr/bin/gnome-keyring-daemon ] || missing+=(gnome-keyring)
# A real Prometheus scrapes `wharf serve --metrics-listen` (crates/wharf-cli/tests/e2e/observability.rs).
[ -x /usr/bin/prometheus ] || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  echo "the browser and terminal tests need ${missing[*]}" >&2
  # shellcheck source=scripts/apt.sh
  source scripts/apt.sh
  apt_install "${missing[@]}"
fi
cargo test --workspace "$@"
