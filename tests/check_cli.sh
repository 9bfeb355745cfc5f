#!/usr/bin/env bash
# `mzcache run` and `mzcache chat` end to end on the synthesized tiny-qwen3 model (ctest "cli_run_chat",
# label tools): the commands as a user types them, built on the public C API only
# (tools/cli/cmd_run.cpp). Checks, each failing the test with the command's output:
#   run: a generation with its TTFT line; --session saved, then loaded by a second run without
#        recompute; --residency-json written as JSON with every unit; --ctx auto picks a context;
#        --sustained reports its caps; a corrupt session file is refused with a clear error and a
#        non-zero exit, the file left as it was;
#   chat: two turns around /evict 60% (the second restores through restore_generate), /memory units
#        (the kernel's view, one line per unit), /threads and /threads 1 (the conversation stays),
#        /restore, /save FILE (loaded again by run), unknown commands answered, EOF ends it;
#   chat --watch-pressure /background: onTrimMemory UI_HIDDEN (nothing), BACKGROUND, COMPLETE (no KV
#        left in RAM), then a turn that restores what was given back;
#   chat --conversation NAME started and resumed from the pool's folder, `conversations` (table,
#        --json) and `conversations rm` (an unknown name refused);
#   plan --recommend: the residency table's 8B rows name a failure and its reason per phone tier;
#   --weights (issue 49): on a tiny Q4_0 model (made here), run --weights repacked holds every layer
#        in anonymous memory (the repacked form) and the default keeps them mapped from the file, chat
#        --weights repacked shows it in /memory units, serve and bench models take the option, and a
#        value that is not a form is refused.
# Usage: tests/check_cli.sh MZCACHE MODEL_DIR   (MODEL_DIR/tiny-qwen3-q8_0.gguf; as cli_on_test_model.sh,
# $MZ_TEST_MODEL_DIR_OVERRIDE wins when set)
set -uo pipefail
cli=$1
dir=${MZ_TEST_MODEL_DIR_OVERRIDE:-$2}
model=$dir/tiny-qwen3-q8_0.gguf
[ -f "$model" ] || { echo "check_cli: no test model at $model"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
out=$work/out.txt

# expect NAME PATTERN: PATTERN (grep -E) must be in the last command's output.
expect() {
  if ! grep -qE -- "$2" "$out"; then
    echo "FAIL $1: no line matching /$2/ in:"
    sed 's/^/  | /' "$out"
    fail=1
  else
    echo "ok   $1"
  fi
}

# expect_json NAME FILE EXPR: the Python expression EXPR must hold for j, FILE's JSON.
expect_json() {
  if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert eval(sys.argv[2]), j' "$2" "$3" >/dev/null 2>&1; then
    echo "ok   $1"
  else
    echo "FAIL $1: not ($3) in:"
    sed 's/^/  | /' "$2"
    fail=1
  fi
}

run() { "$cli" run -m "$model" --swap "$work/swap" "$@" >"$out" 2>&1; }

run -p "hello there" -n 8 --session "$work/s.mzs" --session-codec none
rc=$?
[ $rc = 0 ] || { echo "FAIL run exited $rc"; cat "$out"; fail=1; }
expect "run prints TTFT" '\[prompt [0-9]+ tokens \| TTFT [0-9.]+ s'
expect "run saves the session" '\[session saved: .*s\.mzs, [0-9]+ tokens'
[ -s "$work/s.mzs" ] || { echo "FAIL session file missing"; fail=1; }

run -p "and then" -n 4 --session "$work/s.mzs" --residency-json "$work/res.json"
expect "second run loads the session without recompute" '\[session .*s\.mzs: [0-9]+ tokens restored in .* no recompute\]'
expect "residency summary" 'kernel \(mincore\): .* counted resident are in RAM'
expect_json "residency JSON has units and a summary" "$work/res.json" 'j["units"] and "in_ram" in j["summary"]'

run -p "hi" -n 2 --ctx auto
expect "--ctx auto chooses a context" '^--ctx auto: [0-9]+ tokens \(peak'

run -p "hi" -n 4 --sustained --duty 0.9
expect "--sustained reports its caps" '\[sustained: threads [0-9]+\.\.[0-9]+ \(now [0-9]+\), duty cycle 0\.90'

cp "$work/s.mzs" "$work/bad.mzs"
printf 'XXXXXXXX' | dd of="$work/bad.mzs" bs=1 seek=0 conv=notrunc status=none
sum_before=$(sha256sum "$work/bad.mzs" | cut -d' ' -f1)
run -p "hi" -n 2 --session "$work/bad.mzs"
rc=$?
if [ $rc != 0 ] && grep -qE '^error: session .*bad\.mzs' "$out" && [ "$(sha256sum "$work/bad.mzs" | cut -d' ' -f1)" = "$sum_before" ]; then
  echo "ok   a corrupt session is refused (exit $rc), the file untouched"
else
  echo "FAIL corrupt session: exit $rc"; sed 's/^/  | /' "$out"; fail=1
fi

printf '%s\n' "hello" "/memory units" "/evict 60%" "tell me more" "/threads" "/threads 1" "once more" \
  "/restore" "/save $work/chat.mzs" "/nonsense" |
  "$cli" chat -m "$model" --swap "$work/swap2" -n 6 --kv-codec none >"$out" 2>&1
rc=$?
[ $rc = 0 ] || { echo "FAIL chat exited $rc"; fail=1; }
expect "chat /memory: the report" 'remaining in memory: 100\.0%'
expect "chat /memory units: one line per unit" 'weights\[base\] +resident'
expect "chat /evict 60%" 'released [0-9.]+ MiB in'
expect "chat turn after /evict restores overlapped" '\[restore_generate: [1-9][0-9]* units restored'
expect "chat /threads shows clusters" 'cluster CPUs [0-9]'
expect "chat /threads 1" 'computing on 1 thread'
expect "chat /restore" 'restore done in'
expect "chat /save" 'saved [0-9]+ tokens'
expect "chat: unknown command" 'unknown command /nonsense'
[ "$(grep -c '\[prompt [0-9]* tokens | TTFT' "$out")" = 3 ] || { echo "FAIL chat: 3 turns expected"; sed 's/^/  | /' "$out"; fail=1; }

# Backgrounding (issue 49): /background plays onTrimMemory UI_HIDDEN, BACKGROUND, COMPLETE; UI_HIDDEN
# asks for nothing, COMPLETE leaves no KV in RAM, and the next turn restores what was given back.
printf '%s\n' "hello" "/background" "/trim banana" "again" |
  "$cli" chat -m "$model" --swap "$work/swap3" -n 4 --kv-codec none --watch-pressure=watermark >"$out" 2>&1
expect "chat /background: UI_HIDDEN gives nothing back" 'onTrimMemory\(20 UI_HIDDEN\): gave back 0\.0 MiB'
expect "chat /background: BACKGROUND handled" 'onTrimMemory\(40 BACKGROUND\): gave back [0-9.]+ MiB'
expect "chat /background: COMPLETE gives back the rest, no KV stays" 'onTrimMemory\(80 COMPLETE\): gave back [0-9]*[1-9][0-9]*\.[0-9] MiB .* of it KV 0\.0 MiB'
expect "chat /trim: a bad level is refused with the usage" '^> usage: /trim LEVEL'
expect "chat after /background: the turn restores front-first, overlapped" '\[restore_generate: [1-9][0-9]* units restored'

run -p "after chat" -n 2 --session "$work/chat.mzs"
expect "run resumes chat's saved conversation" '\[session .*chat\.mzs: [0-9]+ tokens restored'

# A named conversation of the pool: started, resumed by a second chat (its stored tokens, not
# recomputed), listed by `conversations` (table and JSON), deleted by `conversations rm`; an unknown
# name is refused with a clear error and a non-zero exit.
conv() { "$cli" conversations --dir "$work/pool" -m "$model" "$@" >"$out" 2>&1; }
printf 'hello\n' | "$cli" chat -m "$model" --conversation alpha --pool-dir "$work/pool" -n 4 >"$out" 2>&1
expect "chat --conversation starts one" '^\[conversation alpha in .*: 0 tokens, 0 messages'
printf 'more\n' | "$cli" chat -m "$model" --conversation alpha --pool-dir "$work/pool" -n 4 >"$out" 2>&1
expect "chat --conversation resumes it" '^\[conversation alpha in .*: [1-9][0-9]* tokens, 2 messages'
conv
expect "conversations lists it" '^\| alpha \| [1-9][0-9]* \| [0-9.]+ MiB \|'
conv --json
expect_json "conversations --json: alpha with its tokens and stored bytes" "$out" \
  '[c["id"] for c in j] == ["alpha"] and j[0]["tokens"] > 15 and j[0]["stored_bytes"] > 0'
conv rm nope
rc=$?
if [ $rc != 0 ] && grep -qE "^error: deleting nope: .*no conversation 'nope'" "$out"; then
  echo "ok   conversations rm of an unknown name is refused (exit $rc)"
else
  echo "FAIL conversations rm nope: exit $rc"; sed 's/^/  | /' "$out"; fail=1
fi
conv rm alpha
expect "conversations rm alpha" '^deleted alpha'
conv --json
expect_json "alpha is gone after rm" "$out" 'j == []'

# plan --recommend: the 8B rows of the residency table (issue 49), every cell naming its failure and why.
"$cli" plan --recommend --ram-gib 8 --read-mbps 800 --shapes qwen3-0.6b --quants q8_0 --json >"$out" 2>&1
expect_json "plan --recommend: Llama-3.1-8B Q4_K_M on an 8 GB phone is killed at load, with --no-repack it thrashes" "$out" \
  '[(r["repack"], r["tiers"][1]["failure"]) for r in j["residency"] if r["model"] == "Llama-3.1-8B" and r["quant"] == "q4_k_m"] == [(True, "killed at load"), (False, "thrash")] and all(c["why"] for r in j["residency"] for c in r["tiers"])'
"$cli" plan --recommend --ram-gib 8 --read-mbps 800 --shapes qwen3-0.6b --quants q8_0 >"$out" 2>&1
expect "plan --recommend: the residency table's 8B rows" '^\| Qwen3-8B \| q3_k_m \| [0-9.]+ \| repacked \(default\) \| \*\*killed on return\*\*'

# --weights: the switch reaches the model (the residency report's backing of each layer's unit, read
# through mz_unit_info), on a Q4_0 model (AVX2 and NEON have a repacked Q4_0 kernel; Q8_0 has none
# on AVX2, so the q8_0 test model would stay in the file form either way).
q4=$work/tiny-q4_0.gguf
if "$cli" make-model --shape tiny-qwen3 --type q4_0 -o "$q4" >"$out" 2>&1; then
  "$cli" run -m "$q4" --swap "$work/swap4" -p "hi" -n 2 --weights repacked --residency-json "$work/rep.json" >"$out" 2>&1
  expect_json "run --weights repacked: every layer is anonymous (repacked), the base unit stays mapped" "$work/rep.json" \
    'all(u["backing"] == "anonymous" for u in j["units"] if u["kind"] == "weights" and u["layer"] >= 0) and [u["backing"] for u in j["units"] if u["unit"] == "weights[base]"] == ["model-file"]'
  "$cli" run -m "$q4" --swap "$work/swap4" -p "hi" -n 2 --weights file --residency-json "$work/file.json" >"$out" 2>&1
  expect_json "run --weights file: every layer mapped from the model file" "$work/file.json" \
    'all(u["backing"] == "model-file" for u in j["units"] if u["kind"] == "weights")'
  printf '/memory units\n' | "$cli" chat -m "$q4" --swap "$work/swap5" -n 2 --weights repacked >"$out" 2>&1
  expect "chat --weights repacked: /memory units shows the layers anonymous" 'weights\[0\] +resident +anonymous'
  "$cli" run -m "$q4" -p "hi" -n 2 --weights bogus >"$out" 2>&1
  rc=$?
  if [ $rc != 0 ] && grep -qE -- '--weights: bogus not in \{page-cache,file,anonymous,repacked\}' "$out"; then
    echo "ok   run --weights bogus is refused (exit $rc)"
  else
    echo "FAIL run --weights bogus: exit $rc"; sed 's/^/  | /' "$out"; fail=1
  fi
  "$cli" serve --help >"$out" 2>&1
  expect "serve --help: --weights" '--weights'
  "$cli" bench models --help >"$out" 2>&1
  expect "bench models --help: --weights" '--weights'
else
  echo "FAIL make-model tiny-qwen3 q4_0"; sed 's/^/  | /' "$out"; fail=1
fi

"$cli" run --help >"$out" 2>&1
expect "run --help" '--kv-type'

if [ $fail = 0 ]; then echo "check_cli: all passed"; else echo "check_cli: FAILED"; fi
exit $fail
