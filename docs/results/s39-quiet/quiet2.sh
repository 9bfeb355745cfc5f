#!/bin/sh
# Session 39's second quiet set: the returning-user race of main (NEW), the partial-chunk branch
# alone (TAIL, b654c18) and session 38's main (BASE), alternated; then bench models twice with the
# room pass in the call (mzcache) and behind the restore (mzcache-behind). Usage: quiet2.sh OUT NEW BASE TAIL
set -eu
OUT=$1 NEW=$2 BASE=$3 TAIL=$4
P=/root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install
M=~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf
O=~/.cache/mzcache/npm/openai-6.49.0
run() { name=$1; shift; echo "$name start: $(uptime)" >> "$OUT/quiet.log"; flock /tmp/mz-bench.lock nice -n -5 "$@" > "$OUT/$name.log" 2>&1; echo "$name end: $(uptime)" >> "$OUT/quiet.log"; }
run serve-race2 node bench/serve_race.mjs --mzcache "$NEW" --mzcache-as base="$BASE" --mzcache-as tail="$TAIL" --llama-server $P/bin/llama-server -m $M --openai $O \
  --conversations 3 --history-words 500 --reps 2 --systems mzcache,base,tail -o "$OUT/serve-race2"
for i in 2 3; do
  run bench-models$i "$NEW" bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,mzcache-behind,all-in-memory \
    --dir /tmp/s39/bm-scratch -o "$OUT/bench-models$i"
done
