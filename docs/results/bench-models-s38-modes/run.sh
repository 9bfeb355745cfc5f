#!/bin/bash
# usage: run.sh LABEL TREE
L=$1; T=$2
uptime > /tmp/s38-modes-out/$L.uptime
cd $T && flock /tmp/mz-bench.lock bash -c "uptime > /tmp/s38-modes-out/$L.uptime; nice -n -5 build/mzcache bench models --models qwen3-0.6b,llama3.2-1b --steps 10 --systems mzcache,all-in-memory,unload-load --dir /var/tmp/s38-modes/$L -o /tmp/s38-modes-out/$L > /tmp/s38-modes-out/$L.log 2>&1"
uptime >> /tmp/s38-modes-out/$L.uptime
