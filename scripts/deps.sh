#!/usr/bin/env bash
# Obtain and build the pinned ggml + llama.cpp from the npm package node-llama-cpp.
#
# Contract: prints the install prefix (one line, last line of stdout) on success; exits non-zero with
# a message on stderr on failure. Idempotent: a finished build is found in the cache and reused in
# well under a second. Nothing is written inside the source tree.
#
#   MZ_DEPS_CACHE   cache root (default ~/.cache/mzcache)
#   MZ_SKIP_APT=1   do not run apt-get (packages are known to be present)
#   MZ_DEPS_SERVER=1 also build llama.cpp's llama-server (the peer `bench serve` races, and a system
#                    of `bench field-notes`: the test command asks for it); added to a finished build
#                    incrementally
#   MZ_DEPS_BENCH=1  also build llama.cpp's llama-bench (the peer of `bench speed`; likewise not needed
#                    by the tests: it pulls in llama-common and its HTTP client, 37% of the CPU time
#                    of the whole dependency build); added incrementally
# Usage: scripts/deps.sh [--help]   (no other argument: the environment variables above are the knobs)
set -euo pipefail
case "${1:-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "deps.sh: unknown argument $1 (it takes none; see --help)" >&2; exit 2 ;;
esac

NLC_VERSION=3.21.1
NLC_SHA256=7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f
# Build flags are part of the cache key: change them and a new build is made.
BUILD_FLAGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CPU=ON \
 -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DCMAKE_BUILD_TYPE=Release"
KEY=$(printf '%s %s %s' "$NLC_VERSION" "$NLC_SHA256" "$BUILD_FLAGS" | sha256sum | cut -c1-12)

CACHE=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}
ROOT=$CACHE/deps/node-llama-cpp-$NLC_VERSION-$KEY
PREFIX=$ROOT/install

log() { echo "[deps] $*" >&2; }

APT_PACKAGES="build-essential cmake ninja-build git libgtest-dev libgmock-dev libbenchmark-dev \
 libcli11-dev nlohmann-json3-dev libzstd-dev liblz4-dev liburing-dev libxxhash-dev gnuplot-nox libfmt-dev \
 libspdlog-dev libomp-dev ccache bible-kjv pkg-config binutils libcpp-httplib-dev curl python3-fusepy \
 libhiredis-dev libssl-dev openssl redis-server nginx"

install_apt() {
  [ "${MZ_SKIP_APT:-0}" = 1 ] && return 0
  local missing=()
  # The native architecture's package: once the AArch64 stage added arm64 copies of the -dev
  # packages (multiarch), a bare name is ambiguous to dpkg -s and would count as missing.
  local arch
  arch=$(dpkg --print-architecture)
  for p in $APT_PACKAGES; do
    dpkg -s "$p:$arch" >/dev/null 2>&1 || dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  # node/npm often come from elsewhere than Debian (the machine image ships them): check the commands.
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >&2
}

install_apt

build_tool() {  # build_tool NAME: llama.cpp's tool NAME into $PREFIX/bin, from the cached build tree
  # (incremental), with the shared libraries it brings (llama-bench: libllama-common)
  [ -x "$PREFIX/bin/$1" ] && return 0
  log "building $1 (once)"
  cmake --build "$ROOT/build" --target "$1" -j "$(nproc)" >&2
  cp -P "$ROOT"/build/bin/*.so* "$PREFIX/lib/"
  cp "$ROOT/build/bin/$1" "$PREFIX/bin/"
}
build_tools() {
  [ "${MZ_DEPS_SERVER:-0}" = 1 ] && build_tool llama-server
  [ "${MZ_DEPS_BENCH:-0}" = 1 ] && build_tool llama-bench
  return 0
}

if [ -f "$PREFIX/.complete" ]; then
  build_tools
  echo "$PREFIX"
  exit 0
fi

mkdir -p "$ROOT"
cd "$ROOT"
if [ ! -f pkg.ok ]; then
  log "fetching node-llama-cpp@$NLC_VERSION from npm"
  rm -rf pack && mkdir pack
  (cd pack && npm pack --silent "node-llama-cpp@$NLC_VERSION" >/dev/null)
  got=$(sha256sum pack/node-llama-cpp-$NLC_VERSION.tgz | cut -d' ' -f1)
  if [ "$got" != "$NLC_SHA256" ]; then
    log "sha256 mismatch for node-llama-cpp-$NLC_VERSION.tgz: got $got, want $NLC_SHA256"
    exit 1
  fi
  tar -xzf pack/node-llama-cpp-$NLC_VERSION.tgz -C pack package/llama/gitRelease.bundle
  rm -rf src
  git clone -q pack/package/llama/gitRelease.bundle src
  rm -rf pack/package pack/*.tgz
  touch pkg.ok
fi

log "building ggml + llama.cpp (2 cores: about 5 minutes, once)"
# shellcheck disable=SC2086
cmake -S src -B build -G Ninja $BUILD_FLAGS -DCMAKE_INSTALL_PREFIX="$PREFIX" \
  -DCMAKE_INSTALL_RPATH="$PREFIX/lib" -DCMAKE_BUILD_RPATH="$PREFIX/lib" >&2
cmake --build build --target llama ggml -j "$(nproc)" >&2
# Install by hand: only the targets above were built, so `cmake --install` would fail on the rest.
rm -rf "$PREFIX" && mkdir -p "$PREFIX/include" "$PREFIX/lib" "$PREFIX/bin"
cp src/include/*.h src/ggml/include/*.h "$PREFIX/include/"
cp -P build/bin/*.so* "$PREFIX/lib/"
# Models' vocabularies: the synthesizer copies tokenizers from here.
mkdir -p "$PREFIX/share/vocab"
cp src/models/ggml-vocab-*.gguf "$PREFIX/share/vocab/"
for lib in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
  [ -e "$PREFIX/lib/$lib" ] || { log "install incomplete: $PREFIX/lib/$lib missing"; exit 1; }
done
touch "$PREFIX/.complete"
build_tools
log "done: $PREFIX"
echo "$PREFIX"
