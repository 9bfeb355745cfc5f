#!/usr/bin/env bash
# Several models, one memory budget (issue 45): `mzcache serve -m A -m B` and `mzcache chat -m A -m B`
# end to end. Loopback only; every wait is bounded; nothing is timed.
# Usage: check_serve_models.sh MZCACHE_CLI MODEL_DIR WORK_DIR (MODEL_DIR holds tiny-qwen3-q8_0.gguf and
# tiny-llama-q8_0.gguf)
# Checks, each failing the test with a message:
#   1. the reference: each model alone (a one-model server, as before several models) answers two
#      greedy turns of its conversation; a one-model server still accepts any "model" name;
#   2. two models in one server with a budget of about one and a half models: GET /v1/models lists
#      both; an unknown model is a 400 naming it and the known ones; another model's conversation is
#      a 400 naming its model; duplicate names are refused at start; --models-dir serves every GGUF
#      of a folder, an empty one is refused;
#   3. turns alternating between the models answer exactly what each model alone answered (greedy,
#      lossless codecs), the idle model's weights were given back (dropped > 0 in /v1/mzcache/pool)
#      and came back for its next turn; /metrics has mzcache_model_weights_bytes for each model and
#      tier (parsed by the Prometheus text parser when the deps cache has it); trim gives back across
#      both models;
#   4. kill -9 while a model comes back (a turn of the idle model in flight) and restart: every
#      conversation of both models is listed again with its model, and both continue exactly;
#   5. a model whose file changed on disk (touched: its mtime) is refused (409 model_changed naming
#      the file), nothing served from it; the other model still answers; the official openai client
#      lists the models, gets the 400 for an unknown one, and does not retry the 409;
#   6. `mzcache chat -m A -m B`: /model NAME switches between turns, each model keeps its
#      conversation (also in a second run), an unknown name is refused with the known ones.
set -euo pipefail
CLI=$1 MODELS=$2 W=$3
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODELS=$MZ_TEST_MODEL_DIR_OVERRIDE
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/serve_lib.sh"
rm -rf "$W" && mkdir -p "$W/m"
# Model A is a copy (section 5 changes it on disk); B is the test model itself.
cp "$MODELS/tiny-qwen3-q8_0.gguf" "$W/m/qwen-a.gguf"
A="$W/m/qwen-a.gguf" NA=qwen-a
B="$MODELS/tiny-llama-q8_0.gguf" NB=tiny-llama-q8_0
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "check_serve_models: FAILED: $*" >&2; [ -f "$W/server.log" ] && tail -20 "$W/server.log" >&2; exit 1; }
ok() { echo "check_serve_models: ok: $*"; }
COMMON=(--port 0 --port-file "$W/port" --persist-codec none --kv-codec none -c 512 --max-tokens 16 -t 1 --parallel 2
  --no-watch-pressure)
start() {  # start POOL_DIR ARGS...: starts the server, sets PID and PORT
  local dir=$1; shift
  rm -f "$W/port"
  "$CLI" serve "${COMMON[@]}" --pool-dir "$dir" "$@" >>"$W/server.log" 2>&1 &
  PID=$!
  wait_port
}
stop() { kill "$PID"; wait "$PID" || fail "the server did not exit cleanly"; PID=; }
stop9() { kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=; }
call() {  # call METHOD PATH [BODY]: body into $W/resp, status into CODE
  CODE=$(curl -s -o "$W/resp" -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' \
    ${3:+--data-binary "$3"} "http://127.0.0.1:$PORT$2")
}
expect() { [ "$CODE" = "$1" ] || fail "$2: HTTP $CODE, expected $1: $(cat "$W/resp")"; }
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
jq_() { jget "$1" <"$W/resp"; }
U1='[{"role":"user","content":"Tell me about memory."}]'
# turn MODEL CONV MESSAGES: a greedy turn; prints the reply
turn() {
  call POST /v1/chat/completions "{\"model\":\"$1\",\"conversation\":\"$2\",\"messages\":$3,\"max_tokens\":12,\"temperature\":0}"
  expect 200 "turn of $2 on $1"
  jq_ 'd["choices"][0]["message"]["content"]'
}
next_msgs() {  # next_msgs MESSAGES REPLY: the history with the reply and a new user message
  python3 -c "import json,sys; m=json.loads(sys.argv[1]); m += [{'role':'assistant','content':sys.argv[2]},{'role':'user','content':'And then?'}]; print(json.dumps(m))" "$1" "$2"
}
weights() {  # weights NAME FIELD: from the last /v1/mzcache/pool response
  jq_ "[m for m in d['models'] if m['name']=='$1'][0]['weights']['$2']"
}

# --- 1. references: each model alone
start "$W/refA" -m "$A"
RA1=$(turn anything-at-all qa "$U1")  # one model: any name is accepted, as before
UA2=$(next_msgs "$U1" "$RA1")
RA2=$(turn "$NA" qa "$UA2")
call GET /v1/models; [ "$(jq_ 'len(d["data"])')" = 1 ] || fail "a one-model server lists $(cat "$W/resp")"
stop
start "$W/refB" -m "$B"
RB1=$(turn "$NB" lb "$U1")
UB2=$(next_msgs "$U1" "$RB1")
RB2=$(turn "$NB" lb "$UB2")
stop
[ -n "$RA1" ] && [ -n "$RB1" ] || fail "empty reference replies"
ok "references: each model alone answered 2 greedy turns; a one-model server accepts any model name"

# --- 2. two models, one budget of about one and a half models
set +e
"$CLI" serve -m "$A" -m "$W/m/../m/qwen-a.gguf" --port 0 --pool-dir "$W/dup" >"$W/dup.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "two models named 'qwen-a'" "$W/dup.log" || fail "duplicate model names not refused (rc $rc): $(cat "$W/dup.log")"
mkdir -p "$W/empty" "$W/dir"
set +e
"$CLI" serve --models-dir "$W/empty" --port 0 --pool-dir "$W/dup" >"$W/empty.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "holds no .gguf file" "$W/empty.log" || fail "an empty --models-dir not refused (rc $rc): $(cat "$W/empty.log")"
ln -s "$B" "$W/dir/$NB.gguf"
ln -s "$A" "$W/dir/$NA.gguf"
echo notes >"$W/dir/README.txt"
start "$W/dirpool" --models-dir "$W/dir"
call GET /v1/models; expect 200 "models of --models-dir"
[ "$(jq_ '",".join(m["id"] for m in d["data"])')" = "$NA,$NB" ] || fail "--models-dir: $(cat "$W/resp")"
stop
ok "--models-dir serves every .gguf of the folder (sorted), an empty one is refused"
SA=$(stat -L -c %s "$A") SB=$(stat -L -c %s "$B")
BUDGET=$(( (SB + SA / 2) >> 20 ))
[ "$SA" -gt "$SB" ] && BUDGET=$(( (SA + SB / 2) >> 20 ))
start "$W/pool" -m "$A" -m "$B" --memory-budget "$BUDGET"
call GET /v1/models; expect 200 "models"
[ "$(jq_ '",".join(m["id"] for m in d["data"])')" = "$NA,$NB" ] || fail "/v1/models: $(cat "$W/resp")"
call POST /v1/chat/completions "{\"model\":\"gpt-4o\",\"messages\":$U1}"; expect 400 "unknown model"
[ "$(jq_ 'd["error"]["param"]')" = model ] && grep -q "gpt-4o" "$W/resp" && grep -q "$NA, $NB" "$W/resp" ||
  fail "unknown model: the 400 does not name it and the known ones: $(cat "$W/resp")"
ok "/v1/models lists both; duplicate names refused; unknown model: 400 naming it ($BUDGET MiB budget)"

# --- 3. alternating turns: the same answers as each model alone; the idle model gives back, returns
[ "$(turn "$NA" qa "$U1")" = "$RA1" ] || fail "$NA turn 1 differs from the one-model server's"
call POST /v1/chat/completions "{\"model\":\"$NB\",\"conversation\":\"qa\",\"messages\":$U1}"; expect 400 "another model's conversation"
grep -q "belongs to model '$NA'" "$W/resp" || fail "another model's conversation: $(cat "$W/resp")"
[ "$(turn "$NB" lb "$U1")" = "$RB1" ] || fail "$NB turn 1 differs from the one-model server's"
call GET /v1/mzcache/pool; expect 200 "pool"
dropped=$(weights "$NA" dropped)
[ "$dropped" -gt 0 ] || fail "$NA idle beside $NB in a $BUDGET MiB budget: none of its weights given back: $(jq_ 'd["models"]')"
[ "$(jq_ 'd["budget"]["memory_budget"]')" = "$((BUDGET << 20))" ] || fail "pool report: no shared budget: $(jq_ 'd.get("budget")')"
[ "$(jq_ 'd["budget"]["idle_model_weight_bytes"] > 0')" = True ] || fail "the budget gave back no idle model's weights: $(jq_ 'd["budget"]')"
[ "$(jq_ '" ".join(sorted(c["model"] for c in d["conversations"]))')" = "$NA $NB" ] || fail "conversations by model: $(jq_ 'd["conversations"]')"
[ "$(turn "$NA" qa "$UA2")" = "$RA2" ] || fail "$NA turn 2 (its weights back) differs from the one-model server's"
call GET /v1/mzcache/pool
[ "$(weights "$NA" resident)" -gt 0 ] || fail "$NA's weights did not come back: $(jq_ 'd["models"]')"
[ "$(turn "$NB" lb "$UB2")" = "$RB2" ] || fail "$NB turn 2 differs from the one-model server's"
ok "alternating turns answer as each model alone; the idle model gave back $dropped bytes of weights and they came back"
call GET /metrics; expect 200 metrics
for m in "$NA" "$NB"; do
  for t in resident page_cache evicted; do
    grep -q "^mzcache_model_weights_bytes{model=\"$m\",tier=\"$t\"} [0-9]" "$W/resp" || fail "/metrics: no $m $t weights: $(grep model_weights "$W/resp")"
  done
done
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/parse-prometheus-text-format-1.1.1
if [ -f "$NPM_DIR/node_modules/parse-prometheus-text-format/package.json" ] && command -v node >/dev/null; then
  NODE_PATH="$NPM_DIR/node_modules" node -e '
    const parse = require("parse-prometheus-text-format");
    const fams = parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const f = fams.find(x => x.name === "mzcache_model_weights_bytes");
    if (!f || f.type !== "GAUGE" || f.metrics.length !== 6) { console.error(JSON.stringify(f)); process.exit(1); }' "$W/resp" ||
    fail "the Prometheus parser does not read 6 mzcache_model_weights_bytes samples"
fi
call POST /v1/mzcache/trim '{"level": 80}'; expect 200 trim
[ "$(jq_ 'd["freed"] > 0')" = True ] || fail "trim 80 across both models freed nothing: $(jq_ "d.get('freed'), d['models'], d.get('budget')")"
[ "$(weights "$NA" resident)" -lt "$(weights "$NA" total)" ] && [ "$(weights "$NB" resident)" -lt "$(weights "$NB" total)" ] ||
  fail "trim 80 left a model whole: $(jq_ 'd["models"]')"
ok "/metrics: weights by model and tier; trim gives back across both models"

# --- 4. kill -9 while the idle model comes back, then restart: nothing lost
curl -s -H 'Content-Type: application/json' --data-binary \
  "{\"model\":\"$NA\",\"conversation\":\"victim\",\"messages\":$U1,\"max_tokens\":16,\"temperature\":0}" \
  "http://127.0.0.1:$PORT/v1/chat/completions" >/dev/null 2>&1 &
CURL=$!
for _ in $(seq 200); do  # until the turn has started (its conversation exists), or 2 s
  call GET /v1/conversations/victim
  [ "$CODE" = 200 ] && break
  sleep 0.01
done
stop9
wait "$CURL" 2>/dev/null || true
start "$W/pool" -m "$A" -m "$B" --memory-budget "$BUDGET"
call GET /v1/conversations; expect 200 conversations
for pair in "qa $NA" "lb $NB"; do
  set -- $pair
  [ "$(jq_ "[c['model'] for c in d['data'] if c['id']=='$1']")" = "['$2']" ] || fail "after kill -9: conversation $1 of $2 missing: $(cat "$W/resp")"
done
[ "$(turn "$NB" lb "$UB2")" = "$RB2" ] || fail "after kill -9: $NB's conversation does not continue exactly"
[ "$(turn "$NA" qa "$UA2")" = "$RA2" ] || fail "after kill -9: $NA's conversation does not continue exactly"
ok "kill -9 while $NA came back: every conversation of both models found again and continues exactly"

# --- 5. a model file changed on disk: refused, nothing served from it
touch -d '2001-01-01' "$A"
call POST /v1/chat/completions "{\"model\":\"$NA\",\"messages\":$U1,\"max_tokens\":4}"; expect 409 "changed model"
[ "$(jq_ 'd["error"]["code"]')" = model_changed ] && grep -q "qwen-a.gguf" "$W/resp" || fail "changed model: $(cat "$W/resp")"
[ "$(turn "$NB" lb "$UB2")" = "$RB2" ] || fail "the unchanged model stopped answering"
ok "a model whose file changed is refused (409 model_changed naming the file); the other still answers"
# The official openai client (installed into the deps cache once, as check_serve.sh does): the
# models listed, the 400 for an unknown model, an answer naming its model, and the 409 not retried
# (x-should-retry: false) although the client retries 409s by default: one request reaches the server.
OPENAI_VERSION=6.49.0
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-$OPENAI_VERSION
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "openai@$OPENAI_VERSION" >/dev/null) || fail "npm install openai@$OPENAI_VERSION"
fi
cat >"$W/models.mjs" <<'JS'
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
const [base, pkgDir, A, B] = process.argv.slice(2);
const require = createRequire(import.meta.url);
const mod = await import(pathToFileURL(require.resolve('openai', { paths: [pkgDir] })).href);
const OpenAI = mod.OpenAI ?? mod.default?.OpenAI ?? mod.default;
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 2, timeout: 60000 });
const die = (what) => { console.error(`FAILED: ${what}`); process.exit(1); };
const ids = [];
for await (const m of client.models.list()) ids.push(m.id);
if (ids.join(',') !== `${A},${B}`) die(`models.list: ${ids}`);
const messages = [{ role: 'user', content: 'Hi' }];
const refused = async (model) => {
  try { await client.chat.completions.create({ model, messages, max_tokens: 4 }); } catch (e) { return e; }
  die(`model ${model} answered`);
};
const e400 = await refused('nope');
if (e400.status !== 400 || e400.param !== 'model' || !String(e400.message).includes('nope')) die(`unknown model: ${e400}`);
const r = await client.chat.completions.create({ model: B, messages, max_tokens: 4, temperature: 0 });
if (r.model !== B || !r.choices[0].message.content) die(`${B}: ${JSON.stringify(r)}`);
const requests = async () => Number((await (await fetch(`${base}/metrics`)).text()).match(/^mzcache_requests_total (\d+)/m)[1]);
const before = await requests();
const e409 = await refused(A);
if (e409.status !== 409 || e409.code !== 'model_changed') die(`changed model: ${e409.status} ${e409.code}`);
const sent = (await requests()) - before;
if (sent !== 1) die(`the 409 was sent ${sent} times (retried)`);
console.log('openai client: ok');
JS
node "$W/models.mjs" "http://127.0.0.1:$PORT" "$NPM_DIR" "$NA" "$NB" || fail "the openai client"
stop
ok "openai@$OPENAI_VERSION client: models listed, 400 for an unknown model, the 409 not retried"

# --- 6. chat -m A -m B: /model switches, each model keeps its conversation
cp "$MODELS/tiny-qwen3-q8_0.gguf" "$A"  # a fresh file (section 5 changed it)
chat() { "$CLI" chat -m "$A" -m "$B" --pool-dir "$W/chat" -n 4 -t 1 -c 512 >"$W/chat.out" 2>&1; }
printf 'hello\n/model %s\nhi there\n/model nope\n/models\n/model %s\nagain\n/quit\n' "$NB" "$NA" | chat ||
  fail "chat with two models: $(cat "$W/chat.out")"
grep -q "\[now $NB: conversation chat, 0 tokens" "$W/chat.out" || fail "/model $NB: $(cat "$W/chat.out")"
grep -q "usage: /model NAME (one of: $NA, $NB)" "$W/chat.out" || fail "/model nope not refused: $(cat "$W/chat.out")"
grep -Eq "\[now $NA: conversation chat, [1-9][0-9]* tokens, 2 messages" "$W/chat.out" || fail "$NA lost its turn: $(cat "$W/chat.out")"
printf '/models\n/quit\n' | chat || fail "chat, second run: $(cat "$W/chat.out")"
grep -Eq "  \* $NA +[1-9][0-9]* tokens" "$W/chat.out" && grep -Eq "    $NB +[1-9][0-9]* tokens" "$W/chat.out" ||
  fail "a second chat did not find both models' conversations: $(cat "$W/chat.out")"
ok "chat -m A -m B: /model switches between turns, each model keeps its conversation across runs"
echo "check_serve_models: PASSED"
