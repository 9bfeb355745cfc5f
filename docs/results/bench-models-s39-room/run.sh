#!/bin/bash
# Session 39 A/B: bench models, main 0ee5383 (A: /tmp/s39/mzcache-base-room) against the room pass
# behind the restore on by default (B: this branch's commit 8f895dc, /tmp/s39/mzcache-behind).
# Run order as it happened: A1, X1 (slot B1, but the binary was the timer build of main, not B),
# A1b (slot A2 of the first pass), then this script with ROUNDS="2 3 4" and "for s in B A":
# B2 A2 B3 A3 B4 A4.
O=/tmp/s39/ab; mkdir -p $O
for i in ${ROUNDS:-1 2 3}; do for s in A B; do
  [ $s = A ] && B=/tmp/s39/mzcache-base-room || B=/tmp/s39/mzcache-behind
  echo "== $s$i uptime before: $(uptime) $(date -u +%T)"
  flock /tmp/mz-bench.lock nice -n -5 $B bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,all-in-memory,unload-load --dir $O/scratch -o $O/$s$i > $O/$s$i.log 2>&1
  echo "== $s$i rc $? load after: $(cat /proc/loadavg) $(date -u +%T)"
  rm -rf $O/scratch
done; done
