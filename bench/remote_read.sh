#!/usr/bin/env bash
# bench remote-read (issue 47, session 35): the remote tier's client path alone against the server's
# own rate. Starts a redis-server of its own (loopback, a free port, no persistence, a scratch folder
# under DIR, stopped at the end), then --rounds rounds, each alternating:
#   before  --before BIN (optional): bench/bench_remote_kv built from an older tree
#   after   --bench BIN: bench/bench_remote_kv of this tree (RemoteKv's pipelined GET of 20 values of
#           1 MiB and 16 MiB; GETRANGE of 20 values of 28 MiB in 28 layer ranges of 1 MiB)
#   tls     with --tls: the same --bench binary over rediss:// (the same server's TLS port, a
#           self-signed certificate for 127.0.0.1 made by `openssl req` under DIR/tls, trusted with
#           --remote-ca-file): the TLS transport's rate against plain TCP's in the same round
#   peer    redis-benchmark -t set,get -d <bytes> -c 1 (one connection, no pipeline) at 1 MiB and 16 MiB
# Writes DIR/bench-remote-read.{json,md,png} (medians over rounds, min-max, ratios of the same
# round) and the raw outputs under DIR/raw/. Progress on stderr.
# Measuring: run it under the bench lock (flock /tmp/mz-bench.lock nice -n -5 bench/remote_read.sh ...).
set -euo pipefail
OUT=build/bench-remote-read BENCH=build/bench/bench_remote_kv BEFORE="" ROUNDS=3 MIN_TIME=1 TLS=0
usage() {
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  echo "Usage: bench/remote_read.sh [--out DIR] [--bench BIN] [--before BIN] [--tls] [--rounds 3] [--min-time 1]"
  echo "  --min-time: seconds each benchmark runs per round (Google Benchmark's --benchmark_min_time)"
}
die() { echo "remote_read: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --bench) BENCH=$2; shift 2 ;;
    --before) BEFORE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --min-time) MIN_TIME=$2; shift 2 ;;
    --tls) TLS=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
for t in redis-server redis-cli redis-benchmark python3 gnuplot; do command -v $t >/dev/null || die "$t is not installed"; done
[ -x "$BENCH" ] || die "no benchmark at $BENCH (ninja -C build bench_remote_kv; needs libbenchmark-dev)"
[ -z "$BEFORE" ] || [ -x "$BEFORE" ] || die "no benchmark at --before $BEFORE"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive number"

mkdir -p "$OUT/raw" "$OUT/redis"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
TLS_ARGS=()
if [ "$TLS" = 1 ]; then
  "$(dirname "$0")/../scripts/loopback-cert.sh" "$OUT/tls" 2 || die "no certificate for --tls"
  TLS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  TLS_ARGS=(--tls-port "$TLS_PORT" --tls-cert-file "$OUT/tls/cert.pem" --tls-key-file "$OUT/tls/key.pem"
    --tls-ca-cert-file "$OUT/tls/cert.pem" --tls-auth-clients optional)
fi
redis-server --port "$PORT" "${TLS_ARGS[@]}" --bind 127.0.0.1 --dir "$OUT/redis" --save "" --appendonly no \
  --logfile "$OUT/redis/redis.log" --daemonize no >/dev/null 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null || true' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG || die "redis-server did not start: $(tail -3 "$OUT/redis/redis.log")"
URL=redis://127.0.0.1:$PORT
echo "remote_read: redis-server $(redis-server --version | awk '{print $3}') on $URL; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

run_bench() {  # bin, out json[, url, more flags]
  "$1" --remote="${3:-$URL}" ${4:+"$4"} --benchmark_min_time="$MIN_TIME" --benchmark_format=json --benchmark_out="$2" \
    --benchmark_out_format=json >/dev/null || die "$1 failed"
}
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  if [ -n "$BEFORE" ]; then
    echo "remote_read: round $r/$ROUNDS: before" >&2
    run_bench "$BEFORE" "$OUT/raw/before-$r.json"
  fi
  echo "remote_read: round $r/$ROUNDS: after" >&2
  run_bench "$BENCH" "$OUT/raw/after-$r.json"
  if [ "$TLS" = 1 ]; then
    echo "remote_read: round $r/$ROUNDS: tls" >&2
    run_bench "$BENCH" "$OUT/raw/tls-$r.json" "rediss://127.0.0.1:$TLS_PORT" "--remote-ca-file=$OUT/tls/cert.pem"
  fi
  for d in 1048576 16777216; do
    echo "remote_read: round $r/$ROUNDS: redis-benchmark $d" >&2
    n=$((d > 1048576 ? 40 : 1000))
    redis-benchmark -p "$PORT" -t set,get -d "$d" -n "$n" -c 1 --csv >"$OUT/raw/peer-$d-$r.csv" 2>/dev/null ||
      die "redis-benchmark failed"
  done
  redis-cli -p "$PORT" flushall >/dev/null
done
LOAD_AFTER=$(cut -d' ' -f1 /proc/loadavg)

python3 - "$OUT" "$ROUNDS" "$LOAD_BEFORE" "$LOAD_AFTER" "$MIN_TIME" <<'EOF'
import csv, json, os, statistics, sys
out, rounds, lb, la, mt = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
raw = os.path.join(out, "raw")
def gb(name, kind, r):
    p = os.path.join(raw, f"{kind}-{r}.json")
    if not os.path.exists(p): return None
    for b in json.load(open(p))["benchmarks"]:
        if b["name"].startswith(name) and "bytes_per_second" in b: return b["bytes_per_second"] / 1e9
    return None
def peer(d, r):
    for row in csv.reader(open(os.path.join(raw, f"peer-{d}-{r}.csv"))):
        if row and row[0] == "GET": return float(row[1]) * d / 1e9
    return None
cases = [("GET, 20 values of 1 MiB", "mz_bench_remote::Get/20/1048576", 1048576),
         ("GET, 20 values of 16 MiB", "mz_bench_remote::Get/20/16777216", 16777216),
         ("GETRANGE, 20 values of 28 MiB in 28 ranges of 1 MiB", "mz_bench_remote::GetRange/20/29360128", 1048576)]
def stat(v):
    v = [x for x in v if x is not None]
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} if v else None
rows = []
for label, name, d in cases:
    before = [gb(name, "before", r) for r in range(1, rounds + 1)]
    after = [gb(name, "after", r) for r in range(1, rounds + 1)]
    pe = [peer(d, r) for r in range(1, rounds + 1)]
    tl = [gb(name, "tls", r) for r in range(1, rounds + 1)]
    rat_t = [t / a if a and t else None for a, t in zip(after, tl)]
    rat_b = [a / b if a and b else None for a, b in zip(after, before)]
    rat_p = [a / p if a and p else None for a, p in zip(after, pe)]
    rows.append({"case": label, "peer_value_bytes": d, "after_GBps": stat(after), "before_GBps": stat(before),
                 "peer_GBps": stat(pe), "after_over_before": stat(rat_b), "after_over_peer": stat(rat_p),
                 "tls_GBps": stat(tl), "tls_over_plain": stat(rat_t)})
res = {"machine": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": \t"),
       "load_1min_before": float(lb), "load_1min_after": float(la), "rounds": rounds, "min_time_s": float(mt),
       "cases": rows}
json.dump(res, open(os.path.join(out, "bench-remote-read.json"), "w"), indent=2)
f = lambda s: "-" if not s else f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})"
x = lambda s: "-" if not s else f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
md = [f"bench remote-read: {res['machine']}, {rounds} rounds alternated, 1-minute load {lb} before, {la} after. GB/s, median (min-max).", "",
      "| case | this tree | before | after / before | redis-benchmark GET, same value size (peer) | after / peer | this tree over TLS | TLS / plain |", "|---|---|---|---|---|---|---|---|"]
for r in rows:
    md.append(f"| {r['case']} | {f(r['after_GBps'])} | {f(r['before_GBps'])} | {x(r['after_over_before'])} | "
              f"{f(r['peer_GBps'])} ({r['peer_value_bytes'] >> 20} MiB) | {x(r['after_over_peer'])} | "
              f"{f(r['tls_GBps'])} | {x(r['tls_over_plain'])} |")
open(os.path.join(out, "bench-remote-read.md"), "w").write("\n".join(md) + "\n")
print("\n".join(md))
with open(os.path.join(out, "raw", "plot.dat"), "w") as p:
    for i, r in enumerate(rows):
        for j, k in enumerate(["before_GBps", "after_GBps", "peer_GBps", "tls_GBps"]):
            s = r[k]
            if s: p.write(f"{i * 5 + j} {s['median']} {s['min']} {s['max']} \"{k.split('_')[0]}\"\n")
EOF
gnuplot <<EOF || die "gnuplot failed"
set terminal pngcairo size 900,500
set output "$OUT/bench-remote-read.png"
set title "RemoteKv reads (before, after, peer redis-benchmark GET, after over TLS; loopback; median, min-max)"
set ylabel "GB/s"
set style fill solid 0.6
set boxwidth 0.8
set yrange [0:*]
set xtics ("GET 20 x 1 MiB" 1.5, "GET 20 x 16 MiB" 6.5, "GETRANGE 20 x 28 x 1 MiB" 11.5)
plot "$OUT/raw/plot.dat" using 1:2 with boxes notitle, "" using 1:2:3:4 with yerrorbars notitle, \
  "" using 1:(\$4):5 with labels offset 0,1 notitle
EOF
echo "remote_read: wrote $OUT/bench-remote-read.{json,md,png}" >&2
