#!/usr/bin/env python3
"""Pools the runs of bench/ab_binaries.py (the same two binaries, run one after another) into one
table: per figure, every sample of each binary, the median (min-max), new/old and whether the two
ranges overlap.

Usage: ab_combine.py RUN_DIR [RUN_DIR...] OUT_DIR
Reads RUN_DIR/ab.json of each run; writes OUT_DIR/ab.json and OUT_DIR/ab.md."""
import json, os, statistics, sys

def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__); sys.exit(0 if len(sys.argv) > 1 else 2)
    runs = [json.load(open(os.path.join(d, "ab.json"))) for d in sys.argv[1:-1]]
    out = sys.argv[-1]
    os.makedirs(out, exist_ok=True)
    figs = {}
    for r in runs:
        for row in r["rows"]:
            f = figs.setdefault(row["figure"], {"old": [], "new": []})
            f["old"] += row["old"]; f["new"] += row["new"]
    fmt = lambda v: f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
    md = [f"Machine: {runs[0]['machine']}; {len(runs)} runs of {runs[0]['reps']} reps each, pooled ({sum(r['reps'] for r in runs)} samples per binary), binaries alternated within each run; {runs[0]['threads']} threads.",
          f"old: {runs[0]['old']}; new: {runs[0]['new']}", "",
          "| figure | old: median (min-max) | new: median (min-max) | new / old | ranges overlap |", "|---|---|---|---|---|"]
    rows = []
    for k, f in figs.items():
        o, n = f["old"], f["new"]
        ratio = statistics.median(n) / statistics.median(o)
        overlap = not (max(n) < min(o) or max(o) < min(n))
        rows.append({"figure": k, "old": o, "new": n, "ratio_of_medians": ratio, "ranges_overlap": overlap})
        md.append(f"| {k} | {fmt(o)} | {fmt(n)} | {ratio:.3f} | {'yes' if overlap else 'no'} |")
    json.dump({"machine": runs[0]["machine"], "old": runs[0]["old"], "new": runs[0]["new"], "rows": rows}, open(out + "/ab.json", "w"), indent=2)
    open(out + "/ab.md", "w").write("\n".join(md) + "\n")
    print("\n".join(md))

if __name__ == "__main__":
    main()
