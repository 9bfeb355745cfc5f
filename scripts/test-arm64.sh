#!/usr/bin/env bash
# mzcache for AArch64: cross-builds the library (libmzcache.so and the static core), the test suites
# and the JNI example for aarch64-linux-gnu with Debian's cross compiler, against the pinned ggml +
# libllama built for AArch64 from the same source (scripts/deps-arm64.sh), and runs the suites under
# qemu-aarch64. Installs what it needs (cross compiler, qemu-user, arm64 -dev packages).
#
# Usage: scripts/test-arm64.sh [--full | --suites "S1 S2 ..."] [--build-dir DIR] [--list] [--help]
#   (default)      the CI subset: the suites of CI_SUITES below, each with the filter written next to
#                  it (tests too slow under qemu are left out there, with the reason), then the JNI
#                  example; this is what the arm64 stage of scripts/test.sh runs (unless
#                  MZ_ARM64_SUITES names other suites)
#   --full         every test program of the tree (the `tests` target and the fuzz replays), whole,
#                  then the JNI example
#   --suites "..." only these suites (names as in tests/test_<name>.cpp, or c_api), whole
#   --build-dir D  build folder (default build-arm64)
#   --list         print the CI subset and its filters, and exit
#   MZ_DEPS_SRC    the pinned llama.cpp source for scripts/deps-arm64.sh (default: from scripts/deps.sh)
#   MZ_TEST_MODEL_DIR_OVERRIDE  folder of synthesized test models to use (and add to); scripts/test.sh
#                  sets it to the x86 build's build/test-models
#   JOBS           parallel compile jobs, and suites run at once under qemu (default: nproc)
#
# Contract: exits 0 only if the build succeeded, every suite run passed (gtest's exit status) and the
# JNI driver passed; prints "[arm64] <suite>: <s> s" per suite and gtest's "[  PASSED  ] N tests."
# lines (scripts/test.sh sums those). Every binary that runs is AArch64 and runs under qemu-aarch64
# (CMAKE_CROSSCOMPILING_EMULATOR of cmake/toolchain-aarch64.cmake); nothing x86 is tested here.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=ci
SUITES=
BUILD=build-arm64
# The CI subset (what the arm64 stage of scripts/test.sh runs): suite and gtest filter ('*' = whole).
# Chosen from the per-test times of the qemu runs in docs/android.md (measured under load on the
# 2-core VM): the NEON attention kernel and the small suites whole, and every core suite
# represented; left out here, run by --full:
#   loader     LoaderFuzz.* (thousands of mutated GGUF headers, 220-280 s each under qemu; the GGUF
#              parser is fuzzed on x86 by fuzz_gguf, and replay_gguf replays its corpus here)
#   codecs     LossyErrorBounds and Idempotence (the longest codec tests: each lossy codec over many
#              seeded shapes; the lossless round trip, the q8 layout and the bounds stay)
#   unit_table all but UnitTableAgreement (random evict/decode/restore/truncate sequences, the table
#              against the KvCache views): the Elastic* tests (states x codecs, faults, RSS)
#   env        EnvPageCache.PopulateMappedMapsTheFileWhetherOrNotItIsCongruent: it checks with
#              mincore that MADV_POPULATE_READ brought the mapping in, and qemu-user passes most
#              madvise advice as a no-op (0 bytes resident under qemu; the data check passes)
#   pipeline   all but RestoreGenerateCompressed (q8 chunks read in place, bit-identical to restoring
#              them): 79 of 81 tests, 10-30 s each under qemu
#   differential  all (against libllama for AArch64: a 640-token prompt through both engines, four
#              times over, is minutes of emulated compute per case; the whole-suite time is in
#              docs/android.md)
CI_SUITES=(
  "attention:*"
  "policy:*"
  "amount_policy:*"
  "env:*-EnvPageCache.PopulateMappedMapsTheFileWhetherOrNotItIsCongruent"
  "swap:*"
  "tokenizer:*"
  "loader:-LoaderFuzz.*"
  "codecs:*-Codecs.LossyErrorBounds:Codecs.Idempotence"
  "unit_table:UnitTableAgreement.*"
  "pipeline:RestoreGenerateCompressed.*"
)
while [ $# -gt 0 ]; do
  case $1 in
    --full) MODE=full; shift ;;
    --suites) MODE=list; SUITES=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    --list) printf '%s\n' "${CI_SUITES[@]}"; exit 0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-arm64.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
JOBS=${JOBS:-$(nproc)}
BUILD=$(realpath -m "$BUILD")
log() { echo "[arm64] $*"; }

PREFIX=$(scripts/deps-arm64.sh | tail -n 1)
log "deps: $PREFIX"
. scripts/ccache-env.sh
# The host's multiarch arm64 runtime (ld.so and libc of one build), not -L /usr/aarch64-linux-gnu:
# see cmake/toolchain-aarch64.cmake.
QEMU=(qemu-aarch64)

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64.cmake" \
  -DMZ_DEPS_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMZ_UNITY=ON \
  ${MZ_CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache} >/dev/null

# What to build and run: "suite:filter" entries.
declare -a RUN=()
case $MODE in
  ci) RUN=("${CI_SUITES[@]}") ;;
  list) for s in $SUITES; do RUN+=("$s:*"); done ;;
  full)
    for f in tests/test_*.cpp; do n=${f#tests/test_}; RUN+=("${n%.cpp}:*"); done
    RUN+=("c_api:*")
    for f in fuzz/fuzz_*.cpp; do n=${f#fuzz/fuzz_}; RUN+=("replay_${n%.cpp}:*"); done ;;
esac
targets=(mzcache_shared)
for e in "${RUN[@]}"; do
  s=${e%%:*}
  case $s in replay_*) targets+=("$s") ;; multitask) targets+=(test_multitask mzcache) ;; *) targets+=("test_$s") ;; esac
done
log "building ${targets[*]} (aarch64, $JOBS jobs)"
t0=$(date +%s)
ninja -C "$BUILD" -j "$JOBS" "${targets[@]}" | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
[ "${PIPESTATUS[0]}" = 0 ] || { log "build failed"; exit 1; }
log "build: $(( $(date +%s) - t0 )) s"
file -L "$BUILD/libmzcache.so" | grep -q 'ARM aarch64' || { log "libmzcache.so is not AArch64"; exit 1; }

# Test models: GGUF files are the same on every architecture, so the ones the x86 build synthesized
# are used when MZ_TEST_MODEL_DIR_OVERRIDE names them (scripts/test.sh exports it: build/test-models).
# Synthesizing one under qemu is slow (tiny-qwen3, 50 MB: more than 10 minutes on the 2-core VM
# under load); without the override the suites synthesize their own into build-arm64/test-models.
MODELS=${MZ_TEST_MODEL_DIR_OVERRIDE:-$BUILD/test-models}
LOGS=$BUILD/arm64-logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
run_suite() {  # run_suite NAME FILTER: one gtest program under qemu, in build/tests; output to $LOGS/NAME.log
  local s=$1 filter=$2 bin args=() t rc=0
  case $s in
    replay_*) bin=$BUILD/fuzz/$s; args=("$PWD/fuzz/corpus/${s#replay_}" "$PWD/fuzz/regressions/${s#replay_}") ;;
    c_api) bin=$BUILD/tests/test_c_api ;;
    *) bin=$BUILD/tests/test_$s; args=("--gtest_filter=$filter") ;;
  esac
  t=$(date +%s)
  # c_api reads its model from MZ_TEST_MODEL; the gtest suites synthesize theirs on first use (to a
  # private name, then renamed: suites running at once do not collide).
  # MZ_UNDER_QEMU_USER: tests of the kernel's accounting of this process (RSS) skip themselves: the
  # process is the emulator.
  (cd "$BUILD/tests" && MZ_UNDER_QEMU_USER=1 MZ_TEST_MODEL=$MODELS/tiny-qwen3-q8_0.gguf "${QEMU[@]}" "$bin" "${args[@]}") \
    >"$LOGS/$s.log" 2>&1 || rc=$?
  echo "$rc $(( $(date +%s) - t ))" >"$LOGS/$s.status"
}
# Suites run JOBS at a time (each is one qemu process; most run one thread); their output is printed
# whole, in list order, once all have finished. c_api (needs tiny-qwen3, which the gtest suites make) runs
# after the others.
failed=()
report() {  # report NAME: prints the suite's output and its time, records a failure
  local s=$1 rc secs
  read -r rc secs <"$LOGS/$s.status"
  cat "$LOGS/$s.log"
  if [ "$rc" = 0 ]; then log "$s: $secs s"; else log "$s: $secs s, FAILED (exit $rc)"; failed+=("$s"); fi
}
names=() later=()
for e in "${RUN[@]}"; do
  s=${e%%:*} f=${e#*:}
  if [ "$s" = c_api ]; then later+=("$e"); continue; fi
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  log "running $s ($f) under qemu-aarch64"
  run_suite "$s" "$f" &
  names+=("$s")
done
wait
for e in "${later[@]}"; do log "running ${e%%:*} under qemu-aarch64"; run_suite "${e%%:*}" "${e#*:}"; names+=("${e%%:*}"); done
for s in "${names[@]}"; do report "$s"; done

# The JNI examples (docs/examples/jni_trim_memory.c, jni_pool_lifecycle.c), built as an app's NDK build builds them: against
# the installed AArch64 libmzcache.so (cmake --install) and liblog (here a stand-in,
# tests/android/), -Wall -Wextra -Werror, no undefined symbols; then driven under qemu.
log "JNI example: building libllmjni.so against the installed AArch64 libmzcache"
JDK_INC=$(dirname "$(ls /usr/lib/jvm/*/include/jni.h 2>/dev/null | head -n 1)" 2>/dev/null || true)
if [ -z "$JDK_INC" ] || [ ! -f "$JDK_INC/jni.h" ]; then
  log "no jni.h: installing openjdk-17-jdk-headless"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q openjdk-17-jdk-headless >/dev/null
  JDK_INC=$(dirname "$(ls /usr/lib/jvm/*/include/jni.h | head -n 1)")
fi
J=$BUILD/jni
rm -rf "$J" && mkdir -p "$J"
cmake --install "$BUILD" --prefix "$J/prefix" >/dev/null
CC=aarch64-linux-gnu-gcc
CFLAGS=(-std=c11 -O2 -Wall -Wextra -Werror -fPIC -I"$JDK_INC" -I"$JDK_INC/linux" -Itests/android -I"$J/prefix/include")
$CC "${CFLAGS[@]}" -shared tests/android/liblog_shim.c -o "$J/liblog.so"
$CC "${CFLAGS[@]}" -shared docs/examples/jni_trim_memory.c -L"$J/prefix/lib" -lmzcache -L"$J" -llog \
  -Wl,--no-undefined -Wl,-rpath,"$J/prefix/lib:$J" -o "$J/libllmjni.so"
$CC "${CFLAGS[@]}" -shared docs/examples/jni_pool_lifecycle.c -L"$J/prefix/lib" -lmzcache -L"$J" -llog \
  -Wl,--no-undefined -Wl,-rpath,"$J/prefix/lib:$J" -o "$J/libllmjni_pool.so"
$CC "${CFLAGS[@]}" tests/android/jni_driver.c -L"$J" -lllmjni -llog -L"$J/prefix/lib" -lmzcache \
  -Wl,-rpath,"$J/prefix/lib:$J" -o "$J/jni_driver"
for f in libllmjni.so libllmjni_pool.so jni_driver; do
  file "$J/$f" | grep -q 'ARM aarch64' || { log "$f is not AArch64"; exit 1; }
done
[ -f "$MODELS/tiny-qwen3-q8_0.gguf" ] || { run_suite loader 'LoaderValid.*'; report loader; }
log "running the JNI driver under qemu-aarch64"
t=$(date +%s)
mkdir -p "$J/conversations"
if "${QEMU[@]}" "$J/jni_driver" "$MODELS/tiny-qwen3-q8_0.gguf" "$J/conversations"; then log "jni: $(( $(date +%s) - t )) s"; else failed+=(jni); fi

if [ ${#failed[@]} -gt 0 ]; then
  log "FAILED: ${failed[*]}"
  exit 1
fi
log "all AArch64 suites passed under qemu"
