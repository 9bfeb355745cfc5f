#!/usr/bin/env python3
"""`mzcache bench accuracy --kv-types f16,q8_0` and its alias `bench kv-type` on the synthesized
tiny-qwen3 model at small sizes (ctest "bench_accuracy_kv", label tools; issue 24 §1, live q8 KV).

Checks, each failing the test with what was wrong: the report has the live q8_0 row; in the JSON,
live q8_0 KV against the f16 reference has a finite KL > 0 at every position and top-1 agreement in
[0, 1]; the q8 codec on q8_0 KV adds nothing (identity), q4 adds error, the `none` controls are exact
on both types; q8_0 KV takes the formula's bytes per token, fewer than f16; two idempotence cycles
per type; TTFT rows for both types; `bench kv-type` writes bench-kv-type.json with the same live row
and codec q8 only; an unknown KV type is refused.

Usage: tests/check_bench_accuracy.py MZCACHE MODEL_DIR  (MODEL_DIR/tiny-qwen3-q8_0.gguf;
$MZ_TEST_MODEL_DIR_OVERRIDE wins when set, as tests/cli_on_test_model.sh)
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

failed = []


def check(ok, what, detail=""):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)
        if detail:
            print("\n".join("  | " + line for line in detail.splitlines()))


def run(cli, args, env):
    p = subprocess.run([cli] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    return p.returncode, p.stdout


def main():
    cli = sys.argv[1]
    model = os.path.join(os.environ.get("MZ_TEST_MODEL_DIR_OVERRIDE") or sys.argv[2], "tiny-qwen3-q8_0.gguf")
    if not os.path.isfile(model):
        print("check_bench_accuracy: no test model at " + model)
        return 1
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ, MZ_CACHE_DIR=os.path.join(work, "cache"))  # the contexts' session files
        small = ["-m", model, "--ctx", "256", "--positions", "32", "-t", "1", "--swap-dir", work]
        acc = os.path.join(work, "acc")
        rc, out = run(cli, ["bench", "accuracy", "--kv-types", "f16,q8_0", "--quick", "--cycles", "2", "--ttft-ctx", "512",
                            "--levels", "0", "-o", acc] + small, env)
        if rc != 0:
            check(False, "bench accuracy exited %d" % rc, out)
            return 1
        md = open(os.path.join(acc, "bench-accuracy.md")).read()
        check(re.search(r"^\| q8_0 \| never evicted \(live\) \| 32 \|", md, re.M) is not None,
              "the report has the live q8_0 row", md)
        j = json.load(open(os.path.join(acc, "bench-accuracy.json")))
        q = j["by_kv_type"]["q8_0"]
        live = q["accuracy"]["live"]
        kl = live["kl_per_position"]
        check(j["kv_types"] == ["f16", "q8_0"], "kv_types f16, q8_0")
        check(live["positions"] == 32 and len(kl) == 32, "live q8_0 row over the 32 positions")
        check(all(math.isfinite(x) and x >= 0 for x in kl) and math.isfinite(live["mean_kl"]) and live["mean_kl"] > 0,
              "live q8_0 KL finite and > 0 (mean %g)" % live["mean_kl"])
        check(0 <= live["top1_agree"] <= live["positions"],
              "live q8_0 top-1 agreement in [0, 1] (%d/32)" % live["top1_agree"])
        check(q["accuracy"]["q8"]["vs_same_kv"]["max_kl"] == 0 and q["accuracy"]["q8"]["mean_kl"] == live["mean_kl"],
              "the q8 codec on q8_0 KV adds nothing")
        check(q["accuracy"]["q4"]["vs_same_kv"]["mean_kl"] > 0, "q4 on q8_0 KV adds error")
        check(q["accuracy"]["none"]["vs_same_kv"]["max_kl"] == 0 and j["accuracy"]["none"]["max_kl"] == 0,
              "the none controls are exact on both types")
        check(j["accuracy"]["q8"]["mean_kl"] > 0 and "live" not in j["accuracy"], "the f16 rows where they were")
        m = j["memory"]
        check(m["q8_0"]["bytes_per_token"] == m["q8_0"]["formula_bytes_per_token"] < m["f16"]["bytes_per_token"]
              == m["f16"]["formula_bytes_per_token"], "q8_0 KV bytes per token: the formula, fewer than f16", str(m))
        check(len(q["cycles"]["q4"]) == 2 and len(j["cycles"]["q4"]) == 2, "two idempotence cycles per type")
        check(all(q["ttft"][c]["0"]["median"] > 0 and j["ttft"][c]["0"]["median"] > 0 for c in ("q8", "q4", "cachegen")),
              "TTFT rows for both KV types")

        kvt = os.path.join(work, "kvt")
        rc, out = run(cli, ["bench", "kv-type", "--no-ttft", "-o", kvt] + small, env)
        if rc != 0:
            check(False, "bench kv-type exited %d" % rc, out)
        else:
            k = json.load(open(os.path.join(kvt, "bench-kv-type.json")))["by_kv_type"]["q8_0"]["accuracy"]
            check(k["live"]["kl_per_position"] == kl and sorted(k) == ["live", "none", "q8"],
                  "bench kv-type: the same live q8_0 row, codec q8 only", str(sorted(k)))

        rc, out = run(cli, ["bench", "accuracy", "--kv-types", "f16,q4", "--no-ttft", "-o", os.path.join(work, "bad")] + small,
                      env)
        check(rc != 0 and "q4 is not f16 or q8_0" in out, "an unknown KV type is refused", out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
