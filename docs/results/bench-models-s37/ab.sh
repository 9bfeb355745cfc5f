#!/bin/bash
# A B A B: this branch (s37-switch) against main 0843fbd (/tmp/s37/mzcache-main), bench models.
# Two models (issue 45's second target) twice each, then three models once each (the first target).
NEW=/tmp/s37-switch/mzcache-new
OLD=/tmp/s37/mzcache-main
O=/tmp/s37-switch/runs
mkdir -p $O
run() {  # name binary args...
  local name=$1 bin=$2; shift 2
  echo "== $name load before: $(cat /proc/loadavg) $(date -u +%T)"
  flock /tmp/mz-bench.lock nice -n -5 $bin bench models "$@" --dir $O/scratch -o $O/$name > $O/$name.log 2>&1
  echo "== $name rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
  rm -rf $O/scratch
  grep -E "^\| (mzcache|all-in|unload)|>= 50%|time goes|restored before|unload-load \(medians" $O/$name/bench-models.md
}
M2="--models qwen3-0.6b,llama3.2-1b --steps 8"
M3="--models qwen3-0.6b,llama3.2-1b,qwen3-1.7b --steps 10"
for i in 1 2; do
  run new2-$i $NEW $M2 --systems mzcache,mzcache-inpass,mzcache-overlap-all,all-in-memory
  run old2-$i $OLD $M2 --systems mzcache,mzcache-overlap,all-in-memory
done
run new3-1 $NEW $M3 --systems mzcache,mzcache-spread,all-in-memory
run old3-1 $OLD $M3 --systems mzcache,all-in-memory
