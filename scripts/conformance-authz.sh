#!/usr/bin/env bash
# Run the official conformance suite's `authorization` scenarios (metadata, authorization
# code grant) against a running `wharf serve --authorization-server`, and gate on them.
#
#   scripts/conformance-authz.sh ISSUER USER PASSWORD
#
#   ISSUER    the server's origin, exactly as its metadata's `issuer` (http://127.0.0.1:PORT)
#   USER      an account on it (wharf user add), PASSWORD its password
#
# The suite needs a client registered in advance and prints an authorization URL for a
# person to open; here the client is registered through the server's own registration
# endpoint (a native public client redirecting to the suite's callback), and the person is
# played by curl: it opens the URL, signs in, approves on the consent page and follows the
# redirect to the suite's callback, exactly the requests a browser makes (cookies kept in a
# jar). The verdict is the suite's: every check SUCCESS, none failed or skipped.
#
# Environment: CONFORMANCE_DIR (as scripts/conformance.sh), CALLBACK_PORT (default 18390).
set -euo pipefail

[[ $# -eq 3 ]] || { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
ISSUER="$1" USER_NAME="$2" PASSWORD="$3"
CALLBACK_PORT="${CALLBACK_PORT:-18390}"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
conf_dir="${CONFORMANCE_DIR:-target/conformance}"
[[ "$conf_dir" = /* ]] || conf_dir="$repo_root/$conf_dir"
# shellcheck source=scripts/conformance-suite.sh
source "$script_dir/conformance-suite.sh"
ensure_suite "$conf_dir"

work="$(mktemp -d)"
suite_pid=""
cleanup() { [[ -n "$suite_pid" ]] && kill "$suite_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

redirect="http://127.0.0.1:$CALLBACK_PORT/callback"
registration="$(curl -sS -f -X POST "$ISSUER/register" -H 'content-type: application/json' \
  -d "{\"client_name\":\"MCP conformance suite\",\"application_type\":\"native\",\"redirect_uris\":[\"$redirect\"],\"token_endpoint_auth_method\":\"none\"}")" \
  || { echo "conformance-authz: registration at $ISSUER/register failed" >&2; exit 1; }
client_id="$(printf '%s' "$registration" | sed -n 's/.*"client_id":"\([^"]*\)".*/\1/p')"
[[ -n "$client_id" ]] || { echo "conformance-authz: no client_id in $registration" >&2; exit 1; }
echo "conformance-authz: registered client $client_id"

out="$work/results"
mkdir -p "$out"
"$NODE" "$SUITE_JS" authorization --url "$ISSUER" --client-id "$client_id" -p "$CALLBACK_PORT" -o "$out" \
  >"$work/suite.log" 2>&1 &
suite_pid=$!

# The suite prints the URL, then starts its callback server.
for _ in $(seq 1 300); do
  grep -q 'Callback server started' "$work/suite.log" && break
  kill -0 "$suite_pid" 2>/dev/null || break
  sleep 0.1
done
auth_url="$(grep -m1 -o "$ISSUER/authorize?[^ ]*" "$work/suite.log" || true)"
if [[ -z "$auth_url" ]]; then
  cat "$work/suite.log" >&2
  echo "conformance-authz: the suite printed no authorization URL" >&2
  exit 1
fi

# The person: sign in, approve.
jar="$work/cookies"
field() { sed -n "s/.*name=\"$1\" value=\"\([^\"]*\)\".*/\1/p"; }
page="$(curl -sS -f -c "$jar" -b "$jar" "$auth_url")"
request="$(printf '%s' "$page" | field request)"
csrf="$(printf '%s' "$page" | field csrf)"
[[ -n "$request" && -n "$csrf" ]] || { echo "conformance-authz: no sign-in form in: $page" >&2; exit 1; }
status="$(curl -sS -o /dev/null -w '%{http_code}' -c "$jar" -b "$jar" "$ISSUER/authorize/login" \
  --data-urlencode "request=$request" --data-urlencode "csrf=$csrf" \
  --data-urlencode "username=$USER_NAME" --data-urlencode "password=$PASSWORD")"
[[ "$status" == 303 ]] || { echo "conformance-authz: sign-in answered $status" >&2; exit 1; }
page="$(curl -sS -f -c "$jar" -b "$jar" "$ISSUER/authorize/consent?request=$request")"
grep -q 'MCP conformance suite' <<<"$page" || { echo "conformance-authz: no consent page: $page" >&2; exit 1; }
callback="$(curl -sS -o /dev/null -w '%{redirect_url}' -c "$jar" -b "$jar" "$ISSUER/authorize/consent" \
  --data-urlencode "request=$request" --data-urlencode "csrf=$csrf" --data-urlencode "decision=approve")"
[[ "$callback" == "$redirect?"* ]] || { echo "conformance-authz: consent redirected to '$callback'" >&2; exit 1; }
curl -sS -f -o /dev/null "$callback"

rc=0
wait "$suite_pid" || rc=$?
suite_pid=""
cat "$work/suite.log"
echo "conformance-authz: suite exit code $rc"

# Every check of both scenarios must have passed; a skipped one proved nothing.
"$NODE" - "$out" <<'EOF'
const fs = require('fs'), path = require('path');
const files = [];
const walk = (d) => fs.readdirSync(d).forEach((f) => {
  const p = path.join(d, f);
  if (fs.statSync(p).isDirectory()) walk(p); else if (f === 'checks.json') files.push(p);
});
walk(process.argv[2]);
const checks = files.flatMap((f) => JSON.parse(fs.readFileSync(f, 'utf8')));
const expected = ['authorization-server-metadata', 'authorization-server-metadata-cimd', 'authorization-code-grant'];
let failed = 0;
for (const id of expected) {
  const c = checks.find((c) => c.id === id);
  const status = c ? c.status : 'MISSING';
  console.log(`conformance-authz: ${id}: ${status}${c && c.errorMessage ? ' — ' + c.errorMessage : ''}`);
  if (status !== 'SUCCESS') failed++;
}
for (const c of checks) if (c.status === 'FAILURE') { console.log(`conformance-authz: FAILURE ${c.id}: ${c.errorMessage || ''}`); failed++; }
process.exit(failed ? 1 : 0);
EOF
[[ $rc -eq 0 ]] || { echo "conformance-authz: the suite failed" >&2; exit 1; }
echo "conformance-authz: both scenarios pass"
