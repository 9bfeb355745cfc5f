#!/usr/bin/env bash
# bench models runs each system in its own worker process (issue 45, session 34) and samples each
# one's RSS over time. Two tiny models, two switches, mzcache and all in memory; nothing is timed.
# Usage: check_bench_models_workers.sh MZCACHE_CLI MODEL_DIR WORK_DIR (MODEL_DIR holds
# tiny-qwen3-q8_0.gguf and tiny-llama-q8_0.gguf)
# Checks, each failing the test with a message:
#   1. the run succeeds and writes bench-models.{md,json}, bench-models-rss.dat (one block per
#      system) and, where gnuplot exists, bench-models-rss.png;
#   2. every request carries its system's RSS after it, split into anonymous and file-backed
#      (anon + file <= RSS), and the sampler took samples of both systems;
#   3. the systems' RSS are their own: all in memory (both models loaded, no budget) holds more
#      than mzcache under its budget of 1.5 models, by median over the run (one process running
#      both systems would give the same figure to both);
#   4. the workers are gone and the scratch folder is removed afterwards.
set -euo pipefail
CLI=$1 MODELS=$2 W=$3
[ -n "${MZ_TEST_MODEL_DIR_OVERRIDE:-}" ] && MODELS=$MZ_TEST_MODEL_DIR_OVERRIDE
rm -rf "$W" && mkdir -p "$W/scratch"
fail() { echo "check_bench_models_workers: FAILED: $*" >&2; [ -f "$W/run.log" ] && tail -20 "$W/run.log" >&2; exit 1; }
"$CLI" bench models --models "$MODELS/tiny-qwen3-q8_0.gguf,$MODELS/tiny-llama-q8_0.gguf" --steps 2 --history 32 \
  --query 8 --gen 2 --systems mzcache,all-in-memory --sample-ms 20 --dir "$W/scratch" -o "$W/out" \
  >"$W/run.log" 2>&1 || fail "bench models exited with $?"
for f in bench-models.md bench-models.json bench-models-rss.dat; do [ -s "$W/out/$f" ] || fail "no $f"; done
if command -v gnuplot >/dev/null; then [ -s "$W/out/bench-models-rss.png" ] || fail "no bench-models-rss.png"; fi
[ "$(grep -c '^# mzcache$\|^# all-in-memory$' "$W/out/bench-models-rss.dat")" = 2 ] || fail "bench-models-rss.dat: not one block per system"
python3 - "$W/out/bench-models.json" <<'PY' || fail "the JSON's RSS figures (above)"
import json, sys
d = json.load(open(sys.argv[1]))
reqs = d["requests"]
assert len(reqs) == 4, f"{len(reqs)} requests, want 2 switches x 2 systems"
for r in reqs:
    assert r["rss_after"] > 0, r
    assert r["rss_anon_after"] > 0 and r["rss_file_after"] > 0, r
    assert r["rss_anon_after"] + r["rss_file_after"] <= r["rss_after"], r
rss = d["rss"]
for s in ("mzcache", "all-in-memory"):
    assert rss[s]["samples"] > 0 and rss[s]["rss_min_mib"] > 0, (s, rss[s])
assert rss["all-in-memory"]["rss_median_mib"] > rss["mzcache"]["rss_median_mib"], rss
PY
[ -z "$(ls -A "$W/scratch")" ] || fail "the scratch folder still holds $(ls "$W/scratch")"
if ps -eo args | grep -F -- "--root $W/scratch" | grep -vq grep; then fail "a worker outlived the run"; fi
echo "check_bench_models_workers: ok"
