// bench kv-type: live q8 KV (KV type q8_0) against fp16 KV, in one run, on one model:
//   * memory: resident KV bytes per token of each type after prefill (and the formula);
//   * accuracy: an f16 and a q8_0 context each prefill the same real text (each writes its own KV),
//     then P further real-text positions are teacher-forced on both; per position KL(p_f16 || p_q8)
//     and top-1 agreement (as bench accuracy);
//   * TTFT after eviction: a context of ttft_ctx tokens evicted by the hybrid-swap policy down to
//     each level of remaining memory, then restore_generate of a short query; the two types
//     alternate within each repetition (medians with min-max).
// Speed (pp512, tg128, pp8@d8192) with the llama.cpp peer is `bench speed --kv-types f16,q8_0`.
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "model/model.h"
#include "runtime/context.h"
#include "tools/bench/accuracy_metrics.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/peers_common.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct KvTypeArgs {
  std::string model = "qwen3-0.6b";
  std::string type = "q8_0";
  int ctx = 1024;
  int positions = 256;
  int ttft_ctx = 2048;
  std::vector<int> levels{0, 50};
  int reps = 3;
  int query = 8;
  int threads = 1;
  std::string codec = "q8";
  std::string out = "results/bench-kv-type";
  std::string swap_dir = "/var/tmp";
  bool no_ttft = false;
};

const KvType kTypes[2] = {KvType::kF16, KvType::kQ8};

ContextOptions Options(const KvTypeArgs& a, KvType t, int n_ctx) {
  ContextOptions co;
  co.n_ctx = n_ctx;
  co.n_threads = a.threads;
  co.kv_type = t;
  co.kv_codec = a.codec;
  co.swap_path = a.swap_dir + "/mzcache-kvtype-" + KvTypeName(t) + "-" + std::to_string(getpid()) + ".swap";
  return co;
}

// Prefill of toks[0, n) in 512-token batches (progress on stderr).
Status Prefill(Context& ctx, const std::vector<int32_t>& toks, int n, const char* what) {
  for (int i = 0; i < n; i += 512) {
    const int m = std::min(512, n - i);
    MZ_RETURN_IF_ERROR(ctx.Decode(toks.data() + i, m, false));
    std::fprintf(stderr, "\r  %s: prefill %d/%d", what, i + m, n);
  }
  std::fprintf(stderr, "\n");
  return Status::Ok();
}

Status Run(KvTypeArgs& a) {
  std::string path;
  std::unique_ptr<Model> model;
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &path, &model));
  const HParams& hp = model->hparams();
  const int nv = int(hp.n_vocab), N = a.ctx, P = a.positions;
  nlohmann::json doc;
  const std::string machine = MachineDescription();
  doc["machine"] = machine;
  doc["model"] = path;
  doc["model_name"] = hp.name;
  doc["threads"] = a.threads;
  std::string md = "# bench kv-type: q8_0 KV vs f16 KV\n\nmodel `" + path + "` (" + hp.name + "); machine: " + machine +
                   "; threads " + std::to_string(a.threads) + ".\n\n";

  // ---- memory and accuracy ----
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(RealTokens(path, N + P, &toks));
  std::vector<float> lp_f16(size_t(P) * nv), lq(static_cast<size_t>(nv));
  std::vector<int> top_f16(static_cast<size_t>(P));
  std::vector<double> kl;
  int agree = 0;
  md += "## Memory\n\nResident KV after prefill of " + std::to_string(N) + " tokens (" + std::to_string(hp.n_layer) +
        " layers, " + std::to_string(hp.n_head_kv) + " kv heads, head_dim " + std::to_string(hp.head_dim) +
        ", 256-token chunks).\n\n| KV | resident KV bytes | bytes per token | formula per token | vs f16 |\n|---|---|---|---|---|\n";
  double f16_per_tok = 0;
  for (KvType t : kTypes) {
    Context ctx(model.get(), Options(a, t, N + P + 64));
    MZ_RETURN_IF_ERROR(ctx.Init());
    MZ_RETURN_IF_ERROR(Prefill(ctx, toks, N, KvTypeName(t)));
    const MemoryReport r = ctx.Report();
    const double per_tok = double(r.kv_resident) / N;
    const uint64_t formula = t == KvType::kQ8 ? 2ull * hp.n_layer * hp.n_head_kv * (hp.head_dim + 2)
                                              : 2ull * hp.n_layer * hp.n_head_kv * hp.head_dim * 2;
    if (t == KvType::kF16) f16_per_tok = per_tok;
    md += Sprintf("| %s | %llu | %.0f | %llu | %.3f |\n", KvTypeName(t), (unsigned long long)r.kv_resident, per_tok,
                  (unsigned long long)formula, per_tok / f16_per_tok);
    doc["memory"][KvTypeName(t)] = {{"kv_resident", r.kv_resident}, {"tokens", N}, {"bytes_per_token", per_tok},
                                    {"formula_bytes_per_token", formula}};
    std::fprintf(stderr, "  %s: teacher-forcing %d positions\n", KvTypeName(t), P);
    MZ_RETURN_IF_ERROR(ctx.Decode(toks.data() + N, P, true));
    for (int i = 0; i < P; ++i) {
      if (t == KvType::kF16) {
        LogSoftmax(ctx.logits(i), nv, lp_f16.data() + size_t(i) * nv);
        top_f16[size_t(i)] = ArgMaxIndex(ctx.logits(i), nv);
      } else {
        LogSoftmax(ctx.logits(i), nv, lq.data());
        kl.push_back(KlFromLogProbs(lp_f16.data() + size_t(i) * nv, lq.data(), nv));
        agree += ArgMaxIndex(ctx.logits(i), nv) == top_f16[size_t(i)];
      }
    }
  }
  const KlSummary ks = SummarizeKl(kl);
  md += "\n## Accuracy\n\nEach context prefills the same " + std::to_string(N) + " real-text tokens with its own KV type, "
        "then " + std::to_string(P) + " further positions are teacher-forced; KL(p_f16 || p_q8_0) per position.\n\n"
        "| KL mean | KL p50 | KL p90 | KL p99 | KL max | top-1 agreement |\n|---|---|---|---|---|---|\n" +
        Sprintf("| %.3e | %.3e | %.3e | %.3e | %.3e | %d/%d (%.1f%%) |\n", ks.mean, ks.p50, ks.p90, ks.p99, ks.max, agree, P,
                100.0 * agree / P);
  doc["accuracy"] = {{"ctx", N},       {"positions", P},  {"kl_mean", ks.mean}, {"kl_p50", ks.p50},
                     {"kl_p90", ks.p90}, {"kl_p99", ks.p99}, {"kl_max", ks.max},   {"top1_agree", agree}};
  std::fprintf(stderr, "  KL mean %.3e max %.3e, top-1 %d/%d\n", ks.mean, ks.max, agree, P);

  // ---- TTFT after eviction ----
  if (!a.no_ttft) {
    const int T = a.ttft_ctx;
    std::vector<int32_t> t2;
    MZ_RETURN_IF_ERROR(RealTokens(path, T + a.query, &t2));
    const std::vector<int32_t> query(t2.begin() + T, t2.end());
    std::vector<std::unique_ptr<Context>> ctxs;
    for (KvType t : kTypes) {
      ctxs.push_back(std::make_unique<Context>(model.get(), Options(a, t, T + a.query + 64)));
      MZ_RETURN_IF_ERROR(ctxs.back()->Init());
      MZ_RETURN_IF_ERROR(Prefill(*ctxs.back(), t2, T, KvTypeName(t)));
    }
    std::map<int, std::vector<LevelRun>> runs[2];
    std::vector<double> mem[2];
    for (int rep = 0; rep < a.reps; ++rep)
      for (int k = 0; k < 2; ++k) {
        LevelRun r;
        MZ_RETURN_IF_ERROR(MeasureLevel(*ctxs[size_t(k)], 1.0, query, T, &r));
        mem[k].push_back(r.ttft);
        for (int lv : a.levels) {
          MZ_RETURN_IF_ERROR(MeasureLevel(*ctxs[size_t(k)], lv / 100.0, query, T, &r));
          runs[k][lv].push_back(r);
          std::fprintf(stderr, "  rep %d %-4s from %3d%%: TTFT %.3f s (remaining %.1f%%, %.1f MiB from storage)\n", rep + 1,
                       KvTypeName(kTypes[k]), lv, r.ttft, 100 * r.remaining, r.bytes_from_storage / 1048576.0);
        }
      }
    md += "\n## TTFT after eviction\n\n" + std::to_string(T) + "-token context, " + std::to_string(a.query) +
          "-token query; restore_generate after hybrid-swap eviction (KV codec " + a.codec +
          ") to the level of remaining memory; the types alternate within each of " + std::to_string(a.reps) +
          " repetitions; median (min-max) s.\n\n| KV | all in memory |";
    for (int lv : a.levels) md += Sprintf(" from %d%% | MiB from storage (%d%%) |", lv, lv);
    md += "\n|---|---|";
    for (size_t i = 0; i < a.levels.size(); ++i) md += "---|---|";
    md += "\n";
    for (int k = 0; k < 2; ++k) {
      const Stats sm = Summarize(mem[k]);
      md += Sprintf("| %s | %.3f (%.3f-%.3f) |", KvTypeName(kTypes[k]), sm.median, sm.min, sm.max);
      nlohmann::json& jt = doc["ttft"][KvTypeName(kTypes[k])];
      jt["all_in_memory"] = {{"median", sm.median}, {"min", sm.min}, {"max", sm.max}, {"runs", mem[k]}};
      for (int lv : a.levels) {
        std::vector<double> t;
        for (const LevelRun& r : runs[k][lv]) t.push_back(r.ttft);
        const Stats s = Summarize(t);
        const LevelRun& r0 = runs[k][lv].front();
        md += Sprintf(" %.3f (%.3f-%.3f) | %.1f |", s.median, s.min, s.max, r0.bytes_from_storage / 1048576.0);
        jt[std::to_string(lv)] = {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", t},
                                  {"remaining", r0.remaining}, {"bytes_from_storage", r0.bytes_from_storage}};
      }
      md += "\n";
    }
    doc["ttft_ctx"] = T;
  }
  WriteReport(a.out, "bench-kv-type", md, doc);
  std::fputs(md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/bench-kv-type.{md,json}\n", a.out.c_str());
  return Status::Ok();
}

}  // namespace

void AddKvTypeBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<KvTypeArgs>();
  auto* c = bench->add_subcommand("kv-type", "q8_0 KV vs f16 KV in one run: KV bytes per token, KL and top-1 over "
                                             "teacher-forced real text, TTFT after eviction");
  c->add_option("-m,--model", a->model, "model shape (make-model --list) or GGUF path");
  c->add_option("--type", a->type, "weight type for a synthesized shape");
  c->add_option("--ctx", a->ctx, "context tokens before the teacher-forced positions");
  c->add_option("--positions", a->positions, "teacher-forced positions compared");
  c->add_option("--ttft-ctx", a->ttft_ctx, "context tokens for the TTFT part");
  c->add_option("--levels", a->levels, "remaining-memory levels in percent for the TTFT part");
  c->add_option("-r,--reps", a->reps, "repetitions of the TTFT part");
  c->add_option("-q,--query", a->query, "query tokens of the TTFT part");
  c->add_option("-t,--threads", a->threads, "compute threads");
  c->add_option("--kv-codec", a->codec, "swap codec when evicting (q8: the q8_0 rows stored as they are)");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_option("--swap-dir", a->swap_dir, "folder for the swap files");
  c->add_flag("--no-ttft", a->no_ttft, "skip the TTFT part");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    if (a->positions < 1 || a->ctx < 1 || a->reps < 1 || a->query < 1) {
      std::fprintf(stderr, "error: --ctx, --positions, --reps, --query must be >= 1\n");
      return 2;
    }
    Status st = Run(*a);
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace mz::cli
