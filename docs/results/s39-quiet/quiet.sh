#!/bin/sh
# Session 39's quiet runs (nothing else running): NEW = main with every session-39 merge, BASE =
# session 38's main (0ee5383). Each under the bench lock at nice -5, the 1-minute load before and
# after each run logged to quiet.log. Usage: quiet.sh OUT NEW BASE
set -eu
OUT=$1 NEW=$2 BASE=$3
P=/root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install
M=~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf
O=~/.cache/mzcache/npm/openai-6.49.0
run() { name=$1; shift; echo "$name start: $(uptime)" >> "$OUT/quiet.log"; flock /tmp/mz-bench.lock nice -n -5 "$@" > "$OUT/$name.log" 2>&1; echo "$name end: $(uptime)" >> "$OUT/quiet.log"; }
run serve-race node bench/serve_race.mjs --mzcache "$NEW" --mzcache-as base="$BASE" --llama-server $P/bin/llama-server -m $M --openai $O \
  --conversations 3 --history-words 500 --reps 2 --systems mzcache,base,llama-slots -o "$OUT/serve-race"
run bench-models "$NEW" bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,mzcache-behind,all-in-memory,unload-load \
  --dir /tmp/s39/bm-scratch -o "$OUT/bench-models"
run batch-race node bench/batch_race.mjs --mzcache "$NEW" --mzcache-base "$BASE" --llama-server $P/bin/llama-server -m $M --openai $O \
  --streams 4,8 --history-tokens 512 --max-tokens 128 --reps 2 --api native -o "$OUT/batch-race"
