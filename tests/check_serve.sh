#!/usr/bin/env bash
# `mzcache serve` end to end, as its users reach it: curl, the official `openai` npm client, and
# abuse from a raw socket (tests/serve_abuse.py). Loopback only; every wait is bounded.
# Usage: check_serve.sh MZCACHE_CLI MODEL.gguf WORK_DIR
# Checks, each failing the test with a message:
#   1. security by default: a non-loopback bind without a key is refused; with a key every endpoint
#      but /health answers 401 (OpenAI's error object) without it or with a wrong one; a second
#      server on the same port is refused;
#   2. clear 400s (malformed JSON, deep nesting, n=2, a path as a conversation id, an overlong
#      prompt: context_length_exceeded), 413 over --max-body, 404 JSON for unknown paths;
#   3. chat and completions, streamed and not; a resent history continues its conversation
#      (cached_tokens) instead of computing it again;
#   4. nothing forgotten: after the pool gave back all its memory (trim 80) and after a kill -9 and
#      restart, the next turn continues the stored conversation and answers exactly what a
#      conversation that never left memory answers (greedy, lossless codecs);
#   5. the openai client (chat, stream with usage, completions, typed errors);
#   6. abuse: slow client, 1000 dropped connections, garbage, disconnect mid-stream;
#   7. ENOSPC on persistence (a full tmpfs, as root): turns still answered, the failure counted,
#      and persisted once space is back;
#   8. SIGTERM: exit 0 with every conversation persisted;
#   9. EIO on restore (as root, a FUSE file system that fails reads: tests/eio_fs.py): the turn is
#      answered from the request's own history with the never-evicted logprobs, the failure is
#      counted, and another conversation restores from the same storage once reads work again.
set -euo pipefail
CLI=$1 MODEL=$2 W=$3
# The sanitizer stages share the normal build's synthesized models (as tests/test_util.cpp does).
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODEL=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$MODEL")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/serve_lib.sh"
KEY=test-key-$$
OPENAI_VERSION=6.49.0
rm -rf "$W" && mkdir -p "$W"
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  if mountpoint -q "$W/full" 2>/dev/null; then umount "$W/full" || true; fi
  if mountpoint -q "$W/eio" 2>/dev/null; then umount -l "$W/eio" || true; fi
}
trap cleanup EXIT
fail() { echo "check_serve: FAILED: $*" >&2; [ -f "$W/server.log" ] && tail -20 "$W/server.log" >&2; exit 1; }
ok() { echo "check_serve: ok: $*"; }

start() {  # start POOL_DIR [ARGS...]: starts the server, sets PID and PORT
  local dir=$1; shift
  rm -f "$W/port"
  "$CLI" serve -m "$MODEL" --port 0 --port-file "$W/port" --pool-dir "$dir" --persist-codec none --kv-codec none \
    -c 2048 --max-tokens 24 -t 1 --parallel 2 --max-body 64 --no-watch-pressure --api-key "$KEY" "$@" >>"$W/server.log" 2>&1 &
  PID=$!
  wait_port
}
stop9() { kill -9 "$PID"; wait "$PID" 2>/dev/null || true; PID=; }
# call METHOD PATH [BODY]: the body into $W/resp, the HTTP status into CODE (no subshell: use
# `call ...; x=$(jq_ 'expr')`)
call() {
  CODE=$(curl -s -o "$W/resp" -w '%{http_code}' -X "$1" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
    ${3:+--data-binary "$3"} "http://127.0.0.1:$PORT$2")
}
expect() {  # expect CODE WHAT
  [ "$CODE" = "$1" ] || fail "$2: HTTP $CODE, expected $1: $(cat "$W/resp")"
}
jget() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
jq_() { jget "$1" <"$W/resp"; }  # an expression over the last response

# --- 1. security by default
set +e
"$CLI" serve -m "$MODEL" --host 0.0.0.0 --port 0 >"$W/refused.log" 2>&1
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "API key" "$W/refused.log" || fail "a non-loopback bind without a key was not refused (rc $rc)"
ok "non-loopback bind without a key refused"
start "$W/pool"
code=$(curl -s -o "$W/resp" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/models")
[ "$code" = 401 ] && grep -q invalid_api_key "$W/resp" || fail "no key: HTTP $code"
code=$(curl -s -o "$W/resp" -w '%{http_code}' -H "Authorization: Bearer wrong" "http://127.0.0.1:$PORT/v1/mzcache/pool")
[ "$code" = 401 ] || fail "wrong key: HTTP $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
[ "$code" = 200 ] || fail "/health without a key: $code"
call GET /v1/models; MODEL_ID=$(jq_ 'd["data"][0]["id"]')
expect 200 "models"
ok "API key required (401 without or wrong); model $MODEL_ID"
# The port is the server's alone: a second server on it is refused at once (with SO_REUSEPORT it
# would bind and share the connections: timeout ends it with 124).
set +e
timeout 20 "$CLI" serve -m "$MODEL" --port "$PORT" --pool-dir "$W/second" >"$W/second.log" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] && grep -q "cannot listen" "$W/second.log" || fail "a second server on port $PORT was not refused (rc $rc)"
ok "a second server on the same port refused"

# --- 2. clear errors
call POST /v1/chat/completions '{"messages": ['; expect 400 "malformed JSON"
call POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"x\":$(printf '[%.0s' $(seq 3000))$(printf ']%.0s' $(seq 3000))}" 
expect 400 "deep nesting"
call POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"n":2}'; p=$(jq_ 'd["error"]["param"]')
expect 400 "n=2"; [ "$p" = n ] || fail "n=2: param $p"
call POST /v1/chat/completions '{"messages":[{"role":"user","content":"x"}],"conversation":"../../etc/passwd"}' 
expect 400 "a path as conversation id"
long=$(python3 -c "print(' '.join(['word'] * 6000))")
call POST /v1/chat/completions "{\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}"; c=$(jq_ 'd["error"]["code"]')
expect 400 "overlong prompt"; [ "$c" = context_length_exceeded ] || fail "overlong prompt: code $c"
python3 -c "print('{\"messages\":[{\"role\":\"user\",\"content\":\"' + 'a' * 70000 + '\"}]}')" >"$W/big.json"
code=$(curl -s -o "$W/resp" -w '%{http_code}' -H "Authorization: Bearer $KEY" --data-binary @"$W/big.json" "http://127.0.0.1:$PORT/v1/chat/completions")
[ "$code" = 413 ] && grep -q error "$W/resp" || fail "a 70 kB body over --max-body 64: HTTP $code"
call GET /v1/nothing ; expect 404 "unknown path"
grep -q '"error"' "$W/resp" || fail "404 without an error object"
ok "400s (malformed, nesting, n=2, path id, context_length_exceeded), 413, 404"

# --- 3. chat, streaming, completions, continuation
M1='[{"role":"system","content":"You are terse."},{"role":"user","content":"Tell me about memory."}]'
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":12,\"temperature\":0,\"conversation\":\"ref\"}"; r1=$(cat "$W/resp")
expect 200 "turn 1"
A1=$(jget 'd["choices"][0]["message"]["content"]' <<<"$r1")
P1=$(jget 'd["usage"]["prompt_tokens"]' <<<"$r1")
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":12,\"temperature\":0,\"conversation\":\"evicted\"}" 
expect 200 "turn 1 (second conversation)"
M2=$(python3 -c "import json,sys; m=json.loads(sys.argv[1]); m += [{'role':'assistant','content':sys.argv[2]},{'role':'user','content':'And then?'}]; print(json.dumps(m))" "$M1" "$A1")
LP='"logprobs":true,"top_logprobs":3'
call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":12,\"temperature\":0,$LP,\"conversation\":\"ref\"}"; r2=$(cat "$W/resp")
expect 200 "turn 2 (in memory)"
REF2=$(jget 'd["choices"][0]["message"]["content"]' <<<"$r2")
cached=$(jget 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$r2")
[ "$cached" -ge "$((P1 - 1))" ] || fail "turn 2 computed the resent history again (cached $cached, turn 1 prompt $P1)"
# Implicit routing: no conversation named, the history finds it.
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":8,\"temperature\":0}"; r=$(cat "$W/resp")
conv=$(jget 'd["mzcache"]["conversation"]' <<<"$r")
A=$(jget 'd["choices"][0]["message"]["content"]' <<<"$r")
M=$(python3 -c "import json,sys; m=json.loads(sys.argv[1]); m += [{'role':'assistant','content':sys.argv[2]},{'role':'user','content':'Go on.'}]; print(json.dumps(m))" "$M1" "$A")
call POST /v1/chat/completions "{\"messages\":$M,\"max_tokens\":8,\"temperature\":0}"; r=$(cat "$W/resp")
[ "$(jget 'd["mzcache"]["conversation"]' <<<"$r")" = "$conv" ] || fail "a resent history went to another conversation"
[ "$(jget 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$r")" -gt 0 ] || fail "implicit continuation computed everything"
curl -sN -H "Authorization: Bearer $KEY" --data-binary "{\"messages\":$M1,\"max_tokens\":6,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
  "http://127.0.0.1:$PORT/v1/chat/completions" >"$W/stream.txt"
grep -q '^data: \[DONE\]' "$W/stream.txt" || fail "stream without [DONE]"
grep -q '"chat.completion.chunk"' "$W/stream.txt" || fail "stream without chunks"
grep -q '"usage"' "$W/stream.txt" || fail "stream without the usage chunk"
call POST /v1/completions '{"prompt":"Once upon a time","max_tokens":4}'; grep -q text_completion "$W/resp" || fail "completions"
ok "chat, stream, completions; a resent history continues its conversation ($cached of $P1+ tokens cached)"

# same_logprobs RESPONSE: the response's logprobs (every token, its 3 alternatives) equal turn 2's in
# memory ($r2) within 1e-4: the logits, not only the greedy text, are those of a conversation that
# never left memory (lossless codecs).
same_logprobs() {
  python3 - "$r2" "$1" <<'PY' || fail "$2: logprobs differ from the never-evicted conversation's"
import json, sys
a, b = (json.loads(x)["choices"][0]["logprobs"]["content"] for x in sys.argv[1:3])
assert len(a) == len(b) and a, (len(a), len(b))
d = max(max(abs(x["logprob"] - y["logprob"]), *(abs(p["logprob"] - q["logprob"]) for p, q in zip(x["top_logprobs"], y["top_logprobs"])))
        for x, y in zip(a, b))
assert all(x["token"] == y["token"] and [p["token"] for p in x["top_logprobs"]] == [q["token"] for q in y["top_logprobs"]]
           for x, y in zip(a, b))
assert d <= 1e-4, d
print(f"check_serve: logprobs of {len(a)} tokens x 4 within {d:.1e} of the never-evicted conversation's")
PY
}

# --- 4. nothing forgotten: trim everything, then kill -9 and restart
wait_persisted() {  # every conversation's stored tokens == its tokens
  for _ in $(seq 300); do
    call GET /v1/mzcache/pool
    if python3 <"$W/resp" -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if all(c['stored_tokens']==c['tokens'] and not c['busy'] for c in d['conversations']) else 1)"; then return 0; fi
    sleep 0.1
  done
  fail "conversations not persisted within 30 s"
}
call POST /v1/mzcache/trim '{"level": 80}'; freed=$(jq_ 'd["freed"]')
expect 200 "trim"
[ "$freed" -gt 0 ] || fail "trim 80 gave nothing back"
call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":12,\"temperature\":0,$LP,\"conversation\":\"evicted\"}"; r=$(cat "$W/resp")
same_logprobs "$r" "after trim"
[ "$(jget 'd["choices"][0]["message"]["content"]' <<<"$r")" = "$REF2" ] || fail "after trim: '$(jget 'd["choices"][0]["message"]["content"]' <<<"$r")' != '$REF2'"
[ "$(jget 'd["mzcache"]["units_restored"]' <<<"$r")" -gt 0 ] || fail "after trim nothing was restored"
ok "after the pool gave back $freed bytes, turn 2 answers exactly as in memory"
# The same once more, from a restart after kill -9: a third conversation at turn 1.
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":12,\"temperature\":0,\"conversation\":\"restarted\"}"
wait_persisted
[ -n "${MZ_DEBUG:-}" ] && { ls "$W/pool"; cat "$W/resp"; }
stop9
start "$W/pool"
call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":12,\"temperature\":0,$LP,\"conversation\":\"restarted\"}"; r=$(cat "$W/resp")
expect 200 "after restart"
same_logprobs "$r" "after kill -9 and restart"
[ "$(jget 'd["choices"][0]["message"]["content"]' <<<"$r")" = "$REF2" ] || fail "after kill -9 and restart: a different answer"
cached=$(jget 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$r")
[ "$cached" -ge "$((P1 - 1))" ] || fail "after restart the history was computed again (cached $cached)"
[ "$(jget 'd["mzcache"]["bytes_from_storage"]' <<<"$r")" -gt 0 ] || fail "after restart nothing came from storage"
# Implicitly too: the router knows the stored histories after a restart.
call POST /v1/chat/completions "{\"messages\":$M,\"max_tokens\":4,\"temperature\":0}"; r=$(cat "$W/resp")
[ "$(jget 'd["mzcache"]["conversation"]' <<<"$r")" = "$conv" ] || fail "after restart a resent history went to another conversation"
ok "after kill -9 and restart: stored conversations continued from storage ($cached tokens cached), same answer"

# A stored conversation damaged on disk (bytes flipped across its file while the server was down):
# the next turn is answered from the request's own history, never from the damaged data.
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":6,\"temperature\":0,\"conversation\":\"flipped\"}"
wait_persisted
stop9
python3 - "$W/pool/flipped.mzs" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
for k in range(10):
    b[int(len(b) * (0.3 + 0.065 * k))] ^= 0x5A
open(p, 'wb').write(bytes(b))
PY
start "$W/pool"
call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":6,\"temperature\":0,\"conversation\":\"flipped\"}"; r=$(cat "$W/resp")
expect 200 "a turn on a damaged stored conversation"
[ "$(jget 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$r")" = 0 ] || fail "a damaged conversation's data was used"
call GET /v1/mzcache/pool
jq_ 'len(d["damaged_files"]) + d["server"]["recovered"]' | grep -qv '^0$' || fail "the damage was neither reported nor recovered from"
ok "a damaged stored conversation: answered from the request's history ($(jq_ 'str(len(d["damaged_files"])) + " damaged at open, " + str(d["server"]["recovered"]) + " recovered"'))"
# The pool report carries the batched pass's figures (continuous batching, 0.13): after turns, steps ran.
jq_ 'd["batch"]["batching"] and d["batch"]["steps"] > 0 and d["batch"]["tokens"] >= d["batch"]["steps"] and d["batch"]["max_batch"] >= 1' \
  | grep -q True || fail "the pool report has no batch figures after turns"
ok "batch figures in the pool report ($(jq_ 'str(d["batch"]["steps"]) + " steps, mean batch " + str(round(d["batch"]["mean_batch"], 2))'))"

# --- 5. the openai client
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-$OPENAI_VERSION
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "openai@$OPENAI_VERSION" >/dev/null) || fail "npm install openai@$OPENAI_VERSION"
fi
node "$HERE/serve_openai.mjs" "http://127.0.0.1:$PORT/v1" "$KEY" "$NPM_DIR" || fail "the openai client"
ok "openai@$OPENAI_VERSION client"
# docs/server.md's example as a user runs it: examples/openai_chat.mjs copied into a folder of its
# own beside the client's node_modules, the key in $OPENAI_API_KEY; its second turn continues the first.
mkdir -p "$W/openai-example" && cp "$HERE/../examples/openai_chat.mjs" "$W/openai-example/"
ln -sfn "$NPM_DIR/node_modules" "$W/openai-example/node_modules"
(cd "$W/openai-example" && OPENAI_API_KEY=$KEY node openai_chat.mjs "http://127.0.0.1:$PORT/v1") >"$W/example.txt" 2>&1 \
  || { cat "$W/example.txt" >&2; fail "examples/openai_chat.mjs"; }
cached=$(sed -n 's/^second turn: \([0-9]*\) of [0-9]* prompt tokens cached$/\1/p' "$W/example.txt")
[ "${cached:-0}" -gt 0 ] || { cat "$W/example.txt" >&2; fail "examples/openai_chat.mjs: the second turn did not continue the first"; }
ok "examples/openai_chat.mjs ($cached prompt tokens cached on its second turn)"

# --- 6. abuse
python3 "$HERE/serve_abuse.py" "$PORT" "$KEY" "$PID" --connections "${MZ_SERVE_CONNECTIONS:-1000}" || fail "abuse"
kill -0 "$PID" || fail "the server died under abuse"
ok "abuse survived"

# --- 8. SIGTERM persists and exits 0
call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":4,\"conversation\":\"last\"}"
kill -TERM "$PID"
rc=0
wait "$PID" || rc=$?
PID=
[ "$rc" = 0 ] || fail "SIGTERM: exit $rc"
ls "$W/pool/last.mzs" >/dev/null 2>&1 || fail "SIGTERM: conversation 'last' not persisted"
ok "SIGTERM: exit 0, persisted"

# --- 7. ENOSPC on persistence (root only: a 2 MiB tmpfs)
if [ "$(id -u)" = 0 ] && mkdir -p "$W/full" && mount -t tmpfs -o size=2m tmpfs "$W/full" 2>/dev/null; then
  start "$W/full/pool" --disk-budget 0
  dd if=/dev/zero of="$W/full/filler" bs=64k 2>/dev/null || true  # the disk is now full
  call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":6,\"conversation\":\"nospace\"}"; r=$(cat "$W/resp")
  expect 200 "a turn on a full disk"
  for _ in $(seq 100); do
    call GET /v1/mzcache/pool; pf=$(jq_ 'd["pool"]["persist_failures"]')
    [ "$pf" -gt 0 ] && break
    sleep 0.1
  done
  [ "$pf" -gt 0 ] || fail "a full disk did not count a persist failure"
  rm -f "$W/full/filler"
  call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":6,\"conversation\":\"nospace\"}"
  expect 200 "a turn once space is back"
  wait_persisted
  stop9
  umount "$W/full"
  ok "ENOSPC: answered, $pf persist failures counted, persisted once space was back"
else
  echo "check_serve: skipped: ENOSPC (needs root to mount a tmpfs)"
fi
# --- 9. EIO on restore: the pool's folder on a FUSE file system whose reads fail while a control
# file exists (a real kernel EIO, not an injected status)
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ] && /usr/bin/python3 -c 'import fusepy' 2>/dev/null; then
  mkdir -p "$W/eio-back" "$W/eio"
  rm -f "$W/eio.ctl" "$W/eio.ctl.count"
  /usr/bin/python3 "$HERE/eio_fs.py" "$W/eio-back" "$W/eio" "$W/eio.ctl" >"$W/eiofs.log" 2>&1 &
  for _ in $(seq 100); do mountpoint -q "$W/eio" && break; sleep 0.1; done
  mountpoint -q "$W/eio" || fail "the FUSE file system did not mount: $(cat "$W/eiofs.log")"
  start "$W/eio/pool"
  for c in ea eb; do
    call POST /v1/chat/completions "{\"messages\":$M1,\"max_tokens\":12,\"temperature\":0,\"conversation\":\"$c\"}"
    expect 200 "turn 1 of $c on the FUSE folder"
  done
  wait_persisted
  call POST /v1/mzcache/trim '{"level": 80}'; expect 200 "trim"
  call GET /v1/mzcache/pool; rec0=$(jq_ 'd["server"]["recovered"]')
  touch "$W/eio.ctl"
  call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":12,\"temperature\":0,$LP,\"conversation\":\"ea\"}"; r=$(cat "$W/resp")
  expect 200 "a turn whose restore reads fail with EIO"
  [ -s "$W/eio.ctl.count" ] || fail "no read failed: the turn did not read the storage"
  same_logprobs "$r" "a turn recomputed after EIO"
  call GET /v1/mzcache/pool; rec1=$(jq_ 'd["server"]["recovered"]')
  [ "$rec1" -gt "$rec0" ] || fail "an EIO on restore was not counted as a recovery ($rec0 -> $rec1)"
  rm -f "$W/eio.ctl"
  call POST /v1/chat/completions "{\"messages\":$M2,\"max_tokens\":12,\"temperature\":0,$LP,\"conversation\":\"eb\"}"; r=$(cat "$W/resp")
  expect 200 "the other conversation once reads work"
  same_logprobs "$r" "the other conversation after the EIO"
  [ "$(jget 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <<<"$r")" -ge "$((P1 - 1))" ] ||
    fail "the other conversation was computed again instead of restored"
  [ "$(jget 'd["mzcache"]["units_restored"]' <<<"$r")" -gt 0 ] || fail "the other conversation restored nothing"
  kill -0 "$PID" || fail "the server died"
  ok "EIO on restore ($(cat "$W/eio.ctl.count") failed reads): answered from the request's history, recovery counted; the other conversation restored"
  stop9
  umount "$W/eio" || umount -l "$W/eio"
else
  echo "check_serve: skipped: EIO (needs root, /dev/fuse and python3-fusepy)"
fi
echo "check_serve: all checks passed"
