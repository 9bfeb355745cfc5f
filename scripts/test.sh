#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages, the pinned llama.cpp build, cached
# in ~/.cache/mzcache), builds mzcache, and runs every test: the normal build, then ASan+UBSan,
# then the concurrency tests under TSan, then a short run of every fuzz target (libFuzzer, clang,
# ASan+UBSan; scripts/fuzz.sh), then the library and its core suites cross-built for AArch64 and run
# under qemu (scripts/test-arm64.sh). Exits non-zero if anything fails.
#   MZ_FUZZ_SECONDS  seconds per fuzz target (default 45, two targets at a time; 0 skips the stage)
#   MZ_TEST_QUICK=1  only the normal build (for a fast local loop)
#   TEST_JOBS        tests run at once by ctest (default: CPUs + 1)
# Usage: scripts/test.sh [--help]   (no other argument: the environment variables above are the knobs)
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "test.sh: unknown argument $1 (it takes none; see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
# Tests at once: one more than the CPUs (the suites wait on I/O, children and timers part of the
# time; measured on the 2-core AMD EPYC VM, normal build, back to back: -j3 291 s, -j2 328 s).
TEST_JOBS=${TEST_JOBS:-$((JOBS + 1))}
# Every test waits passively in OpenMP (OMP_WAIT_POLICY=passive): set per test by tests/CMakeLists.txt
# (MZ_TEST_ENV_MOD), so that a plain `ctest` gets it too.
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# Wall time of each stage, printed as it ends and again at the end (the README quotes these).
T_START=$(date +%s); STAGE=; STAGE_T0=$T_START; TIMES=
stage() {  # stage NAME: ends the current stage (printing its time) and starts NAME
  local now; now=$(date +%s)
  if [ -n "$STAGE" ]; then
    echo "[test] $STAGE: $((now - STAGE_T0)) s"
    TIMES="$TIMES $STAGE=$((now - STAGE_T0))s"
  fi
  STAGE=$1; STAGE_T0=$now
}
stage deps
# With llama.cpp's llama-server: bench field-notes (field_notes_quick) runs it as one of the systems
# it compares, and batch_race_native checks against it (a fresh machine has none until deps.sh
# builds it; once, incrementally, then cached).
PREFIX=$(MZ_DEPS_SERVER=1 scripts/deps.sh | tail -n 1)
echo "[test] deps: $PREFIX"
# Compiler cache (ccache, installed by deps.sh), shared by every clone on this machine: CI builds a
# fresh clone in another folder, so paths are made relative to the source tree (base_dir) and the
# working directory is left out of the hash; a second clone of the same commit recompiles only the
# files whose macros hold the clone's own paths (the test model folder, the CLI's path).
. scripts/ccache-env.sh
[ -n "$MZ_CCACHE" ] && ccache -z >/dev/null 2>&1 || true  # the statistics printed at the end are this run's

build() {  # build DIR SANITIZE [TARGET...]: the sanitizer stages build only the tests they run
  local dir=$1 san=$2; shift 2
  cmake -S . -B "$dir" -G Ninja -DMZ_DEPS_PREFIX="$PREFIX" -DMZ_SANITIZE="$san" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMZ_UNITY=ON \
    ${MZ_CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache} >/dev/null
  echo "[test] building $dir ${san:+(sanitizers: $san)}"
  ninja -C "$dir" -j "$JOBS" "$@" | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "[test] build failed: $dir"; exit 1; }
}

stage build
build build ""
stage tests
echo "[test] running tests (normal build)"
(cd build && ctest --output-on-failure -j "$TEST_JOBS" --timeout 1200) | tee -a "$LOG"
[ "${MZ_TEST_QUICK:-0}" = 1 ] && exit 0

stage build-asan
build build-asan "address,undefined" tests
stage tests-asan
echo "[test] running tests under ASan+UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:suppressions=$PWD/tests/asan.supp
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The synthesized test models are shared with the normal build (same generator, same seed).
export MZ_TEST_MODEL_DIR_OVERRIDE=$PWD/build/test-models
# LoaderFuzz.* (thousands of mutated GGUF headers) is left to the fuzz stage here: fuzz_gguf runs
# the same parser under ASan+UBSan, coverage-guided, from a corpus that replays every earlier find.
# Label nosan: tests whose sanitizer run another test repeats (tests/CMakeLists.txt says which).
(cd build-asan && ctest --output-on-failure -j "$TEST_JOBS" --timeout 2400 -LE "slow|install|nosan" -E '^LoaderFuzz\.') | tee -a "$LOG"

stage build-tsan
build build-tsan "thread" tests_concurrency
stage tests-tsan
echo "[test] running concurrency tests under TSan"
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp
# Only the tests that start threads: tests/tsan-unthreaded.txt lists the others (scripts/tsan-census.sh).
UNTHREADED=$(grep -v '^#' tests/tsan-unthreaded.txt | sed 's/[][().*+?^$|\\/]/\\&/g' | paste -sd'|')
(cd build-tsan && ctest --output-on-failure -j "$TEST_JOBS" --timeout 2400 -L concurrency ${UNTHREADED:+-E "^($UNTHREADED)\$"}) | tee -a "$LOG"
stage fuzz
# Each target for MZ_FUZZ_SECONDS from the committed seeds (fuzz/corpus/) plus what earlier runs on
# this machine found; a crash fails the test. Per-target executions and coverage are printed.
if [ "${MZ_FUZZ_SECONDS:-45}" != 0 ]; then
  echo "[test] fuzz targets, ${MZ_FUZZ_SECONDS:-45} s each"
  if ! scripts/fuzz.sh "${MZ_FUZZ_SECONDS:-45}" | tee -a "$LOG"; then
    echo "[test] fuzzing failed (a crash, or the fuzz build)"; exit 1
  fi
fi
stage arm64
# The library and the JNI examples cross-built for AArch64 against the pinned llama.cpp built for
# AArch64 from the same source, and suites run under qemu: the CI subset of scripts/test-arm64.sh
# (every core suite represented, the slowest tests under emulation left to --full, each with its
# reason there), or the whole suites named in MZ_ARM64_SUITES.
echo "[test] AArch64: cross build of the library and suites, run under qemu"
MZ_DEPS_SRC=$(dirname "$PREFIX")/src scripts/test-arm64.sh \
  ${MZ_ARM64_SUITES:+--suites "$MZ_ARM64_SUITES"} | tee -a "$LOG"
# One closing line over all stages (each stage above already stopped the script on any failure).
passed=$(sed -n -e 's/.*tests failed out of \([0-9]*\).*/\1/p' -e 's/^\[  PASSED  \] \([0-9]*\) tests\?\.$/\1/p' "$LOG" |
  awk '{s += $1} END {print s + 0}')
[ -n "${MZ_CCACHE:-}" ] && ccache --show-stats 2>/dev/null | grep -E '^(Cacheable calls|  Hits|  Misses)' | head -3 | sed 's/^/[test] ccache: /' || true
stage done
echo "[test] stage times:$TIMES; total $(( $(date +%s) - T_START )) s"
echo "[test] all test stages passed"
echo "tests: $passed passed, 0 failed"
