#!/usr/bin/env bash
# The main job: installs what is missing, builds mzcache, makes the default model (the synthesized
# Qwen3-0.6B q8_0 with the real Qwen tokenizer) if missing, and runs `mzcache demo`: the story of
# what mzcache is for, measured in this run (a conversation built, memory given back when the
# system asks, the return's time to first token against recomputing, a kill -9 survived), on one
# screen and in <cache>/demo/demo.png. Extra arguments go to `mzcache demo` (--quick: under a
# minute of run time on 2 cores; its options: below).
#   scripts/demo.sh serve [ARGS]   starts `mzcache serve` on the default model instead (ARGS go to
#                                  it) and prints the page's URL and a curl line.
# It builds the shared library too, so that `cmake --install build --prefix P` works right after it
# (README; ctest demo_then_install checks the targets cover what the install copies).
#   scripts/demo.sh --help         this text, without building (the demo's own options:
#                                  build/mzcache demo --help; the server's: build/mzcache serve --help)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
cd "$(dirname "$0")/.."
PREFIX=$(scripts/deps.sh | tail -n 1)
. scripts/ccache-env.sh
cmake -S . -B build -G Ninja -DMZ_DEPS_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMZ_UNITY=ON \
  ${MZ_CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache} >/dev/null
ninja -C build mzcache mzcache_shared | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
if [ "${1:-}" = serve ]; then
  shift
  PORT=8080
  for ((i = 1; i <= $#; i++)); do [ "${!i}" = --port ] && { j=$((i + 1)); PORT=${!j}; }; done
  echo "mzcache serve: the page at http://127.0.0.1:$PORT/ ; try:"
  echo "  curl -s localhost:$PORT/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":16}'"
  exec ./build/mzcache serve "$@"
fi
exec ./build/mzcache demo "$@"
