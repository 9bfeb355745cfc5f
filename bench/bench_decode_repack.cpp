// A/B benchmark for issue 49's third way (docs/residency.md, "Repacked weights"): the same model
// loaded twice in one process, once with its layers in the file layout (page-cache mappings, the
// default) and once repacked (ModelOptions::repack: ggml's CPU_REPACK layout in anonymous memory),
// measured alternately A B A B over rounds:
//   decode     tokens/s of single-token decode steps after a short prompt
//   restore    seconds to bring back one layer given back (the middle one): the file layout maps
//              and populates its file range (read raw); the repacked one reads it the same way
//              into a staging region and repacks it (re-make). Both come from storage: giving a
//              layer back drops its file range from the page cache.
// Prints medians with min and max, and the repacked/file ratio of the medians.
//
//   build/bench/bench_decode_repack MODEL.gguf [--rounds N] [--tokens T] [--threads K]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "env/env.h"
#include "model/model.h"
#include "runtime/context.h"

namespace {

struct Sys {
  const char* name;
  std::unique_ptr<mz::Model> model;
  std::unique_ptr<mz::Context> ctx;
  std::vector<double> tok_s, restore_s;
};

struct Stat {
  double med, lo, hi;
};
Stat Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}

int Die(const std::string& what, const mz::Status& st) {
  std::fprintf(stderr, "bench_decode_repack: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int rounds = 5, tokens = 32, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_decode_repack MODEL.gguf [--rounds N (5)] [--tokens T (32)] [--threads K (2)]\n"
          "Decode tokens/s and the time to bring back one given-back layer, file layout vs repacked\n"
          "(ggml CPU_REPACK), alternated A B A B in one process; medians with min and max.\n");
      return 0;
    }
    if ((a == "--rounds" || a == "--tokens" || a == "--threads") && i + 1 < argc) {
      const int v = std::atoi(argv[++i]);
      if (v <= 0) return std::fprintf(stderr, "bench_decode_repack: %s must be positive\n", a.c_str()), 2;
      (a == "--rounds" ? rounds : a == "--tokens" ? tokens : threads) = v;
    } else if (!a.empty() && a[0] != '-' && path.empty()) {
      path = a;
    } else {
      return std::fprintf(stderr, "bench_decode_repack: unknown argument '%s' (see --help)\n", a.c_str()), 2;
    }
  }
  if (path.empty()) return std::fprintf(stderr, "bench_decode_repack: a model path is required (see --help)\n"), 2;

  Sys sys[2] = {{"file layout", {}, {}, {}, {}}, {"repacked", {}, {}, {}, {}}};
  const std::vector<int32_t> prompt(16, 1);
  for (int s = 0; s < 2; ++s) {
    mz::ModelOptions mo;
    mo.repack = s == 1;
    mz::Status st = mz::Model::Load(mz::Env::Default(), path, mo, &sys[s].model);
    if (!st.ok()) return Die("loading " + path, st);
    if (s == 1 && sys[s].model->n_repack_units() == 0) {
      std::fprintf(stderr, "bench_decode_repack: this CPU has no repacked kernel for %s's layer types\n", path.c_str());
      return 1;
    }
    mz::ContextOptions co;
    co.n_ctx = 512;
    co.n_threads = threads;
    co.swap_path = "/var/tmp/mz-bench-decode-repack-" + std::to_string(s) + ".swap";
    sys[s].ctx = std::make_unique<mz::Context>(sys[s].model.get(), co);
    if (!(st = sys[s].ctx->Init()).ok()) return Die("context", st);
    if (!(st = sys[s].ctx->Decode(prompt.data(), int(prompt.size()), false)).ok()) return Die("prompt", st);
  }
  std::printf("%s: %d of %d layers repacked; %d rounds, %d decode tokens, %d threads\n", path.c_str(),
              sys[1].model->n_repack_units(), int(sys[1].model->hparams().n_layer), rounds, tokens, threads);
  const int mid = int(sys[0].model->hparams().n_layer) / 2;
  mz::Env* env = mz::Env::Default();
  for (int r = 0; r < rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      Sys& x = sys[(r + k) % 2];  // A B, then B A: neither always goes first
      x.ctx->Truncate(int(prompt.size()));
      uint64_t t0 = env->NowNs();
      for (int t = 0; t < tokens; ++t) {
        const int32_t tok = 2 + t;
        mz::Status st = x.ctx->Decode(&tok, 1, false);
        if (!st.ok()) return Die(std::string(x.name) + " decode", st);
      }
      x.tok_s.push_back(tokens / ((env->NowNs() - t0) / 1e9));
      mz::Status st = x.ctx->Evict({{mz::UnitRef::Weights(mid), mz::UnitState::kWeightsDropped}}, 0, nullptr);
      if (!st.ok()) return Die(std::string(x.name) + " evict", st);
      t0 = env->NowNs();
      if (!(st = x.ctx->Restore()).ok()) return Die(std::string(x.name) + " restore", st);
      x.restore_s.push_back((env->NowNs() - t0) / 1e9);
    }
    std::fprintf(stderr, "round %d/%d: decode %.2f vs %.2f tok/s, restore %.1f vs %.1f ms\n", r + 1, rounds,
                 sys[0].tok_s.back(), sys[1].tok_s.back(), sys[0].restore_s.back() * 1e3, sys[1].restore_s.back() * 1e3);
  }
  const double layer_mb = sys[0].model->unit(mid).region_bytes / 1e6;
  std::printf("| system | decode tok/s median (min-max) | restore one layer (%.1f MB) ms median (min-max) |\n", layer_mb);
  std::printf("|---|---:|---:|\n");
  Stat d[2], re[2];
  for (int s = 0; s < 2; ++s) {
    d[s] = Summarize(sys[s].tok_s);
    re[s] = Summarize(sys[s].restore_s);
    std::printf("| %s | %.2f (%.2f-%.2f) | %.1f (%.1f-%.1f) |\n", sys[s].name, d[s].med, d[s].lo, d[s].hi,
                re[s].med * 1e3, re[s].lo * 1e3, re[s].hi * 1e3);
  }
  std::printf("repacked / file layout: decode %.3fx, restore %.3fx\n", d[1].med / d[0].med, re[1].med / re[0].med);
  return 0;
}
