#!/bin/bash
# Quiet A B A B: main after the session-36 merges vs main 066a903, bench models; then the serve race.
cd /work/main
for i in 1 2; do
 for s in new old; do
  bin=/tmp/s36/mzcache-new; [ $s = old ] && bin=/tmp/s36/mzcache-066a903
  echo "== $s $i load before: $(cat /proc/loadavg) $(date -u +%T)"
  flock /tmp/mz-bench.lock nice -n -5 $bin bench models --models qwen3-0.6b,llama3.2-1b --steps 8 --systems mzcache,all-in-memory --dir /tmp/s36/q/scratch-$s -o /tmp/s36/q/ab-$s-$i > /tmp/s36/q/ab-$s-$i.log 2>&1
  echo "== $s $i rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
  grep -E "^\| (mzcache|all-in)|>= 50%" /tmp/s36/q/ab-$s-$i/bench-models.md
 done
done
rm -rf /tmp/s36/q/scratch-*
echo "== race load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 node bench/serve_race.mjs --mzcache /tmp/s36/mzcache-new --llama-server /root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install/bin/llama-server -m /root/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --openai /root/.cache/mzcache/npm/openai-6.49.0 --conversations 3 --history-words 500 --reps 3 --systems mzcache,llama-slots -o /tmp/s36/q/serve-race > /tmp/s36/q/sr.log 2>&1
echo "== race rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
