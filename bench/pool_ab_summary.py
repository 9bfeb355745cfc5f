#!/usr/bin/env python3
"""Summarizes bench-pool JSON files side by side (an A/B of pool options, runs alternated).

For each file: the returns that found their conversation wholly on storage (no KV resident, nothing
in the in-memory swap) with their median TTFT (min-max) and median process CPU seconds, the p50 of
all returns, the p50 of the all-in-memory query, and the load arena / write-behind figures.

usage: bench/pool_ab_summary.py LABEL=path/to/bench-pool.json [LABEL=...]
"""
import json
import statistics as st
import sys


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    print("| run | storage-only returns | median s (min-max) | CPU s (median) | p50 all returns | p50 all in memory | arena reused MiB | write-behind waited s |")
    print("|---|---|---|---|---|---|---|---|")
    for arg in argv[1:]:
        label, _, path = arg.partition("=")
        d = json.load(open(path))
        q = d["queries_detail"]
        sto = [x for x in q if x["kv_resident_share"] == 0 and x["kv_mem_compressed_bytes"] == 0]
        r = [x["ttft_return_s"] for x in sto]
        io = d.get("io_at_trace_end", {})
        print("| %s | %d | %.3f (%.3f-%.3f) | %.3f | %.3f | %.3f | %.0f | %.1f |" % (
            label, len(r), st.median(r), min(r), max(r), st.median([x["cpu_s"] for x in sto]),
            st.median([x["ttft_return_s"] for x in q]), st.median([x["ttft_resident_s"] for x in q]),
            io.get("arena_reused_bytes", 0) / 1048576, io.get("persist_yielded_s", 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
