#!/usr/bin/env python3
"""Old binary against new in the same run (issue 21's "equal within noise"): `bench speed` (mzcache
only) and `bench ttft --quick` (mzcache, Partial Offload, all-in-memory; no ablations, no OS
Paging), the two binaries alternated A B B A ... so that drift of a shared machine hits both.

Usage: ab_binaries.py OLD_MZCACHE NEW_MZCACHE OUT_DIR [--reps N] [--threads T] [--speed-tests LIST]
Writes OUT_DIR/ab.json and ab.md: per figure the median (min-max) of each binary and new/old.
Progress goes to stderr."""
import json, os, statistics, subprocess, sys, time

def run(cmd, log):
    print("ab: " + " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "a") as f:
        subprocess.run(cmd, stdout=f, stderr=f, check=True)

def main():
    if len(sys.argv) < 4 or sys.argv[1] in ("-h", "--help"):
        print(__doc__); sys.exit(0 if len(sys.argv) > 1 else 2)
    old, new, out = sys.argv[1:4]
    opt = lambda k, d: sys.argv[sys.argv.index(k) + 1] if k in sys.argv else d
    reps, threads, tests = int(opt("--reps", "3")), opt("--threads", "2"), opt("--speed-tests", "pp512,tg128,pp8@d8192")
    os.makedirs(out, exist_ok=True)
    figs = {"old": {}, "new": {}}
    t0 = time.time()
    for rep in range(reps):
        order = [("old", old), ("new", new)] if rep % 2 == 0 else [("new", new), ("old", old)]
        for name, binary in order:
            d = os.path.join(out, f"{name}-{rep}")
            log = os.path.join(out, f"{name}-{rep}.log")
            run([binary, "bench", "speed", "--no-llama", "-r", "1", "-t", threads, "--tests", tests, "-o", d], log)
            for r in json.load(open(os.path.join(d, "bench-speed.json")))["results"]:
                figs[name].setdefault(f"speed {r['test']} (t/s)", []).append(r["mzcache_tps_median"])
            run([binary, "bench", "ttft", "--quick", "--no-ablations", "--no-ospaging", "-r", "1", "-t", threads, "-o", d], log)
            for r in json.load(open(os.path.join(d, "bench-ttft.json")))["rows"]:
                key = f"ttft {r['model']} {r['ctx']} {r['level']}%"
                figs[name].setdefault(key + " mzcache (s)", []).append(r["mzcache"]["median"])
                figs[name].setdefault(key + " all-in-memory (s)", []).append(r["all_in_memory"]["median"])
            print(f"ab: rep {rep + 1}/{reps} {name} done, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    fmt = lambda v: f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
    rows = []
    md = ["| figure | old: median (min-max) | new: median (min-max) | new / old |", "|---|---|---|---|"]
    for k in figs["old"]:
        o, n = figs["old"][k], figs["new"].get(k, [])
        if not n:
            continue
        ratio = statistics.median(n) / statistics.median(o)
        rows.append({"figure": k, "old": o, "new": n, "ratio_of_medians": ratio})
        md.append(f"| {k} | {fmt(o)} | {fmt(n)} | {ratio:.3f} |")
    mach = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
    json.dump({"machine": mach, "old": old, "new": new, "reps": reps, "threads": threads, "rows": rows},
              open(os.path.join(out, "ab.json"), "w"), indent=2)
    text = f"Machine: {mach}; {reps} reps per binary, alternated; {threads} threads.\n\n" + "\n".join(md) + "\n"
    open(os.path.join(out, "ab.md"), "w").write(text)
    print(text)

if __name__ == "__main__":
    main()
