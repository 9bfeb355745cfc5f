// Micro-benchmark of the remote tier's client path alone (issue 47, session 35): RemoteKv's public
// calls on a real Redis, no pool, no model. Values of random bytes are written once, then read back
// as the tier reads them:
//   Get/<n>/<bytes>        one pipelined GET of n values (RemoteTier::FetchChunks, ProfileRemote)
//   GetRange/<n>/<bytes>   the stream's reads (RemoteTier::StreamBatch): for each of 28 layers one
//                          pipelined GETRANGE of that layer's 1/28 of every value
// Bytes per second are the values' bytes read (what the tier receives), comparable with
// `redis-benchmark -t get -d <bytes>` on the same server (bench/remote_read.sh runs both,
// alternated). Each read's count and sizes are checked (not its bytes: verifying them is the tier's
// work, measured elsewhere); a failed or short read stops the benchmark with its error.
//
//   build/bench/bench_remote_kv --remote=redis://127.0.0.1:6379 --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true   (one line)
// Without --remote every benchmark is skipped with a message. The values (keys mz:bench:*) are
// removed at the end.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store/remote_kv.h"

namespace mz_bench_remote {

std::string g_url, g_ca_file;
std::unique_ptr<mz::RemoteKv> g_kv;
std::string g_error;
constexpr int kLayers = 28;  // Qwen3-0.6B's, as the fleet bench streams them

mz::RemoteKv* Kv() {
  if (g_kv || !g_error.empty()) return g_kv.get();
  if (g_url.empty()) {
    g_error = "no --remote=redis://host:port given";
    return nullptr;
  }
  mz::RedisOptions o;
  o.ca_file = g_ca_file;
  mz::Status st = mz::ParseRemoteUrl(g_url, &o.url);
  if (st.ok()) st = mz::OpenRedisKv(o, &g_kv);
  if (!st.ok()) g_error = st.ToString();
  return g_kv.get();
}

std::string Key(int i, int64_t bytes) { return "mz:bench:{" + std::to_string(bytes) + ":" + std::to_string(i) + "}"; }

// n values of `bytes` random bytes under their keys (written once per size; Put failures skip).
bool Prepare(benchmark::State& state, int n, int64_t bytes, std::vector<std::string>* keys) {
  mz::RemoteKv* kv = Kv();
  if (!kv) {
    state.SkipWithError(g_error.c_str());
    return false;
  }
  uint64_t x = 0x9E3779B97F4A7C15ull ^ uint64_t(bytes);
  for (int i = 0; i < n; ++i) {
    keys->push_back(Key(i, bytes));
    std::string v(size_t(bytes), '\0');
    for (size_t k = 0; k + 8 <= v.size(); k += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(&v[k], &x, 8);
    }
    const mz::Status st = kv->Put(keys->back(), v, 600, false);
    if (!st.ok()) {
      g_error = st.ToString();
      state.SkipWithError(g_error.c_str());
      return false;
    }
  }
  return true;
}

void Get(benchmark::State& state) {
  const int n = int(state.range(0));
  const int64_t bytes = state.range(1);
  std::vector<std::string> keys;
  if (!Prepare(state, n, bytes, &keys)) return;
  for (auto _ : state) {
    std::vector<std::optional<std::string>> v;
    const mz::Status st = g_kv->Get(keys, &v);
    if (!st.ok() || v.size() != keys.size() || !v.back() || int64_t(v.back()->size()) != bytes) {
      state.SkipWithError(st.ok() ? "a value came back missing or short" : st.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(v.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * bytes);
  (void)g_kv->Remove(keys);
}

void GetRange(benchmark::State& state) {
  const int n = int(state.range(0));
  const int64_t bytes = state.range(1);
  std::vector<std::string> keys;
  if (!Prepare(state, n, bytes, &keys)) return;
  const uint64_t per = uint64_t(bytes) / kLayers;
  for (auto _ : state) {
    std::vector<std::string> v;  // as RemoteTier::StreamBatch: one vector for every layer of a restore
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<std::pair<uint64_t, uint64_t>> ranges(keys.size(), {uint64_t(l) * per, per});
      const mz::Status st = g_kv->GetRange(keys, ranges, &v);
      if (!st.ok() || v.size() != keys.size() || v.back().size() != per) {
        state.SkipWithError(st.ok() ? "a range came back short" : st.ToString().c_str());
        return;
      }
      benchmark::DoNotOptimize(v.data());
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * n * int64_t(per) * kLayers);
  (void)g_kv->Remove(keys);
}

double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace mz_bench_remote

// 20 values (a 5k-token conversation's chunks): 1 MiB (the size redis-benchmark is run at; about
// one layer of a lossless chunk) and 16 MiB (one q8 chunk of Qwen3-0.6B is 14.6 MiB).
BENCHMARK(mz_bench_remote::Get)
    ->Args({20, 1 << 20})
    ->Args({20, 16 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", mz_bench_remote::Min)
    ->ComputeStatistics("max", mz_bench_remote::Max);
BENCHMARK(mz_bench_remote::GetRange)
    ->Args({20, 28 << 20})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", mz_bench_remote::Min)
    ->ComputeStatistics("max", mz_bench_remote::Max);

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--remote=", 0) == 0) {
      mz_bench_remote::g_url = a.substr(9);
      continue;
    }
    if (a.rfind("--remote-ca-file=", 0) == 0) {
      mz_bench_remote::g_ca_file = a.substr(17);
      continue;
    }
    if (a == "--help" || a == "-h") {
      std::printf(
          "bench_remote_kv --remote=redis[s]://host:port [--remote-ca-file=PEM] [Google Benchmark flags]\n"
          "  rediss://: over TLS, the server's certificate checked against --remote-ca-file (default: the\n"
          "  system's CAs).\n"
          "  RemoteKv's pipelined GET and GETRANGE reads of 20 values (1 MiB, 16 MiB; 28 MiB read as 28\n"
          "  layer ranges), as the pool's remote tier reads them. Writes keys mz:bench:* and removes them.\n"
          "  e.g. --benchmark_repetitions=5 --benchmark_report_aggregates_only=true\n");
      return 0;
    }
    rest.push_back(argv[i]);
  }
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  mz_bench_remote::g_kv.reset();
  return 0;
}
