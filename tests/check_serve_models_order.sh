#!/usr/bin/env bash
# Several models, one memory budget (issue 45): `mzcache serve -m A -m B` gives back across both
# models in the shared order (src/pool/shared_budget.h), seen from outside through
# /v1/mzcache/pool. Loopback only; every wait is bounded; nothing is timed.
# Usage: check_serve_models_order.sh MZCACHE_CLI MODEL_DIR WORK_DIR (MODEL_DIR holds
# tiny-qwen3-q8_0.gguf and tiny-llama-q8_0.gguf)
# Checks, each failing the test with a message:
#   1. with a budget that holds both models (no budget pass gives anything back), after a turn of A
#      then of B (both idle now, A the least recently used), POST /v1/mzcache/evict of 1 byte at a
#      time takes, in this order: A's conversation whole, then B's conversation whole (idle
#      conversations of every idle model before any weights), then some of A's weights and none of
#      B's; then A's weights whole before any of B's;
#   2. pressure (/v1/mzcache/trim at levels 5, then 15, from a fresh state: both conversations and
#      weights resident, B now the least recently used) follows the same order at every step: no
#      weights before every idle conversation is out, none of A's (the more recent) weights
#      before all of B's, and trim 80 leaves neither model whole.
# That the weights go back to front (later layers first, the base unit last) is checked in the
# library (tests/test_shared_budget.cpp): the pool report counts units, not which ones.
set -euo pipefail
CLI=$1 MODELS=$2 W=$3
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODELS=$MZ_TEST_MODEL_DIR_OVERRIDE
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/serve_lib.sh"
rm -rf "$W" && mkdir -p "$W"
A="$MODELS/tiny-qwen3-q8_0.gguf" NA=tiny-qwen3-q8_0
B="$MODELS/tiny-llama-q8_0.gguf" NB=tiny-llama-q8_0
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "check_serve_models_order: FAILED: $*" >&2; [ -f "$W/server.log" ] && tail -20 "$W/server.log" >&2; exit 1; }
ok() { echo "check_serve_models_order: ok: $*"; }
start() {  # start POOL_DIR: a server of both models with a budget that holds both
  rm -f "$W/port"
  "$CLI" serve --port 0 --port-file "$W/port" --persist-codec none --kv-codec none -c 512 --max-tokens 8 -t 1 \
    --no-watch-pressure --pool-dir "$1" -m "$A" -m "$B" --memory-budget 4096 >>"$W/server.log" 2>&1 &
  PID=$!
  wait_port
}
stop() { kill "$PID"; wait "$PID" || fail "the server did not exit cleanly"; PID=; }
call() {  # call METHOD PATH [BODY]: body into $W/resp, status into CODE
  CODE=$(curl -s -o "$W/resp" -w '%{http_code}' -X "$1" -H 'Content-Type: application/json' \
    ${3:+--data-binary "$3"} "http://127.0.0.1:$PORT$2")
}
expect() { [ "$CODE" = "$1" ] || fail "$2: HTTP $CODE, expected $1: $(cat "$W/resp")"; }
U1='[{"role":"user","content":"Tell me about memory and what it holds."}]'
turn() {  # turn MODEL CONV
  call POST /v1/chat/completions "{\"model\":\"$1\",\"conversation\":\"$2\",\"messages\":$U1,\"max_tokens\":6,\"temperature\":0}"
  expect 200 "turn of $2 on $1"
}
# state: from the last pool report, "kvA kvB droppedA droppedB totalA totalB" (kv: the model's
# conversation's resident bytes; dropped/total: its weights)
state() {
  python3 - "$W/resp" "$NA" "$NB" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
out = []
for n in sys.argv[2:]:
    out.append(sum(c["kv_resident"] for c in d["conversations"] if c["model"] == n))
for n in sys.argv[2:]:
    out.append([m for m in d["models"] if m["name"] == n][0]["weights"]["dropped"])
for n in sys.argv[2:]:
    out.append([m for m in d["models"] if m["name"] == n][0]["weights"]["total"])
print(*out)
PY
}
# order OLDER NEWER WHAT: the shared order holds in the last report, OLDER the least recently used
# model: weights only once every conversation is out; NEWER's weights only once OLDER's are all out.
order() {
  read -r kvA kvB dA dB tA tB <<<"$(state)"
  local kvO kvN dO dN tO
  if [ "$1" = A ]; then kvO=$kvA kvN=$kvB dO=$dA dN=$dB tO=$tA; else kvO=$kvB kvN=$kvA dO=$dB dN=$dA tO=$tB; fi
  if [ "$dO" -gt 0 ] || [ "$dN" -gt 0 ]; then
    [ "$kvO" = 0 ] && [ "$kvN" = 0 ] || fail "$3: weights given back (older $dO, newer $dN) before every idle conversation (kv $kvO, $kvN)"
  fi
  if [ "$kvO" -gt 0 ]; then [ "$kvN" -gt 0 ] || fail "$3: the newer model's conversation went before the older's"; fi
  if [ "$dN" -gt 0 ]; then [ "$dO" = "$tO" ] || fail "$3: the newer model's weights ($dN) before all the older's ($dO of $tO)"; fi
}

# --- 1. mz_budget_evict, a byte at a time: the order step by step
start "$W/pool"
turn "$NA" qa
turn "$NB" lb
call GET /v1/mzcache/pool; expect 200 pool
read -r kvA0 kvB0 dA0 dB0 tA tB <<<"$(state)"
[ "$kvA0" -gt 0 ] && [ "$kvB0" -gt 0 ] && [ "$dA0" = 0 ] && [ "$dB0" = 0 ] ||
  fail "a budget of both models gave something back already: kv $kvA0 $kvB0, dropped $dA0 $dB0"
call POST /v1/mzcache/evict '{"bytes": 1}'; expect 200 "evict 1"
read -r kvA kvB dA dB _ _ <<<"$(state)"
[ "$kvA" = 0 ] && [ "$kvB" = "$kvB0" ] && [ "$dA" = 0 ] && [ "$dB" = 0 ] ||
  fail "first evict: A's conversation whole, nothing else, expected: kv $kvA $kvB, dropped $dA $dB"
call POST /v1/mzcache/evict '{"bytes": 1}'; expect 200 "evict 2"
read -r kvA kvB dA dB _ _ <<<"$(state)"
[ "$kvB" = 0 ] && [ "$dA" = 0 ] && [ "$dB" = 0 ] ||
  fail "second evict: B's conversation (every idle conversation before weights), expected: kv $kvA $kvB, dropped $dA $dB"
call POST /v1/mzcache/evict '{"bytes": 1}'; expect 200 "evict 3"
read -r kvA kvB dA dB _ _ <<<"$(state)"
[ "$dA" -gt 0 ] && [ "$dA" -lt "$tA" ] && [ "$dB" = 0 ] ||
  fail "third evict: some of A's weights and none of B's expected: dropped $dA of $tA, $dB"
call POST /v1/mzcache/evict "{\"bytes\": $((tA - dA))}"; expect 200 "evict the rest of A"
read -r kvA kvB dA dB _ _ <<<"$(state)"
[ "$dA" = "$tA" ] || fail "evicting the rest of A's weights left some: $dA of $tA (B: $dB)"
[ "$(python3 -c "import json; d=json.load(open('$W/resp')); b=d['budget']; print(b['idle_model_kv_bytes'] > 0 and b['idle_model_weight_bytes'] > 0 and b['evict_calls'] == 4)")" = True ] ||
  fail "the budget report does not count the steps: $(python3 -c "import json; print(json.load(open('$W/resp'))['budget'])")"
ok "evict: A's conversation, then B's, then A's weights ($dA bytes) before any of B's ($dB)"

# --- 2. pressure from a fresh state: B then A (A the more recent)
turn "$NB" lb
turn "$NA" qa
call GET /v1/mzcache/pool
read -r kvA kvB dA dB _ _ <<<"$(state)"
[ "$kvA" -gt 0 ] && [ "$kvB" -gt 0 ] && [ "$dA" = 0 ] && [ "$dB" = 0 ] || fail "not whole again after two turns: kv $kvA $kvB, dropped $dA $dB"
for level in 5 15; do
  call POST /v1/mzcache/trim "{\"level\": $level}"; expect 200 "trim $level"
  [ "$(python3 -c "import json; print(json.load(open('$W/resp'))['freed'] > 0)")" = True ] || fail "trim $level freed nothing"
  order B A "trim $level"
  read -r kvA kvB dA dB _ _ <<<"$(state)"
  echo "check_serve_models_order: trim $level: kv A $kvA B $kvB, weights dropped A $dA B $dB"
done
[ "$kvB" = 0 ] || fail "trim 5 and 15 left B's (the older) conversation resident: $kvB"
call POST /v1/mzcache/trim '{"level": 80}'; expect 200 "trim 80"
order B A "trim 80"
read -r kvA kvB dA dB tA tB <<<"$(state)"
[ "$dA" -gt 0 ] && [ "$dB" = "$tB" ] || fail "trim 80: B's weights all out and some of A's expected: A $dA of $tA, B $dB of $tB"
stop
ok "trim 5, 15, 80: the older model's conversation, every conversation before weights, the older model's weights before the newer's"
echo "check_serve_models_order: PASSED"
