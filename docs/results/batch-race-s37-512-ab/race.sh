#!/bin/sh
# Session 37's race: this tree's build/mzcache, another mzcache binary as system `base` (BASE,
# default /tmp/s37/mzcache-main: main's binary) and llama-server, 4 and 8 streams of 512-token
# histories, 128 new tokens; the 1-minute load average before and after into OUTDIR/load.txt.
# Usage (from anywhere): flock /tmp/mz-bench.lock nice -n -5 docs/results/batch-race-s37-512-ab/race.sh OUTDIR [REPS]
set -e
[ -n "$1" ] || { echo "usage: $0 OUTDIR [REPS]" >&2; exit 2; }
cd "$(dirname "$0")/../../.."
D=${MZ_DEPS_PREFIX:-/root/.cache/mzcache/deps/node-llama-cpp-3.21.1-d6a49d993c27/install}
mkdir -p "$1"
echo "load before: $(cat /proc/loadavg) $(date -u +%H:%M:%S)" | tee "$1/load.txt"
node bench/batch_race.mjs --mzcache build/mzcache --mzcache-base "${BASE:-/tmp/s37/mzcache-main}" --llama-server "$D/bin/llama-server" \
  -m ~/.cache/mzcache/models/qwen3-0.6b-q8_0.gguf --openai ~/.cache/mzcache/npm/openai-6.49.0 --streams 4,8 \
  --history-tokens 512 --max-tokens 128 --reps "${2:-2}" --api native -o "$1"
echo "load after: $(cat /proc/loadavg) $(date -u +%H:%M:%S)" | tee -a "$1/load.txt"
python3 bench/race_decode_phase.py "$1/race.json" > "$1/phases.txt"
