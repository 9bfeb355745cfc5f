#!/bin/sh
# Usage: race.sh OUTDIR [reps]  (run under: flock /tmp/mz-bench.lock nice -n -5 race.sh ...)
set -e
cd /work/wt/batch
D=/root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install
echo "load before: $(cat /proc/loadavg) $(date -u +%H:%M:%S)" | tee "$1.load"
node bench/batch_race.mjs --mzcache build/mzcache --mzcache-base /tmp/s37/mzcache-main --llama-server $D/bin/llama-server \
  -m ~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --openai ~/.cache/mzcache/npm/openai-6.49.0 --streams 4,8 \
  --history-tokens 512 --max-tokens 128 --reps ${2:-2} --api native -o "$1"
echo "load after: $(cat /proc/loadavg) $(date -u +%H:%M:%S)" | tee -a "$1.load"
