#!/usr/bin/env bash
# Run the official MCP conformance suite (@modelcontextprotocol/conformance) against a
# running Wharf server and gate on the result.
#
#   scripts/conformance.sh URL [OUTDIR]
#
#   URL     the server's MCP endpoint, e.g. http://127.0.0.1:8080/mcp (must be
#           127.0.0.1/localhost/[::1]: the DNS-rebinding scenario requires it)
#   OUTDIR  where the suite writes its results; must not exist yet or be empty
#           (default: $CONFORMANCE_DIR/results/<timestamp>)
#
# Environment:
#   REQUIREMENTS     the requirement set: 2026-07-28 (default) or 2025-11-25
#   CONFORMANCE_DIR  cache folder for the suite and its Node 22 (default: target/conformance;
#                    a relative path is taken from the repository root)
#
# What it does:
#   1. installs node@22 + the suite into $CONFORMANCE_DIR unless already installed there;
#   2. runs `server --requirements $REQUIREMENTS` (the scored set, which also runs the
#      unscored tasks-* extension and pending scenarios for information);
#   3. runs each pending scenario again on its own at --spec-version $REQUIREMENTS;
#   4. reads every checks.json and prints the failing checks;
#   5. exits 1 if any scored scenario fails (other than those whose name starts with
#      $ALLOWED_FAILING_PREFIX) or any pending scenario fails; 0 otherwise.
#
# The verdict is taken from the checks.json files, not from the suite's exit code: with
# --requirements the suite exits 1 as soon as any scored scenario fails, including the
# allowed ones. A scenario counts as failed when any of its checks has status FAILURE, when
# none of its checks has status SUCCESS (all skipped, informational or empty: it proved
# nothing), or when it left no checks.json (the suite crashed inside it). A WARNING, INFO or
# SKIPPED check beside a passing one does not fail it.
set -euo pipefail

# The revision whose requirements run: 2026-07-28 (stateless) or 2025-11-25 (the legacy
# era, initialize and sessions, on the same endpoint).
REQUIREMENTS="${REQUIREMENTS:-2026-07-28}"
# Not scored by the suite yet, but we require them to pass. In 2025-11-25, server-sse-polling
# (SEP-1699) tests resumability, which that revision makes optional and Wharf does not offer:
# it yields only INFO checks, so it is left out rather than counted.
case "$REQUIREMENTS" in
  2026-07-28) PENDING_SCENARIOS=(http-header-validation http-custom-header-server-validation json-schema-2020-12) ;;
  2025-11-25) PENDING_SCENARIOS=(json-schema-2020-12 server-session-lifecycle) ;;
  *) echo "conformance: REQUIREMENTS must be 2026-07-28 or 2025-11-25" >&2; exit 2 ;;
esac
# Scored scenarios whose name starts with this prefix may fail without failing the run.
# Empty: nothing may fail (the MRTR scenarios pass since issue 5).
ALLOWED_FAILING_PREFIX=""

usage() {
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 1 && $# -le 2 && -n "${1:-}" ]] || usage
case "$1" in -h|--help) usage ;; esac
URL="$1"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"

conf_dir="${CONFORMANCE_DIR:-target/conformance}"
[[ "$conf_dir" = /* ]] || conf_dir="$repo_root/$conf_dir"

if [[ $# -ge 2 ]]; then
  out_dir="$2"
  [[ "$out_dir" = /* ]] || out_dir="$PWD/$out_dir"
else
  out_dir="$conf_dir/results/$(date -u +%Y%m%dT%H%M%SZ)-$$"
fi
if [[ -e "$out_dir" ]] && [[ -n "$(ls -A "$out_dir" 2>/dev/null)" ]]; then
  echo "conformance: $out_dir is not empty; give a new or empty output folder (stale checks.json would be read)" >&2
  exit 2
fi

# shellcheck source=scripts/conformance-suite.sh
source "$script_dir/conformance-suite.sh"
ensure_suite "$conf_dir"

mkdir -p "$out_dir/requirements" "$out_dir/pending"

run_suite() { "$NODE" "$SUITE_JS" "$@"; }

echo "conformance: results go to $out_dir"
echo "conformance: === server --requirements $REQUIREMENTS against $URL ==="
req_rc=0
run_suite server --url "$URL" --requirements "$REQUIREMENTS" -o "$out_dir/requirements" \
  >"$out_dir/requirements.log" 2>&1 || req_rc=$?
# Keep the suite's own summary visible; the full log stays in the output folder.
sed -n '/=== SUMMARY ===/,$p' "$out_dir/requirements.log"
echo "conformance: suite exit code $req_rc (full log: $out_dir/requirements.log)"

pending_rcs=()
for scenario in "${PENDING_SCENARIOS[@]}"; do
  echo "conformance: === pending scenario $scenario ==="
  mkdir -p "$out_dir/pending/$scenario"
  rc=0
  run_suite server --url "$URL" --scenario "$scenario" --spec-version "$REQUIREMENTS" \
    -o "$out_dir/pending/$scenario" >"$out_dir/pending/$scenario.log" 2>&1 || rc=$?
  grep -E '^Passed: ' "$out_dir/pending/$scenario.log" || true
  echo "conformance: suite exit code $rc (full log: $out_dir/pending/$scenario.log)"
  pending_rcs+=("$scenario=$rc")
done

# Verdict, from the checks.json files.
verdict_rc=0
OUT_DIR="$out_dir" \
REQUIREMENTS_FILE="$SUITE_DIR/requirements/$REQUIREMENTS.yaml" \
YAML_MODULE="$conf_dir/node_modules/yaml" \
ALLOWED_FAILING_PREFIX="$ALLOWED_FAILING_PREFIX" \
PENDING_SCENARIOS="${PENDING_SCENARIOS[*]}" \
REQUIREMENTS_RC="$req_rc" \
PENDING_RCS="${pending_rcs[*]}" \
"$NODE" - <<'EOF' || verdict_rc=$?
const fs = require('fs');
const path = require('path');
const YAML = require(process.env.YAML_MODULE);

const outDir = process.env.OUT_DIR;
const allowedPrefix = process.env.ALLOWED_FAILING_PREFIX || '';
const isAllowed = (name) => allowedPrefix !== '' && name.startsWith(allowedPrefix);
const pending = process.env.PENDING_SCENARIOS.split(/\s+/).filter(Boolean);
const pendingRc = Object.fromEntries(
  (process.env.PENDING_RCS || '').split(/\s+/).filter(Boolean).map((kv) => {
    const i = kv.lastIndexOf('=');
    return [kv.slice(0, i), Number(kv.slice(i + 1))];
  })
);
const requirementsRc = Number(process.env.REQUIREMENTS_RC);

const requirements = YAML.parse(fs.readFileSync(process.env.REQUIREMENTS_FILE, 'utf8'));
const scored = requirements.server;
if (!Array.isArray(scored) || scored.length === 0) {
  console.error(`no scored server scenarios in ${process.env.REQUIREMENTS_FILE}`);
  process.exit(1);
}

// The suite writes OUTDIR/server-<scenario>-<ISO timestamp with : and . as ->/checks.json.
const DIR_RE = /^server-(.+)-(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z)$/;
function collect(dir) {
  const byScenario = new Map();
  if (!fs.existsSync(dir)) return byScenario;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    if (!entry.isDirectory()) continue;
    const m = DIR_RE.exec(entry.name);
    if (!m) continue;
    const file = path.join(dir, entry.name, 'checks.json');
    let run;
    if (!fs.existsSync(file)) {
      run = { error: `no checks.json in ${entry.name} (the suite crashed or was stopped inside this scenario)` };
    } else {
      try {
        const checks = JSON.parse(fs.readFileSync(file, 'utf8'));
        run = Array.isArray(checks) ? { checks } : { error: `${file} is not an array` };
      } catch (e) {
        run = { error: `cannot parse ${file}: ${e.message}` };
      }
    }
    if (!byScenario.has(m[1])) byScenario.set(m[1], []);
    byScenario.get(m[1]).push(run);
  }
  return byScenario;
}

// -> { ok, problems: [string], counts }
function judge(runs) {
  const problems = [];
  const counts = { SUCCESS: 0, FAILURE: 0, WARNING: 0, other: 0 };
  if (!runs || runs.length === 0) {
    return { ok: false, problems: ['no result folder: the scenario did not run'], counts };
  }
  for (const run of runs) {
    if (run.error) { problems.push(run.error); continue; }
    for (const c of run.checks) {
      if (c.status in counts) counts[c.status]++; else counts.other++;
      if (c.status === 'FAILURE') {
        let msg = String(c.errorMessage ?? c.description ?? '').replace(/\s+/g, ' ');
        if (msg.length > 240) msg = msg.slice(0, 237) + '...';
        problems.push(`${c.id}${c.name && c.name !== c.id ? ` (${c.name})` : ''}: ${msg}`);
      }
    }
  }
  // A scenario passes on what it checked: one whose checks were all skipped, informational
  // or absent proved nothing, and counts as failed.
  if (problems.length === 0 && counts.SUCCESS === 0) {
    problems.push(`no passing check (${counts.WARNING} warning, ${counts.other} skipped/info): the scenario proved nothing`);
  }
  return { ok: problems.length === 0, problems, counts };
}

const reqRuns = collect(path.join(outDir, 'requirements'));
const blocking = [];
const allowed = [];
let passed = 0;

console.log(`\n=== Wharf conformance verdict (${scored.length} scored scenarios + ${pending.length} pending) ===`);
const printProblems = (list) => {
  const shown = list.slice(0, 12);
  for (const p of shown) console.log(`      - ${p}`);
  if (list.length > shown.length) console.log(`      ... ${list.length - shown.length} more failing check(s)`);
};

for (const name of scored) {
  const v = judge(reqRuns.get(name));
  if (v.ok) { passed++; continue; }
  if (isAllowed(name)) { allowed.push(name); continue; }
  blocking.push(name);
  console.log(`  FAIL ${name}`);
  printProblems(v.problems);
}
for (const name of pending) {
  const v = judge(collect(path.join(outDir, 'pending', name)).get(name));
  const rc = pendingRc[name];
  if (v.ok && rc !== undefined && rc !== 0) {
    v.ok = false;
    v.problems.push(`the suite exited ${rc} although no check failed`);
  }
  if (v.ok) { passed++; continue; }
  blocking.push(`${name} (pending)`);
  console.log(`  FAIL ${name} (pending)`);
  printProblems(v.problems);
}

if (allowed.length > 0) {
  console.log(`  allowed to fail (prefix "${allowedPrefix}"), failing: ${allowed.length}`);
  for (const name of allowed) console.log(`      ~ ${name}`);
}
const extra = [...reqRuns.keys()].filter((n) => !scored.includes(n) && !pending.includes(n));
const extraFailing = extra.filter((n) => !judge(reqRuns.get(n)).ok);
if (extra.length > 0) {
  console.log(`  not scored, informational: ${extra.length} run, ${extraFailing.length} failing` +
    (extraFailing.length ? ` (${extraFailing.join(', ')})` : ''));
}
if (![0, 1].includes(requirementsRc)) {
  blocking.push(`suite run (exit code ${requirementsRc})`);
  console.log(`  FAIL the --requirements run exited ${requirementsRc} (crash?)`);
}

if (blocking.length > 0) console.log(`\nblocking failures: ${blocking.join(', ')}`);
else console.log(`\nconformance: OK${allowed.length ? ` (${allowed.length} allowed failures)` : ''}`);
// Closing line in the plain "N passed, N failed" form (scenarios; allowed failures are in neither count).
console.log(`${passed} passed, ${blocking.length} failed`);
process.exit(blocking.length > 0 ? 1 : 0);
EOF

if [[ $verdict_rc -ne 0 ]]; then
  echo "conformance: FAILED (results in $out_dir)" >&2
  exit 1
fi
