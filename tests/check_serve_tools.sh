#!/usr/bin/env bash
# Tool calling in `mzcache serve` end to end (docs/server.md "Tool calling"), out of the box: the
# synthesized models carry their real family's chat template (make-model embeds Qwen3's / Llama
# 3.2's from the pinned llama.cpp source), so no --chat-template-file is given. On scripted model
# output (the test hook --test-scripted-replies; the weights are random) and, for tool_choice
# "required" / a named function, on the random weights themselves (constrained decoding), driven by
# curl and the official `openai` npm client (tests/serve_tools.mjs). Loopback only; every wait is
# bounded. About 30 s.
# Usage: check_serve_tools.sh MZCACHE_CLI QWEN3_MODEL.gguf LLAMA_MODEL.gguf LLAMA_CPP_SRC WORK_DIR
# Checks:
#   1. the test hook is refused on a non-loopback host;
#   2. Qwen3 (Hermes <tool_call>): the openai client's tool flow, non-streamed and streamed (calls,
#      ids, arguments, finish_reason tool_calls, the role "tool" message, the final answer), a
#      malformed call returned as content, tool_choice "none", a 400 naming a bad tools field;
#   3. Llama 3.2 (a JSON object as the reply): the call is returned as tool_calls (curl);
#   4. the models' own templates carry tool syntax (/props chat_template);
#   5. tool_choice "required" and a named function on random weights: the reply is one call with
#      JSON arguments holding the schema's required keys (openai client and curl, streamed and not;
#      Qwen3 and Llama 3.2);
#   6. without the pinned source, make-model embeds the plain template and says so.
set -euo pipefail
CLI=$1 QWEN=$2 LLAMA=$3 SRC=$4 W=$5
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && QWEN=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$QWEN") &&
  LLAMA=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$LLAMA")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/serve_lib.sh"
OPENAI_VERSION=6.49.0
rm -rf "$W" && mkdir -p "$W"
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "check_serve_tools: FAILED: $*" >&2; [ -f "$W/server.log" ] && tail -20 "$W/server.log" >&2; exit 1; }
ok() { echo "check_serve_tools: ok: $*"; }

start() {  # start MODEL [SCRIPT]: sets PID and PORT (no SCRIPT: the model samples)
  rm -f "$W/port"
  "$CLI" serve -m "$1" ${2:+--test-scripted-replies "$2"} --port 0 --port-file "$W/port" \
    --pool-dir "$W/pool-$(basename "$1")" -c 2048 -t 1 --parallel 1 --no-watch-pressure >>"$W/server.log" 2>&1 &
  PID=$!
  wait_port
}
stop() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

# The fixture makes tiny-qwen3 (and stamps the folder with the synthesis recipe's revision:
# tests/test_util.cpp); tiny-llama is made here when no other test made it since the stamp (a second).
STAMP=$(dirname "$QWEN")/synth-recipe-revision
if [ ! -s "$LLAMA" ] || { [ -f "$STAMP" ] && [ "$STAMP" -nt "$LLAMA" ]; }; then
  "$CLI" make-model --shape tiny-llama --type q8_0 -o "$LLAMA.tmp$$" >/dev/null 2>&1 && mv "$LLAMA.tmp$$" "$LLAMA" ||
    fail "cannot make $LLAMA"
fi

# --- 1. the hook is loopback only
echo '[]' >"$W/empty.json"
if timeout 20 "$CLI" serve -m "$QWEN" --host 0.0.0.0 --api-key k --port 0 --test-scripted-replies "$W/empty.json" \
  >"$W/refused.log" 2>&1; then fail "--test-scripted-replies accepted on 0.0.0.0"; fi
grep -q 'only on a loopback' "$W/refused.log" || fail "no reason given for refusing the hook: $(cat "$W/refused.log")"
ok "the test hook is refused off loopback"

# --- 2. Qwen3 through the openai client
cat >"$W/qwen.json" <<'JSON'
["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
 "It is 21 degrees in Paris.",
 "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
 "Done: 21 degrees at 12:00.",
 "<tool_call>\nnot json\n</tool_call>",
 "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"]
JSON
start "$QWEN" "$W/qwen.json"
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-$OPENAI_VERSION
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "openai@$OPENAI_VERSION" >/dev/null) || fail "npm install openai@$OPENAI_VERSION"
fi
node "$HERE/serve_tools.mjs" "http://127.0.0.1:$PORT/v1" "$NPM_DIR" || fail "the openai client's tool flow"
ok "openai@$OPENAI_VERSION tool flow (Qwen3 template)"
stop

# --- 3. Llama 3.2: the reply is one JSON object
printf '%s' '["{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"]' >"$W/llama.json"
start "$LLAMA" "$W/llama.json"
curl -s -o "$W/resp" "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d \
  '{"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}'
python3 - "$W/resp" <<'PY' || fail "Llama 3.2 tool call: $(cat "$W/resp")"
import json, sys
r = json.load(open(sys.argv[1]))
c = r["choices"][0]
assert c["finish_reason"] == "tool_calls", c
tc = c["message"]["tool_calls"]
assert len(tc) == 1 and tc[0]["function"]["name"] == "get_weather", tc
assert json.loads(tc[0]["function"]["arguments"]) == {"city": "Paris"}, tc
assert c["message"]["content"] is None, c
PY
ok "Llama 3.2 JSON reply as tool_calls"
# 4. the GGUF's own template is the real one (make-model embedded it from the pinned source)
curl -s "http://127.0.0.1:$PORT/props" >"$W/props"
python3 - "$W/props" "$SRC/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja" <<'PY' || fail "Llama's template: $(head -c 300 "$W/props")"
import json, sys
assert json.load(open(sys.argv[1]))["chat_template"] == open(sys.argv[2]).read()
PY
stop
start "$QWEN"
curl -s "http://127.0.0.1:$PORT/props" >"$W/props"
python3 - "$W/props" "$SRC/models/templates/Qwen-Qwen3-0.6B.jinja" <<'PY' || fail "Qwen3's template: $(head -c 300 "$W/props")"
import json, sys
assert json.load(open(sys.argv[1]))["chat_template"] == open(sys.argv[2]).read()
PY
ok "the synthesized models carry their family's real chat template (Qwen3, Llama 3.2)"

# --- 5. tool_choice "required" / a named function on random weights (constrained decoding)
node "$HERE/serve_tools.mjs" "http://127.0.0.1:$PORT/v1" "$NPM_DIR" required || fail "required tool calls (openai client)"
ok "openai client: tool_choice required and named, streamed and not: one call with JSON arguments"
TOOLS='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"}},"required":["city","days","metric"]}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}]'
check_required() {  # MODEL_LABEL: non-streamed and streamed through curl on the running server
  for stream in false true; do
    curl -s -N -o "$W/resp" "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d \
      "{\"messages\":[{\"role\":\"user\",\"content\":\"Go.\"}],\"tools\":$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"seed\":5,\"stream\":$stream}"
    python3 - "$W/resp" "$stream" <<'PY' || fail "$1 required call (curl, stream $stream): $(head -c 600 "$W/resp")"
import json, sys
raw, stream = open(sys.argv[1]).read(), sys.argv[2] == "true"
if stream:
    chunks = [json.loads(l[6:]) for l in raw.split("\n") if l.startswith("data: {")]
    calls, finish = {}, None
    for ch in chunks:
        for c in ch["choices"]:
            for d in c["delta"].get("tool_calls") or []:
                e = calls.setdefault(d["index"], {"name": "", "arguments": ""})
                e["name"] += d.get("function", {}).get("name") or ""
                e["arguments"] += d.get("function", {}).get("arguments") or ""
            finish = c.get("finish_reason") or finish
    calls = [calls[k] for k in sorted(calls)]
else:
    c = json.loads(raw)["choices"][0]
    finish, calls = c["finish_reason"], [t["function"] for t in c["message"]["tool_calls"]]
assert finish == "tool_calls" and len(calls) == 1 and calls[0]["name"] == "get_weather", (finish, calls)
args = json.loads(calls[0]["arguments"])
assert isinstance(args["city"], str) and isinstance(args["days"], int) and isinstance(args["metric"], bool), args
print(f"  {'streamed' if stream else 'whole'}: get_weather({calls[0]['arguments']})")
PY
  done
}
check_required Qwen3
node "$HERE/serve_tools.mjs" "http://127.0.0.1:$PORT/v1" "$NPM_DIR" schema || fail "schema-constrained tool calls, Qwen3 (openai client)"
stop
start "$LLAMA"
check_required "Llama 3.2"
node "$HERE/serve_tools.mjs" "http://127.0.0.1:$PORT/v1" "$NPM_DIR" schema || fail "schema-constrained tool calls, Llama 3.2 (openai client)"
ok "openai client: an agent's schema (optional keys, nesting, arrays, numbers, null, enums), required and named, streamed and not, on Qwen3 and Llama 3.2"
ok "curl: a named function on random weights (Qwen3, Llama 3.2), streamed and not: its required keys, typed"
stop

# --- 6. without the pinned source, make-model falls back to the plain template and says so
MZ_LLAMA_SRC="$W/no-source" "$CLI" make-model --shape tiny-qwen3 -o "$W/fallback.gguf" >/dev/null 2>"$W/fallback.log" ||
  fail "make-model without the source: $(tail -3 "$W/fallback.log")"
grep -q "real chat template not embedded" "$W/fallback.log" || fail "no note on the fallback: $(head -3 "$W/fallback.log")"
grep -q "<tool_call>" "$W/fallback.gguf" && fail "the fallback model carries tool syntax"
grep -q "im_start" "$W/fallback.gguf" || fail "the fallback model has no ChatML template"
rm -f "$W/fallback.gguf"
ok "make-model without the llama.cpp source: the plain ChatML template, with a note"
echo "check_serve_tools: all passed"
