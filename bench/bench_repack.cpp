// Micro-benchmark for issue 49's "third way" (docs/residency.md, "Repacked weights"): what it costs
// to re-make one layer of Llama-3.1-8B's weights in ggml's repacked CPU layout (the extra buffer
// type CPU_REPACK, the layout llama.cpp's default loader copies weights into) against reading the
// layer raw. One layer's seven matrices, at Q4_0 and Q4_K (the types this x86 CPU's repack table
// takes: on AVX2 Q4_0 -> 8x8 interleaved, Q4_K -> 8x8), valid quantized blocks, one thread (ggml
// repacks a tensor on the thread that sets it):
//   ReadRaw/page_cache  pread of the layer's bytes from a file the page cache holds
//   ReadRaw/storage     the same after posix_fadvise(DONTNEED): from this machine's storage
//   CopyPlain           ggml_backend_tensor_set into a plain CPU buffer (the file layout: a memcpy)
//   Repack              ggml_backend_tensor_set into a CPU_REPACK buffer (the layout change)
// Both set benchmarks touch their buffer once before timing: a fresh allocation's page faults (the
// device profile's alloc_s_per_MiB) come on top of either.
// Re-making a given-back layer the file-backed way costs a read plus a repack; keeping the file
// layout costs a read only (and the generic kernel at every token).
//
//   build/bench/bench_repack --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

// Llama-3.1-8B, one layer: (row length, rows) of attn_q, attn_k, attn_v, attn_output, ffn_gate,
// ffn_up, ffn_down.
constexpr int64_t kLayer[7][2] = {{4096, 4096}, {4096, 1024},  {4096, 1024}, {4096, 4096},
                                  {4096, 14336}, {4096, 14336}, {14336, 4096}};

struct Layer {
  ggml_type type;
  ggml_context* meta = nullptr;
  std::vector<ggml_tensor*> tensors;
  std::vector<std::vector<uint8_t>> data;  // each tensor's quantized bytes
  size_t bytes = 0;
  std::string path;  // the layer's bytes in a file
};

// Valid quantized rows: a few rows quantized from random values, repeated.
Layer& GetLayer(ggml_type type) {
  static Layer layers[2];
  Layer& l = layers[type == GGML_TYPE_Q4_0 ? 0 : 1];
  if (l.meta) return l;
  l.type = type;
  ggml_init_params ip{16 * ggml_tensor_overhead(), nullptr, true};
  l.meta = ggml_init(ip);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& s : kLayer) {
    ggml_tensor* t = ggml_new_tensor_2d(l.meta, type, s[0], s[1]);
    l.tensors.push_back(t);
    const size_t row = ggml_row_size(type, s[0]);
    std::vector<float> src(size_t(s[0]) * 8);
    for (float& x : src) x = u(rng);
    std::vector<uint8_t> rows(row * 8);
    ggml_quantize_chunk(type, src.data(), rows.data(), 0, 8, s[0], nullptr);
    std::vector<uint8_t> d(ggml_nbytes(t));
    for (size_t off = 0; off < d.size(); off += rows.size()) std::memcpy(d.data() + off, rows.data(), rows.size());
    l.bytes += d.size();
    l.data.push_back(std::move(d));
  }
  l.path = "/var/tmp/mz-bench-repack-" + std::to_string(getpid()) + "-" + ggml_type_name(type);
  const int fd = open(l.path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  for (const auto& d : l.data)
    if (write(fd, d.data(), d.size()) != ssize_t(d.size())) std::perror("write");
  fsync(fd);
  close(fd);
  return l;
}

ggml_backend_buffer_type_t RepackBuft() {
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  if (!dev) return nullptr;
  auto get = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
      ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts");
  if (!get) return nullptr;
  for (ggml_backend_buffer_type_t* b = get(dev); b && *b; ++b)
    if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
  return nullptr;
}

void ReadRaw(benchmark::State& state, ggml_type type, bool cold) {
  Layer& l = GetLayer(type);
  std::vector<uint8_t> buf(l.bytes);
  const int fd = open(l.path.c_str(), O_RDONLY);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      state.ResumeTiming();
    }
    size_t done = 0;
    while (done < l.bytes) {
      const ssize_t n = pread(fd, buf.data() + done, l.bytes - done, off_t(done));
      if (n <= 0) break;
      done += size_t(n);
    }
    benchmark::DoNotOptimize(buf.data());
  }
  close(fd);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(l.bytes));
  state.counters["layer_MB"] = double(l.bytes) / 1e6;
}

// Sets the layer's tensors into a buffer of buft (plain CPU or CPU_REPACK), once per iteration.
void SetInto(benchmark::State& state, ggml_type type, bool repack) {
  Layer& l = GetLayer(type);
  ggml_backend_buffer_type_t buft = repack ? RepackBuft() : ggml_backend_cpu_buffer_type();
  if (!buft) {
    state.SkipWithError("no CPU_REPACK buffer type in this ggml");
    return;
  }
  ggml_init_params ip{16 * ggml_tensor_overhead(), nullptr, true};
  ggml_context* ctx = ggml_init(ip);
  std::vector<ggml_tensor*> ts;
  for (ggml_tensor* t : l.tensors) ts.push_back(ggml_dup_tensor(ctx, t));
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
  ggml_backend_buffer_clear(buf, 0);  // first touch outside the timing: the layout change alone
  bool ok = true;
  for (ggml_tensor* t : ts) ok &= !repack || t->extra != nullptr;
  if (!ok) state.SkipWithError("this CPU has no repacked kernel for the type");
  if (ok)
    for (auto _ : state)
      for (size_t i = 0; i < ts.size(); ++i) ggml_backend_tensor_set(ts[i], l.data[i].data(), 0, l.data[i].size());
  ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(l.bytes));
  state.counters["layer_MB"] = double(l.bytes) / 1e6;
}

void BM_ReadRawPageCache(benchmark::State& s, ggml_type t) { ReadRaw(s, t, false); }
void BM_ReadRawStorage(benchmark::State& s, ggml_type t) { ReadRaw(s, t, true); }
void BM_CopyPlain(benchmark::State& s, ggml_type t) { SetInto(s, t, false); }
void BM_Repack(benchmark::State& s, ggml_type t) { SetInto(s, t, true); }

BENCHMARK_CAPTURE(BM_ReadRawPageCache, q4_0, GGML_TYPE_Q4_0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_ReadRawStorage, q4_0, GGML_TYPE_Q4_0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_CopyPlain, q4_0, GGML_TYPE_Q4_0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_Repack, q4_0, GGML_TYPE_Q4_0)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_ReadRawPageCache, q4_K, GGML_TYPE_Q4_K)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_ReadRawStorage, q4_K, GGML_TYPE_Q4_K)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_CopyPlain, q4_K, GGML_TYPE_Q4_K)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);
BENCHMARK_CAPTURE(BM_Repack, q4_K, GGML_TYPE_Q4_K)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(4);

}  // namespace

int main(int argc, char** argv) {
  ggml_cpu_init();
  ggml_log_set([](ggml_log_level, const char*, void*) {}, nullptr);  // one "repack tensor" line per set
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (ggml_type t : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_K}) unlink(GetLayer(t).path.c_str());
  return 0;
}
