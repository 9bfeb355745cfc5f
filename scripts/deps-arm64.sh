#!/usr/bin/env bash
# The AArch64 (aarch64-linux-gnu) counterpart of scripts/deps.sh: installs the cross toolchain,
# qemu-user and the arm64 -dev packages mzcache links, and builds the pinned ggml + libllama for
# AArch64 from the same source tree scripts/deps.sh cloned (same pinned commit, never re-fetched).
#
# Usage: scripts/deps-arm64.sh [--src DIR] [--apt-only] [--help]
#   --src DIR     the pinned llama.cpp source (default: <scripts/deps.sh's prefix>/../src, which runs
#                 scripts/deps.sh first; it returns at once when its build is cached)
#   --apt-only    only install the Debian packages, build nothing
#   MZ_DEPS_CACHE cache root (default ~/.cache/mzcache)
#   MZ_SKIP_APT=1 do not run apt-get (packages are known to be present)
#   JOBS          parallel compile jobs (default: nproc)
#
# Contract: prints the install prefix (last line of stdout) on success; exits non-zero with a
# message on stderr on failure. The prefix has the layout CMakeLists.txt expects of MZ_DEPS_PREFIX
# (include/, lib/libllama.so libggml*.so, share/vocab/, .complete), all AArch64. It is cached in
# $MZ_DEPS_CACHE/deps/node-llama-cpp-<version>-aarch64-<key>/install, keyed by the source commit,
# the build flags, the toolchain file (its build settings) and the cross compiler's version; a cached build is reused in
# well under a second. Nothing is written inside the source tree or the x86 dependency folder.
#
# ggml is built for generic armv8-a (NEON, no dotprod/i8mm/SVE: runs on every 64-bit Arm phone and
# under qemu-user), with OpenMP (libgomp of the cross toolchain) as the x86 build has, shared
# libraries as the x86 build has. No llama.cpp tools: the differential test links libllama itself.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLCHAIN=$PWD/cmake/toolchain-aarch64.cmake
SRC=${MZ_DEPS_SRC:-}
APT_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --src) SRC=$2; shift 2 ;;
    --apt-only) APT_ONLY=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "deps-arm64.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "[deps-arm64] $*" >&2; }

# Host tools (cross compiler, qemu) and the arm64 multiarch -dev packages. The :arm64 packages are
# Multi-Arch: same, so they install beside the amd64 ones (--no-remove: apt must never trade the
# host's packages for them).
HOST_PACKAGES="g++-aarch64-linux-gnu qemu-user file cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev"
ARM64_PACKAGES="libc6:arm64 libstdc++6:arm64 libgomp1:arm64 libzstd-dev:arm64 liblz4-dev:arm64 liburing-dev:arm64 libxxhash-dev:arm64 libfmt-dev:arm64 \
 libgtest-dev:arm64 libgmock-dev:arm64"
install_apt() {
  [ "${MZ_SKIP_APT:-0}" = 1 ] && return 0
  local missing=() p SUDO=
  for p in $HOST_PACKAGES $ARM64_PACKAGES; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" != 0 ] && SUDO=sudo
  log "installing Debian packages: ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-remove "${missing[@]}" >&2
}
install_apt
[ "$APT_ONLY" = 1 ] && exit 0

if [ -z "$SRC" ]; then
  X86_PREFIX=$(scripts/deps.sh | tail -n 1)
  SRC=$(cd "$X86_PREFIX/.." && pwd)/src
fi
[ -f "$SRC/CMakeLists.txt" ] && [ -d "$SRC/ggml" ] || { log "no llama.cpp source at $SRC"; exit 1; }
SRC=$(cd "$SRC" && pwd)
COMMIT=$(git -C "$SRC" rev-parse HEAD)
# The version label is the npm package's (the x86 folder is node-llama-cpp-<version>-<key>).
VERSION=$(basename "$(dirname "$SRC")" | sed -n 's/^node-llama-cpp-\([0-9.]*\)-.*/\1/p')
VERSION=${VERSION:-unknown}

# Build flags are part of the cache key: change them and a new build is made.
# C++ at -O1 (C keeps Release's -O3): libllama's C++ is 85% of this build's compile time, and these
# libraries only run under qemu in tests (the tokenizer, and the differential suite's reference
# forward); ggml's quantized matrix kernels are C and stay at -O3. llama-model.cpp, user CPU of the
# cross compiler: -O3 12.5 s, -O1 7.4 s.
BUILD_FLAGS="-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8-a -DGGML_CPU=ON -DGGML_OPENMP=ON \
 -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
 -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release \
 -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS=-DNDEBUG"
CXX_VERSION=$(aarch64-linux-gnu-g++ -dumpfullversion)
# The toolchain file counts without its comments and without the emulator lines (how target
# programs are run does not change what is built).
TOOLCHAIN_KEY=$(grep -vE '^[[:space:]]*#|QEMU|EMULATOR' "$TOOLCHAIN" | sha256sum | cut -c1-16)
KEY=$(printf '%s %s %s %s' "$COMMIT" "$BUILD_FLAGS" "$TOOLCHAIN_KEY" "$CXX_VERSION" | sha256sum | cut -c1-12)
CACHE=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}
ROOT=$CACHE/deps/node-llama-cpp-$VERSION-aarch64-$KEY
PREFIX=$ROOT/install
# SOURCE: the llama.cpp source this prefix was built from, where CMakeLists.txt finds the Jinja
# engine it compiles (common/jinja); written on a cached prefix too (it is not part of the key).
if [ -f "$PREFIX/.complete" ]; then
  [ -f "$PREFIX/SOURCE" ] || echo "$SRC" > "$PREFIX/SOURCE"
  echo "$PREFIX"
  exit 0
fi

log "building ggml + llama.cpp ${COMMIT:0:12} for aarch64 (armv8-a) in $ROOT (2 cores: about 10 minutes, once)"
mkdir -p "$ROOT"
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$ROOT/build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$TOOLCHAIN" $BUILD_FLAGS \
  -DCMAKE_INSTALL_RPATH="$PREFIX/lib" -DCMAKE_BUILD_RPATH="$PREFIX/lib" >&2
cmake --build "$ROOT/build" --target llama ggml -j "${JOBS:-$(nproc)}" >&2
rm -rf "$PREFIX" && mkdir -p "$PREFIX/include" "$PREFIX/lib" "$PREFIX/share/vocab"
cp "$SRC"/include/*.h "$SRC"/ggml/include/*.h "$PREFIX/include/"
cp -P "$ROOT"/build/bin/*.so* "$PREFIX/lib/"
cp "$SRC"/models/ggml-vocab-*.gguf "$PREFIX/share/vocab/"
for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
  [ -e "$PREFIX/lib/$lib" ] || { log "install incomplete: $PREFIX/lib/$lib missing"; exit 1; }
  file -L "$PREFIX/lib/$lib" | grep -q 'ARM aarch64' || { log "$PREFIX/lib/$lib is not an AArch64 library"; exit 1; }
done
printf 'commit %s\nflags %s\ncompiler aarch64-linux-gnu-g++ %s\n' "$COMMIT" "$BUILD_FLAGS" "$CXX_VERSION" > "$PREFIX/BUILD-INFO"
echo "$SRC" > "$PREFIX/SOURCE"
touch "$PREFIX/.complete"
log "done: $PREFIX"
echo "$PREFIX"
