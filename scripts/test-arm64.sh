#!/usr/bin/env bash
# Cross-compiles the attention kernel (src/kernels) and its tests (tests/test_attention.cpp) for
# AArch64 (the NEON path) and runs them under qemu-aarch64. Installs the cross compiler and
# qemu-user from Debian if missing. GoogleTest is built from Debian's /usr/src/googletest for arm64
# and cached in ~/.cache/mzcache/gtest-arm64.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
[ -d /usr/src/googletest/googletest ] || need+=(googletest)
if [ ${#need[@]} -gt 0 ]; then
  echo "[arm64] installing ${need[*]}"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi
G=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/gtest-arm64
if [ ! -f "$G/libgtest.a" ]; then
  mkdir -p "$G" && (cd "$G" &&
    aarch64-linux-gnu-g++ -std=c++17 -O2 -I/usr/src/googletest/googletest/include -I/usr/src/googletest/googletest \
      -c /usr/src/googletest/googletest/src/gtest-all.cc &&
    aarch64-linux-gnu-g++ -std=c++17 -O2 -I/usr/src/googletest/googletest/include \
      -c /usr/src/googletest/googletest/src/gtest_main.cc &&
    ar rcs libgtest.a gtest-all.o && ar rcs libgtest_main.a gtest_main.o)
fi
out=$(mktemp -d)
# The kernel is every file of src/kernels (dispatch + scalar in attention.cpp, the NEON path in
# attention_neon.cpp; attention_avx2.cpp compiles to nothing here). MZ_ATTENTION_ONLY: the kernel
# alone, no codec library: the tests comparing the q8 layout with the codec run in the x86 builds;
# the q8 read-in-place test builds its payloads with kernels/q8_block.h and runs here too.
kernel_sources=(src/kernels/*.cpp)
echo "[arm64] compiling ${kernel_sources[*]} tests/test_attention.cpp"
aarch64-linux-gnu-g++ -std=c++20 -O2 -Wall -Wextra -march=armv8-a -DMZ_ATTENTION_ONLY -Isrc -I/usr/src/googletest/googletest/include \
  "${kernel_sources[@]}" tests/test_attention.cpp -L"$G" -lgtest_main -lgtest -static -pthread -o "$out/test_attention_arm64"
echo "[arm64] running the attention tests (NEON path) under qemu-aarch64"
qemu-aarch64 "$out/test_attention_arm64"
rm -rf "$out"
