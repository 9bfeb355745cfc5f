#!/usr/bin/env bash
# Every command a user is told about answers --help (ctest `help_everywhere`, label tools; about 5 s).
#   check_help.sh MZCACHE_CLI SOURCE_DIR
# 1. The CLI: `mzcache --help` and `mzcache SUB --help` for every subcommand it lists, and one level
#    further for the subcommands that have their own (bench, reliability, conversations): each must
#    exit 0 and print its usage. At least 10 subcommands must be found (a parse that finds none fails).
# 2. The scripts (scripts/*.sh but the sourced ccache-env.sh, bench/*.sh, bench/*.py, bench/*.mjs
#    when node is installed, tests/check_serve_page.sh which docs/server.md tells users to run):
#    `--help` must exit 0 within 60 s and print at least 3 lines. Each runs from a copy of its folder
#    in a temporary directory with no CMakeLists.txt beside it, so a script that ignores --help and
#    starts its real work (scripts/test.sh and scripts/fuzz.sh did: a 40-minute run) fails fast there
#    instead of building in the source tree.
# Prints one line per command; exits 1 after listing every failure, 0 when all passed.
set -euo pipefail
cli=$(realpath "$1"); src=$(cd "$2" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
out=$tmp/out.txt
fails=0
fail() { echo "FAIL: $*"; sed 's/^/  | /' "$out" | head -20; fails=$((fails + 1)); }

subcommands() {  # subcommands CMD...: the names under "Subcommands:" of CMD --help
  "$@" --help 2>/dev/null | awk '/^Subcommands:/ {on = 1; next} on && /^  [a-z]/ {print $1}'
}
cli_help() {  # cli_help ARGS...: `mzcache ARGS --help` exits 0 and prints Usage
  local rc=0
  "$cli" "$@" --help >"$out" 2>&1 || rc=$?
  if [ $rc != 0 ]; then fail "mzcache $* --help exited $rc"
  elif ! grep -q '^Usage:' "$out"; then fail "mzcache $* --help printed no Usage line"
  else echo "ok: mzcache $* --help"; fi
}

cli_help
mapfile -t subs < <(subcommands "$cli")
[ "${#subs[@]}" -ge 10 ] || { echo "FAIL: mzcache --help lists ${#subs[@]} subcommands (want >= 10)"; fails=$((fails + 1)); }
for s in "${subs[@]}"; do
  cli_help "$s"
  mapfile -t subsubs < <(subcommands "$cli" "$s")
  for ss in "${subsubs[@]}"; do cli_help "$s" "$ss"; done
done

script_help() {  # script_help REL_PATH RUNNER...: the script's --help from a copy of its folder
  local rel=$1 dir rc=0; shift
  dir=$tmp/tree/$(dirname "$rel")
  mkdir -p "$dir" && cp -r "$src/$(dirname "$rel")/." "$dir/"
  (cd "$tmp/tree" && timeout 60 "$@" "$rel" --help) >"$out" 2>&1 </dev/null || rc=$?
  if [ $rc != 0 ]; then fail "$rel --help exited $rc"
  elif [ "$(wc -l <"$out")" -lt 3 ]; then fail "$rel --help printed $(wc -l <"$out") lines, want a help text"
  else echo "ok: $rel --help"; fi
  rm -rf "$tmp/tree"
}
n_scripts=0
for f in "$src"/scripts/*.sh "$src"/bench/*.sh "$src"/tests/check_serve_page.sh; do
  [ "$(basename "$f")" = ccache-env.sh ] && continue
  script_help "${f#"$src"/}" bash; n_scripts=$((n_scripts + 1))
done
for f in "$src"/bench/*.py; do script_help "${f#"$src"/}" python3; n_scripts=$((n_scripts + 1)); done
if command -v node >/dev/null 2>&1; then
  for f in "$src"/bench/*.mjs; do script_help "${f#"$src"/}" node; n_scripts=$((n_scripts + 1)); done
else
  echo "note: node not installed: bench/*.mjs not checked"
fi
echo "check_help: ${#subs[@]} subcommands, $n_scripts scripts, $fails failures"
[ $fails = 0 ]
