#!/usr/bin/env bash
# bench fleet (issue 47, docs/fleet.md "bench fleet"): the fleet's three measured cases, thin over
# scripts/fleet.sh (redis-server with AOF, mzcache serve x N with --remote, nginx by X-Mz-Conversation)
# and the official `openai` npm client (tests/fleet_openai.mjs for one turn, bench/fleet_bench.mjs for
# many conversations and the load).
#   return  a returning conversation of about --return-tokens tokens, its next turn on a freshly
#           started server: from Redis (another server: an empty pool folder, --remote), from local
#           storage (the same server restarted: a copy of its pool folder) and re-prefilled (an empty
#           folder, no remote); --rounds rounds, the order rotated each round. TTFT (the server's),
#           the request's time (the Redis fetch at open included) and the bytes moved (Redis bytes
#           fetched from /metrics, bytes read from storage from the reply). Codec: --return-codec
#           (default none, lossless) for both --persist-codec and --kv-codec. --return-cases picks and
#           orders them (default local,redis,recompute); two more: prefix (another server, the
#           request without X-Mz-Conversation: its history found in Redis by chain hash and streamed
#           in, front layers first, overlapped with the prefill) and prefix-whole (the same with
#           --remote-prefix-whole: fetched whole before the prefill; the peer of prefix).
#   shared  --convs conversations sharing a system prompt of about --sys-tokens tokens, one turn each,
#           --concurrency at once through nginx over 3 servers; with the remote tier, then without
#           it: keys and bytes in Redis (SCAN, STRLEN, MEMORY USAGE, INFO) and on the three pool
#           folders (du), tokens computed. Default persist codec (q8).
#   kill    --clients clients through nginx for --load-s seconds, the busiest server killed with
#           kill -9 at --kill-at s: requests failed (the client never retries; nginx does) and tokens
#           recomputed (prompt - cached) on the turns after the kill against before. Codec q8.
#   redis   one Redis shard's rate on this machine (an input of docs/fleet.md "On paper"):
#           redis-benchmark GET and SET of --redis-value-kib values (default 1024: one layer of one
#           256-token Qwen3-0.6B chunk, uncompressed; what a streamed GETRANGE reads), 2 connections.
# Usage: bench/fleet_bench.sh [--out DIR] [--cases return,shared,kill,redis] [--model GGUF] [--cli MZCACHE]
#   [--threads 2] [--fleet-threads 1] [--rounds 3] [--return-tokens 4096] [--return-codec none]
#   [--return-cases local,redis,recompute] [--convs 50]
#   [--sys-tokens 1536] [--concurrency 3] [--clients 8] [--load-s 120] [--kill-at 60] [--load-sys-tokens 512] [--redis-value-kib 1024]
# --threads: the return case's servers (one runs at a time). --fleet-threads: each of the 3 servers
# of the shared and kill cases, which compute at once: on a 2-core machine 3 x 2 threads would
# oversubscribe the cores 3x, and ggml's thread barrier busy-waits (1 thread each: 1.5x).
# Writes DIR/bench-fleet.{json,md}, DIR/*.png (gnuplot), raw files under DIR/raw/. Progress on stderr.
# Defaults: the synthesized Qwen3-0.6B q8_0 (~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf), DIR
# build/bench-fleet. Measuring: run it under the bench lock (flock /tmp/mz-bench.lock nice -n -5 ...).
# Needs redis-server, nginx, gnuplot, node and the cached openai package (tests/check_fleet.sh).
set -euo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
help() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; }
OUT=$R/build/bench-fleet CASES=return,shared,kill,redis MODEL=$HOME/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf
CLI=$R/build/mzcache THREADS=2 FTHREADS=1 ROUNDS=3 RET_TOKENS=4096 RET_CODEC=none CONVS=50 SYS_TOKENS=1536 CONC=3
CLIENTS=8 LOAD_S=120 KILL_AT=60 LOAD_SYS=512 VALUE_KIB=1024 RET_CASES=local,redis,recompute
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) help; exit 0 ;;
    --out) OUT=$2 ;; --cases) CASES=$2 ;; --model) MODEL=$2 ;; --cli) CLI=$2 ;; --threads) THREADS=$2 ;; --fleet-threads) FTHREADS=$2 ;;
    --rounds) ROUNDS=$2 ;; --return-tokens) RET_TOKENS=$2 ;; --return-codec) RET_CODEC=$2 ;; --return-cases) RET_CASES=$2 ;;
    --convs) CONVS=$2 ;; --sys-tokens) SYS_TOKENS=$2 ;; --concurrency) CONC=$2 ;; --clients) CLIENTS=$2 ;;
    --load-s) LOAD_S=$2 ;; --kill-at) KILL_AT=$2 ;; --load-sys-tokens) LOAD_SYS=$2 ;; --redis-value-kib) VALUE_KIB=$2 ;;
    *) echo "fleet_bench: unknown option '$1' (--help)" >&2; exit 2 ;;
  esac
  [ $# -ge 2 ] || { echo "fleet_bench: $1 needs a value" >&2; exit 2; }
  shift 2
done
say() { echo "[bench fleet] $*" >&2; }
die() { echo "[bench fleet] error: $*" >&2; exit 1; }
[ -x "$CLI" ] || die "no mzcache binary at $CLI (build it, or --cli)"
[ -f "$MODEL" ] || die "no model at $MODEL (mzcache make-model, or --model)"
for t in redis-server redis-cli gnuplot node python3 curl; do command -v $t >/dev/null || die "$t is not installed"; done
NPM=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/openai-6.49.0
[ -f "$NPM/node_modules/openai/package.json" ] || die "no openai package in $NPM (tests/check_fleet.sh installs it)"
FLEET=$R/scripts/fleet.sh TURN=$R/tests/fleet_openai.mjs CLIENT=$R/bench/fleet_bench.mjs
mkdir -p "$OUT/raw"
OUT=$(cd "$OUT" && pwd) RAW=$OUT/raw
W=$(mktemp -d /tmp/mz-bench-fleet.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for f in "$W"/fleet-*; do [ -d "$f" ] && "$FLEET" stop "$f" >/dev/null 2>&1; done
  rm -rf "$W"
}
trap cleanup EXIT
loadavg() { cut -d' ' -f1 /proc/loadavg; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# text TOKENS FILE: plain English of about TOKENS tokens (a sentence is about 20 Qwen3 tokens: 4096
# asked gave 5281 with 16, the chat template included)
text() { python3 -c '
import sys
n = max(1, int(sys.argv[1]) // 20)
w = ["river", "mill", "baker", "lantern", "orchard", "harbor", "quarry", "meadow", "signal", "ledger"]
print(" ".join(f"Note {i}: the {w[i % 10]} near the {w[(i * 3 + 1) % 10]} was counted {i} times before dawn." for i in range(n)))' "$1" >"$2"; }
# messages SYSTEM_FILE USER OUT [REPLY_JSON USER2]: a chat's messages as JSON
messages() { python3 - "$@" <<'PY'
import json, sys
m = [{"role": "system", "content": open(sys.argv[1]).read()}, {"role": "user", "content": sys.argv[2]}]
if len(sys.argv) > 5:
    m += [{"role": "assistant", "content": json.load(open(sys.argv[4]))["text"]}, {"role": "user", "content": sys.argv[5]}]
json.dump(m, open(sys.argv[3], "w"))
PY
}
health_pending() { curl -s --max-time 5 "http://127.0.0.1:$1/health" | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h.get("remote",{}).get("pending",0))' 2>/dev/null || echo 1; }
metric() { curl -s --max-time 5 "http://127.0.0.1:$1/metrics" | awk -v k="$2" 'index($0,k)==1 {print $NF; f=1} END {if(!f) print 0}' | tail -1; }
wait_written() {  # wait_written PORT: the server's remote writes done (nothing pending, a manifest written)
  for _ in $(seq 1200); do
    [ "$(health_pending "$1")" = 0 ] && [ "$(metric "$1" mzcache_remote_manifests_written_total)" != 0 ] && return 0
    sleep 0.25
  done
  die "server on $1 did not finish its remote writes within 300 s"
}
start_one() {  # start_one NAME ARGS...: a server on its own port; prints its port, its pid in W/NAME.pid
  local name=$1; shift
  rm -f "$W/$name.port"
  "$CLI" serve -m "$MODEL" --port 0 --port-file "$W/$name.port" --no-watch-pressure "$@" >>"$RAW/$name.log" 2>&1 &
  echo $! >"$W/$name.pid"
  PIDS+=("$!")
  for _ in $(seq 1200); do [ -s "$W/$name.port" ] && break; kill -0 "$(cat "$W/$name.pid")" 2>/dev/null || die "server $name exited: $(tail -3 "$RAW/$name.log")"; sleep 0.1; done
  [ -s "$W/$name.port" ] || die "server $name did not listen within 120 s"
}
stop_one() { local p; p=$(cat "$W/$1.pid"); kill "$p" 2>/dev/null || true; for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }

{
  echo "{\"date\": \"$(date -u +%FT%TZ)\", \"commit\": \"$(git -C "$R" rev-parse --short HEAD 2>/dev/null || echo unknown)\","
  echo " \"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -1)\", \"cores\": $(nproc), \"mem_gib\": $(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo),"
  echo " \"model\": \"$(basename "$MODEL")\", \"threads\": $THREADS, \"fleet_threads\": $FTHREADS, \"cases\": \"$CASES\","
  echo " \"load_start\": $(loadavg)}"
} | tr -d '\n' >>"$RAW/meta.jsonl"
echo >>"$RAW/meta.jsonl"

case_return() {
  say "return: making a conversation of about $RET_TOKENS tokens (codec $RET_CODEC)"
  local F=$W/fleet-return args
  args="--persist-codec $RET_CODEC --kv-codec $RET_CODEC -c $((RET_TOKENS + 2048)) -t $THREADS --parallel 1"
  MZ_CLI=$CLI MZ_MODEL=$MODEL MZ_FLEET_SERVERS=1 MZ_FLEET_PORT=0 MZ_FLEET_SERVE_ARGS=$args "$FLEET" start "$F" 2>>"$RAW/fleet.log"
  text "$RET_TOKENS" "$W/return-system.txt"
  messages "$W/return-system.txt" "Summarize the notes in one line." "$W/return-m1.json"
  node "$TURN" "http://127.0.0.1:$(cat "$F/lb.port")/v1" "$NPM" return-conv "$W/return-m1.json" 8 >"$RAW/return-first.json" ||
    die "the first turn failed"
  say "return: first turn $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["prompt_tokens"], "prompt tokens,", round(r["wall_s"],1), "s")' "$RAW/return-first.json")"
  wait_written "$(cat "$F/server-1.port")"
  kill "$(cat "$F/server-1.pid")"; for _ in $(seq 600); do kill -0 "$(cat "$F/server-1.pid")" 2>/dev/null || break; sleep 0.1; done
  messages "$W/return-system.txt" "Summarize the notes in one line." "$W/return-m2.json" "$RAW/return-first.json" "Now the last note only."
  local RPORT; RPORT=$(cat "$F/redis.port")
  redis-cli -p "$RPORT" info memory | tr -d '\r' | grep -E '^used_memory:' >"$RAW/return-redis-memory.txt"
  : >"$RAW/return-rounds.jsonl"
  local order i k c n port la0 la1 fetched line id
  IFS=, read -r -a order <<<"$RET_CASES"
  n=${#order[@]}
  for i in $(seq "$ROUNDS"); do
    for k in $(seq 0 $((n - 1))); do
      c=${order[$(((k + i - 1) % n))]}
      rm -rf "$W/pool-$c"
      id=return-conv
      case $c in
        local) cp -r "$F/pool-1" "$W/pool-local"; start_one "return-$c" --pool-dir "$W/pool-$c" $args ;;
        redis) start_one "return-$c" --pool-dir "$W/pool-$c" --remote "redis://127.0.0.1:$RPORT" $args ;;
        prefix) id=-; start_one "return-$c" --pool-dir "$W/pool-$c" --remote "redis://127.0.0.1:$RPORT" $args ;;
        prefix-whole) id=-; start_one "return-$c" --pool-dir "$W/pool-$c" --remote "redis://127.0.0.1:$RPORT" --remote-prefix-whole $args ;;
        recompute) start_one "return-$c" --pool-dir "$W/pool-$c" $args ;;
        *) die "unknown return case '$c' (local, redis, prefix, prefix-whole, recompute)" ;;
      esac
      port=$(cat "$W/return-$c.port")
      la0=$(loadavg)
      line=$(node "$TURN" "http://127.0.0.1:$port/v1" "$NPM" "$id" "$W/return-m2.json" 8) || die "round $i $c: the turn failed"
      la1=$(loadavg)
      fetched=$(metric "$port" 'mzcache_remote_bytes_total{direction="fetched"}')
      stop_one "return-$c"
      echo "{\"round\": $i, \"case\": \"$c\", \"codec\": \"$RET_CODEC\", \"load_before\": $la0, \"load_after\": $la1, \"redis_bytes_fetched\": ${fetched:-0}, \"turn\": $line}" >>"$RAW/return-rounds.jsonl"
      say "return: round $i/$ROUNDS $c: $(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("TTFT", round(r["ttft_s"],3), "s, request", round(r["wall_s"],3), "s, cached", r["cached_tokens"], "/", r["prompt_tokens"])' "$line")"
    done
  done
  "$FLEET" stop "$F" 2>>"$RAW/fleet.log"
}

# census DIR OUT: Redis keys and bytes by kind, and the pool folders' bytes (after the servers stopped)
census() { python3 - "$1" "$2" <<'PY'
import json, os, subprocess, sys
d, out = sys.argv[1], sys.argv[2]
port = open(f"{d}/redis.port").read().strip()
def cli(*a):
    return subprocess.run(["redis-cli", "-p", port, *a], capture_output=True, text=True, check=True).stdout
keys = [k for k in cli("--scan", "--pattern", "mz:*").split("\n") if k]
r = {"dbsize": int(cli("dbsize").strip()), "chunk_keys": 0, "manifest_keys": 0, "chunk_bytes": 0,
     "manifest_bytes": 0, "chunk_memory": 0, "manifest_memory": 0}
for k in keys:
    kind = "chunk" if ":k:" in k else "manifest"
    r[f"{kind}_keys"] += 1
    r[f"{kind}_bytes"] += int(cli("strlen", k).strip())
    r[f"{kind}_memory"] += int(cli("memory", "usage", k).strip() or 0)
for l in cli("info", "memory").split("\n"):
    if l.startswith("used_memory:"): r["used_memory"] = int(l.split(":")[1])
disks = []
i = 1
while os.path.exists(f"{d}/server-{i}.port"):
    p, b, mzs, chunks = f"{d}/pool-{i}", 0, 0, 0
    for root, _, files in os.walk(p):
        for f in files:
            b += os.path.getsize(os.path.join(root, f))
            mzs += f.endswith(".mzs")
            chunks += os.path.basename(root) == "chunks"
    disks.append({"server": i, "bytes": b, "session_files": mzs, "chunk_files": chunks})
    i += 1
json.dump({"redis": r, "disks": disks}, open(out, "w"))
PY
}

case_shared() {
  text "$SYS_TOKENS" "$W/shared-system.txt"
  local remote F P i la0 la1 t0 t1
  for remote in 1 0; do
    F=$W/fleet-shared-$remote
    say "shared: $CONVS conversations over 3 servers, remote tier $([ $remote = 1 ] && echo on || echo off)"
    MZ_CLI=$CLI MZ_MODEL=$MODEL MZ_FLEET_SERVERS=3 MZ_FLEET_PORT=0 MZ_FLEET_REMOTE=$remote \
      MZ_FLEET_SERVE_ARGS="-c 4096 -t $FTHREADS --parallel 2" "$FLEET" start "$F" 2>>"$RAW/fleet.log"
    la0=$(loadavg) t0=$(date +%s.%N)
    node "$CLIENT" many "http://127.0.0.1:$(cat "$F/lb.port")/v1" "$NPM" "$W/shared-system.txt" "$CONVS" "$CONC" \
      "$RAW/shared-$remote.jsonl" || die "shared: some conversations failed ($RAW/shared-$remote.jsonl)"
    t1=$(date +%s.%N) la1=$(loadavg)
    if [ $remote = 1 ]; then for i in 1 2 3; do P=$(cat "$F/server-$i.port"); for _ in $(seq 1200); do [ "$(health_pending "$P")" = 0 ] && break; sleep 0.25; done; done; fi
    for i in 1 2 3; do P=$(cat "$F/server-$i.pid"); kill "$P"; for _ in $(seq 600); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done; done
    census "$F" "$RAW/shared-$remote-census.json"
    python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.update(remote=int(sys.argv[2]), wall_s=float(sys.argv[4])-float(sys.argv[3]), load_before=float(sys.argv[5]), load_after=float(sys.argv[6])); json.dump(c, open(sys.argv[1], "w"))' \
      "$RAW/shared-$remote-census.json" "$remote" "$t0" "$t1" "$la0" "$la1"
    say "shared: remote $remote: $(cat "$RAW/shared-$remote-census.json" | head -c 300)"
    "$FLEET" stop "$F" 2>>"$RAW/fleet.log"
  done
}

case_kill() {
  text "$LOAD_SYS" "$W/load-system.txt"
  local F=$W/fleet-kill la0 la1
  say "kill: $CLIENTS clients for $LOAD_S s, kill -9 at $KILL_AT s"
  MZ_CLI=$CLI MZ_MODEL=$MODEL MZ_FLEET_SERVERS=3 MZ_FLEET_PORT=0 \
    MZ_FLEET_SERVE_ARGS="-c 4096 -t $FTHREADS --parallel 4" "$FLEET" start "$F" 2>>"$RAW/fleet.log"
  la0=$(loadavg)
  node "$CLIENT" load "http://127.0.0.1:$(cat "$F/lb.port")/v1" "$NPM" "$F" "$CLIENTS" "$LOAD_S" "$KILL_AT" \
    "$W/load-system.txt" "$RAW/kill.jsonl" || die "kill: the load client failed"
  la1=$(loadavg)
  echo "{\"load_before\": $la0, \"load_after\": $la1, \"clients\": $CLIENTS, \"duration_s\": $LOAD_S, \"kill_at_s\": $KILL_AT}" >"$RAW/kill-meta.json"
  cp "$F/nginx-error.log" "$RAW/kill-nginx-error.log" 2>/dev/null || true
  "$FLEET" stop "$F" 2>>"$RAW/fleet.log"
}

case_redis() {
  local port la0 la1 n
  port=$(free_port) n=$((4096 / (VALUE_KIB > 0 ? VALUE_KIB : 1) * 64 + 64))
  mkdir -p "$W/redis-bench"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$W/redis-bench" --save "" --appendonly no --daemonize no >/dev/null 2>&1 &
  PIDS+=("$!")
  local rpid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  say "redis: GET/SET of $VALUE_KIB KiB values, $n requests each, 2 connections"
  la0=$(loadavg)
  redis-benchmark -p "$port" -t set,get -d $((VALUE_KIB * 1024)) -n "$n" -c 2 -r 64 --csv >"$RAW/redis-bench.csv" 2>/dev/null ||
    die "redis-benchmark failed"
  la1=$(loadavg)
  kill "$rpid"; wait "$rpid" 2>/dev/null || true
  echo "{\"value_kib\": $VALUE_KIB, \"requests\": $n, \"connections\": 2, \"load_before\": $la0, \"load_after\": $la1}" >"$RAW/redis-bench-meta.json"
  say "redis: $(tr '\n' ' ' <"$RAW/redis-bench.csv")"
}

say "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); out: $OUT"
IFS=, read -ra CL <<<"$CASES"
for c in "${CL[@]}"; do
  case $c in return) case_return ;; shared) case_shared ;; kill) case_kill ;; redis) case_redis ;; *) die "unknown case '$c' (return, shared, kill, redis)" ;; esac
done
say "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$R/bench/fleet_bench_report.py" "$OUT"
say "wrote $OUT/bench-fleet.json, $OUT/bench-fleet.md and its plots"
