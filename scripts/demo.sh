#!/usr/bin/env bash
# The main job: installs what is missing, builds mzcache, makes the embedded default model (the
# synthesized Qwen3-0.6B q8_0 with the real Qwen tokenizer) if missing, and runs a short generation
# that prints TTFT and tokens/s. Extra arguments go to `mzcache run`. It builds the shared library
# too, so that `cmake --install build --prefix P` works right after it (README; ctest
# demo_then_install checks the targets cover what the install copies).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=$(scripts/deps.sh | tail -n 1)
. scripts/ccache-env.sh
cmake -S . -B build -G Ninja -DMZ_DEPS_PREFIX="$PREFIX" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMZ_UNITY=ON \
  ${MZ_CCACHE:+-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache} >/dev/null
ninja -C build mzcache mzcache_shared | grep -vE '^\[[0-9]+/[0-9]+\] (Building|Linking)' || true
exec ./build/mzcache run -p "${MZ_PROMPT:-Tell me about memory on phones.}" -n "${MZ_N_PREDICT:-48}" "$@"
