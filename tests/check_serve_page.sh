#!/usr/bin/env bash
# The web page of `mzcache serve` in a real browser (tests/serve_page.mjs says what it checks; then
# tests/serve_page_models.mjs with two models):
# Debian's chromium (installed with apt-get when missing and this runs as root) driven by the npm
# package puppeteer-core (pinned; installed once into the cache, no browser download).
# Usage: check_serve_page.sh MZCACHE_CLI MODEL.gguf WORK_DIR [--screenshot PATH]
#   --screenshot PATH: also writes a screenshot of the page after a trim and a return (how
#   docs/images/serve-page.png is made: scripts in docs/server.md).
# Exit: 0 passed; 1 failed (the failed check on stderr); 77 skipped: chromium is not installed and
# cannot be (not root, no apt-get, or the install failed): the reason is printed.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
[ $# -ge 3 ] || { echo "usage: $0 MZCACHE_CLI MODEL.gguf WORK_DIR [--screenshot PATH] (--help)" >&2; exit 2; }
CLI=$1 MODEL=$2 W=$3
shift 3
SHOT=()
if [ "${1:-}" = --screenshot ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 CLI MODEL WORK_DIR [--screenshot PATH]" >&2; exit 2; }
  SHOT=(--screenshot "$(realpath -m "$2")")
fi
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODEL=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$MODEL")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/serve_lib.sh"
KEY=page-key-$$
PUPPETEER_VERSION=24.43.1
rm -rf "$W" && mkdir -p "$W"
PID=
cleanup() { [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "check_serve_page: FAILED: $*" >&2; [ -f "$W/server.log" ] && tail -20 "$W/server.log" >&2; exit 1; }

CHROMIUM=$(command -v chromium || true)
if [ -z "$CHROMIUM" ]; then
  if [ "$(id -u)" != 0 ]; then
    why="not root: cannot apt-get install it"
  elif ! command -v apt-get >/dev/null; then
    why="no apt-get on this system"
  else
    echo "check_serve_page: installing Debian's chromium (apt-get install -y chromium)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >"$W/apt.log" 2>&1 ||
      { apt-get update >>"$W/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium >>"$W/apt.log" 2>&1; } || true
    CHROMIUM=$(command -v chromium || true)
    why="apt-get install chromium failed: see $W/apt.log"
  fi
  if [ -z "$CHROMIUM" ]; then
    echo "check_serve_page: SKIPPED: chromium is not installed and could not be installed ($why)"
    exit 77
  fi
fi
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/puppeteer-core-$PUPPETEER_VERSION
if [ ! -f "$NPM_DIR/node_modules/puppeteer-core/package.json" ]; then
  mkdir -p "$NPM_DIR"
  # puppeteer-core downloads no browser (unlike puppeteer): the page runs in Debian's chromium.
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "puppeteer-core@$PUPPETEER_VERSION" >/dev/null) ||
    fail "npm install puppeteer-core@$PUPPETEER_VERSION"
fi

"$CLI" serve -m "$MODEL" --port 0 --port-file "$W/port" --pool-dir "$W/pool" --persist-codec none --kv-codec none \
  -c 2048 --max-tokens 32 -t 1 --no-watch-pressure --api-key "$KEY" >"$W/server.log" 2>&1 &
PID=$!
wait_port
# HOME for chromium's profile and crash files: the work directory, not the user's.
HOME="$W" node "$HERE/serve_page.mjs" "http://127.0.0.1:$PORT" "$KEY" "$NPM_DIR" "$CHROMIUM" "${SHOT[@]}" ||
  fail "the page in chromium (above)"
kill -TERM "$PID"
wait "$PID" || fail "the server did not stop cleanly (exit $?)"
PID=
# Two models (issue 45; tests/serve_page_models.mjs): the model picker and the weights bar per model.
MODEL2=$(dirname "$MODEL")/tiny-llama-q8_0.gguf
rm -f "$W/port"
"$CLI" serve -m "$MODEL" -m "$MODEL2" --port 0 --port-file "$W/port" --pool-dir "$W/pool2" --persist-codec none \
  --kv-codec none -c 512 --max-tokens 8 -t 1 --no-watch-pressure >>"$W/server.log" 2>&1 &
PID=$!
wait_port
HOME="$W" node "$HERE/serve_page_models.mjs" "http://127.0.0.1:$PORT" "$NPM_DIR" "$CHROMIUM" ||
  fail "the page with two models in chromium (above)"
kill -TERM "$PID"
wait "$PID" || fail "the two-model server did not stop cleanly (exit $?)"
PID=
echo "check_serve_page: ok"
