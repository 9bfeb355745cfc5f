#!/usr/bin/env bash
# The installed library as an app developer uses it (ctest `install_and_example`):
#   check_install.sh BUILD_DIR SOURCE_DIR MODEL.gguf
# 1. `cmake --install BUILD_DIR --prefix P` into a fresh folder;
# 2. P has the versioned shared library (SONAME libmzcache.so.MAJOR), the header, the pkg-config file
#    and the CMake package, and ggml/libllama beside the library;
# 3. libmzcache.so exports only mz_* symbols (nm -D);
# 4. examples/simple.c is built out of tree through pkg-config and through find_package(mzcache), and
#    each binary runs on MODEL with an empty environment (nothing set: no LD_LIBRARY_PATH);
# 5. P/bin/mzcache, the command, runs with an empty environment and loads ggml/libllama from P/lib;
# 6. tests/exit_threads.c, built through pkg-config against the installed prefix, runs the load,
#    decode, free and exit sequence $MZ_INSTALL_EXIT_RUNS times (default 3; each a forked child):
#    every run must exit 0 with one thread left before main returns, which a leftover thread breaks in
#    every run, not once in a thousand: so 3 runs suffice (an OpenMP worker still running
#    beside exit()'s static destructors crashed about once in 1,060 exits: issue 46).
# Exits non-zero with the reason on the first failure; removes its folder either way.
set -euo pipefail
build=$(cd "$1" && pwd); src=$(cd "$2" && pwd); model=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
P=$tmp/prefix
fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$P" >/dev/null || fail "cmake --install"
for f in include/mzcache.h lib/libmzcache.so lib/pkgconfig/mzcache.pc lib/cmake/mzcache/mzcacheConfig.cmake \
         lib/cmake/mzcache/mzcacheConfigVersion.cmake lib/cmake/mzcache/mzcacheTargets.cmake lib/libllama.so lib/libggml.so; do
  [ -e "$P/$f" ] || fail "missing $f in the installed prefix"
done
major=$(sed -n 's/^#define MZ_VERSION_MAJOR \([0-9]*\).*/\1/p' "$src/include/mzcache.h")
soname=$(objdump -p "$P/lib/libmzcache.so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libmzcache.so.$major" ] || fail "SONAME is '$soname', want libmzcache.so.$major"
[ -e "$P/lib/$soname" ] || fail "$soname is not installed"
echo "check_install: SONAME $soname"

# Exported (defined, dynamic) symbols other than mz_*: none allowed.
exported=$(nm -D --defined-only "$P/lib/libmzcache.so" | awk '{print $NF}')
n_mz=$(grep -c '^mz_' <<<"$exported" || true)
others=$(grep -v '^mz_' <<<"$exported" || true)
[ -z "$others" ] || fail "libmzcache.so exports symbols outside the C API: $(head -5 <<<"$others" | tr '\n' ' ')"
n_api=$(grep -oE '\bmz_[a-z0-9_]+\(' "$src/include/mzcache.h" | sort -u | wc -l)
[ "$n_mz" -ge "$n_api" ] || fail "libmzcache.so exports $n_mz mz_ symbols, the header declares $n_api functions"
echo "check_install: exports $n_mz symbols, all mz_* (the header declares $n_api functions)"

run() {  # run BINARY: with an empty environment, as a user would start it
  env -i PATH=/usr/bin:/bin "$1" "$model" > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; fail "$1 exited $?"; }
  grep -q '^restore_generate: TTFT' "$tmp/out.txt" || { cat "$tmp/out.txt" >&2; fail "$1 did not restore_generate"; }
  sed 's/^/  /' "$tmp/out.txt"
}

# pkg-config
PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --exists mzcache || fail "pkg-config does not find mzcache"
cc -std=c11 -Wall -Wextra -Werror "$src/examples/simple.c" -o "$tmp/simple_pc" \
  $(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags --libs mzcache) || fail "building the example through pkg-config"
echo "check_install: built examples/simple.c through pkg-config; running it"
run "$tmp/simple_pc"

# find_package(mzcache)
cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release >/dev/null \
  || fail "configuring examples/ with find_package(mzcache)"
cmake --build "$tmp/ex" >/dev/null || fail "building examples/ with find_package(mzcache)"
echo "check_install: built examples/ through find_package(mzcache); running it"
run "$tmp/ex/simple"

# The installed command: its ggml and libllama are the prefix's, and it reads the model.
[ -x "$P/bin/mzcache" ] || fail "missing bin/mzcache in the installed prefix"
llama=$(env -i PATH=/usr/bin:/bin ldd "$P/bin/mzcache" | awk '$1 ~ /^libllama\.so/ {print $3}')
[ "$(readlink -f "$llama")" = "$(readlink -f "$P/lib/libllama.so.0")" ] || fail "bin/mzcache loads libllama from '$llama', not from the prefix"
env -i PATH=/usr/bin:/bin "$P/bin/mzcache" --help > "$tmp/out.txt" 2>&1 || { cat "$tmp/out.txt" >&2; fail "bin/mzcache --help"; }
env -i PATH=/usr/bin:/bin HOME="$tmp" "$P/bin/mzcache" info -m "$model" > "$tmp/out.txt" 2>&1 \
  || { cat "$tmp/out.txt" >&2; fail "bin/mzcache info on $model"; }
grep -qi "layer" "$tmp/out.txt" || { cat "$tmp/out.txt" >&2; fail "bin/mzcache info printed no layers"; }
echo "check_install: bin/mzcache runs from the prefix (libllama: $llama)"

# The exits of the installed library (what tests/exit_threads.c checks on the build tree's copy).
cc -std=c11 -Wall -Wextra -Werror "$src/tests/exit_threads.c" -o "$tmp/exit_threads" \
  $(PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config --cflags --libs mzcache) || fail "building tests/exit_threads.c through pkg-config"
env -i PATH=/usr/bin:/bin "$tmp/exit_threads" "$model" "${MZ_INSTALL_EXIT_RUNS:-3}" > "$tmp/out.txt" 2>&1 \
  || { cat "$tmp/out.txt" >&2; fail "exit_threads on the installed library"; }
sed 's/^/  /' "$tmp/out.txt"
echo "check_install: ok"
