#!/bin/bash
# A B A B: bench batch (library) at 4 and 8 streams, new (s36-batch) vs main (066a903), then llama-batched-bench.
M=$HOME/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf
NEW=${NEW:-build/mzcache} OLD=${OLD:-/tmp/s36/mzcache-066a903}
O=${OUT:-/tmp/s36b/ab}
run() { # name bin rep
  echo "== $1 rep $3 $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  $2 bench batch -m $M --streams 4,8 --systems batched --reps 1 --history 512 --new 128 --restore-streams 0 --dir /var/tmp -o $O/$1-$3 > $O/$1-$3.log 2>&1
  grep -A6 "aggregate" $O/$1-$3/batch.md | head -12
}
run new $NEW 1; run old $OLD 1; run old $OLD 2; run new $NEW 2
echo "== llama-batched-bench $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
/tmp/s36b/llama-batched-bench -m $M -c 8192 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 4,8 -t 2 -tb 2 > $O/llama-bb.log 2>&1
grep -E "^\|" $O/llama-bb.log
echo "== end $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
