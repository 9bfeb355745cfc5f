#!/usr/bin/env bash
# `mzcache serve`'s observability and resource endpoints (tests/serve_obs.py, issue 46): installs the
# pinned Prometheus text parser (npm parse-prometheus-text-format) into the deps cache once, the way
# check_serve.sh installs the openai client, then runs the checks.
# Usage: check_serve_obs.sh MZCACHE MODEL WORKDIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLI=$1 MODEL=$2 W=$3
# The sanitizer stages share the normal build's synthesized models (as tests/test_util.cpp does).
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODEL=$MZ_TEST_MODEL_DIR_OVERRIDE/$(basename "$MODEL")
PARSER_VERSION=1.1.1
NPM_DIR=${MZ_DEPS_CACHE:-$HOME/.cache/mzcache}/npm/parse-prometheus-text-format-$PARSER_VERSION
if [ ! -f "$NPM_DIR/node_modules/parse-prometheus-text-format/package.json" ]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && npm install --silent --no-audit --no-fund "parse-prometheus-text-format@$PARSER_VERSION" >/dev/null) ||
    { echo "FAILED: npm install parse-prometheus-text-format@$PARSER_VERSION" >&2; exit 1; }
fi
rm -rf "$W"
mkdir -p "$W"
exec python3 "$HERE/serve_obs.py" "$CLI" "$MODEL" "$W" "$NPM_DIR"
