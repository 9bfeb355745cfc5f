#!/usr/bin/env bash
# README's sequence, `scripts/demo.sh` then `cmake --install build --prefix P`, needs every file the
# install copies out of the build tree to be built by the targets demo.sh builds (issue 46: the
# demo built only the CLI, and the install failed on the missing libmzcache.so.VERSION).
# Checked on the build graph, without building: for each build-tree file named in
# cmake_install.cmake that ninja builds, it must be one of demo.sh's targets' inputs (ninja -t
# inputs, which follows order-only dependencies too), or come from the same build step as one
# (the library's symlinks). Files made at configure time (the .pc file, the CMake package files)
# are not built by ninja and always exist.
# Usage: check_demo_install.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
fail() { echo "check_demo_install: FAILED: $*" >&2; exit 1; }
# The targets of demo.sh's `ninja -C build TARGET...` line.
line=$(grep -E '^ninja -C build ' "$SRC/scripts/demo.sh" | head -n 1) || fail "no ninja line in scripts/demo.sh"
read -r -a targets <<<"$(sed -E 's/^ninja -C build ([^|]*).*/\1/' <<<"$line")"
[ "${#targets[@]}" -gt 0 ] || fail "no targets on demo.sh's ninja line: $line"
# The targets, their direct inputs (a phony target's file: ninja -t inputs leaves it out) and all
# their inputs.
direct() { ninja -C "$BUILD" -t query "$1" | sed -n '/input:/,/outputs:/p' | grep -E '^    ' | tr -d '|' | awk '{print $1}'; }
closure=$( (printf '%s\n' "${targets[@]}"; for t in "${targets[@]}"; do direct "$t"; done
            ninja -C "$BUILD" -t inputs "${targets[@]}") | sort -u)
query_edge() { ninja -C "$BUILD" -t query "$1" 2>/dev/null | sed -n '/input:/,/outputs:/p'; }
n=0
for p in $(grep -ho "\"$BUILD/[^\"\$]*\"" "$BUILD/cmake_install.cmake" | tr -d '"' | sort -u); do
  rel=${p#"$BUILD"/}
  case $rel in *cmake_install.cmake) continue ;; esac
  ninja -C "$BUILD" -t query "$rel" >/dev/null 2>&1 || continue  # made at configure time
  edge=$(query_edge "$rel")
  [ -n "$edge" ] || continue  # a source ninja knows but does not build
  n=$((n + 1))
  grep -qxF "$rel" <<<"$closure" && continue
  ok=0
  for q in $closure; do
    [ "$(query_edge "$q")" = "$edge" ] && { ok=1; break; }
  done 2>/dev/null
  [ $ok = 1 ] || fail "cmake --install copies $rel, which \`ninja -C build ${targets[*]}\` (scripts/demo.sh) does not build"
done
[ $n -gt 0 ] || fail "cmake_install.cmake names no built file: the check sees nothing"
echo "check_demo_install: ok: the $n built files cmake --install copies are built by \`ninja ${targets[*]}\` (scripts/demo.sh)"
