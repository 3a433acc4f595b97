# Sourced by scripts/services.sh and scripts/test.sh: `apt_install PACKAGE...` installs
# Debian packages, as root or through sudo, refreshing the package lists once when the
# install fails on their own (a fresh machine's lists may be missing or stale), and stops
# the script when they still cannot be installed.
apt_install() {
  local sudo=()
  # sudo asks for a password only where someone can type it.
  if [ "$(id -u)" -ne 0 ]; then
    if [ -t 0 ]; then sudo=(sudo); else sudo=(sudo -n); fi
  fi
  command -v apt-get >/dev/null \
    || { printf 'FATAL: %s missing and apt-get is not available to install it\n' "$*" >&2; exit 1; }
  printf 'installing %s from Debian'"'"'s packages\n' "$*" >&2
  # Through `env`: sudo resets the environment.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 \
    || { "${sudo[@]}" apt-get update -q >&2 \
      && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2; } \
    || { printf 'FATAL: could not install %s\n' "$*" >&2; exit 1; }
}
