# Shared by the benchmark scripts: messages, wrk, reading wrk's output, and where the builds are.
# The including script sets ROOT (the repository) and SCRIPT (its name, for messages).

# Where cargo puts its builds, as an absolute path.
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
case "$TARGET" in /*) ;; *) TARGET="$ROOT/$TARGET" ;; esac

die() { echo "${SCRIPT:-bench}: error: $*" >&2; exit 1; }
log() { echo "${SCRIPT:-bench}: $*" >&2; }

# Installs wrk from Debian's packages when it is missing.
ensure_wrk() {
    if ! command -v wrk >/dev/null; then
        log "wrk not found; installing it with apt-get"
        sudo=()
        if [[ $(id -u) != 0 ]]; then
            command -v sudo >/dev/null && sudo -n true 2>/dev/null && sudo=(sudo -n)
        fi
        if [[ $(id -u) == 0 || ${#sudo[@]} -gt 0 ]]; then
            export DEBIAN_FRONTEND=noninteractive
            "${sudo[@]}" apt-get install -y -q wrk >&2 \
                || { "${sudo[@]}" apt-get update -q >&2 && "${sudo[@]}" apt-get install -y -q wrk >&2; } \
                || true
        fi
        command -v wrk >/dev/null \
            || die "wrk is not installed and could not be installed; install it (Debian/Ubuntu: apt-get install wrk) and run again"
    fi
}

# Latency as wrk prints it (123.45us, 1.20ms, 2.00s) in microseconds.
to_us() {
    awk -v v="$1" 'BEGIN {
        n = v + 0
        if (v ~ /us$/) m = 1; else if (v ~ /ms$/) m = 1000; else if (v ~ /m$/) m = 60e6; else if (v ~ /s$/) m = 1e6; else m = 1
        printf "%.1f", n * m }'
}
