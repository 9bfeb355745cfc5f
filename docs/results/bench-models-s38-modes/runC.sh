#!/bin/bash
while [ "$(wc -l < /tmp/s38-modes-out/B3.uptime 2>/dev/null || echo 0)" -lt 2 ]; do sleep 10; done
cd /work/wt/modes && flock /tmp/mz-bench.lock bash -c "uptime > /tmp/s38-modes-out/C1.uptime; nice -n -5 build/mzcache bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,mzcache-serial,all-in-memory --dir /var/tmp/s38-modes/C1 -o /tmp/s38-modes-out/C1 > /tmp/s38-modes-out/C1.log 2>&1"
uptime >> /tmp/s38-modes-out/C1.uptime
