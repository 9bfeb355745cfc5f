#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, -DMZ_FUZZ=ON with clang, in build-fuzz) and runs each for a
# while, FUZZ_PARALLEL at a time (default 2 on a machine with 2 or more CPUs), then prints per target: executions, exec/s, coverage (cov: and ft:
# from libFuzzer's final stats), crashes. Exits non-zero if any target crashed (the crashing input
# is left in build-fuzz/artifacts/<target>/; replay it with build-fuzz/fuzz/fuzz_<target> FILE).
#   scripts/fuzz.sh [SECONDS-PER-TARGET [TARGET...]]   default 60 s, all targets
#   scripts/fuzz.sh --make-seeds                        rewrites the seed corpora in fuzz/corpus/
# Each target starts from the committed seeds (fuzz/corpus/<target>/) plus what earlier runs on this
# machine found (build-fuzz/corpus/<target>/, kept). Installs clang with apt-get if missing.
#   FUZZ_NICE   nice level of the fuzzers (default 10: the machine is shared)
#   FUZZ_ARGS   extra libFuzzer flags (e.g. -jobs=2 -workers=2)
#   FUZZ_PARALLEL  targets run at once (default min(nproc, 2))
#   scripts/fuzz.sh --help                              this text
set -euo pipefail
cd "$(dirname "$0")/.."
ALL="gguf session codec profile chat serve"
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  ""|--make-seeds|[0-9]*) ;;
  *) echo "fuzz.sh: the first argument is the seconds per target, --make-seeds or --help, not '$1'" >&2; exit 2 ;;
esac

if ! command -v clang++ >/dev/null 2>&1; then
  echo "[fuzz] installing clang"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q clang
fi
PREFIX=$(scripts/deps.sh | tail -n 1)
. scripts/ccache-env.sh
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMZ_DEPS_PREFIX="$PREFIX" -DMZ_FUZZ=ON -DMZ_UNITY=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  ${MZ_CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache} >/dev/null
echo "[fuzz] building build-fuzz (clang, -fsanitize=fuzzer,address,undefined)"
ninja -C build-fuzz -j "${JOBS:-$(nproc)}" fuzzers | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[fuzz] build failed"; exit 1; }

if [ "${1:-}" = --make-seeds ]; then
  build-fuzz/fuzz/fuzz_make_seeds fuzz/corpus
  du -sh fuzz/corpus
  exit 0
fi
SECS=${1:-60}
[[ "$SECS" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: seconds per target must be a whole number, not '$SECS'" >&2; exit 2; }
shift || true
TARGETS=${*:-$ALL}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:suppressions=$PWD/tests/asan.supp
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The synthesized tiny model the session target loads is shared with the normal build's tests.
[ -d build/test-models ] && export MZ_TEST_MODEL_DIR_OVERRIDE=${MZ_TEST_MODEL_DIR_OVERRIDE:-$PWD/build/test-models}

for t in $TARGETS; do [ -x "build-fuzz/fuzz/fuzz_$t" ] || { echo "[fuzz] no target $t"; exit 2; }; done
run_one() {  # run_one TARGET: one libFuzzer run into build-fuzz/fuzz-TARGET.log; its exit code in .rc
  local t=$1 bin=build-fuzz/fuzz/fuzz_$1 log=build-fuzz/fuzz-$1.log rc
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/artifacts/$t"
  touch "$log.start"
  set +e
  # shellcheck disable=SC2086
  nice -n "${FUZZ_NICE:-10}" "$bin" -max_total_time="$SECS" -print_final_stats=1 -timeout=30 -rss_limit_mb=3072 \
    -artifact_prefix="build-fuzz/artifacts/$t/" ${FUZZ_ARGS:-} "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  echo "$rc" >"$log.rc"
}
# Targets run FUZZ_PARALLEL at a time (default: the number of CPUs, at most 2; each target is one
# process on one core), so the CI stage takes about ceil(targets / parallel) x SECONDS.
PAR=${FUZZ_PARALLEL:-$(nproc)}
[ "$PAR" -gt 2 ] && [ -z "${FUZZ_PARALLEL:-}" ] && PAR=2
[ "$PAR" -ge 1 ] || PAR=1
echo "[fuzz] ${SECS} s per target, $PAR at a time: $TARGETS"
running=0
for t in $TARGETS; do
  if [ "$running" -ge "$PAR" ]; then wait -n || true; running=$((running - 1)); fi
  echo "[fuzz] $t: running ${SECS} s"
  run_one "$t" &
  running=$((running + 1))
done
wait || true

failed=0
SUMMARY=
for t in $TARGETS; do
  log=build-fuzz/fuzz-$t.log
  rc=$(cat "$log.rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | awk '{s += $1} END {print s + 0}')
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | awk '{s += $1} END {print s + 0}')
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last"); ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  crashes=$(find "build-fuzz/artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) -newer "$log.start" 2>/dev/null | wc -l)
  line="$t: ${execs} execs, ${rate} exec/s, cov ${cov:-?} ft ${ft:-?}, crashes ${crashes}, exit $rc"
  echo "[fuzz] $line"
  SUMMARY="$SUMMARY$line\n"
  if [ "$rc" != 0 ]; then
    failed=1
    echo "[fuzz] $t FAILED (log $log):"
    grep -E 'ERROR|runtime error|fuzz contract|Test unit written|SUMMARY' "$log" | head -n 20 || true
  fi
done
printf "[fuzz] summary (%s s per target):\n" "$SECS"
printf "$SUMMARY" | sed 's/^/[fuzz]   /'
[ "$failed" = 0 ] && echo "[fuzz] no crashes" || { echo "[fuzz] crashes found"; exit 1; }
