#!/usr/bin/env python3
"""Decode-phase rate of bench/batch_race.mjs runs: for each run (rep, streams, system) in race.json,
the content chunks streamed between the level's last first token and the first stream's end
(every stream decoding, no prompt left), per second. What session 35 and 36 counted as "the batched
decode alone" (docs/results.md).

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
            print(f"  rep {r['rep']} N={r['streams']} {r['system']:8s} window {d:6.2f}s  {rate:6.1f} chunks/s")


if __name__ == "__main__":
    main()
