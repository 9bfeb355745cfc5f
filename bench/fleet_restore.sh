#!/usr/bin/env bash
# One conversation's next turn on a fresh server: from local storage (a copy of a pool folder that
# holds it), from Redis (an empty pool folder, --remote: the manifest and chunk heads at open, the
# layers streamed while it restores) and recomputed (an empty pool folder, no remote), alternated
# in that order each round: the request's wall time (the Redis fetch included) and the server's
# TTFT. A one-off figure, not a test; after tests/check_fleet.sh, whose work folder has all it needs
# (the reference server's pool, the fleet's Redis AOF, the messages).
# Usage: bench/fleet_restore.sh [FLEET_WORK_DIR (default build/fleet)] [ROUNDS (default 3)]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
R=$(cd "$(dirname "$0")/.." && pwd)
W=${1:-$R/build/fleet} N=${2:-3}
CLI=$R/build/mzcache MODEL=$R/build/test-models/tiny-qwen3-q8_0.gguf
NPM=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-6.49.0
M=$(mktemp -d)
RPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cp -r "$W/fleet/redis" "$M/redis"
redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$M/redis" --appendonly yes --save "" --daemonize no >/dev/null 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; rm -rf "$M"' EXIT
for _ in $(seq 100); do redis-cli -p "$RPORT" ping 2>/dev/null | grep PONG >/dev/null && break; sleep 0.1; done
ARGS="--persist-codec none --kv-codec none -c 2048 -t 1 --parallel 2 --no-watch-pressure"
run() {  # run LOG EXTRA...: one server, one turn of fleet-conv-1 (messages m3.json), its JSON line
  local log=$1; shift
  rm -f "$M/port"
  # shellcheck disable=SC2086
  "$CLI" serve -m "$MODEL" --port 0 --port-file "$M/port" $ARGS "$@" >>"$M/$log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do [ -s "$M/port" ] && break; sleep 0.1; done
  node "$R/tests/fleet_openai.mjs" "http://127.0.0.1:$(cat "$M/port")/v1" "$NPM" fleet-conv-1 "$W/m3.json"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$N"); do
  rm -rf "$M/local" "$M/remote" "$M/none"
  cp -r "$W/ref-pool" "$M/local"
  echo "local     $i: $(run local.log --pool-dir "$M/local")"
  echo "remote    $i: $(run remote.log --pool-dir "$M/remote" --remote "redis://127.0.0.1:$RPORT")"
  echo "recompute $i: $(run none.log --pool-dir "$M/none")"
done
