#!/bin/bash
# Three models: this branch's first build (f670670: mzcache against mzcache-spread in one run).
NEW=/tmp/s37-switch/mzcache-new
O=/tmp/s37-switch/runs
name=new3-1
echo "== $name load before: $(cat /proc/loadavg) $(date -u +%T)"
flock /tmp/mz-bench.lock bash -c "echo \"== $name lock taken: \$(cat /proc/loadavg) \$(date -u +%T)\"; nice -n -5 $NEW bench models --models qwen3-0.6b,llama3.2-1b,qwen3-1.7b --steps 10 --systems mzcache,mzcache-spread,all-in-memory --dir $O/scratch -o $O/$name > $O/$name.log 2>&1; echo \"== $name rc \$? load after: \$(cat /proc/loadavg) \$(date -u +%T)\""
rm -rf $O/scratch
grep -E "^\| (mzcache|all-in)|>= 50%|time goes|restored before" $O/$name/bench-models.md
