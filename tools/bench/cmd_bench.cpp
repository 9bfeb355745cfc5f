// bench speed: pp512, tg128 and pp8 at depth 8192, mzcache vs llama.cpp's llama-bench on the same
// GGUF and thread count, alternating A B A B within one invocation.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <random>

#include "model/model.h"
#include "runtime/context.h"
#include "tools/bench/bench_util.h"
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

// One timed run of a test on mzcache. Depth contexts are built once and truncated back between runs.
class MzRunner {
 public:
  MzRunner(Model* m, int threads) : model_(m), threads_(threads) {}

  Status Run(const SpeedTest& t, double* seconds) {
    std::mt19937 rng(1234);
    const int nv = int(model_->hparams().n_vocab);
    auto rand_tokens = [&](int n) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = int32_t(rng() % uint32_t(nv));
      return v;
    };
    ContextOptions co;
    co.n_ctx = t.depth + t.n_prompt + t.n_gen + 16;
    co.n_threads = threads_;
    if (!ctx_ || ctx_depth_ != t.depth || ctx_->options().n_ctx < co.n_ctx) {
      ctx_ = std::make_unique<Context>(model_, co);
      ctx_depth_ = t.depth;
      if (t.depth > 0) {
        std::fprintf(stderr, "  mzcache: building a %d-token context (not timed)\n", t.depth);
        auto d = rand_tokens(t.depth);
        MZ_RETURN_IF_ERROR(ctx_->Decode(d.data(), t.depth, false));
      }
    }
    ctx_->Truncate(t.depth);
    auto p = rand_tokens(std::max(1, t.n_prompt));
    double t0 = NowSeconds();
    if (t.n_prompt > 0) MZ_RETURN_IF_ERROR(ctx_->Decode(p.data(), t.n_prompt, false));
    for (int i = 0; i < t.n_gen; ++i) {
      int32_t tok = int32_t(rng() % uint32_t(nv));
      MZ_RETURN_IF_ERROR(ctx_->Decode(&tok, 1, false));
    }
    *seconds = NowSeconds() - t0;
    return Status::Ok();
  }

 private:
  Model* model_;
  int threads_;
  std::unique_ptr<Context> ctx_;
  int ctx_depth_ = -1;
};

// One llama-bench run (-r 1) of a test; returns seconds of the timed part.
Status LlamaRun(const SpeedArgs& a, const SpeedTest& t, double* seconds, std::string* raw) {
  std::string cmd = "'" + LlamaBenchPath() + "' -m '" + a.model + "' -t " + std::to_string(a.threads) +
                    " -r 1 -o json -p " + std::to_string(t.n_prompt) + " -n " + std::to_string(t.n_gen) + " -d " +
                    std::to_string(t.depth) + " -fa " + (t.fa ? "on" : "off") + (t.depth > 0 ? " --no-warmup" : "") +
                    " 2>/dev/null";
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

}  // namespace

void AddBenchCommands(CLI::App& app, Runners& runners) {
  auto* bench = app.add_subcommand("bench", "benchmarks (results as markdown + JSON + plots)");
  bench->require_subcommand(1);
  AddTtftBench(bench, runners);
  AddEvictBench(bench, runners);
  AddPeersBench(bench, runners);
  AddAccuracyBench(bench, runners);
  AddFootprintBench(bench, runners);
  AddPaperBench(bench, runners);
  auto a = std::make_shared<SpeedArgs>();
  auto* speed = bench->add_subcommand("speed", "pp512, tg128, pp8 at depth 8192: mzcache vs llama.cpp llama-bench");
  speed->add_option("-m,--model", a->model, "GGUF (default: the synthesized Qwen3-0.6B q8_0)");
  speed->add_option("-t,--threads", a->threads, "threads for both engines");
  speed->add_option("-r,--reps", a->reps, "repetitions (alternating mzcache / llama.cpp)");
  speed->add_option("--tests", a->tests, "comma-separated: ppN, tgN, ppN@dDEPTH");
  speed->add_option("-o,--out", a->out_dir, "folder for bench-speed.{md,json}");
  speed->add_flag("--no-llama", a->no_llama, "only mzcache");
  runners.push_back([speed, a]() -> int {
    if (!speed->parsed()) return -1;
    if (a->model.empty()) {
      Status st = EnsureDefaultModel(&a->model);
      if (!st.ok()) return Fail(st);
    }
    std::unique_ptr<Model> model;
    Status st = Model::Load(Env::Default(), a->model, ModelOptions(), &model);
    if (!st.ok()) return Fail(st);
    const HParams& hp = model->hparams();
    const double bw = MeasureReadBandwidth(a->threads);
    std::fprintf(stderr, "memory read bandwidth (%d threads): %.1f GB/s\n", a->threads, bw / 1e9);
    MzRunner mz(model.get(), a->threads);
    nlohmann::json results = nlohmann::json::array();
    std::string md = "| test | mzcache t/s | llama.cpp t/s | ratio | mzcache s (median) | bound s |\n|---|---|---|---|---|---|\n";
    for (const SpeedTest& t : ParseTests(a->tests)) {
      std::vector<double> ours, theirs;
      std::vector<std::string> raws;
      // Warm-up (not recorded) for mzcache; llama-bench does its own except for depth tests.
      double dummy;
      if (t.depth == 0) mz.Run(t, &dummy);
      for (int r = 0; r < a->reps; ++r) {
        std::fprintf(stderr, "[%s] rep %d/%d: mzcache...", t.name.c_str(), r + 1, a->reps);
        double s = 0;
        st = mz.Run(t, &s);
        if (!st.ok()) return Fail(st);
        ours.push_back(s);
        std::fprintf(stderr, " %.3f s", s);
        if (!a->no_llama) {
          std::fprintf(stderr, "; llama.cpp...");
          std::string raw;
          st = LlamaRun(*a, t, &s, &raw);
          if (!st.ok()) return Fail(st);
          theirs.push_back(s);
          raws.push_back(raw);
          std::fprintf(stderr, " %.3f s", s);
        }
        std::fprintf(stderr, "\n");
      }
      const int n_tok = t.n_prompt + t.n_gen;
      auto tps = [&](const std::vector<double>& xs) {
        std::vector<double> v;
        for (double x : xs) v.push_back(n_tok / x);
        return Summarize(v);
      };
      Stats so = tps(ours), sl = tps(theirs), to = Summarize(ours);
      // Memory-bandwidth bound: every weight byte is read once per ubatch and every KV byte of the
      // context once (for decode, once per token).
      const double kv_bytes = double(hp.kv_bytes_per_token()) * (t.depth + n_tok);
      const double passes = t.n_gen > 0 ? t.n_gen : 1;
      const double bound = passes * (double(model->tensor_bytes()) + kv_bytes) / bw;
      const double ratio = theirs.empty() ? 0 : so.median / sl.median;
      char line[512];
      if (theirs.empty())
        std::snprintf(line, sizeof line, "| %s | %.2f ± %.2f | - | - | %.3f | %.3f |\n", t.name.c_str(), so.mean,
                      so.stddev, to.median, bound);
      else
        std::snprintf(line, sizeof line, "| %s | %.2f ± %.2f | %.2f ± %.2f | %.2fx | %.3f | %.3f |\n", t.name.c_str(),
                      so.mean, so.stddev, sl.mean, sl.stddev, ratio, to.median, bound);
      md += line;
      std::fputs(line, stdout);
      results.push_back({{"test", t.name},
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
    nlohmann::json doc = {{"model", a->model},
                          {"model_name", hp.name},
                          {"threads", a->threads},
                          {"reps", a->reps},
                          {"machine", MachineDescription()},
                          {"read_bandwidth_GBps", bw / 1e9},
                          {"results", results}};
    std::string header = "# bench speed\n\nmodel: `" + a->model + "` (" + hp.name + "), threads " +
                         std::to_string(a->threads) + ", reps " + std::to_string(a->reps) +
                         " (alternating mzcache / llama.cpp)\nmachine: " + MachineDescription() +
                         "\nmemory read bandwidth: " + std::to_string(bw / 1e9) +
                         " GB/s\nt/s: mean ± stddev; ratio: median mzcache t/s / median llama.cpp t/s; "
                         "bound: bytes that must be read (weights + KV) / bandwidth\n\n";
    WriteFile(a->out_dir, "bench-speed.md", header + md);
    WriteFile(a->out_dir, "bench-speed.json", doc.dump(2));
    std::fprintf(stderr, "wrote %s/bench-speed.{md,json}\n", a->out_dir.c_str());
    return 0;
  });
}

}  // namespace mz::cli
