#!/usr/bin/env bash
# Which tests of the concurrency suites start no thread (so ThreadSanitizer has nothing to check in
# them): runs each suite of the normal build once under an LD_PRELOAD shim that marks every
# pthread_create and every multi-threaded OpenMP region (tests/census/pthread_census.c), and prints
# the tests that saw neither, one per line: the list tests/tsan-unthreaded.txt holds.
# Usage: scripts/tsan-census.sh [BUILD_DIR]   (default build; the suites must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ "${1:-}" = --help ] && { sed -n 2,6p "$0"; exit 0; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
gcc -shared -fPIC -O1 -o "$T/census.so" tests/census/pthread_census.c -ldl
for s in attention unit_table codecs pipeline swap kv_q8 pressure env pool threads; do
  echo "[census] $s" >&2
  (cd "$BUILD/tests" && LD_PRELOAD="$T/census.so" "./test_$s" >"$T/$s.log" 2>&1) || { echo "[census] test_$s failed" >&2; exit 1; }
done
cat "$T"/*.log | awk '/^\[ RUN      \]/{if (cur != "" && !thr) print cur; cur=$4; thr=0; next} /^@@/{thr=1} END{if (cur != "" && !thr) print cur}' | sort
