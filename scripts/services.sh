#!/usr/bin/env bash
# Makes sure the PostgreSQL and Redis the tests use answer on 127.0.0.1:5432 and :6379
# (and that nginx, which the deployment tests run, is installed):
# starts them when they are installed but stopped, installs them from Debian's packages when
# they are missing, and exits non-zero, naming what is wrong, when they still do not answer.
# Tests never skip a backend: without these services they fail.
set -euo pipefail

PG_URL=${WHARF_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
REDIS_URL=${WHARF_TEST_REDIS_URL:-redis://127.0.0.1:6379/}

say() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'FATAL: %s\n' "$*" >&2; exit 1; }

sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo -n)

# shellcheck source=scripts/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = PONG ]; }

wait_for() { # name check
  for _ in $(seq 1 100); do "$2" && return 0; sleep 0.1; done
  return 1
}

# PostgreSQL
command -v pg_isready >/dev/null || apt_install postgresql postgresql-client
if ! pg_up; then
  say "PostgreSQL is not answering on 127.0.0.1:5432; starting it"
  if command -v pg_ctlcluster >/dev/null && ls /etc/postgresql/*/main >/dev/null 2>&1; then
    for dir in /etc/postgresql/*/main; do
      v=$(basename "$(dirname "$dir")")
      "${sudo[@]}" pg_ctlcluster "$v" main start >&2 || true
    done
  else
    "${sudo[@]}" service postgresql start >&2 || true
  fi
  wait_for PostgreSQL pg_up || die "PostgreSQL does not answer on 127.0.0.1:5432 (tests need it: $PG_URL)"
fi
db=${PG_URL##*/}
db=${db%%\?*}
if ! psql "$PG_URL" -Atc 'select 1' >/dev/null 2>&1; then
  say "creating database $db"
  psql "${PG_URL%/*}/postgres" -c "CREATE DATABASE \"$db\"" >&2 \
    || die "cannot connect to PostgreSQL as $PG_URL (trust authentication for 127.0.0.1 is expected)"
fi
psql "$PG_URL" -Atc 'select 1' >/dev/null || die "cannot query PostgreSQL at $PG_URL"

# Redis
command -v redis-server >/dev/null || apt_install redis-server
if ! redis_up; then
  say "Redis is not answering on 127.0.0.1:6379; starting it"
  "${sudo[@]}" service redis-server start >&2 2>/dev/null \
    || redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no >&2 || true
  wait_for Redis redis_up || die "Redis does not answer on 127.0.0.1:6379 (tests need it: $REDIS_URL)"
fi

# nginx: the deployment tests (crates/wharf-cli/tests/e2e/deploy.rs) run deploy/nginx/wharf.conf
# in an nginx of their own; the package's own service is not needed.
if ! [ -x /usr/sbin/nginx ] && ! command -v nginx >/dev/null; then
  apt_install nginx-light
  "${sudo[@]}" service nginx stop >&2 2>/dev/null || true
fi
{ [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null; } || die "nginx is not installed (deploy tests need it)"

say "PostgreSQL ($PG_URL) and Redis ($REDIS_URL) answer; nginx is installed"
