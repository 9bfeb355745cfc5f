// bench accuracy: the paper's Fig. 14 for our KV codecs (q8, q4, cachegen):
//   * space savings on real KV (the chunks of a context built by prefill of real text);
//   * accuracy against the uncompressed fp16 KV: the whole context's KV is evicted to the codec's
//     in-memory compressed state and restored, then >= 200 further real-text positions are
//     teacher-forced and each position's next-token distribution is compared with the never-evicted
//     context's: KL(p_f16 || p_codec) and top-1 agreement (mean, quantiles, max, histogram);
//   * idempotence: 10 evict/restore cycles with the same codec; KL after each cycle and whether the
//     restored KV is byte-identical to the first cycle's (it must be: the codecs are idempotent);
//   * TTFT of a short query from 50% and 0% remaining per codec (restore_generate, hybrid swap).
// A "none" codec control runs the same harness once: its KL must be exactly 0.
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "memory/unit_table.h"
#include "model/model.h"
#include "runtime/context.h"
#include "store/kv_codec.h"
#include "runtime/session_file.h"
#include "tools/bench/accuracy_metrics.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/peers_common.h"

namespace mz::cli {
namespace {

struct AccArgs {
  std::string model = "qwen3-0.6b";
  std::string type = "q8_0";
  int ctx = 2048;
  int positions = 256;
  int cycles = 10;
  std::vector<std::string> codecs{"q8", "q4", "cachegen"};
  int ttft_ctx = 8192;
  std::vector<int> levels{50, 0};
  int reps = 3;
  int query = 8;
  int threads = 2;
  std::string out = "results/bench-accuracy";
  std::string swap_dir = "/var/tmp";
  bool quick = false, no_ttft = false;
};

// xxh64 over the valid token rows of every KV chunk of the context (what a codec round trip touches).
uint64_t KvHash(Context& ctx) {
  const KvGeometry& g = ctx.kv().geometry();
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < ctx.kv().n_chunks_for(int(ctx.history().size())); ++c) {
      const ChunkShape s = ctx.units().shape(l, c);
      const uint16_t* p = ctx.kv().chunk(l, c);
      for (int blk = 0; blk < 2; ++blk)
        for (int hd = 0; hd < s.n_kv_head; ++hd)
          XXH64_update(h, p + s.block_elems() * size_t(blk) + size_t(hd) * s.chunk_tokens * s.head_dim,
                       size_t(s.n_tokens) * s.head_dim * 2);
    }
  const uint64_t v = XXH64_digest(h);
  XXH64_freeState(h);
  return v;
}

// Every KV chunk of the context, rear first, into the codec's in-memory compressed state.
Plan AllKvCompressed(Context& ctx) {
  Plan p;
  const int L = int(ctx.model()->hparams().n_layer), C = ctx.kv().n_chunks_for(int(ctx.history().size()));
  for (int l = L - 1; l >= 0; --l)
    for (int c = C - 1; c >= 0; --c) p.push_back({UnitRef::Kv(l, c), UnitState::kKvMemCompressed});
  return p;
}

struct Cycle {
  std::vector<double> kl;  // per position
  int agree = 0;
  int agree_decided = 0;  // agreement on positions whose reference top-1 is clearly ahead
  bool same_kv_as_first = true;
  double stack_ratio = 0;  // held by the in-memory stack / raw bytes represented
  double evict_s = 0, restore_s = 0;
};

// One bench accuracy run: the model, the real-text tokens, the never-evicted reference and what
// each part measured, and the report being built.
struct AccRun {
  explicit AccRun(AccArgs& args) : a(args) {}
  AccArgs& a;
  std::string path;
  std::unique_ptr<Model> model;
  int nv = 0, n = 0, P = 0;
  std::vector<int32_t> toks;   // the context's n tokens, then the P teacher-forced ones
  ContextOptions co;           // the reference's options (codec "none")
  std::string sess;            // the context's session file
  uint64_t ref_hash = 0;       // KvHash of the never-evicted context
  // Reference next-token distributions (never evicted, fp16 KV): log-probabilities [P][nv], top-1,
  // and which positions are decided (top-1 ahead of top-2 by >= kMargin probability).
  std::vector<float> ref_lp;
  std::vector<int> ref_top;
  std::vector<bool> decided;
  static constexpr double kMargin = 0.05;
  double ref_entropy = 0;
  int n_decided = 0;
  std::map<std::string, std::vector<Cycle>> cycles;  // codec -> evict/restore cycles
  std::vector<std::string> acc_codecs;               // a.codecs and the "none" control
  nlohmann::json doc;
  std::string md, sav_dat;
};

// Space savings on the context's own real KV (every codec asked for, and lz4/zstd); the report's
// header.
Status SpaceSavings(AccRun* R, Context& ref) {
  const AccArgs& a = R->a;
  const HParams& hp = R->model->hparams();
  nlohmann::json& doc = R->doc;
  doc["machine"] = MachineDescription();
  doc["model"] = R->path;
  doc["model_name"] = hp.name;
  doc["ctx"] = R->n;
  doc["positions"] = R->P;
  doc["n_cycles"] = a.cycles;
  R->md = "# bench accuracy\n\nmodel `" + R->path + "` (" + hp.name + "); machine: " + MachineDescription() +
          "; threads " + std::to_string(a.threads) + ".\n\n## Space savings on real KV\n\nAll " +
          std::to_string(hp.n_layer) + " layers' KV chunks of a " + std::to_string(R->n) +
          "-token context built by prefill of real text (" + std::to_string(ref.kv().geometry().chunk_tokens) +
          " tokens per chunk).\n\n| codec | encoded / raw | space saving |\n|---|---|---|\n";
  std::vector<std::string> all_codecs = a.codecs;
  for (const char* extra : {"lz4", "zstd"})
    if (std::find(all_codecs.begin(), all_codecs.end(), extra) == all_codecs.end()) all_codecs.push_back(extra);
  for (const std::string& cn : all_codecs) {
    std::unique_ptr<KvCodec> codec = MakeKvCodec(cn);
    if (!codec) return Status::InvalidArgument("unknown codec " + cn);
    uint64_t raw = 0, enc = 0;
    std::vector<uint8_t> buf;
    const int C = ref.kv().n_chunks_for(R->n);
    for (int l = 0; l < int(hp.n_layer); ++l)
      for (int c = 0; c < C; ++c) {
        const ChunkShape s = ref.units().shape(l, c);
        buf.resize(codec->MaxEncodedSize(s));
        size_t w = 0;
        MZ_RETURN_IF_ERROR(codec->Encode(s, ref.kv().chunk(l, c), buf.data(), buf.size(), &w));
        enc += w;
        raw += 2ull * s.n_kv_head * uint64_t(s.n_tokens) * s.head_dim * 2;
      }
    const double ratio = double(enc) / double(raw);
    R->md += Sprintf("| %s%s | %.3f | %.1f%% |\n", cn.c_str(), codec->lossless() ? " (lossless)" : "", ratio, 100 * (1 - ratio));
    doc["space"][cn] = {{"raw_bytes", raw}, {"encoded_bytes", enc}, {"ratio", ratio}, {"saving", 1 - ratio}};
    R->sav_dat += Sprintf("%s %.4f\n", cn.c_str(), 100 * (1 - ratio));
  }
  return Status::Ok();
}

// Reference next-token distributions: the P positions teacher-forced on the never-evicted context.
Status ReferenceDistributions(AccRun* R, Context& ref) {
  const int P = R->P, nv = R->nv;
  std::fprintf(stderr, "  reference: teacher-forcing %d positions on the never-evicted context\n", P);
  double t0 = NowSeconds();
  MZ_RETURN_IF_ERROR(ref.Decode(R->toks.data() + R->n, P, true));
  R->ref_lp.assign(size_t(P) * nv, 0.f);
  R->ref_top.assign(size_t(P), 0);
  R->decided.assign(size_t(P), false);
  for (int i = 0; i < P; ++i) {
    float* lp = R->ref_lp.data() + size_t(i) * nv;
    LogSoftmax(ref.logits(i), nv, lp);
    R->ref_top[size_t(i)] = ArgMaxIndex(ref.logits(i), nv);
    double p1 = 0, p2 = 0;
    for (int v = 0; v < nv; ++v) {
      const double pv = std::exp(double(lp[v]));
      R->ref_entropy -= pv > 0 ? pv * double(lp[v]) : 0;
      if (pv > p1) p2 = p1, p1 = pv;
      else if (pv > p2) p2 = pv;
    }
    R->decided[size_t(i)] = p1 - p2 >= AccRun::kMargin;
    R->n_decided += R->decided[size_t(i)];
  }
  R->ref_entropy /= P;
  R->doc["reference_mean_entropy"] = R->ref_entropy;
  R->doc["decided_positions"] = R->n_decided;
  R->doc["decided_margin"] = AccRun::kMargin;
  ref.Truncate(R->n);
  std::fprintf(stderr, "  reference done in %.1f s\n", NowSeconds() - t0);
  return Status::Ok();
}

// One evict/restore cycle of ctx with codec cn, then the P positions compared with the reference.
Status OneCycle(AccRun* R, Context& ctx, const std::string& cn, int cy, uint64_t* first_hash, Cycle* r) {
  const int P = R->P, nv = R->nv;
  double e0 = NowSeconds();
  MZ_RETURN_IF_ERROR(ctx.Evict(AllKvCompressed(ctx), 0, nullptr));
  const MemoryReport rep = ctx.Report();
  r->stack_ratio = rep.kv_mem_compressed_raw ? double(rep.kv_mem_compressed) / double(rep.kv_mem_compressed_raw) : 0;
  double e1 = NowSeconds();
  MZ_RETURN_IF_ERROR(ctx.Restore());
  double e2 = NowSeconds();
  r->evict_s = e1 - e0;
  r->restore_s = e2 - e1;
  const uint64_t h = KvHash(ctx);
  if (cy == 0) *first_hash = h;
  r->same_kv_as_first = h == *first_hash;
  MZ_RETURN_IF_ERROR(ctx.Decode(R->toks.data() + R->n, P, true));
  std::vector<float> lq(static_cast<size_t>(nv));
  for (int i = 0; i < P; ++i) {
    LogSoftmax(ctx.logits(i), nv, lq.data());
    r->kl.push_back(KlFromLogProbs(R->ref_lp.data() + size_t(i) * nv, lq.data(), nv));
    const bool same = ArgMaxIndex(ctx.logits(i), nv) == R->ref_top[size_t(i)];
    r->agree += same;
    r->agree_decided += same && R->decided[size_t(i)];
  }
  ctx.Truncate(R->n);
  const KlSummary s = SummarizeKl(r->kl);
  std::fprintf(stderr, "  %-8s cycle %2d: mean KL %.3e, max %.3e, top-1 %d/%d, KV %s cycle 1 (stack %.3f of raw)\n",
               cn.c_str(), cy + 1, s.mean, s.max, r->agree, P, r->same_kv_as_first ? "==" : "!=", r->stack_ratio);
  if (cn == "none") r->same_kv_as_first = h == R->ref_hash;  // lossless: identical to the never-evicted KV
  return Status::Ok();
}

// Every codec (and the "none" control, once): the context loaded from its session file, then
// a.cycles evict/restore cycles.
Status RunCycles(AccRun* R) {
  R->acc_codecs = R->a.codecs;
  R->acc_codecs.push_back("none");  // control
  for (const std::string& cn : R->acc_codecs) {
    const int n_cycles = cn == "none" ? 1 : R->a.cycles;
    ContextOptions cc = R->co;
    cc.kv_codec = cn;
    Context ctx(R->model.get(), cc);
    MZ_RETURN_IF_ERROR(ctx.Init());
    MZ_RETURN_IF_ERROR(LoadSession(ctx, R->sess));
    uint64_t first_hash = 0;
    for (int cy = 0; cy < n_cycles; ++cy) {
      Cycle r;
      MZ_RETURN_IF_ERROR(OneCycle(R, ctx, cn, cy, &first_hash, &r));
      R->cycles[cn].push_back(std::move(r));
    }
  }
  return Status::Ok();
}

// The accuracy table (first cycle of each codec), the control's line and the KL histogram.
void ReportAccuracy(AccRun* R) {
  const AccArgs& a = R->a;
  const int n = R->n, P = R->P;
  std::string& md = R->md;
  md += "\n## Accuracy against the fp16 KV\n\n" + std::to_string(n) + "-token real-text context; all its KV evicted "
        "to the codec's in-memory compressed state and restored; then the next " + std::to_string(P) +
        " real-text tokens teacher-forced (one batch) and each position's next-token distribution compared with the "
        "never-evicted context's. KL(p_f16 || p_codec) in nats. `none` is the harness control (lossless: must be "
        "0 and bit-identical). The model has synthesized random weights: its reference distributions are flat (mean "
        "entropy " + Sprintf("%.2f", R->ref_entropy) + " nats; top-1 ahead of top-2 by >= " + Sprintf("%.2f", AccRun::kMargin) +
        " probability at " + std::to_string(R->n_decided) + " of " + std::to_string(P) + " positions), so top-1 flips "
        "at near-ties; the last column counts agreement on those clearly decided positions only.\n\n"
        "| codec | positions | mean KL | median | p90 | p99 | max KL | top-1 agreement | top-1 agreement, decided positions |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  const double hlo = -8, hhi = 0;
  const int hbins = 16;
  std::string hist_dat = "# log10(KL) bin center";
  for (const std::string& cn : a.codecs) hist_dat += " " + cn;
  hist_dat += "\n";
  std::map<std::string, std::vector<int>> hists;
  for (const std::string& cn : R->acc_codecs) {
    const Cycle& c1 = R->cycles[cn].front();
    const KlSummary s = SummarizeKl(c1.kl);
    md += Sprintf("| %s | %d | %.3e | %.3e | %.3e | %.3e | %.3e | %d/%d (%.1f%%) | %d/%d |\n", cn.c_str(), s.n, s.mean,
                  s.p50, s.p90, s.p99, s.max, c1.agree, P, 100.0 * c1.agree / P, c1.agree_decided, R->n_decided);
    R->doc["accuracy"][cn] = {{"mean_kl", s.mean}, {"median_kl", s.p50}, {"p90_kl", s.p90}, {"p99_kl", s.p99},
                              {"max_kl", s.max}, {"top1_agree", c1.agree}, {"positions", P},
                              {"top1_agree_decided", c1.agree_decided}, {"decided_positions", R->n_decided},
                              {"kl_per_position", c1.kl}};
    if (cn != "none") hists[cn] = Log10Histogram(c1.kl, hlo, hhi, hbins);
  }
  const Cycle& ctl = R->cycles["none"].front();
  md += Sprintf("\nControl `none`: max KL %.3e, restored KV byte-identical to the never-evicted context: %s.\n",
                SummarizeKl(ctl.kl).max, ctl.same_kv_as_first ? "yes" : "NO");
  for (int b = 0; b < hbins; ++b) {
    hist_dat += Sprintf("%.3f", hlo + (b + 0.5) * (hhi - hlo) / hbins);
    for (const std::string& cn : a.codecs) hist_dat += Sprintf(" %d", hists[cn][size_t(b)]);
    hist_dat += "\n";
  }
  WriteFile(a.out, "accuracy-kl-hist.dat", hist_dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'accuracy-kl-hist.png'\nset title 'KL(p_{f16} || "
                   "p_{codec}) per position, " + std::to_string(P) + " positions after a " + std::to_string(n) +
                   "-token context'\nset xlabel 'log10 KL (nats); first bin includes smaller values'\nset ylabel "
                   "'positions'\nset style data histogram\nset style histogram clustered gap 1\nset style fill solid "
                   "0.8 border -1\nset xtics rotate by -45\nplot 'accuracy-kl-hist.dat'";
  for (size_t i = 0; i < a.codecs.size(); ++i)
    gp += Sprintf("%s u %zu%s t '%s'", i ? ", ''" : "", i + 2, i ? "" : ":xtic(sprintf('%.1f', $1))", a.codecs[i].c_str());
  const std::string png = PlotPng(a.out, "accuracy-kl-hist", gp + "\n");
  if (!png.empty()) md += "\n![KL histogram](" + png + ")\n";
}

// Idempotence: mean KL after each cycle and whether the restored KV matched the first cycle's.
void ReportIdempotence(AccRun* R) {
  const AccArgs& a = R->a;
  std::string& md = R->md;
  md += "\n## Idempotence: " + std::to_string(a.cycles) + " evict/restore cycles\n\nMean KL over the " +
        std::to_string(R->P) + " positions after each cycle (the same context, evicted to the codec and restored again "
        "each time). `restored KV identical` compares the restored context's KV bytes with the first cycle's.\n\n"
        "| codec |";
  for (int cy = 1; cy <= a.cycles; ++cy) md += Sprintf(" cycle %d |", cy);
  md += " max KL over cycles | restored KV identical in every cycle |\n|---|";
  for (int cy = 0; cy <= a.cycles + 1; ++cy) md += "---|";
  md += "\n";
  std::string cyc_dat = "# cycle";
  for (const std::string& cn : a.codecs) cyc_dat += " " + cn + "_mean " + cn + "_max";
  cyc_dat += "\n";
  for (int cy = 0; cy < a.cycles; ++cy) {
    cyc_dat += std::to_string(cy + 1);
    for (const std::string& cn : a.codecs) {
      const KlSummary s = SummarizeKl(R->cycles[cn][size_t(cy)].kl);
      cyc_dat += Sprintf(" %.6e %.6e", s.mean, s.max);
    }
    cyc_dat += "\n";
  }
  for (const std::string& cn : a.codecs) {
    md += "| " + cn + " |";
    double mx = 0;
    bool same = true;
    nlohmann::json jc = nlohmann::json::array();
    for (const Cycle& c : R->cycles[cn]) {
      const KlSummary s = SummarizeKl(c.kl);
      md += Sprintf(" %.3e |", s.mean);
      mx = std::max(mx, s.max);
      same = same && c.same_kv_as_first;
      jc.push_back({{"mean_kl", s.mean}, {"max_kl", s.max}, {"top1_agree", c.agree}, {"kv_identical_to_first", c.same_kv_as_first},
                    {"stack_ratio", c.stack_ratio}, {"evict_s", c.evict_s}, {"restore_s", c.restore_s}});
    }
    md += Sprintf(" %.3e | %s |\n", mx, same ? "yes" : "NO");
    R->doc["cycles"][cn] = jc;
  }
  WriteFile(a.out, "accuracy-cycles.dat", cyc_dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'accuracy-cycles.png'\nset title 'KL after each evict/restore "
                   "cycle (mean and max over " + std::to_string(R->P) + " positions)'\nset xlabel 'cycle'\nset ylabel 'KL (nats)'\n"
                   "set logscale y\nset xrange [0.5:" + std::to_string(a.cycles) + ".5]\nset key outside right\nplot ";
  for (size_t i = 0; i < a.codecs.size(); ++i)
    gp += Sprintf("%s'accuracy-cycles.dat' u 1:%zu w lp lc %zu pt 7 t '%s mean', '' u 1:%zu w lp lc %zu dt 2 pt 6 t '%s max'",
                  i ? ", " : "", 2 + 2 * i, i + 1, a.codecs[i].c_str(), 3 + 2 * i, i + 1, a.codecs[i].c_str());
  const std::string png = PlotPng(a.out, "accuracy-cycles", gp + "\n");
  if (!png.empty()) md += "\n![KL per cycle](" + png + ")\n";
}

void PlotSpaceSavings(AccRun* R) {
  WriteFile(R->a.out, "accuracy-space.dat", R->sav_dat);
  const std::string png = PlotPng(R->a.out, "accuracy-space",
                "set terminal pngcairo size 700,400\nset output 'accuracy-space.png'\nset title 'KV space savings on real "
                "KV'\nset ylabel 'space saving (%)'\nset yrange [0:100]\nset style data histogram\nset style fill solid "
                "0.8 border -1\nset boxwidth 0.7\nplot 'accuracy-space.dat' u 2:xtic(1) notitle\n");
  if (!png.empty()) R->md += "\n![space savings](" + png + ")\n";
}

// TTFT per codec: runs[codec][level], and the all-in-memory TTFTs (*all_mem).
Status MeasureCodecTtft(AccRun* R, const std::vector<int32_t>& t2, std::map<std::string, std::map<int, std::vector<LevelRun>>>* runs,
                        std::vector<double>* all_mem) {
  const AccArgs& a = R->a;
  const int N = a.ttft_ctx;
  const std::vector<int32_t> query(t2.begin() + N, t2.end());
  for (int rep = 0; rep < a.reps; ++rep) {
    for (size_t k = 0; k < a.codecs.size(); ++k) {
      const std::string& cn = a.codecs[(k + size_t(rep)) % a.codecs.size()];  // rotate the order every rep
      ContextOptions cc;
      cc.n_ctx = N + a.query + 64;
      cc.n_threads = a.threads;
      cc.kv_codec = cn;
      cc.swap_path = R->co.swap_path;
      Context ctx(R->model.get(), cc);
      MZ_RETURN_IF_ERROR(ctx.Init());
      std::string s2;
      MZ_RETURN_IF_ERROR(EnsureSessionContext(ctx, R->path, t2, N, &s2));
      if (k == 0) {
        LevelRun r;
        MZ_RETURN_IF_ERROR(MeasureLevel(ctx, 1.0, query, N, &r));
        all_mem->push_back(r.ttft);
      }
      for (int lv : a.levels) {
        LevelRun r;
        MZ_RETURN_IF_ERROR(MeasureLevel(ctx, lv / 100.0, query, N, &r));
        (*runs)[cn][lv].push_back(r);
        std::fprintf(stderr, "  rep %d %-8s from %3d%%: TTFT %.3f s (remaining %.1f%%, %.0f MiB from storage, %.0f MiB decoded)\n",
                     rep + 1, cn.c_str(), lv, r.ttft, 100 * r.remaining, r.bytes_from_storage / 1048576.0,
                     r.bytes_decoded / 1048576.0);
      }
    }
  }
  return Status::Ok();
}

// The TTFT-per-codec section: table, JSON and plot.
void ReportCodecTtft(AccRun* R, std::map<std::string, std::map<int, std::vector<LevelRun>>>& runs,
                     const std::vector<double>& all_mem) {
  const AccArgs& a = R->a;
  const int N = a.ttft_ctx;
  std::string& md = R->md;
  const Stats mem = Summarize(all_mem);
  md += "\n## TTFT per codec\n\n" + std::to_string(N) + "-token context, " + std::to_string(a.query) +
        "-token query, restore_generate after hybrid-swap eviction to the level; medians of " +
        std::to_string(a.reps) + " runs (min-max), codec order rotated every rep. All in memory: " +
        Sprintf("%.3f s.", mem.median) + "\n\n| codec |";
  for (int lv : a.levels) md += Sprintf(" TTFT from %d%% s | from storage / decoded MiB (%d%%) |", lv, lv);
  md += "\n|---|";
  for (size_t i = 0; i < a.levels.size(); ++i) md += "---|---|";
  md += "\n";
  std::string tt_dat = "# codec";
  for (int lv : a.levels) tt_dat += Sprintf(" ttft%d", lv);
  tt_dat += "\n";
  for (const std::string& cn : a.codecs) {
    md += "| " + cn + " |";
    tt_dat += cn;
    for (int lv : a.levels) {
      std::vector<double> t;
      for (auto& r : runs[cn][lv]) t.push_back(r.ttft);
      const Stats s = Summarize(t);
      const LevelRun& r0 = runs[cn][lv].front();
      md += (t.size() > 1 ? Sprintf(" %.3f (%.3f-%.3f) |", s.median, s.min, s.max) : Sprintf(" %.3f |", s.median)) +
            Sprintf(" %.0f / %.0f |", r0.bytes_from_storage / 1048576.0, r0.bytes_decoded / 1048576.0);
      tt_dat += Sprintf(" %.4f", s.median);
      R->doc["ttft"][cn][std::to_string(lv)] = {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", t},
                                                {"remaining", r0.remaining}, {"bytes_from_storage", r0.bytes_from_storage},
                                                {"bytes_decoded", r0.bytes_decoded}};
    }
    md += "\n";
    tt_dat += "\n";
  }
  R->doc["ttft_ctx"] = N;
  R->doc["ttft_all_in_memory"] = {{"median", mem.median}, {"min", mem.min}, {"max", mem.max}};
  WriteFile(a.out, "accuracy-ttft.dat", tt_dat);
  std::string gp = "set terminal pngcairo size 700,450\nset output 'accuracy-ttft.png'\nset title 'TTFT per codec, " +
                   std::to_string(N) + "-token context'\nset ylabel 'TTFT (s)'\nset yrange [0:*]\nset style data histogram\n"
                   "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\nset key top left\nplot ";
  for (size_t i = 0; i < a.levels.size(); ++i)
    gp += Sprintf("%s u %zu%s t 'from %d%% remaining'", i ? ", ''" : "'accuracy-ttft.dat'", i + 2,
                  i ? "" : ":xtic(1)", a.levels[i]);
  const std::string png = PlotPng(a.out, "accuracy-ttft", gp + Sprintf(", %.4f w l dt 2 t 'all in memory'\n", mem.median));
  if (!png.empty()) md += "\n![TTFT per codec](" + png + ")\n";
}

Status CodecTtft(AccRun* R) {
  const int N = R->a.ttft_ctx;
  std::fprintf(stderr, "== TTFT per codec: %d-token context, %d-token query ==\n", N, R->a.query);
  std::vector<int32_t> t2;
  MZ_RETURN_IF_ERROR(RealTokens(R->path, N + R->a.query, &t2));
  std::map<std::string, std::map<int, std::vector<LevelRun>>> runs;
  std::vector<double> all_mem;
  MZ_RETURN_IF_ERROR(MeasureCodecTtft(R, t2, &runs, &all_mem));
  ReportCodecTtft(R, runs, all_mem);
  return Status::Ok();
}

// bench accuracy: the reference context, space savings, accuracy and idempotence per codec, TTFT
// per codec, then the report.
Status RunAccuracy(AccArgs& a) {
  AccRun R(a);
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &R.path, &R.model));
  R.nv = int(R.model->hparams().n_vocab), R.n = a.ctx, R.P = a.positions;
  std::fprintf(stderr, "== %s: accuracy over %d teacher-forced positions after a %d-token context ==\n",
               ModelStem(R.path).c_str(), R.P, R.n);
  MZ_RETURN_IF_ERROR(RealTokens(R.path, R.n + R.P, &R.toks));
  R.co.n_ctx = R.n + R.P + 64;
  R.co.n_threads = a.threads;
  R.co.swap_path = a.swap_dir + "/mzcache-accuracy-" + std::to_string(getpid()) + ".swap";
  R.co.kv_codec = "none";
  Context ref(R.model.get(), R.co);
  MZ_RETURN_IF_ERROR(ref.Init());
  MZ_RETURN_IF_ERROR(EnsureSessionContext(ref, R.path, R.toks, R.n, &R.sess));
  R.ref_hash = KvHash(ref);
  MZ_RETURN_IF_ERROR(SpaceSavings(&R, ref));
  MZ_RETURN_IF_ERROR(ReferenceDistributions(&R, ref));
  MZ_RETURN_IF_ERROR(RunCycles(&R));
  ReportAccuracy(&R);
  ReportIdempotence(&R);
  PlotSpaceSavings(&R);
  if (!a.no_ttft) MZ_RETURN_IF_ERROR(CodecTtft(&R));
  WriteReport(a.out, "bench-accuracy", R.md, R.doc);
  std::fputs(R.md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/bench-accuracy.{md,json} and plots\n", a.out.c_str());
  return Status::Ok();
}

}  // namespace

void AddAccuracyBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<AccArgs>();
  auto* c = bench->add_subcommand("accuracy", "Fig. 14: KV codecs' space savings on real KV, KL and top-1 agreement vs "
                                              "fp16 over teacher-forced real text, idempotence over evict/restore "
                                              "cycles, TTFT from 50%/0% remaining per codec");
  c->add_option("-m,--model", a->model, "model shape (make-model --list) or GGUF path");
  c->add_option("--type", a->type, "weight type for a synthesized shape");
  c->add_option("--ctx", a->ctx, "context tokens before the teacher-forced positions (default 2048; --quick: 1024)");
  c->add_option("--positions", a->positions, "teacher-forced positions compared (>= 200 recommended)");
  c->add_option("--cycles", a->cycles, "evict/restore cycles for the idempotence check");
  c->add_option("--codecs", a->codecs, "lossy codecs to compare");
  c->add_option("--ttft-ctx", a->ttft_ctx, "context tokens for the TTFT part (default 8192; --quick: 2048)");
  c->add_option("--levels", a->levels, "remaining-memory levels in percent for the TTFT part");
  c->add_option("-r,--reps", a->reps, "repetitions of the TTFT part (default 3; --quick: 1)");
  c->add_option("-q,--query", a->query, "query tokens of the TTFT part");
  c->add_option("-t,--threads", a->threads, "compute threads");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_option("--swap-dir", a->swap_dir, "folder for the swap file (storage under test)");
  c->add_flag("--quick", a->quick, "1024-token context, 200 positions, TTFT at 2048 tokens with 1 rep (unless given)");
  c->add_flag("--no-ttft", a->no_ttft, "skip the TTFT part");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    if (a->quick) {
      if (c->count("--ctx") == 0) a->ctx = 1024;
      if (c->count("--positions") == 0) a->positions = 200;
      if (c->count("--ttft-ctx") == 0) a->ttft_ctx = 2048;
      if (c->count("--reps") == 0) a->reps = 1;
    }
    if (a->positions < 1 || a->ctx < 1 || a->cycles < 1 || a->codecs.empty()) {
      std::fprintf(stderr, "error: --ctx, --positions, --cycles must be >= 1 and --codecs not empty\n");
      return 2;
    }
    Status st = RunAccuracy(*a);
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace mz::cli
