#!/bin/bash
# E1: main's binary, forced overlap against auto (restore-first) on two models, quiet-ish.
B=/tmp/s37/mzcache-main
O=/tmp/s37-switch
echo "== e1 load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock nice -n -5 $B bench models --models qwen3-0.6b,llama3.2-1b --steps 8 --systems mzcache,mzcache-overlap,all-in-memory --dir $O/scratch -o $O/e1 > $O/e1.log 2>&1
echo "== e1 rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
rm -rf $O/scratch
grep -E "^\| (mzcache|all-in)|>= 50%|time goes|restored before" $O/e1/bench-models.md
