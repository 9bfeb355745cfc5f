#!/usr/bin/env bash
# A fleet end to end (issue 47, docs/fleet.md): scripts/fleet.sh starts redis-server (AOF on), three
# `mzcache serve --remote` and nginx (affinity by X-Mz-Conversation); the official `openai` npm client
# holds a conversation through nginx (tests/fleet_openai.mjs). A reference server (no fleet, never
# killed) gets the same requests. Lossless codecs, greedy replies. Checks:
#   1. turns 1 and 2 go to one server (affinity) and answer as the reference does;
#   2. once its turn is in Redis, that server is killed (kill -9): turn 3 is answered by another
#      server, with cached_tokens covering at least turn 2's prompt, and the same greedy reply as
#      the reference;
#   3. Redis down: a new conversation is still answered (as the reference does), that server's
#      /health says degraded and /metrics mzcache_remote_degraded 1; Redis back (its AOF): the
#      write-behind catches up (health ok, nothing pending, the conversation's manifest in Redis).
# Loopback only; every wait is bounded. Skipped (77) without redis-server or nginx.
# Usage: check_fleet.sh MZCACHE_CLI MODEL.gguf WORK_DIR
set -euo pipefail
CLI=$1 MODEL=$2 W=$3
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODEL=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$MODEL")
HERE=$(cd "$(dirname "$0")" && pwd)
FLEET=$HERE/../scripts/fleet.sh
OPENAI_VERSION=6.49.0
command -v redis-server >/dev/null || { echo "check_fleet: SKIPPED: no redis-server (scripts/deps.sh installs it)"; exit 77; }
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "check_fleet: SKIPPED: no nginx"; exit 77; }
rm -rf "$W" && mkdir -p "$W"
F=$W/fleet
REF_PID=
cleanup() {
  [ -n "$REF_PID" ] && { kill -9 "$REF_PID" 2>/dev/null; wait "$REF_PID" 2>/dev/null; } || true
  "$FLEET" stop "$F" >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() {
  echo "check_fleet: FAILED: $*" >&2
  for f in "$F"/server-*.log "$W/ref.log"; do [ -f "$f" ] && { echo "--- $f" >&2; tail -8 "$f" >&2; }; done
  exit 1
}
ok() { echo "check_fleet: ok: $*"; }

NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-$OPENAI_VERSION
if [ ! -f "$NPM_DIR/node_modules/openai/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "openai@$OPENAI_VERSION" >/dev/null) || fail "npm install openai@$OPENAI_VERSION"
fi

ARGS="--persist-codec none --kv-codec none -c 2048 -t 1 --parallel 2"
MZ_CLI=$CLI MZ_MODEL=$MODEL MZ_FLEET_PORT=0 MZ_FLEET_SERVE_ARGS=$ARGS "$FLEET" start "$F" || fail "scripts/fleet.sh start"
LB=http://127.0.0.1:$(cat "$F/lb.port")/v1
# shellcheck disable=SC2086
"$CLI" serve -m "$MODEL" --port 0 --port-file "$W/ref.port" --pool-dir "$W/ref-pool" --no-watch-pressure $ARGS \
  >"$W/ref.log" 2>&1 &
REF_PID=$!
for _ in $(seq 600); do [ -s "$W/ref.port" ] && break; kill -0 "$REF_PID" 2>/dev/null || fail "the reference server exited"; sleep 0.1; done
[ -s "$W/ref.port" ] || fail "the reference server did not listen"
REF=http://127.0.0.1:$(cat "$W/ref.port")/v1

turn() {  # turn URL ID MESSAGES_FILE OUT
  node "$HERE/fleet_openai.mjs" "$1" "$NPM_DIR" "$2" "$3" >"$4" || fail "a turn of $2 through $1: $(cat "$4")"
}
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
extend() {  # extend IN REPLY_JSON USER_TEXT OUT: the history plus the reply and a new user message
  python3 - "$@" <<'PY'
import json, sys
msgs = json.load(open(sys.argv[1]))
msgs.append({"role": "assistant", "content": json.load(open(sys.argv[2]))["text"]})
msgs.append({"role": "user", "content": sys.argv[3]})
json.dump(msgs, open(sys.argv[4], "w"))
PY
}
server_of() {  # the fleet's server index whose port answered (nginx's X-Mz-Upstream "127.0.0.1:PORT")
  local up=${1##*:} i
  for i in 1 2 3; do [ "$(cat "$F/server-$i.port")" = "$up" ] && { echo "$i"; return; }; done
  echo 0
}
health() { curl -s --max-time 5 "http://127.0.0.1:$(cat "$F/server-$1.port")/health"; }

# A system prompt of a few 256-token chunks, then three turns.
python3 - "$W/m1.json" <<'PY'
import json, sys
sysmsg = " ".join(f"Rule {i}: answer briefly, cite the source, and keep the tone plain." for i in range(60))
json.dump([{"role": "system", "content": sysmsg}, {"role": "user", "content": "What is a fleet?"}], open(sys.argv[1], "w"))
PY
ID=fleet-conv-1
turn "$LB" $ID "$W/m1.json" "$W/r1.json"
turn "$REF" $ID "$W/m1.json" "$W/ref1.json"
[ "$(field "$W/r1.json" text)" = "$(field "$W/ref1.json" text)" ] || fail "turn 1 differs from the reference"
extend "$W/m1.json" "$W/r1.json" "And a load balancer?" "$W/m2.json"
turn "$LB" $ID "$W/m2.json" "$W/r2.json"
turn "$REF" $ID "$W/m2.json" "$W/ref2.json"
S1=$(server_of "$(field "$W/r1.json" upstream)") S2=$(server_of "$(field "$W/r2.json" upstream)")
[ "$S1" != 0 ] && [ "$S1" = "$S2" ] || fail "turns 1 and 2 went to servers $S1 and $S2 (no affinity)"
[ "$(field "$W/r2.json" text)" = "$(field "$W/ref2.json" text)" ] || fail "turn 2 differs from the reference"
ok "turns 1 and 2 on server $S1 (affinity by X-Mz-Conversation), as the reference"

# Its turn 2 in Redis (the write-behind: local persist, then the remote tier), then kill -9.
for _ in $(seq 300); do
  health "$S1" | python3 -c 'import json,sys; h=json.load(sys.stdin); sys.exit(0 if h["remote"]["pending"]==0 and not h["remote"]["degraded"] else 1)' &&
    curl -s "http://127.0.0.1:$(cat "$F/server-$S1.port")/metrics" | grep '^mzcache_remote_manifests_written_total [1-9]' >/dev/null && break
  sleep 0.1
done
curl -s "http://127.0.0.1:$(cat "$F/server-$S1.port")/metrics" | grep '^mzcache_remote_manifests_written_total [1-9]' >/dev/null ||
  fail "server $S1 wrote nothing to Redis within 30 s: $(health "$S1")"
kill -9 "$(cat "$F/server-$S1.pid")"
extend "$W/m2.json" "$W/r2.json" "Thanks. One more?" "$W/m3.json"
turn "$LB" $ID "$W/m3.json" "$W/r3.json"
turn "$REF" $ID "$W/m3.json" "$W/ref3.json"
S3=$(server_of "$(field "$W/r3.json" upstream)")
[ "$S3" != 0 ] && [ "$S3" != "$S1" ] || fail "turn 3 was answered by server $S3 after server $S1 was killed"
C3=$(field "$W/r3.json" cached_tokens) P2=$(field "$W/r2.json" prompt_tokens)
[ "$C3" -ge "$P2" ] || fail "turn 3 on server $S3 reused $C3 tokens, fewer than turn 2's prompt ($P2)"
[ "$(field "$W/r3.json" text)" = "$(field "$W/ref3.json" text)" ] || fail "turn 3 differs from the reference: $(cat "$W/r3.json") vs $(cat "$W/ref3.json")"
ok "server $S1 killed: turn 3 on server $S3, $C3 cached tokens (turn 2's prompt: $P2; the reference: $(field "$W/ref3.json" cached_tokens)), the reference's reply"
echo "check_fleet: turn 3 (figures, not checked): fleet server $S3 (fetched from Redis) request $(field "$W/r3.json" wall_s) s, TTFT $(field "$W/r3.json" ttft_s) s; reference (in memory) request $(field "$W/ref3.json" wall_s) s, TTFT $(field "$W/ref3.json" ttft_s) s"

# Turn 3's own write done (its server has nothing pending), the chunk keys are counted: the next
# conversation shares the system prompt, whose chunks must not be stored again.
for _ in $(seq 300); do
  health "$S3" | python3 -c 'import json,sys; h=json.load(sys.stdin); sys.exit(0 if h["remote"]["pending"]==0 else 1)' && break
  sleep 0.1
done
RPORT=$(cat "$F/redis.port")
K1=$(redis-cli -p "$RPORT" --scan --pattern 'mz:*:k:*' | wc -l)

# Redis down: answered all the same, degraded; back: caught up.
"$FLEET" redis-stop "$F" >/dev/null 2>&1
ID2=fleet-conv-2
turn "$LB" $ID2 "$W/m1.json" "$W/r4.json"
turn "$REF" $ID2 "$W/m1.json" "$W/ref4.json"
[ "$(field "$W/r4.json" text)" = "$(field "$W/ref4.json" text)" ] || fail "with Redis down the reply differs from the reference"
S4=$(server_of "$(field "$W/r4.json" upstream)")
[ "$S4" != 0 ] || fail "no upstream for turn 4"
health "$S4" | grep '"status":"degraded"' >/dev/null || fail "server $S4's /health with Redis down: $(health "$S4")"
curl -s "http://127.0.0.1:$(cat "$F/server-$S4.port")/metrics" | grep '^mzcache_remote_degraded 1' >/dev/null || fail "no mzcache_remote_degraded 1"
ok "Redis down: answered by server $S4 as the reference, /health degraded, /metrics mzcache_remote_degraded 1"
"$FLEET" redis-start "$F" >/dev/null 2>&1
for _ in $(seq 300); do
  health "$S4" | python3 -c 'import json,sys; h=json.load(sys.stdin); sys.exit(0 if h["status"]=="ok" and h["remote"]["pending"]==0 else 1)' && break
  sleep 0.1
done
health "$S4" | grep '"status":"ok"' >/dev/null || fail "server $S4 did not catch up within 30 s: $(health "$S4")"
RPORT=$(cat "$F/redis.port")
redis-cli -p "$RPORT" --scan --pattern "mz:*:m:{$ID2}" | grep . >/dev/null || fail "conversation $ID2 is not in Redis after it came back"
redis-cli -p "$RPORT" --scan --pattern "mz:*:m:{$ID}" | grep . >/dev/null || fail "conversation $ID was lost by Redis's restart (AOF)"
ok "Redis back: server $S4 caught up ($ID2 in Redis), $ID kept by the AOF"
K2=$(redis-cli -p "$RPORT" --scan --pattern 'mz:*:k:*' | wc -l)
P4=$(field "$W/r4.json" prompt_tokens)
[ $((K2 - K1)) -lt $((P4 / 256)) ] || fail "$ID2 added $((K2 - K1)) chunk keys; its $((P4 / 256)) system-prompt chunks were already there"
ok "$ID2 shares $ID's system prompt: $((K2 - K1)) chunk keys added for its $((P4 / 256)) full chunks ($K2 in all)"
echo "check_fleet: all checks passed"
