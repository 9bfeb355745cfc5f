#!/usr/bin/env bash
# Layering check of src/ (ctest "layering", label lint). Each folder of src/ is one layer, lowest first:
#   core < env < kernels < model < store < policy < memory < restore < runtime < pressure < pool < api
# A file's layer is its folder's. Fails, printing every offence, when:
#   - a file lies in a folder that is not a layer (add it to LAYERS at its place);
#   - an include "x/..." points to a higher layer than the including file's (upward include);
#   - an include "x/..." names a file that does not exist in src/ (stale path);
#   - the includes between files form a cycle (tsort), or the includes between folders do (which
#     with a strict order can only come from an upward include, so this is a second look).
#   - a file of the thin commands (tools/serve/, tools/cli/ but for the exceptions named below)
#     includes a header of src/ (they are built on mzcache.h only).
# Only quoted includes whose first path part is a layer are checked ("mzcache.h", "ggml.h" and the
# system headers are not part of src/). Usage: tests/check_layers.sh [repo root] (default: the
# checkout this script lives in). Needs bash, grep, sed, tsort (coreutils).
set -euo pipefail
root=${1:-"$(cd "$(dirname "$0")/.." && pwd)"}
cd "$root/src"

LAYERS=(core env kernels model store policy memory restore runtime pressure pool api)
declare -A rank
for i in "${!LAYERS[@]}"; do rank[${LAYERS[$i]}]=$i; done

fail=0
file_edges=$(mktemp)
dir_edges=$(mktemp)
trap 'rm -f "$file_edges" "$dir_edges"' EXIT

while IFS= read -r -d '' f; do
  f=${f#./}
  from=${f%%/*}
  if [ "$from" = "$f" ] || [ -z "${rank[$from]+x}" ]; then
    echo "layering: $f is not in a layer folder (${LAYERS[*]})"
    fail=1
    continue
  fi
  echo "$f $f" >>"$file_edges"  # every file is a node, included or not
  while IFS=: read -r line inc; do
    to=${inc%%/*}
    [ "$to" = "$inc" ] && continue           # "mzcache.h", "ggml.h": not a src/ path
    [ -z "${rank[$to]+x}" ] && continue      # "gtest/...", other libraries' folders
    if [ ! -f "$inc" ]; then
      echo "layering: $f:$line includes \"$inc\", which is not a file in src/"
      fail=1
      continue
    fi
    if [ "${rank[$to]}" -gt "${rank[$from]}" ]; then
      echo "layering: $f:$line includes \"$inc\": $from may not include $to (higher layer)"
      fail=1
    fi
    echo "$inc $f" >>"$file_edges"           # inc must come before f
    [ "$to" != "$from" ] && echo "$to $from" >>"$dir_edges"
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$f" |
           sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2/')
done < <(find . -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' \) -print0 | sort -z)

for edges in "$file_edges" "$dir_edges"; do
  [ -s "$edges" ] || continue
  if ! out=$(tsort <"$edges" 2>&1 >/dev/null); then
    echo "layering: include cycle:"
    echo "$out" | sed 's/^/  /'
    fail=1
  fi
done

# The thin commands: tools/serve/ and tools/cli/ are built on the public C API (mzcache.h) and the
# CLI's own helpers (tools/...), and include nothing of src/, except the files named here with the
# reason they need the library's insides:
#   cmd_model.cpp  make-model and info: the GGUF synthesizer and the weight-unit table (no C API)
#   cmd_plan.cpp   plan --recommend: device tiers from the device profile and the shape table
THIN_EXCEPT=" tools/cli/cmd_model.cpp tools/cli/cmd_plan.cpp "
cd "$root"
for f in tools/serve/* tools/cli/*; do
  [ -f "$f" ] || continue
  case "$THIN_EXCEPT" in *" $f "*) continue ;; esac
  while IFS=: read -r line inc; do
    to=${inc%%/*}
    if [ -n "${rank[$to]+x}" ]; then
      echo "layering: $f:$line includes \"$inc\": the thin commands use mzcache.h, not the library's insides"
      fail=1
    fi
  done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$f" |
           sed -E 's/^([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2/')
done

if [ "$fail" -ne 0 ]; then
  echo "layering: FAILED (order: ${LAYERS[*]})"
  exit 1
fi
echo "layering: ok ($(sort -u "$file_edges" | wc -l) include edges, order: ${LAYERS[*]})"
