#!/usr/bin/env python3
"""The main job's story (`mzcache demo`, scripts/demo.sh) on the tiny model: every step's figure is
present and sane. Usage: check_demo.py MZCACHE_CLI MODEL.gguf WORK_DIR

Checks (each fails the test with a message):
  1. the conversation was built to the asked size, with resident memory reported;
  2. the trim gave memory back: bytes freed > 0 and the worker's RSS after < before;
  3. the return restored from storage (bytes read > 0 and units restored > 0), the recompute case
     restored nothing, and both times to first token were measured (which is faster is the demo's
     figure, a measurement, not asserted here: a test that times itself fails on a loaded machine);
  4. the worker was really killed (SIGKILL) and the restarted one found every token of the last
     committed turn on storage, and answered;
  5. the screen names the machine and the PNG was written.
"""
import json, os, subprocess, sys

cli, model, work = sys.argv[1:4]
# The sanitizer stages share the normal build's synthesized models (as tests/test_util.cpp does).
if os.environ.get("MZ_TEST_MODEL_DIR_OVERRIDE"):
    model = os.path.join(os.environ["MZ_TEST_MODEL_DIR_OVERRIDE"], os.path.basename(model))
os.makedirs(work, exist_ok=True)
out = os.path.join(work, "demo")
js = os.path.join(work, "demo.json")
p = subprocess.run([cli, "demo", "--quick", "--tokens", "768", "--reps", "1", "-t", "1", "-m", model, "--out", out,
                    "--json", js], capture_output=True, text=True, timeout=600)
sys.stdout.write(p.stdout)
if p.returncode != 0:
    sys.exit("check_demo: FAILED: demo exited %d\n%s" % (p.returncode, p.stderr[-3000:]))
d = json.load(open(js))


def check(cond, what):
    if not cond:
        sys.exit("check_demo: FAILED: " + what + "\n" + json.dumps(d, indent=1)[:4000])
    print("check_demo: ok:", what)


b, tr, res, rec, re_ = d["build"], d["trim"], d["ttft_restored"], d["ttft_recompute"], d["restart"]
check(b["tokens"] == 768 and b["rss"] > 0 and b["kv_resident"] > 0 and b["weights_resident"] > 0,
      "built 768 tokens, resident memory reported")
check(tr["freed"] > 0 and tr["after"]["rss"] < tr["before"]["rss"],
      "trim gave back %d bytes, RSS %d -> %d" % (tr["freed"], tr["before"]["rss"], tr["after"]["rss"]))
check(res["units_restored"] > 0 and res["bytes_from_storage"] > 0,
      "the return restored %d units, %d bytes from storage" % (res["units_restored"], res["bytes_from_storage"]))
check(rec["units_restored"] == 0 and rec["bytes_from_storage"] == 0, "the recompute case restored nothing")
check(res["ttft_s"] > 0 and rec["ttft_s"] > 0,
      "restored TTFT %.3f s and recompute TTFT %.3f s measured" % (res["ttft_s"], rec["ttft_s"]))
check(d["ttft_memory"]["ttft_s"] > 0, "in-memory TTFT measured")
check(d["killed"] is True, "the worker was killed by SIGKILL")
check(re_["found_tokens"] == d["reply"]["tokens"] and re_["found_tokens"] > b["tokens"],
      "after the restart %d of %d tokens were found" % (re_["found_tokens"], d["reply"]["tokens"]))
check(re_["ttft_s"] > 0 and re_["units_restored"] > 0, "the restarted app restored and answered")
check("machine:" in p.stdout and d["machine"], "the screen names the machine")
# The restart's TTFT is timed after the model load: the line says so (it read "answered after X
# (model load Y)", with Y above X).
check("Model loaded again in " in p.stdout and "first token" in p.stdout,
      "the restart line says the first token is timed after the model load")
check(d.get("png") == "demo.png" and os.path.getsize(os.path.join(out, "demo.png")) > 1000, "demo.png written")
