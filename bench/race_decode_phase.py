#!/usr/bin/env python3
"""Phases of bench/batch_race.mjs runs: for each run (rep, streams, system) in race.json,
  - the prompt phase: every stream's prompt tokens (the server's count) over the time from the
    level's start to its last first token (prompts of N streams arriving together; the steps also
    carry the decode tokens of the streams already answering);
  - the decode phase: the content chunks streamed between the level's last first token and the
    first stream's end (every stream decoding, no prompt left), per second, and the mean time per
    decode step that implies (N streams / chunks per second), what sessions 35 and 36 counted as
    "the batched decode alone" (docs/results.md);
  - for an mzcache server with its account (server_report, session 37): its batcher's steps and mean
    batch, the pool's persists, and its replies' seconds per generated token on the callers'
    threads: in one-token decode calls (waiting for and computing steps), sampling, and emit.

Usage: bench/race_decode_phase.py RACE.json [RACE.json ...]
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("race_json", nargs="+", help="race.json written by bench/batch_race.mjs")
    a = ap.parse_args()
    for f in a.race_json:
        with open(f) as fh:
            j = json.load(fh)
        print(f)
        for r in j["runs"]:
            ps = r["per_stream"]
            t0 = max(p["first_s"] for p in ps)
            t1 = min(p["end_s"] for p in ps)
            n = sum(1 for p in ps for c in p["chunk_s"] if t0 < c <= t1)
            d = t1 - t0
            rate = n / d if d > 0 else float("nan")
            start = min(p["start_s"] for p in ps)
            prompt = sum(p.get("prompt_tokens") or 0 for p in ps)
            prate = prompt / (t0 - start) if t0 > start else float("nan")
            step_ms = 1e3 * len(ps) / rate if rate > 0 else float("nan")
            line = (f"  rep {r['rep']} N={r['streams']} {r['system']:8s} prompts {prompt:5d} tok in {t0 - start:6.2f}s "
                    f"({prate:6.1f} tok/s)  decode window {d:6.2f}s  {rate:6.1f} chunks/s (~{step_ms:5.1f} ms a step)")
            sr = r.get("server_report")
            if sr and sr.get("steps"):
                gen = sum(p.get("completion_tokens") or 0 for p in ps)
                per = lambda k: f"{1e3 * sr[k] / gen:5.2f}" if sr.get(k) is not None and gen else "  -  "
                line += (f"\n      server: {sr['steps']} steps, mean batch {sr['mean_batch']:.2f}, persists {sr['persists']}; "
                         f"per generated token ms: decode call {per('reply_decode_s')}, sample {per('reply_sample_s')}, "
                         f"emit {per('reply_emit_s')}")
            print(line)


if __name__ == "__main__":
    main()
