#!/bin/bash
# Quiet runs of main 4be8168 (all session-37 merges): bench models (two models x2 with unload-load, three models), then the serve race.
cd /work/main
B=/tmp/s37/mzcache-merged
O=/tmp/s37/f
mkdir -p $O
for i in 1 2; do
echo "== models2-$i load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 $B bench models --models qwen3-0.6b,llama3.2-1b --steps 8 --systems mzcache,unload-load,all-in-memory --dir $O/scratch -o $O/models2-$i > $O/models2-$i.log 2>&1
echo "== models2-$i rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
rm -rf $O/scratch
done
echo "== models3 load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 $B bench models --models qwen3-0.6b,llama3.2-1b,qwen3-1.7b --steps 10 --systems mzcache,unload-load,all-in-memory --dir $O/scratch -o $O/models3 > $O/models3.log 2>&1
echo "== models3 rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
rm -rf $O/scratch
echo "== race load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 node bench/serve_race.mjs --mzcache $B --mzcache-as main0843fbd=/tmp/s37/mzcache-main --llama-server /root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install/bin/llama-server -m /root/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --openai /root/.cache/mzcache/npm/openai-6.49.0 --conversations 3 --history-words 500 --reps 2 --systems mzcache,main0843fbd,llama-slots -o $O/serve-race > $O/sr.log 2>&1
echo "== race rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
