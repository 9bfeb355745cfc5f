#!/usr/bin/env bash
# Which tests of the concurrency suites start no thread (so ThreadSanitizer has nothing to check in
# them): runs each test of those suites in the normal build, each in its own process as ctest runs
# it, under an LD_PRELOAD shim that marks every pthread_create and every multi-threaded OpenMP
# region (tests/census/pthread_census.c), and prints the tests that saw neither, one per line: the
# list tests/tsan-unthreaded.txt holds. (A whole suite in one process would miss a thread started by
# an earlier test and used again by a later one.) Two tests at a time; a few minutes.
# Usage: scripts/tsan-census.sh [BUILD_DIR [SUITE...]]   (default build and every concurrency suite,
# e.g. `scripts/tsan-census.sh build remote batch`; the suites must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ "${1:-}" = --help ] && { sed -n 2,9p "$0"; exit 0; }
shift || true
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
gcc -shared -fPIC -O1 -o "$T/census.so" tests/census/pthread_census.c -ldl
# Every suite labelled concurrency in tests/CMakeLists.txt (a hand-kept list here once missed
# shared_budget, remote and batch: their single-threaded tests ran under TSan for nothing).
SUITES=${*:-$(grep -oP 'mz_add_test\(\K\w+(?= LABEL concurrency)' tests/CMakeLists.txt)}
[ -n "$SUITES" ] || { echo "[census] no suite labelled concurrency in tests/CMakeLists.txt" >&2; exit 1; }
for s in $SUITES; do
  # --gtest_list_tests: "Suite." lines, then "  Name" lines (a parameter's value after "  #").
  "$BUILD/tests/test_$s" --gtest_list_tests | awk -v bin="test_$s" \
    '/^[^ ]/{suite=$1; next} /^  /{print bin, suite $1}' | grep -v '\.DISABLED_' || true
done >"$T/list"
echo "[census] $(wc -l <"$T/list") tests in: $(echo $SUITES)" >&2
export CENSUS_SO=$T/census.so BUILD
# One test: its name when it started no thread; a failing test stops the census.
census_one() {
  out=$(cd "$BUILD/tests" && LD_PRELOAD="$CENSUS_SO" "./$1" --gtest_filter="$2" 2>&1) ||
    { echo "[census] $1 $2 failed" >&2; return 1; }
  grep -q '^@@' <<<"$out" || echo "$2"
}
export -f census_one
xargs -P 2 -L 1 bash -c 'census_one "$0" "$1"' <"$T/list" | sort
