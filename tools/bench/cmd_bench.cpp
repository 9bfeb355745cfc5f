// bench speed: pp512, tg128 and pp8 at depth 8192, mzcache vs llama.cpp's llama-bench on the same
// GGUF and thread count, alternating A B A B within one invocation.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>

#include "mzcache.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peers_common.h"
#include "tools/bench/report.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct SpeedTest {
  std::string name;  // "pp512", "tg128", "pp8@d8192"
  int n_prompt = 0, n_gen = 0, depth = 0;
  bool fa = false;   // llama.cpp flash attention for this test
};

struct SpeedArgs {
  std::string model;
  int threads = 2;
  int reps = 3;
  std::string tests = "pp512,tg128,pp8@d8192";
  std::string out_dir = "results/bench-speed";
  bool no_llama = false;
  std::string threads_sweep;  // "1,2": mzcache only, one context, threads changed between runs
  // Resident KV formats compared in the same run ("f16", "q8_0" or "f16,q8_0"): each repetition
  // runs every type in turn on both engines (llama.cpp: -ctk/-ctv of the type; q8_0 needs its
  // flash attention, so -fa on).
  std::string kv_types = "f16";
};

std::vector<SpeedTest> ParseTests(const std::string& spec) {
  std::vector<SpeedTest> out;
  size_t i = 0;
  while (i < spec.size()) {
    size_t j = spec.find(',', i);
    std::string t = spec.substr(i, j == std::string::npos ? std::string::npos : j - i);
    i = j == std::string::npos ? spec.size() : j + 1;
    SpeedTest s;
    s.name = t;
    size_t at = t.find("@d");
    if (at != std::string::npos) {
      s.depth = std::stoi(t.substr(at + 2));
      s.fa = true;  // the paper's comparison: llama.cpp with flash attention
      t = t.substr(0, at);
    }
    if (t.rfind("pp", 0) == 0) s.n_prompt = std::stoi(t.substr(2));
    else if (t.rfind("tg", 0) == 0) s.n_gen = std::stoi(t.substr(2));
    else continue;
    out.push_back(s);
  }
  return out;
}

// One timed run of a test on mzcache, through the public C API. Depth contexts are built once and
// truncated back between runs.
class MzRunner {
 public:
  MzRunner(mz_model* m, int n_vocab, int threads, int32_t kv_type = MZ_KV_F16)
      : model_(m), n_vocab_(n_vocab), threads_(threads), kv_type_(kv_type) {}
  // Later runs compute on n threads: the context is kept (mz_context_set_threads), not rebuilt.
  Status SetThreads(int n) {
    threads_ = n;
    return ctx_ ? MzStatus(mz_context_set_threads(ctx_.get(), n, nullptr, 0)) : Status::Ok();
  }

  Status Run(const SpeedTest& t, double* seconds) {
    std::mt19937 rng(1234);
    const int nv = n_vocab_;
    auto rand_tokens = [&](int n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = int32_t(rng() % uint32_t(nv));
      return v;
    };
    mz_context_params cp = mz_context_default_params();
    cp.n_ctx = uint32_t(t.depth + t.n_prompt + t.n_gen + 16);
    cp.n_threads = threads_;
    cp.kv_type = kv_type_;
    if (!ctx_ || ctx_depth_ != t.depth || ctx_n_ctx_ < cp.n_ctx) {
      ctx_.reset();
      mz_context* c = nullptr;
      MZ_RETURN_IF_ERROR(MzStatus(mz_context_new(model_, &cp, &c)));
      ctx_.reset(c);
      ctx_depth_ = t.depth;
      ctx_n_ctx_ = cp.n_ctx;
      if (t.depth > 0) {
        std::fprintf(stderr, "  mzcache: building a %d-token context (not timed)\n", t.depth);
        auto d = rand_tokens(t.depth);
        MZ_RETURN_IF_ERROR(MzStatus(mz_decode(ctx_.get(), d.data(), t.depth, false)));
      }
    }
    MZ_RETURN_IF_ERROR(MzStatus(mz_context_truncate(ctx_.get(), t.depth)));
    auto p = rand_tokens(std::max(1, t.n_prompt));
    double t0 = NowSeconds();
    if (t.n_prompt > 0) MZ_RETURN_IF_ERROR(MzStatus(mz_decode(ctx_.get(), p.data(), t.n_prompt, false)));
    for (int i = 0; i < t.n_gen; ++i) {
      int32_t tok = int32_t(rng() % uint32_t(nv));
      MZ_RETURN_IF_ERROR(MzStatus(mz_decode(ctx_.get(), &tok, 1, false)));
    }
    *seconds = NowSeconds() - t0;
    return Status::Ok();
  }

 private:
  mz_model* model_;
  int n_vocab_;
  int threads_;
  int32_t kv_type_;
  MzContext ctx_;
  int ctx_depth_ = -1;
  uint32_t ctx_n_ctx_ = 0;
};

// One llama-bench run (-r 1) of a test; returns seconds of the timed part. kv_q8: -ctk q8_0
// -ctv q8_0 (with -fa on, which llama.cpp needs for a quantized V cache).
Status LlamaRun(const SpeedArgs& a, const SpeedTest& t, double* seconds, std::string* raw, bool kv_q8 = false) {
  const bool fa = t.fa || kv_q8;
  std::string cmd = "'" + LlamaBenchPath() + "' -m '" + a.model + "' -t " + std::to_string(a.threads) +
                    " -r 1 -o json -p " + std::to_string(t.n_prompt) + " -n " + std::to_string(t.n_gen) + " -d " +
                    std::to_string(t.depth) + " -fa " + (fa ? "on" : "off") + (kv_q8 ? " -ctk q8_0 -ctv q8_0" : "") +
                    (t.depth > 0 ? " --no-warmup" : "") + " 2>/dev/null";
  int rc = 0;
  std::string out = RunCapture(cmd, &rc);
  if (rc != 0) return Status::IOError("llama-bench failed (exit " + std::to_string(rc) + "): " + cmd);
  try {
    auto j = nlohmann::json::parse(out);
    *seconds = double(j.at(0).at("samples_ns").at(0).get<int64_t>()) * 1e-9;
    *raw = j.at(0).dump();
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("cannot parse llama-bench output: ") + e.what());
  }
  return Status::Ok();
}

// What a bench speed run measures once: the model (through the C API) and the RAM bandwidth bound.
struct SpeedSetup {
  MzModel model;
  mz_model_info info{};
  double bw = 0;  // memory read bandwidth, bytes/s
};

// One test's repetitions, alternating mzcache and llama-bench (after one untimed mzcache warm-up
// for tests without depth; llama-bench warms itself up), progress on stderr.
Status RunTestReps(const SpeedArgs& a, const SpeedTest& t, MzRunner* mz, std::vector<double>* ours,
                   std::vector<double>* theirs, std::vector<std::string>* raws) {
  double dummy;
  if (t.depth == 0) (void)mz->Run(t, &dummy);
  for (int r = 0; r < a.reps; ++r) {
    std::fprintf(stderr, "[%s] rep %d/%d: mzcache...", t.name.c_str(), r + 1, a.reps);
    double s = 0;
    MZ_RETURN_IF_ERROR(mz->Run(t, &s));
    ours->push_back(s);
    std::fprintf(stderr, " %.3f s", s);
    if (!a.no_llama) {
      std::fprintf(stderr, "; llama.cpp...");
      std::string raw;
      MZ_RETURN_IF_ERROR(LlamaRun(a, t, &s, &raw));
      theirs->push_back(s);
      raws->push_back(raw);
      std::fprintf(stderr, " %.3f s", s);
    }
    std::fprintf(stderr, "\n");
  }
  return Status::Ok();
}

// One test's markdown row (also printed) and JSON entry.
void ReportTest(const SpeedSetup& su, const SpeedTest& t, const std::vector<double>& ours,
                const std::vector<double>& theirs, const std::vector<std::string>& raws, std::string* md,
                nlohmann::json* results) {
  const int n_tok = t.n_prompt + t.n_gen;
  auto tps = [&](const std::vector<double>& xs) {
    std::vector<double> v;
    for (double x : xs) v.push_back(n_tok / x);
    return Summarize(v);
  };
  Stats so = tps(ours), sl = tps(theirs), to = Summarize(ours);
  // Memory-bandwidth bound: every weight byte is read once per ubatch and every KV byte of the
  // context once (for decode, once per token).
  const double kv_bytes = double(su.info.kv_bytes_per_token) * (t.depth + n_tok);
  const double passes = t.n_gen > 0 ? t.n_gen : 1;
  const double bound = passes * (double(su.info.weight_bytes) + kv_bytes) / su.bw;
  const double ratio = theirs.empty() ? 0 : so.median / sl.median;
  char line[512];
  if (theirs.empty())
    std::snprintf(line, sizeof line, "| %s | %.2f ± %.2f | - | - | %.3f | %.3f |\n", t.name.c_str(), so.mean,
                  so.stddev, to.median, bound);
  else
    std::snprintf(line, sizeof line, "| %s | %.2f ± %.2f | %.2f ± %.2f | %.2fx | %.3f | %.3f |\n", t.name.c_str(),
                  so.mean, so.stddev, sl.mean, sl.stddev, ratio, to.median, bound);
  *md += line;
  std::fputs(line, stdout);
  results->push_back({{"test", t.name},
                      {"n_prompt", t.n_prompt},
                      {"n_gen", t.n_gen},
                      {"depth", t.depth},
                      {"llama_flash_attn", t.fa},
                      {"mzcache_seconds", ours},
                      {"llama_seconds", theirs},
                      {"mzcache_tps_mean", so.mean},
                      {"mzcache_tps_stddev", so.stddev},
                      {"mzcache_tps_median", so.median},
                      {"llama_tps_mean", sl.mean},
                      {"llama_tps_stddev", sl.stddev},
                      {"llama_tps_median", sl.median},
                      {"ratio_median", ratio},
                      {"bandwidth_bound_seconds", bound},
                      {"llama_bench_raw", raws}});
}

// Writes bench-speed.{md,json}: the run's header over the test rows.
void WriteSpeedReport(const SpeedArgs& a, const SpeedSetup& su, const std::string& rows_md,
                      const nlohmann::json& results) {
  const std::string machine = MachineDescription();
  nlohmann::json doc = {{"model", a.model},
                        {"model_name", su.info.name},
                        {"threads", a.threads},
                        {"reps", a.reps},
                        {"machine", machine},
                        {"read_bandwidth_GBps", su.bw / 1e9},
                        {"results", results}};
  std::string header = "# bench speed\n\nmodel: `" + a.model + "` (" + su.info.name + "), threads " +
                       std::to_string(a.threads) + ", reps " + std::to_string(a.reps) +
                       " (alternating mzcache / llama.cpp)\nmachine: " + machine +
                       "\nmemory read bandwidth: " + std::to_string(su.bw / 1e9) +
                       " GB/s\nt/s: mean ± stddev; ratio: median mzcache t/s / median llama.cpp t/s; "
                       "bound: bytes that must be read (weights + KV) / bandwidth\n\n";
  WriteReport(a.out_dir, "bench-speed", header + rows_md, doc);
  std::fprintf(stderr, "wrote %s/bench-speed.{md,json}\n", a.out_dir.c_str());
}

// bench speed --threads-sweep 1,2: mzcache alone, one context per test whose compute threads are
// changed between runs (mz_context_set_threads), the thread counts alternating within each
// repetition (1 2 1 2 ...) so slow drifts of a shared machine hit every count alike. One untimed
// warm-up per count. Writes bench-threads.{md,json}: median, min and max t/s per count, every run's
// seconds and the 1-minute load average before it.
Status RunThreadsSweep(SpeedArgs& a, SpeedSetup& su) {
  std::vector<int> counts;
  {
    std::stringstream ss(a.threads_sweep);
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) counts.push_back(std::stoi(item));
  }
  if (counts.empty()) return Status::InvalidArgument("--threads-sweep: no thread counts");
  MzRunner mz(su.model.get(), su.info.n_vocab, counts[0]);
  nlohmann::json results = nlohmann::json::array();
  std::string md = "| test | threads | t/s median | t/s min | t/s max | runs | load avg (1 min) before runs |\n"
                   "|---|---|---|---|---|---|---|\n";
  for (const SpeedTest& t : ParseTests(a.tests)) {
    const int n_tok = t.n_prompt + t.n_gen;
    std::vector<std::vector<double>> secs(counts.size()), loads(counts.size());
    for (size_t k = 0; k < counts.size(); ++k) {  // warm-up (also builds a depth context once)
      double dummy;
      MZ_RETURN_IF_ERROR(mz.SetThreads(counts[k]));
      MZ_RETURN_IF_ERROR(mz.Run(t, &dummy));
    }
    for (int r = 0; r < a.reps; ++r)
      for (size_t k = 0; k < counts.size(); ++k) {
        MZ_RETURN_IF_ERROR(mz.SetThreads(counts[k]));
        loads[k].push_back(LoadAvg1());
        double s = 0;
        MZ_RETURN_IF_ERROR(mz.Run(t, &s));
        secs[k].push_back(s);
        std::fprintf(stderr, "[%s] rep %d/%d, %d threads: %.3f s (%.2f t/s), load %.2f\n", t.name.c_str(), r + 1,
                     a.reps, counts[k], s, n_tok / s, loads[k].back());
      }
    for (size_t k = 0; k < counts.size(); ++k) {
      std::vector<double> tps;
      for (double x : secs[k]) tps.push_back(n_tok / x);
      const Stats st = Summarize(tps), ld = Summarize(loads[k]);
      char line[256];
      std::snprintf(line, sizeof line, "| %s | %d | %.2f | %.2f | %.2f | %d | %.1f-%.1f |\n", t.name.c_str(), counts[k],
                    st.median, st.min, st.max, st.n, ld.min, ld.max);
      md += line;
      std::fputs(line, stdout);
      results.push_back({{"test", t.name},
                         {"n_prompt", t.n_prompt},
                         {"n_gen", t.n_gen},
                         {"depth", t.depth},
                         {"threads", counts[k]},
                         {"seconds", secs[k]},
                         {"loadavg1_before", loads[k]},
                         {"tps_median", st.median},
                         {"tps_min", st.min},
                         {"tps_max", st.max}});
    }
  }
  const std::string machine = MachineDescription();
  nlohmann::json doc = {{"model", a.model}, {"model_name", su.info.name}, {"threads_sweep", counts},
                        {"reps", a.reps},   {"machine", machine},         {"results", results}};
  std::string header = "# bench speed --threads-sweep\n\nmodel: `" + a.model + "` (" + su.info.name + "), reps " +
                       std::to_string(a.reps) +
                       " per thread count, alternating within each repetition, one context per test "
                       "(threads changed with mz_context_set_threads)\nmachine: " + machine + "\n\n";
  WriteReport(a.out_dir, "bench-threads", header + md, doc);
  std::fprintf(stderr, "wrote %s/bench-threads.{md,json}\n", a.out_dir.c_str());
  return Status::Ok();
}

// bench speed --kv-types f16,q8_0: for each test and repetition, every KV type in turn, mzcache then
// llama.cpp (one mzcache context per type and test; untimed warm-up per type for tests without
// depth). Writes bench-speed-kv.{md,json}: t/s median, min and max per (test, type, engine) and
// the median ratio of each type to the first one.
Status RunKvTypes(SpeedArgs& a, SpeedSetup& su) {
  std::vector<KvType> kv;
  MZ_RETURN_IF_ERROR(ParseKvTypeList(a.kv_types, "--kv-types", &kv));
  std::vector<std::string> types;
  for (KvType t : kv) types.push_back(KvTypeName(t));
  nlohmann::json results = nlohmann::json::array();
  std::string md = "| test | KV | mzcache t/s median (min-max) | vs " + types[0] +
                   " | llama.cpp t/s median (min-max) | vs " + types[0] + " | mzcache / llama.cpp |\n|---|---|---|---|---|---|---|\n";
  for (const SpeedTest& t : ParseTests(a.tests)) {
    const int n_tok = t.n_prompt + t.n_gen;
    std::vector<std::unique_ptr<MzRunner>> mz;
    for (const std::string& ty : types)
      mz.push_back(std::make_unique<MzRunner>(su.model.get(), su.info.n_vocab, a.threads, ty == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16));
    std::vector<std::vector<double>> ours(types.size()), theirs(types.size());
    for (size_t k = 0; k < types.size(); ++k) {  // warm-up (also builds a depth context once per type)
      double dummy;
      MZ_RETURN_IF_ERROR(mz[k]->Run(t, &dummy));
    }
    for (int r = 0; r < a.reps; ++r)
      for (size_t k = 0; k < types.size(); ++k) {
        double s = 0;
        MZ_RETURN_IF_ERROR(mz[k]->Run(t, &s));
        ours[k].push_back(s);
        std::fprintf(stderr, "[%s] rep %d/%d, KV %s: mzcache %.3f s", t.name.c_str(), r + 1, a.reps, types[k].c_str(), s);
        if (!a.no_llama) {
          std::string raw;
          MZ_RETURN_IF_ERROR(LlamaRun(a, t, &s, &raw, types[k] == "q8_0"));
          theirs[k].push_back(s);
          std::fprintf(stderr, "; llama.cpp %.3f s", s);
        }
        std::fprintf(stderr, "\n");
      }
    auto tps = [&](const std::vector<double>& xs) {
      std::vector<double> v;
      for (double x : xs) v.push_back(n_tok / x);
      return Summarize(v);
    };
    const Stats base_o = tps(ours[0]), base_l = theirs[0].empty() ? Stats() : tps(theirs[0]);
    for (size_t k = 0; k < types.size(); ++k) {
      const Stats so = tps(ours[k]);
      const Stats sl = theirs[k].empty() ? Stats() : tps(theirs[k]);
      const bool has_l = !theirs[k].empty();
      std::string line = Sprintf("| %s | %s | %.2f (%.2f-%.2f) | %.3fx | ", t.name.c_str(), types[k].c_str(), so.median,
                                 so.min, so.max, so.median / base_o.median);
      line += has_l ? Sprintf("%.2f (%.2f-%.2f) | %.3fx | %.2fx |\n", sl.median, sl.min, sl.max, sl.median / base_l.median,
                              so.median / sl.median)
                    : std::string("- | - | - |\n");
      md += line;
      std::fputs(line.c_str(), stdout);
      results.push_back({{"test", t.name},
                         {"kv_type", types[k]},
                         {"n_prompt", t.n_prompt},
                         {"n_gen", t.n_gen},
                         {"depth", t.depth},
                         {"llama_flash_attn", t.fa || types[k] == "q8_0"},
                         {"llama_cache_type", types[k] == "q8_0" ? "q8_0" : "f16"},
                         {"mzcache_seconds", ours[k]},
                         {"llama_seconds", theirs[k]},
                         {"mzcache_tps_median", so.median},
                         {"mzcache_tps_min", so.min},
                         {"mzcache_tps_max", so.max},
                         {"llama_tps_median", has_l ? sl.median : 0.0},
                         {"llama_tps_min", has_l ? sl.min : 0.0},
                         {"llama_tps_max", has_l ? sl.max : 0.0}});
    }
  }
  const std::string machine = MachineDescription();
  nlohmann::json doc = {{"model", a.model}, {"model_name", su.info.name}, {"threads", a.threads}, {"reps", a.reps},
                        {"kv_types", types}, {"machine", machine},         {"results", results}};
  std::string header = "# bench speed --kv-types\n\nmodel: `" + a.model + "` (" + su.info.name + "), threads " +
                       std::to_string(a.threads) + ", reps " + std::to_string(a.reps) +
                       " (each repetition runs every KV type in turn, mzcache then llama.cpp; llama.cpp q8_0 is "
                       "-ctk q8_0 -ctv q8_0 -fa on, f16 is its default cache with -fa on only for depth tests)\n"
                       "machine: " + machine + "\n\n";
  WriteReport(a.out_dir, "bench-speed-kv", header + md, doc);
  std::fprintf(stderr, "wrote %s/bench-speed-kv.{md,json}\n", a.out_dir.c_str());
  return Status::Ok();
}

// bench speed: every test in turn, then the report.
Status RunSpeed(SpeedArgs& a) {
  // The peer is built on demand (the test command does not need it): say how, before any work.
  if (!a.no_llama && !std::filesystem::exists(LlamaBenchPath()))
    return Status::InvalidArgument("llama.cpp's llama-bench is not built (" + LlamaBenchPath() +
                                   "): `MZ_DEPS_BENCH=1 scripts/deps.sh` builds it once from the pinned "
                                   "source (a few minutes), or pass --no-llama for mzcache alone");
  SpeedSetup su;
  std::string path;
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, "q8_0", &path, &su.model));
  a.model = path;
  MZ_RETURN_IF_ERROR(MzStatus(mz_model_get_info(su.model.get(), &su.info)));
  if (!a.threads_sweep.empty()) return RunThreadsSweep(a, su);
  if (a.kv_types != "f16") return RunKvTypes(a, su);
  su.bw = MeasureReadBandwidth(a.threads);
  std::fprintf(stderr, "memory read bandwidth (%d threads): %.1f GB/s\n", a.threads, su.bw / 1e9);
  MzRunner mz(su.model.get(), su.info.n_vocab, a.threads);
  nlohmann::json results = nlohmann::json::array();
  std::string md = "| test | mzcache t/s | llama.cpp t/s | ratio | mzcache s (median) | bound s |\n|---|---|---|---|---|---|\n";
  for (const SpeedTest& t : ParseTests(a.tests)) {
    std::vector<double> ours, theirs;
    std::vector<std::string> raws;
    MZ_RETURN_IF_ERROR(RunTestReps(a, t, &mz, &ours, &theirs, &raws));
    ReportTest(su, t, ours, theirs, raws, &md, &results);
  }
  WriteSpeedReport(a, su, md, results);
  return Status::Ok();
}

}  // namespace

void AddBenchCommands(CLI::App& app, Runners& runners) {
  auto* bench = app.add_subcommand("bench", "benchmarks (results as markdown + JSON + plots)");
  bench->require_subcommand(1);
  AddTtftBench(bench, runners);
  AddEvictBench(bench, runners);
  AddPoolBench(bench, runners);
  AddModelsBench(bench, runners);
  AddFieldNotesBench(bench, runners);
  AddBatchBench(bench, runners);
  AddPeersBench(bench, runners);
  AddAccuracyBench(bench, runners);
  AddKvTypeBench(bench, runners);
  AddFootprintBench(bench, runners);
  AddPaperBench(bench, runners);
  AddSustainedBench(bench, runners);
  auto a = std::make_shared<SpeedArgs>();
  auto* speed = bench->add_subcommand("speed", "pp512, tg128, pp8 at depth 8192: mzcache vs llama.cpp llama-bench");
  speed->add_option("-m,--model", a->model, "GGUF (default: the synthesized Qwen3-0.6B q8_0)");
  speed->add_option("-t,--threads", a->threads, "threads for both engines");
  speed->add_option("-r,--reps", a->reps, "repetitions (alternating mzcache / llama.cpp)");
  speed->add_option("--tests", a->tests, "comma-separated: ppN, tgN, ppN@dDEPTH");
  speed->add_option("-o,--out", a->out_dir, "folder for bench-speed.{md,json}");
  speed->add_flag("--no-llama", a->no_llama, "only mzcache");
  speed->add_option("--kv-types", a->kv_types,
                    "resident KV formats, comma-separated (f16, q8_0): every repetition runs each in turn on both "
                    "engines (llama.cpp -ctk/-ctv q8_0 -fa on); writes bench-speed-kv.{md,json}");
  speed->add_option("--threads-sweep", a->threads_sweep,
                    "mzcache only: thread counts (e.g. 1,2) alternated run by run on one context per test "
                    "(mz_context_set_threads); writes bench-threads.{md,json}");
  runners.push_back([speed, a]() -> int {
    if (!speed->parsed()) return -1;
    Status st = RunSpeed(*a);
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace mz::cli
