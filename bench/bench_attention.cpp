// Micro-benchmark of the chunked attention kernel (kernels/attention.h): one layer's worth of a
// short query over a long context, with the KV chunks fp16 (resident) or q8 (read in place, as
// compute does over chunks held compressed in memory). Shapes of real models; one thread (the
// kernel's per-thread work; with nth threads each takes 1/nth of the items). Several layers'
// KV are rotated so the K/V bytes stream from DRAM as in a forward pass.
//
//   build/bench/bench_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   valgrind --tool=callgrind build/bench/bench_attention --benchmark_filter=Qwen3_0_6B/q8/8192
//       --benchmark_min_time=1x    (instruction counts, repeatable)
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "store/kv_codec.h"

namespace {

struct Shape {
  const char* name;
  int n_head, n_kv_head, head_dim;
};
constexpr Shape kShapes[] = {{"Qwen3_0_6B", 16, 8, 128}, {"Llama_3_2_1B", 32, 8, 64}};
constexpr int kChunkTokens = 256, kQueryTokens = 8, kLayers = 3;

// One layer's chunks, fp16 and q8-encoded (the codec's blobs; the view points past the header).
struct Layer {
  std::vector<std::vector<uint16_t>> raw;
  std::vector<std::vector<uint8_t>> enc;
  std::vector<const uint16_t*> k, v;
  std::vector<const uint8_t*> q8;
  std::vector<int> rows;
};

Layer MakeLayer(const Shape& s, int n_ctx, uint32_t seed) {
  Layer L;
  const int n_chunks = (n_ctx + kChunkTokens - 1) / kChunkTokens;
  const size_t block = size_t(s.n_kv_head) * kChunkTokens * s.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto codec = mz::MakeKvCodec("q8");
  mz::ChunkShape cs{s.n_kv_head, kChunkTokens, s.head_dim, kChunkTokens, 0, 1};
  for (int c = 0; c < n_chunks; ++c) {
    L.raw.emplace_back(2 * block);
    for (auto& x : L.raw.back()) x = mz::fp32_to_fp16(nd(rng));
    L.enc.emplace_back(codec->MaxEncodedSize(cs));
    size_t n = 0;
    if (!codec->Encode(cs, L.raw.back().data(), L.enc.back().data(), L.enc.back().size(), &n).ok()) std::abort();
  }
  for (int c = 0; c < n_chunks; ++c) {
    L.k.push_back(L.raw[size_t(c)].data());
    L.v.push_back(L.raw[size_t(c)].data() + block);
    L.q8.push_back(L.enc[size_t(c)].data() + mz::kKvCodecHeaderBytes);
    L.rows.push_back(kChunkTokens);
  }
  return L;
}

void BM_Attention(benchmark::State& st, Shape s, bool q8) {
  const int n_ctx = int(st.range(0));
  std::vector<Layer> layers;
  for (int l = 0; l < kLayers; ++l) layers.push_back(MakeLayer(s, n_ctx, 17u + uint32_t(l)));
  std::vector<float> q(size_t(kQueryTokens) * s.n_head * s.head_dim), out(q.size());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : q) x = nd(rng);
  mz::AttnArgs a{q.data(), out.data(), kQueryTokens, s.n_head, n_ctx - kQueryTokens, 1.0f / std::sqrt(float(s.head_dim))};
  int l = 0;
  for (auto _ : st) {
    Layer& L = layers[size_t(l)];
    l = (l + 1) % kLayers;
    mz::KvLayerView kv{L.k.data(), L.v.data(), int(L.k.size()), kChunkTokens, s.n_kv_head, s.head_dim, n_ctx};
    if (q8) {
      kv.q8_chunks = L.q8.data();
      kv.q8_rows = L.rows.data();
    }
    mz::attention_chunked(a, kv, 0, 1);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  st.counters["keys/s"] = benchmark::Counter(double(n_ctx) * double(st.iterations()), benchmark::Counter::kIsRate);
}

int Register() {
  for (const Shape& s : kShapes)
    for (bool q8 : {false, true})
      benchmark::RegisterBenchmark((std::string(s.name) + (q8 ? "/q8" : "/fp16")).c_str(), BM_Attention, s, q8)
          ->Arg(8192)
          ->Arg(16384)
          ->Unit(benchmark::kMillisecond);
  return 0;
}
const int registered = Register();

}  // namespace

BENCHMARK_MAIN();
