#!/usr/bin/env python3
"""bench/fleet_bench.sh's report: reads OUT/raw/ (what the cases wrote) and writes OUT/bench-fleet.json,
OUT/bench-fleet.md and gnuplot plots (OUT/fleet-return.png, fleet-shared.png, fleet-kill.png) for the
cases that ran. Usage: fleet_bench_report.py OUT_DIR"""
import json
import os
import statistics
import subprocess
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def report_return(raw, out, md, res):
    rows = lines(f"{raw}/return-rounds.jsonl")
    first = json.load(open(f"{raw}/return-first.json"))
    cases = {}
    for c in ("redis", "prefix", "prefix-whole", "local", "recompute"):
        rs = [r for r in rows if r["case"] == c]
        if not rs:
            continue
        cases[c] = {
            "codec": rs[0]["codec"],
            "ttft_s": spread([r["turn"]["ttft_s"] for r in rs]),
            "request_s": spread([r["turn"]["wall_s"] for r in rs]),
            "prompt_tokens": rs[0]["turn"]["prompt_tokens"],
            "cached_tokens": spread([r["turn"]["cached_tokens"] for r in rs]),
            "redis_bytes_fetched": spread([r["redis_bytes_fetched"] for r in rs]),
            "storage_bytes_read": spread([r["turn"]["bytes_from_storage"] for r in rs]),
            "load": spread([r["load_before"] for r in rs] + [r["load_after"] for r in rs]),
            "texts_equal": len({r["turn"]["text"] for r in rs}) == 1,
        }
    same_text = len({r["turn"]["text"] for r in rows}) == 1
    res["return"] = {"first_turn_prompt_tokens": first["prompt_tokens"], "cases": cases,
                     "same_reply_all_cases": same_text, "rounds": rows}
    md.append("## 1. A returning conversation: its next turn on a fresh server\n")
    md.append(f"History: {first['prompt_tokens']} prompt tokens (its first turn); the next turn's prompt: "
              f"{next(iter(cases.values()))['prompt_tokens']} tokens. Codec (persist and KV): "
              f"{next(iter(cases.values()))['codec']}. Same greedy reply in every case and round: "
              f"{'yes' if same_text else 'NO'}.\n")
    md.append("| case | TTFT median (min-max) s | request median (min-max) s | cached tokens | Redis bytes fetched | storage bytes read | load avg (min-max) |")
    md.append("|---|---|---|---|---|---|---|")
    names = {"redis": "another server, from Redis", "local": "same server, local storage", "recompute": "re-prefill (nothing stored)",
             "prefix": "another server, no id: prefix by chain hash from Redis, streamed",
             "prefix-whole": "another server, no id: prefix by chain hash from Redis, fetched whole first"}
    for c, v in cases.items():
        t, w, l = v["ttft_s"], v["request_s"], v["load"]
        md.append(f"| {names[c]} | {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) | {w['median']:.3f} ({w['min']:.3f}-{w['max']:.3f}) "
                  f"| {v['cached_tokens']['median']:.0f} | {v['redis_bytes_fetched']['median'] / 2**20:.1f} MiB "
                  f"| {v['storage_bytes_read']['median'] / 2**20:.1f} MiB | {l['min']:.2f}-{l['max']:.2f} |")
    if "recompute" in cases:
        base = cases["recompute"]["ttft_s"]["median"]
        for c in ("redis", "prefix", "prefix-whole", "local"):
            if c in cases:
                md.append(f"\n{names[c]}: TTFT {cases[c]['ttft_s']['median'] / base:.3f}x re-prefill's (medians, same run).")
    if "prefix" in cases and "prefix-whole" in cases:
        # The streamed prefix against its peer, round by round (each round ran both, alternated).
        per = {}
        for r in rows:
            if r["case"] in ("prefix", "prefix-whole"):
                per.setdefault(r["round"], {})[r["case"]] = r["turn"]
        ratios = {k: [] for k in ("wall_s", "ttft_s")}
        for rd in per.values():
            if len(rd) == 2:
                for k in ratios:
                    if rd["prefix-whole"][k] > 0:
                        ratios[k].append(rd["prefix"][k] / rd["prefix-whole"][k])
        res["return"]["prefix_vs_whole"] = {k: spread(v) for k, v in ratios.items() if v}
        if ratios["wall_s"]:
            w, t = spread(ratios["wall_s"]), spread(ratios["ttft_s"]) if ratios["ttft_s"] else None
            md.append(f"\nStreamed / fetched whole (no id, prefix by chain hash), each round's own ratio: request time "
                      f"{w['median']:.3f}x (min {w['min']:.3f}, max {w['max']:.3f}, {w['n']} rounds)"
                      + (f"; server TTFT {t['median']:.3f}x ({t['min']:.3f}-{t['max']:.3f})" if t else "")
                      + ". The server's TTFT starts when its restore does: a prefix fetched whole is fetched before "
                      "(in the request's time, not in its TTFT); a streamed one arrives during it.")
    md.append("")
    dat = f"{out}/fleet-return.dat"
    short = {"redis": "Redis (another server)", "local": "local (same server)", "recompute": "re-prefill",
             "prefix": "no id, streamed", "prefix-whole": "no id, whole"}
    with open(dat, "w") as f:
        for i, (c, v) in enumerate(cases.items()):
            f.write(f'{i} "{short[c]}" {v["ttft_s"]["median"]} {v["ttft_s"]["min"]} {v["ttft_s"]["max"]} '
                    f'{v["request_s"]["median"]} {v["request_s"]["min"]} {v["request_s"]["max"]}\n')
    gnuplot(f"""set terminal pngcairo size 900,500
set output '{out}/fleet-return.png'
set title "Returning conversation ({first['prompt_tokens']} tokens): next turn on a fresh server (median, min-max)"
set ylabel 'seconds'
set style data histograms
set style histogram errorbars gap 2 lw 1
set style fill solid 0.6
set yrange [0:*]
set key top left
plot '{dat}' using 3:4:5:xtic(2) title 'TTFT', '' using 6:7:8 title 'request (Redis fetch at open included)'
""")


def report_shared(raw, out, md, res):
    runs = {}
    for remote in (1, 0):
        p = f"{raw}/shared-{remote}-census.json"
        if not os.path.exists(p):
            continue
        c = json.load(open(p))
        reqs = lines(f"{raw}/shared-{remote}.jsonl")
        ok = [r for r in reqs if r["ok"]]
        c["requests"] = len(reqs)
        c["failed"] = len(reqs) - len(ok)
        c["prompt_tokens"] = sum(r["prompt_tokens"] for r in ok)
        c["tokens_computed"] = sum(r["prompt_tokens"] - r["cached_tokens"] for r in ok)
        c["servers_used"] = sorted({r["upstream"] for r in ok})
        c["disk_bytes"] = sum(d["bytes"] for d in c["disks"])
        runs["with_remote" if remote else "without_remote"] = c
    res["shared"] = runs
    md.append("## 2. A system prompt shared by many conversations over 3 servers\n")
    md.append("| | conversations (failed) | tokens computed / prompt tokens | Redis: chunk keys, bytes | Redis: manifests, bytes | Redis used_memory | 3 disks: bytes (session files, chunk files) | wall s | load avg |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for name, c in runs.items():
        r = c["redis"]
        disks = " + ".join(f"{d['bytes'] / 2**20:.1f}" for d in c["disks"])
        files = ", ".join(f"{d['session_files']}/{d['chunk_files']}" for d in c["disks"])
        md.append(f"| {name.replace('_', ' ')} | {c['requests']} ({c['failed']}) | {c['tokens_computed']} / {c['prompt_tokens']} "
                  f"| {r['chunk_keys']}, {r['chunk_bytes'] / 2**20:.1f} MiB | {r['manifest_keys']}, {r['manifest_bytes'] / 2**20:.1f} MiB "
                  f"| {r.get('used_memory', 0) / 2**20:.1f} MiB | {disks} = {c['disk_bytes'] / 2**20:.1f} MiB ({files}) "
                  f"| {c['wall_s']:.1f} | {c['load_before']:.2f}-{c['load_after']:.2f} |")
    md.append("")
    dat = f"{out}/fleet-shared.dat"
    with open(dat, "w") as f:
        for i, (name, c) in enumerate(runs.items()):
            r = c["redis"]
            f.write(f'{i} "{name.replace("_", " ")}" {r["chunk_bytes"] / 2**20} {r["manifest_bytes"] / 2**20} {c["disk_bytes"] / 2**20}\n')
    gnuplot(f"""set terminal pngcairo size 900,500
set output '{out}/fleet-shared.png'
set title "Shared system prompt: bytes stored (Redis vs the three servers' disks)"
set ylabel 'MiB'
set style data histograms
set style histogram cluster gap 1
set style fill solid 0.6
set yrange [0:*]
set key outside below
plot '{dat}' using 3:xtic(2) title 'Redis chunks', '' using 4 title 'Redis manifests', '' using 5 title '3 pool folders'
""")


def report_kill(raw, out, md, res):
    rows = lines(f"{raw}/kill.jsonl")
    meta = json.load(open(f"{raw}/kill-meta.json"))
    kill = next((r for r in rows if r.get("event") == "kill"), None)
    reqs = [r for r in rows if "event" not in r]
    kt = kill["t"] if kill else float("inf")
    before = [r for r in reqs if r["t1"] < kt]
    after = [r for r in reqs if r["t1"] >= kt]
    failed = [r for r in reqs if not r["ok"]]

    def computed(rs):
        ok = [r for r in rs if r["ok"]]
        return {"requests": len(rs), "failed": len(rs) - len(ok),
                "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
                "cached_tokens": sum(r["cached_tokens"] for r in ok),
                "tokens_computed": sum(r["prompt_tokens"] - r["cached_tokens"] for r in ok),
                "continuing_turns_computed_median": statistics.median([r["prompt_tokens"] - r["cached_tokens"] for r in ok if r["turn"] > 1] or [0])}
    # The conversations the killed server held: their first turn after the kill, on another server.
    moved = []
    if kill:
        last_up = {}
        for r in sorted(reqs, key=lambda r: r["t1"]):
            if r["t1"] < kt and r["ok"]:
                last_up[r["conversation"]] = r["upstream"]
        seen = set()
        for r in sorted(reqs, key=lambda r: r["t0"]):
            if r["t1"] >= kt and r["ok"] and last_up.get(r["conversation"]) == kill["upstream"] and r["conversation"] not in seen:
                seen.add(r["conversation"])
                moved.append({"conversation": r["conversation"], "turn": r["turn"], "upstream": r["upstream"],
                              "prompt_tokens": r["prompt_tokens"], "cached_tokens": r["cached_tokens"],
                              "computed": r["prompt_tokens"] - r["cached_tokens"], "ttft_s": r["ttft_s"]})
    b, a = computed(before), computed(after)
    # nginx's X-Mz-Upstream names every server it tried: two or more, a request it retried.
    retried = [r for r in reqs if r["ok"] and "," in r["upstream"]]
    extra = sum(m["computed"] for m in moved) - len(moved) * b["continuing_turns_computed_median"]
    res["kill"] = {"meta": meta, "kill": kill, "requests": len(reqs), "failed": len(failed),
                   "failures": failed, "retried_by_nginx": len(retried), "before": b, "after": a,
                   "moved_conversations": moved, "extra_tokens_recomputed": extra}
    md.append("## 3. A server killed (kill -9) under a steady load\n")
    md.append(f"{meta['clients']} clients through nginx for {meta['duration_s']} s; server {kill['server'] if kill else '?'} "
              f"(the busiest: {kill['served_before'] if kill else '?'} requests) killed at {kt:.1f} s. Load average "
              f"{meta['load_before']:.2f} before, {meta['load_after']:.2f} after.\n")
    md.append(f"**Requests failed: {len(failed)} of {len(reqs)}** (the client never retries; nginx retries on the next server: "
              f"{len(retried)} requests answered after nginx tried the killed server).\n")
    md.append("| | requests (failed) | prompt tokens | cached | computed (prompt - cached) | median computed, turns > 1 |")
    md.append("|---|---|---|---|---|---|")
    for name, c in (("before the kill", b), ("after the kill", a)):
        md.append(f"| {name} | {c['requests']} ({c['failed']}) | {c['prompt_tokens']} | {c['cached_tokens']} | {c['tokens_computed']} | {c['continuing_turns_computed_median']:.0f} |")
    if moved:
        md.append(f"\nThe killed server's conversations, first turn after the kill (on another server): {len(moved)}; "
                  f"tokens computed {sum(m['computed'] for m in moved)} of {sum(m['prompt_tokens'] for m in moved)} prompt tokens "
                  f"(per conversation: {', '.join(str(m['computed']) + '/' + str(m['prompt_tokens']) for m in moved)}); "
                  f"**tokens recomputed because of the kill: {extra:.0f}** (those turns' computed tokens minus "
                  f"{len(moved)} x {b['continuing_turns_computed_median']:.0f}, a continuing turn's median before the kill).")
    md.append("")
    dat = f"{out}/fleet-kill.dat"
    with open(dat, "w") as f:
        for r in reqs:
            f.write(f"{r['t1']} {r['t1'] - r['t0']} {r['prompt_tokens'] - r['cached_tokens'] if r['ok'] else -1} {1 if r['ok'] else 0}\n")
    gnuplot(f"""set terminal pngcairo size 900,600
set output '{out}/fleet-kill.png'
set multiplot layout 2,1 title "{meta['clients']} clients through nginx; kill -9 at {kt:.1f} s"
set ylabel 'request s'
set arrow from {kt},graph 0 to {kt},graph 1 nohead lc rgb 'red'
plot '{dat}' using 1:($4==1?$2:1/0) with points pt 7 ps 0.5 title 'answered', '' using 1:($4==0?$2:1/0) with points pt 2 ps 1.5 lc rgb 'red' title 'failed'
set ylabel 'tokens computed'
set xlabel 'seconds'
plot '{dat}' using 1:($4==1?$3:1/0) with points pt 7 ps 0.5 title 'prompt - cached'
unset multiplot
""")


def report_redis(raw, out, md, res):
    import csv
    meta = json.load(open(f"{raw}/redis-bench-meta.json"))
    rows = list(csv.DictReader(open(f"{raw}/redis-bench.csv")))
    size = meta["value_kib"] * 1024
    ops = {r["test"]: {"rps": float(r["rps"]), "MB_s": float(r["rps"]) * size / 1e6,
                       "p50_ms": float(r["p50_latency_ms"]), "p99_ms": float(r["p99_latency_ms"])} for r in rows}
    res["redis"] = {"meta": meta, "ops": ops}
    md.append("## One Redis shard's rate (redis-benchmark, loopback)\n")
    md.append(f"{meta['value_kib']} KiB values, {meta['requests']} requests, {meta['connections']} connections, one redis-server "
              f"(single-threaded), no persistence. Load average {meta['load_before']:.2f} before, {meta['load_after']:.2f} after.\n")
    md.append("| command | requests/s | MB/s | p50 ms | p99 ms |")
    md.append("|---|---|---|---|---|")
    for k, v in ops.items():
        md.append(f"| {k} | {v['rps']:.0f} | {v['MB_s']:.0f} | {v['p50_ms']:.3f} | {v['p99_ms']:.3f} |")
    md.append("")


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    out = os.path.abspath(sys.argv[1])
    raw = f"{out}/raw"
    runs = lines(f"{raw}/meta.jsonl")
    res = {"runs": runs}
    md = ["# bench fleet (issue 47)\n"]
    for m in runs:
        md.append(f"* {m['date']}, commit {m['commit']}, cases {m['cases']}: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB; "
                  f"model {m['model']}; {m['threads']} threads per server (return), {m['fleet_threads']} per server "
                  f"(shared, kill: 3 servers at once); 1-minute load average {m['load_start']} at the start.")
    md.append("\nLoad averages (1 minute) per case below. Other helpers' niced builds may have run beside it.\n")
    if os.path.exists(f"{raw}/return-rounds.jsonl"):
        report_return(raw, out, md, res)
    if os.path.exists(f"{raw}/shared-1-census.json") or os.path.exists(f"{raw}/shared-0-census.json"):
        report_shared(raw, out, md, res)
    if os.path.exists(f"{raw}/kill.jsonl"):
        report_kill(raw, out, md, res)
    if os.path.exists(f"{raw}/redis-bench.csv"):
        report_redis(raw, out, md, res)
    json.dump(res, open(f"{out}/bench-fleet.json", "w"), indent=1)
    open(f"{out}/bench-fleet.md", "w").write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
