// bench evict: time to evict and to restore about 1 GiB of KV (per state) and of weights, against the
// raw direct-I/O read bandwidth and memcpy bandwidth measured in the same run. KV content is real:
// chunks from a prefill of real text, replicated to reach the size.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <memory>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/real_text.h"

namespace mz::cli {

namespace {

struct EvictArgs {
  std::string model;
  double gib = 1.0;
  int reps = 3;
  std::string codecs = "q8,q4,cachegen,none";
  std::string swap_dir = "/var/tmp";
  std::string out = "results/bench-evict";
  int threads = 2;
};

// The report under construction: markdown table rows and their JSON twins.
struct EvictReport {
  std::string md;
  nlohmann::json rows = nlohmann::json::array();
};

// Best of three 512 MiB memcpy, in bytes/s.
double MeasureMemcpy() {
  const size_t n = size_t(512) << 20;
  std::vector<char> x(n, 1), y(n, 0);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    double t0 = NowSeconds();
    std::memcpy(y.data(), x.data(), n);
    best = std::max(best, double(n) / (NowSeconds() - t0));
  }
  return best;
}

std::vector<std::string> SplitCodecs(const std::string& list) {
  auto codecs = std::vector<std::string>();
  for (size_t i = 0, j; i < list.size(); i = j + 1) {
    j = list.find(',', i);
    if (j == std::string::npos) j = list.size();
    codecs.push_back(list.substr(i, j - i));
  }
  return codecs;
}

struct Case {
  UnitState state;
  std::string codec;
  bool mapped = false;  // storage raw: restored chunks map their extents (UnitTableOptions::map_swap)
};

// Storage raw twice: read into anonymous memory, and mapped from the swap (the default), where a
// restored chunk keeps its extent: evicting it again writes nothing. Its "evict s" is then the
// median of the evictions after the first (clean re-evictions); the first is reported apart.
std::vector<Case> KvCases(const std::vector<std::string>& codecs) {
  std::vector<Case> cases{{UnitState::kKvStorageRaw, "none", false}, {UnitState::kKvStorageRaw, "none", true}};
  for (auto& cd : codecs) {
    cases.push_back({UnitState::kKvMemCompressed, cd});
    cases.push_back({UnitState::kKvStorageCompressed, cd});
  }
  return cases;
}

// One KV row: a context of `tokens` tokens filled from the real chunks, every chunk evicted to
// cs.state and restored a.reps times. Appends the row to *rep and prints it.
Status RunKvCase(const EvictArgs& a, Model* model, const std::vector<std::vector<uint16_t>>& real, int tokens,
                 const Case& cs, EvictReport* rep) {
  const HParams& hp = model->hparams();
  ContextOptions co;
  co.n_ctx = tokens + 256;
  co.kv_codec = cs.codec;
  co.restore_threads = a.threads;
  co.swap_path = a.swap_dir + "/mzcache-bench-evict.swap";
  co.map_swap = cs.mapped;
  Context ctx(model, co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  // The context's KV from real chunks (two per layer, alternating), through the context's own
  // operation: no prefill of `tokens` tokens needed to measure eviction and restoration.
  MZ_RETURN_IF_ERROR(ctx.ImportKv(tokens, [&](int l, int ch, uint16_t* dst) {
    std::memcpy(dst, real[size_t(l * 2 + ch % 2)].data(), ctx.kv().geometry().chunk_bytes());
  }));
  const int C = ctx.kv().n_chunks();
  Plan plan;
  for (int l = int(hp.n_layer) - 1; l >= 0; --l)
    for (int ch = C - 1; ch >= 0; --ch) plan.push_back({UnitRef::Kv(l, ch), cs.state});
  std::vector<double> ev, re;
  uint64_t stored = 0;
  const double moved = double(ctx.Report().kv_total);
  for (int r = 0; r < a.reps; ++r) {
    double t0 = NowSeconds();
    MZ_RETURN_IF_ERROR(ctx.Evict(plan, 0, nullptr));
    ev.push_back(NowSeconds() - t0);
    MemoryReport mr = ctx.Report();
    stored = mr.kv_mem_compressed + mr.kv_storage_compressed + mr.kv_storage_raw;
    t0 = NowSeconds();
    MZ_RETURN_IF_ERROR(ctx.Restore());
    re.push_back(NowSeconds() - t0);
  }
  const double first_evict = ev.front();
  if (cs.mapped && ev.size() > 1) ev.erase(ev.begin());
  const Stats e = Summarize(ev), r = Summarize(re);
  const std::string state = std::string(UnitStateName(cs.state)) +
                            (cs.state != UnitState::kKvStorageRaw ? ""
                             : cs.mapped ? " (mapped; evict = again, clean; first " +
                                               std::to_string(first_evict).substr(0, 5) + " s)"
                                         : " (anonymous)");
  char line[512];
  std::snprintf(line, sizeof line, "| KV | %s | %s | %.2f | %.3f | %.3f | %.2f | %.0f |\n", state.c_str(),
                cs.codec.c_str(), moved / 1073741824.0, e.median, r.median, moved / r.median / 1e9,
                stored / 1048576.0);
  rep->md += line;
  std::fputs(line, stdout);
  rep->rows.push_back({{"units", "kv"}, {"state", UnitStateName(cs.state)}, {"codec", cs.codec}, {"bytes", moved},
                       {"mapped", cs.mapped}, {"first_evict_s", first_evict}, {"evict_s", e.median},
                       {"restore_s", r.median}, {"stored_bytes", stored}});
  return Status::Ok();
}

// The weights row: drop every layer unit, restore (direct I/O, parallel), a.reps times.
Status RunWeightsCase(const EvictArgs& a, Model* model, EvictReport* rep) {
  const HParams& hp = model->hparams();
  ContextOptions co;
  co.restore_threads = a.threads;
  Context ctx(model, co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  Plan plan;
  for (int l = int(hp.n_layer) - 1; l >= 0; --l) plan.push_back({UnitRef::Weights(l), UnitState::kWeightsDropped});
  double moved = 0;
  for (int l = 0; l < int(hp.n_layer); ++l) moved += double(model->unit(l).region_bytes);
  std::vector<double> ev, re;
  for (int r = 0; r < a.reps; ++r) {
    double t0 = NowSeconds();
    Status st = ctx.Evict(plan, 0, nullptr);
    ev.push_back(NowSeconds() - t0);
    t0 = NowSeconds();
    if (st.ok()) st = ctx.Restore();
    MZ_RETURN_IF_ERROR(st);
    re.push_back(NowSeconds() - t0);
  }
  const Stats e = Summarize(ev), r = Summarize(re);
  char line[512];
  std::snprintf(line, sizeof line, "| weights (all layers) | weights-dropped | - | %.2f | %.3f | %.3f | %.2f | 0 |\n",
                moved / 1073741824.0, e.median, r.median, moved / r.median / 1e9);
  rep->md += line;
  std::fputs(line, stdout);
  rep->rows.push_back({{"units", "weights"}, {"state", "weights-dropped"}, {"bytes", moved}, {"evict_s", e.median},
                       {"restore_s", r.median}});
  return Status::Ok();
}

int RunEvictBench(EvictArgs& a) {
  if (a.model.empty()) {
    Status st = EnsureDefaultModel(&a.model);
    if (!st.ok()) return Fail(st);
  }
  std::unique_ptr<Model> model;
  Status st = Model::Load(Env::Default(), a.model, ModelOptions(), &model);
  if (!st.ok()) return Fail(st);
  const HParams& hp = model->hparams();
  // Real KV: 512 tokens of real text (2 chunks per layer).
  std::vector<std::vector<uint16_t>> real;
  ChunkShape real_shape;
  st = RealKvChunks(a.model, &real, &real_shape);
  if (!st.ok()) return Fail(st);
  const double bw_read = MeasureDirectRead(a.swap_dir, size_t(512) << 20);
  const double bw_memcpy = MeasureMemcpy();
  EvictReport rep;
  rep.md = "# bench evict\n\nmodel `" + a.model + "`; machine " + MachineDescription() + "\ndirect-I/O read " +
           std::to_string(bw_read / 1e9).substr(0, 5) + " GB/s, memcpy " + std::to_string(bw_memcpy / 1e9).substr(0, 5) +
           " GB/s (measured in this run); restore threads " + std::to_string(a.threads) + "; medians of " +
           std::to_string(a.reps) +
           "\n\n| units | state | codec | GiB moved | evict s | restore s | restore GB/s | stored MiB |\n|---|---|---|---|---|---|---|---|\n";
  const int tokens = int(a.gib * 1073741824.0 / double(hp.kv_bytes_per_token()));
  for (const Case& cs : KvCases(SplitCodecs(a.codecs))) {
    st = RunKvCase(a, model.get(), real, tokens, cs, &rep);
    if (!st.ok()) return Fail(st);
  }
  st = RunWeightsCase(a, model.get(), &rep);
  if (!st.ok()) return Fail(st);
  nlohmann::json doc = {{"model", a.model}, {"machine", MachineDescription()}, {"read_GBps", bw_read / 1e9},
                        {"memcpy_GBps", bw_memcpy / 1e9}, {"rows", rep.rows}};
  WriteFile(a.out, "bench-evict.md", rep.md);
  WriteFile(a.out, "bench-evict.json", doc.dump(2));
  std::fprintf(stderr, "wrote %s/bench-evict.{md,json}\n", a.out.c_str());
  return 0;
}

}  // namespace

void AddEvictBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<EvictArgs>();
  auto* c = bench->add_subcommand("evict", "time to evict and restore ~1 GiB of KV (per state and codec) and of weights");
  c->add_option("-m,--model", a->model, "GGUF (default: synthesized Qwen3-0.6B q8_0)");
  c->add_option("--gib", a->gib, "KV size to move");
  c->add_option("-r,--reps", a->reps, "repetitions");
  c->add_option("--codecs", a->codecs, "codecs for the compressed states");
  c->add_option("--swap-dir", a->swap_dir, "folder of the swap file");
  c->add_option("-t,--threads", a->threads, "restore threads");
  c->add_option("-o,--out", a->out, "results folder");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunEvictBench(*a);
  });
}

}  // namespace mz::cli
