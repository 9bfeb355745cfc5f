#!/bin/bash
# Quiet runs (nothing else computing): the serve race of main 5b1985e against the base d1e0052 and
# llama-server slots, then bench models A/B (base vs learned restore rates 9f1b385).
cd /work/main
O=/tmp/s38/q; mkdir -p $O
echo "== race load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 node bench/serve_race.mjs --mzcache /tmp/s38/mzcache-merged --mzcache-as based1e0052=/tmp/s38/mzcache-base --llama-server /root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install/bin/llama-server -m /root/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --openai /root/.cache/mzcache/npm/openai-6.49.0 --conversations 3 --history-words 500 --reps 2 --systems mzcache,based1e0052,llama-slots -o $O/serve-race > $O/sr.log 2>&1
echo "== race rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
"$(dirname "$0")/../bench-models-s38-quiet/run.sh"  # the bench models A/B
