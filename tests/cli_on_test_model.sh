#!/bin/sh
# Runs the CLI on the synthesized tiny-qwen3 test model (ctest: reliability_*).
# Usage: cli_on_test_model.sh CLI MODEL_DIR ARGS...  ->  CLI ARGS... -m DIR/tiny-qwen3-q8_0.gguf,
# where DIR is $MZ_TEST_MODEL_DIR_OVERRIDE when set (the sanitizer stages share the normal build's
# models, as tests/test_util.cpp does), else MODEL_DIR.
cli=$1
dir=${MZ_TEST_MODEL_DIR_OVERRIDE:-$2}
shift 2
exec "$cli" "$@" -m "$dir/tiny-qwen3-q8_0.gguf"
