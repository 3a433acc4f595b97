# Sourced by the conformance scripts: installs the pinned suite and the Node it needs into a
# cache folder (once), and sets NODE and SUITE_JS.
#
#   ensure_suite DIR

SUITE_PACKAGE="@modelcontextprotocol/conformance"
SUITE_VERSION="0.2.0-alpha.12"
NODE_PACKAGE="node@22"
NODE_MAJOR=22

ensure_suite() {
  local dir="$1"
  NODE="$dir/node_modules/.bin/node"
  SUITE_DIR="$dir/node_modules/$SUITE_PACKAGE"
  SUITE_JS="$SUITE_DIR/dist/index.js"
  if suite_installed; then
    echo "conformance: using $SUITE_PACKAGE@$SUITE_VERSION and Node $("$NODE" --version) from $dir"
    return 0
  fi
  command -v npm >/dev/null 2>&1 || {
    echo "conformance: npm is needed to install the suite (apt-get install npm, or any Node >= 18 with npm)" >&2
    exit 1
  }
  echo "conformance: installing $NODE_PACKAGE and $SUITE_PACKAGE@$SUITE_VERSION into $dir"
  mkdir -p "$dir"
  (
    cd "$dir"
    [[ -f package.json ]] || npm init -y >/dev/null
    npm install --no-audit --no-fund "$NODE_PACKAGE" "$SUITE_PACKAGE@$SUITE_VERSION"
  )
  suite_installed || {
    echo "conformance: install finished but $NODE is not a working Node $NODE_MAJOR or the suite is not $SUITE_VERSION" >&2
    exit 1
  }
  echo "conformance: installed; Node $("$NODE" --version)"
}

# True when NODE is a working Node $NODE_MAJOR and the pinned suite is installed beside it.
suite_installed() {
  [[ -x "$NODE" && -f "$SUITE_JS" && -f "$SUITE_DIR/package.json" ]] || return 1
  local node_version suite_version
  node_version="$("$NODE" --version 2>/dev/null)" || return 1
  [[ "$node_version" == "v$NODE_MAJOR."* ]] || return 1
  suite_version="$("$NODE" -p 'require(process.argv[1]).version' "$SUITE_DIR/package.json" 2>/dev/null)" || return 1
  [[ "$suite_version" == "$SUITE_VERSION" ]]
}
