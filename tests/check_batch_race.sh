#!/usr/bin/env bash
# bench/batch_race.mjs with --api native (issue 44, session 35) on the tiny model; nothing is timed.
# Usage: check_batch_race.sh MZCACHE_CLI LLAMA_SERVER MODEL WORK_DIR
# Checks, each failing the test with a message:
#   1. --check-native: on this llama-server a reply forced to hold invalid UTF-8 fails without the
#      bench's `chat_parser` grammar and streams whole with it (the reason --api native exists);
#   2. a race at 1 and 2 streams (32-token histories, 8 new tokens) succeeds and writes race.json,
#      race.md and (where gnuplot exists) race.png;
#   3. in race.json every stream of both systems got its 8 completion tokens (finish reason length),
#      llama-server's through its native /completion and mzcache's through /v1/completions, and both
#      servers counted the same prompt tokens for the same client (the same text went to both).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLI=$1 LLAMA=$2 MODEL=$3 W=$4
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODEL=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$MODEL")
fail() { echo "check_batch_race: FAILED: $*" >&2; for f in "$W"/*.log; do [ -f "$f" ] && tail -15 "$f" >&2; done; exit 1; }
[ -x "$LLAMA" ] || { echo "check_batch_race: no llama-server at $LLAMA: skipped"; exit 0; }
OPENAI_VERSION=6.49.0
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-$OPENAI_VERSION
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "openai@$OPENAI_VERSION" >/dev/null) || fail "npm install openai@$OPENAI_VERSION"
fi
rm -rf "$W" && mkdir -p "$W"
BENCH=$HERE/../bench/batch_race.mjs
node "$BENCH" --check-native --llama-server "$LLAMA" -m "$MODEL" -o "$W/check" >"$W/check.log" 2>&1 ||
  fail "--check-native exited with $?"
grep -q '^check-native: ok' "$W/check.log" || fail "--check-native did not say ok"
echo "ok 1 --check-native: $(grep -c 'seed' "$W/check.log") lines, the grammar lets the reply through"
node "$BENCH" --mzcache "$CLI" --llama-server "$LLAMA" -m "$MODEL" --openai "$NPM_DIR" --streams 1,2 \
  --history-tokens 32 --max-tokens 8 --reps 1 --api native -o "$W/race" >"$W/race.log" 2>&1 || fail "the race exited with $?"
for f in race.json race.md; do [ -s "$W/race/$f" ] || fail "no $f"; done
if command -v gnuplot >/dev/null; then [ -s "$W/race/race.png" ] || fail "no race.png"; fi
echo "ok 2 the race ran and wrote its files"
node - "$W/race/race.json" <<'JS' || fail "race.json (above)"
const j = JSON.parse(require('fs').readFileSync(process.argv[2], 'utf8'));
const want = { mzcache: '/v1/completions', llama: 'native /completion' };
const bad = m => { console.error(m); process.exit(1); };
if (j.runs.length !== 4) bad(`${j.runs.length} runs, want 2 levels x 2 systems`);
for (const N of [1, 2]) {
  const by = {};
  for (const sys of ['mzcache', 'llama']) {
    const r = j.runs.find(x => x.streams === N && x.system === sys) ?? bad(`no ${sys} run at ${N} streams`);
    if (r.per_stream.length !== N) bad(`${sys} N=${N}: ${r.per_stream.length} streams`);
    for (const p of r.per_stream) {
      if (p.api !== want[sys]) bad(`${sys} client ${p.client}: api ${p.api}, want ${want[sys]}`);
      if (p.completion_tokens !== 8 || p.finish_reason !== 'length') bad(`${sys} client ${p.client}: ${p.completion_tokens} tokens, finish ${p.finish_reason}`);
      if (!(p.prompt_tokens > 0)) bad(`${sys} client ${p.client}: prompt tokens ${p.prompt_tokens}`);
    }
    by[sys] = [...r.per_stream].sort((a, b) => a.client - b.client).map(p => p.prompt_tokens);
  }
  if (JSON.stringify(by.mzcache) !== JSON.stringify(by.llama)) bad(`N=${N}: prompt tokens differ: mzcache ${by.mzcache}, llama ${by.llama}`);
}
JS
echo "ok 3 every stream got its 8 tokens on its own route; both servers counted the same prompts"
