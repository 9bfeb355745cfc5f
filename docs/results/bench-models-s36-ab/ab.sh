#!/bin/bash
# A B A B: new (s36-models) vs main 066a903, bench models, each under the bench lock.
for i in 1 2; do
 for s in new old; do
  bin=/work/wt/models/build/mzcache; [ $s = old ] && bin=/tmp/s36/mzcache-066a903
  echo "== $s $i load before: $(cat /proc/loadavg) $(date -u +%T)"
  flock /tmp/mz-bench.lock nice -n -5 $bin bench models --models qwen3-0.6b,llama3.2-1b --steps 8 --systems mzcache,all-in-memory --dir /tmp/s36m/scratch-$s -o /tmp/s36m/ab-$s-$i > /tmp/s36m/ab-$s-$i.log 2>&1
  echo "== $s $i rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
  grep -E "^\| (mzcache|all-in)|>= 50%" /tmp/s36m/ab-$s-$i/bench-models.md
 done
done
