#!/bin/bash
# Quiet A/B: bench models, base d1e0052 (A) vs learned restore rates 9f1b385 (B), A B A B A B.
O=/tmp/s38/qm; mkdir -p $O
for i in 1 2 3; do for s in A B; do
  [ $s = A ] && B=/tmp/s38/mzcache-base || B=/tmp/s38/mzcache-learn
  echo "== $s$i load before: $(cat /proc/loadavg) $(date -u +%T)"
  flock /tmp/mz-bench.lock nice -n -5 $B bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,all-in-memory,unload-load --dir $O/scratch -o $O/$s$i > $O/$s$i.log 2>&1
  echo "== $s$i rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
  rm -rf $O/scratch
done; done
