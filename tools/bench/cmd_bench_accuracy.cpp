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
//
// --kv-types f16,q8_0 (issue 24 §1, live q8 KV): the never-evicted f16 context stays the reference.
// A q8_0 context builds the same context by its own prefill (its KV written live as q8 rows; kept
// as <stem>-<n>-q8_0.sess), and adds: resident KV bytes per token of each type; a row for the
// never-evicted q8_0 context against the f16 reference (what live q8 KV costs); every codec's
// rows (and the control) measured again on the q8_0 context, against the f16 reference and against
// the never-evicted q8_0 context (what evicting + restoring costs on top of live q8 KV); the
// idempotence cycles and the TTFT per codec for each type. (On q8_0 KV a lossy codec's restore is
// re-encoded as q8 rows, so q4 / cachegen cycles need not give the same bytes again: the q8 rounding
// moves the values the codec sees in the next cycle. q8 is the identity there, none is lossless.)
// `bench kv-type` is this command with --kv-types f16,q8_0 --codecs q8 --cycles 1 (and its own
// defaults and report name).
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "memory/unit_table.h"
#include "model/model.h"
#include "runtime/context.h"
#include "store/kv_codec.h"
#include "store/q8_kv.h"
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
  std::string kv_types = "f16";
  int ttft_ctx = 8192;
  std::vector<int> levels{50, 0};
  int reps = 3;
  int query = 8;
  int threads = 2;
  std::string out = "results/bench-accuracy";
  std::string swap_dir = "/var/tmp";
  bool quick = false, no_ttft = false;
  std::string report = "bench-accuracy";  // report files' stem
  std::string title = "bench accuracy";   // report heading
};

// xxh64 over the valid token rows of every KV chunk of the context (what a codec round trip touches),
// as fp16 (a q8_0 chunk is hashed through its q8 decode).
uint64_t KvHash(Context& ctx) {
  const KvGeometry& g = ctx.kv().geometry();
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  std::vector<uint16_t> f16;
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < ctx.kv().n_chunks_for(int(ctx.history().size())); ++c) {
      const ChunkShape s = ctx.units().shape(l, c);
      const uint16_t* p = ctx.kv().chunk(l, c);
      if (g.q8()) {
        f16.resize(s.raw_bytes() / 2);
        Q8KvToF16(s, reinterpret_cast<const uint8_t*>(p), f16.data());
        p = f16.data();
      }
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
  NextTokenComparison vs_f16;  // against the never-evicted f16 context (the reference)
  NextTokenComparison vs_own;  // against the never-evicted context of the same KV type (not f16: that is vs_f16)
  bool same_kv_as_first = true;
  double stack_ratio = 0;  // held by the in-memory stack / raw bytes represented
  double evict_s = 0, restore_s = 0;
};

// One KV type's part of a run: its never-evicted context and what was measured on contexts of it.
struct KvRun {
  KvType type = KvType::kF16;
  const char* name() const { return KvTypeName(type); }
  std::string sess;          // its context's session file (built by its own prefill)
  uint64_t ref_hash = 0;     // KvHash of the never-evicted context
  uint64_t kv_resident = 0;  // resident KV bytes holding the n-token context
  NextTokenReference own;    // the never-evicted context's next-token distributions
  NextTokenComparison live;  // those against the f16 reference (not f16)
  std::map<std::string, std::vector<Cycle>> cycles;  // codec -> evict/restore cycles
  std::map<std::string, std::map<int, std::vector<LevelRun>>> ttft;  // codec -> level -> runs
  std::vector<double> ttft_all_mem;
  // This type's results in the JSON: the document itself for f16 (the layout without --kv-types),
  // doc["by_kv_type"][name] otherwise.
  nlohmann::json& Doc(nlohmann::json& doc) const { return type == KvType::kF16 ? doc : doc["by_kv_type"][name()]; }
  // The comparison of a cycle against this type's never-evicted context.
  const NextTokenComparison& Own(const Cycle& c) const { return type == KvType::kF16 ? c.vs_f16 : c.vs_own; }
};

// One bench accuracy run: the model, the real-text tokens, the never-evicted contexts (one per KV
// type, f16 first: its distributions are the reference) and what each part measured, and the
// report being built.
struct AccRun {
  explicit AccRun(AccArgs& args) : a(args) {}
  AccArgs& a;
  std::string path;
  std::unique_ptr<Model> model;
  int nv = 0, n = 0, P = 0;
  int chunk_tokens = 0;        // the contexts' KV chunk (KvGeometry::chunk_tokens), read by SpaceSavings
  std::vector<int32_t> toks;   // the context's n tokens, then the P teacher-forced ones
  ContextOptions co;           // the reference's options (codec "none", f16 KV)
  std::vector<KvRun> kv;       // f16 first
  std::vector<std::string> acc_codecs;  // a.codecs and the "none" control
  nlohmann::json doc;
  std::string md, sav_dat;
  const NextTokenReference& ref() const { return kv.front().own; }
  bool multi() const { return kv.size() > 1; }
  // A codec's row in plots and data files: "q4", or "q8_0/q4" with more than one KV type.
  std::string Label(const KvRun& K, const std::string& cn) const { return multi() ? std::string(K.name()) + "/" + cn : cn; }
};

// Space savings on the context's own real KV (every codec asked for, and lz4/zstd); the report's
// header.
Status SpaceSavings(AccRun* R, Context& ref) {
  const AccArgs& a = R->a;
  const HParams& hp = R->model->hparams();
  nlohmann::json& doc = R->doc;
  R->chunk_tokens = ref.kv().geometry().chunk_tokens;
  doc["machine"] = MachineDescription();
  doc["model"] = R->path;
  doc["model_name"] = hp.name;
  doc["ctx"] = R->n;
  doc["positions"] = R->P;
  doc["n_cycles"] = a.cycles;
  R->md = "# " + a.title + "\n\nmodel `" + R->path + "` (" + hp.name + "); machine: " + MachineDescription() +
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

// The never-evicted context of K's type (holding the n tokens): its resident KV, its KV hash, and
// the next-token distributions of the P teacher-forced positions (for f16: the reference; for
// another type also compared with the reference: the live row).
Status NeverEvicted(AccRun* R, Context& ctx, KvRun* K) {
  const int P = R->P, nv = R->nv;
  K->kv_resident = ctx.Report().kv_resident;
  K->ref_hash = KvHash(ctx);
  std::fprintf(stderr, "  %s KV: teacher-forcing %d positions on the never-evicted context\n", K->name(), P);
  const double t0 = NowSeconds();
  MZ_RETURN_IF_ERROR(ctx.Decode(R->toks.data() + R->n, P, true));
  const bool is_ref = K == &R->kv.front();
  for (int i = 0; i < P; ++i) {
    K->own.Add(ctx.logits(i), nv);
    if (!is_ref) K->live.Add(R->ref(), i, ctx.logits(i));
  }
  ctx.Truncate(R->n);
  if (is_ref) {
    R->doc["reference_mean_entropy"] = K->own.mean_entropy();
    R->doc["decided_positions"] = K->own.n_decided;
    R->doc["decided_margin"] = K->own.margin;
  } else {
    const KlSummary s = SummarizeKl(K->live.kl);
    std::fprintf(stderr, "  %s KV vs f16 KV: mean KL %.3e, max %.3e, top-1 %d/%d\n", K->name(), s.mean, s.max,
                 K->live.agree, P);
  }
  std::fprintf(stderr, "  %s KV done in %.1f s\n", K->name(), NowSeconds() - t0);
  return Status::Ok();
}

// One evict/restore cycle of ctx (KV type K) with codec cn, then the P positions compared with the
// reference (and with K's never-evicted context).
Status OneCycle(AccRun* R, const KvRun& K, Context& ctx, const std::string& cn, int cy, uint64_t* first_hash, Cycle* r) {
  const int P = R->P;
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
  for (int i = 0; i < P; ++i) {
    r->vs_f16.Add(R->ref(), i, ctx.logits(i));
    if (K.type != KvType::kF16) r->vs_own.Add(K.own, i, ctx.logits(i));
  }
  ctx.Truncate(R->n);
  const KlSummary s = SummarizeKl(r->vs_f16.kl);
  std::fprintf(stderr, "  %-4s %-8s cycle %2d: mean KL %.3e, max %.3e, top-1 %d/%d, KV %s cycle 1 (stack %.3f of raw)\n",
               K.name(), cn.c_str(), cy + 1, s.mean, s.max, r->vs_f16.agree, P, r->same_kv_as_first ? "==" : "!=",
               r->stack_ratio);
  if (cn == "none") r->same_kv_as_first = h == K.ref_hash;  // lossless: identical to the never-evicted KV
  return Status::Ok();
}

// Every KV type, every codec (and the "none" control, once): the context loaded from its type's
// session file, then a.cycles evict/restore cycles.
Status RunCycles(AccRun* R) {
  R->acc_codecs = R->a.codecs;
  R->acc_codecs.push_back("none");  // control
  for (KvRun& K : R->kv)
    for (const std::string& cn : R->acc_codecs) {
      const int n_cycles = cn == "none" ? 1 : R->a.cycles;
      ContextOptions cc = R->co;
      cc.kv_codec = cn;
      cc.kv_type = K.type;
      Context ctx(R->model.get(), cc);
      MZ_RETURN_IF_ERROR(ctx.Init());
      MZ_RETURN_IF_ERROR(LoadSession(ctx, K.sess));
      uint64_t first_hash = 0;
      for (int cy = 0; cy < n_cycles; ++cy) {
        Cycle r;
        MZ_RETURN_IF_ERROR(OneCycle(R, K, ctx, cn, cy, &first_hash, &r));
        K.cycles[cn].push_back(std::move(r));
      }
    }
  return Status::Ok();
}

// Resident KV bytes per token of each type, measured and by formula.
void ReportMemory(AccRun* R) {
  const HParams& hp = R->model->hparams();
  const int chunk = R->chunk_tokens;
  R->md += "\n## Resident KV per token\n\nResident KV bytes holding the " + std::to_string(R->n) + "-token context (" +
           std::to_string(hp.n_layer) + " layers, " + std::to_string(hp.n_head_kv) + " kv heads, head_dim " +
           std::to_string(hp.head_dim) + ", " + std::to_string(chunk) + "-token chunks; `MemoryReport::kv_resident` / "
           "tokens) and the formula: per token and layer 2 * n_kv_head * head_dim * 2 bytes for f16, 2 * n_kv_head * "
           "(head_dim + 2) for q8_0 (a context that is not a whole number of chunks measures more).\n\n"
           "| KV | resident KV bytes | bytes per token | formula per token | vs f16 |\n|---|---|---|---|---|\n";
  const double f16_per_tok = double(R->kv.front().kv_resident) / R->n;
  for (const KvRun& K : R->kv) {
    const double per_tok = double(K.kv_resident) / R->n;
    const uint64_t formula = uint64_t(hp.n_layer) * KvChunkBytes(K.type, int(hp.n_head_kv), chunk, int(hp.head_dim)) / chunk;
    R->md += Sprintf("| %s | %llu | %.0f | %llu | %.3f |\n", K.name(), (unsigned long long)K.kv_resident, per_tok,
                     (unsigned long long)formula, per_tok / f16_per_tok);
    R->doc["memory"][K.name()] = {{"kv_resident", K.kv_resident}, {"tokens", R->n}, {"bytes_per_token", per_tok},
                                  {"formula_bytes_per_token", formula}, {"vs_f16", per_tok / f16_per_tok}};
  }
}

// One row of the accuracy table and its JSON: c against the f16 reference; own (if any) against the
// never-evicted context of the row's KV type.
void AccuracyRow(AccRun* R, const KvRun& K, const std::string& what, const NextTokenComparison& c,
                 const NextTokenComparison* own, nlohmann::json* j) {
  const int P = R->P, nd = R->ref().n_decided;
  const KlSummary s = SummarizeKl(c.kl);
  R->md += Sprintf("| %s | %s | %d | %.3e | %.3e | %.3e | %.3e | %.3e | %d/%d (%.1f%%) | %d/%d |", K.name(), what.c_str(),
                   s.n, s.mean, s.p50, s.p90, s.p99, s.max, c.agree, P, 100.0 * c.agree / P, c.agree_decided, nd);
  *j = {{"mean_kl", s.mean}, {"median_kl", s.p50}, {"p90_kl", s.p90}, {"p99_kl", s.p99}, {"max_kl", s.max},
        {"top1_agree", c.agree}, {"positions", P}, {"top1_agree_decided", c.agree_decided}, {"decided_positions", nd},
        {"kl_per_position", c.kl}};
  if (R->multi()) {
    if (own) {
      const KlSummary o = SummarizeKl(own->kl);
      R->md += Sprintf(" %.3e | %.3e | %d/%d |", o.mean, o.max, own->agree, P);
      (*j)["vs_same_kv"] = {{"mean_kl", o.mean}, {"max_kl", o.max}, {"top1_agree", own->agree}};
    } else {
      R->md += " - | - | - |";
    }
  }
  R->md += "\n";
}

// The accuracy table (first cycle of each codec; with several KV types, the live rows too), the
// controls' lines and the KL histogram.
void ReportAccuracy(AccRun* R) {
  const AccArgs& a = R->a;
  const int n = R->n, P = R->P;
  std::string& md = R->md;
  md += "\n## Accuracy against the fp16 KV\n\n" + std::to_string(n) + "-token real-text context; all its KV evicted "
        "to the codec's in-memory compressed state and restored; then the next " + std::to_string(P) +
        " real-text tokens teacher-forced (one batch) and each position's next-token distribution compared with the "
        "never-evicted f16 KV context's. KL(p_f16 || p_codec) in nats. `none` is the harness control (lossless: must be "
        "0 and bit-identical). The model has synthesized random weights: its reference distributions are flat (mean "
        "entropy " + Sprintf("%.2f", R->ref().mean_entropy()) + " nats; top-1 ahead of top-2 by >= " +
        Sprintf("%.2f", R->ref().margin) + " probability at " + std::to_string(R->ref().n_decided) + " of " +
        std::to_string(P) + " positions), so top-1 flips at near-ties; the decided-positions column counts agreement on "
        "those clearly decided positions only.\n";
  if (R->multi())
    md += "\nKV types: every context of a row holds its KV in the row's type. A non-f16 type's context is built by its own "
          "prefill of the same text (its KV written live in that type, then saved and reloaded bit for bit). `never "
          "evicted (live)`: that context as built, against the f16 reference: the cost of the KV type itself. The codec "
          "rows on it: evicted and restored through the codec, against the f16 reference (total) and, in the last three "
          "columns, against the never-evicted context of the same KV type (what evicting + restoring adds on top of the "
          "KV type; for f16 rows the reference is that context, so the columns repeat).\n";
  md += "\n| KV | codec | positions | mean KL | median | p90 | p99 | max KL | top-1 agreement | top-1 agreement, decided "
        "positions |";
  md += R->multi() ? " mean KL vs same KV never evicted | max KL vs same KV never evicted | top-1 vs same KV never evicted "
                     "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
                   : "\n|---|---|---|---|---|---|---|---|---|---|\n";
  const double hlo = -8, hhi = 0;
  const int hbins = 16;
  std::vector<std::pair<std::string, std::vector<int>>> hists;  // (label, counts)
  for (const KvRun& K : R->kv) {
    nlohmann::json& jk = K.Doc(R->doc)["accuracy"];
    if (&K != &R->kv.front()) {
      AccuracyRow(R, K, "never evicted (live)", K.live, nullptr, &jk["live"]);
      hists.push_back({std::string(K.name()) + "/live", Log10Histogram(K.live.kl, hlo, hhi, hbins)});
    }
    for (const std::string& cn : R->acc_codecs) {
      const Cycle& c1 = K.cycles.at(cn).front();
      AccuracyRow(R, K, cn, c1.vs_f16, &K.Own(c1), &jk[cn]);
      if (cn != "none") hists.push_back({R->Label(K, cn), Log10Histogram(c1.vs_f16.kl, hlo, hhi, hbins)});
    }
  }
  md += "\n";
  for (const KvRun& K : R->kv) {
    const Cycle& ctl = K.cycles.at("none").front();
    md += Sprintf("Control `none` on %s KV: max KL against the never-evicted %s KV context %.3e; restored KV "
                  "byte-identical to it: %s.\n", K.name(), K.name(), SummarizeKl(K.Own(ctl).kl).max,
                  ctl.same_kv_as_first ? "yes" : "NO");
  }
  std::string hist_dat = "# log10(KL) bin center";
  for (const auto& h : hists) hist_dat += " " + h.first;
  hist_dat += "\n";
  for (int b = 0; b < hbins; ++b) {
    hist_dat += Sprintf("%.3f", hlo + (b + 0.5) * (hhi - hlo) / hbins);
    for (const auto& h : hists) hist_dat += Sprintf(" %d", h.second[size_t(b)]);
    hist_dat += "\n";
  }
  WriteFile(a.out, "accuracy-kl-hist.dat", hist_dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'accuracy-kl-hist.png'\nset title 'KL(p_{f16} || "
                   "p_{codec}) per position, " + std::to_string(P) + " positions after a " + std::to_string(n) +
                   "-token context'\nset xlabel 'log10 KL (nats); first bin includes smaller values'\nset ylabel "
                   "'positions'\nset style data histogram\nset style histogram clustered gap 1\nset style fill solid "
                   "0.8 border -1\nset xtics rotate by -45\nplot 'accuracy-kl-hist.dat'";
  for (size_t i = 0; i < hists.size(); ++i)
    gp += Sprintf("%s u %zu%s t '%s' noenhanced", i ? ", ''" : "", i + 2, i ? "" : ":xtic(sprintf('%.1f', $1))",
                  hists[i].first.c_str());
  const std::string png = PlotPng(a.out, "accuracy-kl-hist", gp + "\n");
  if (!png.empty()) md += "\n![KL histogram](" + png + ")\n";
}

// Idempotence: mean KL after each cycle and whether the restored KV matched the first cycle's.
void ReportIdempotence(AccRun* R) {
  const AccArgs& a = R->a;
  std::string& md = R->md;
  md += "\n## Idempotence: " + std::to_string(a.cycles) + " evict/restore cycles\n\nMean KL against the f16 reference over "
        "the " + std::to_string(R->P) + " positions after each cycle (the same context, evicted to the codec and restored "
        "again each time). `restored KV identical` compares the restored context's KV bytes with the first cycle's.\n";
  if (R->multi())
    md += "\nOn q8_0 KV a lossy codec's restore is re-encoded as q8 rows: the q8 rounding moves the values the codec "
          "sees in the next cycle, so q4 and cachegen need not restore the same bytes again (q8 is the identity there).\n";
  md += "\n| KV | codec |";
  for (int cy = 1; cy <= a.cycles; ++cy) md += Sprintf(" cycle %d |", cy);
  md += " max KL over cycles | restored KV identical in every cycle |\n|---|---|";
  for (int cy = 0; cy <= a.cycles + 1; ++cy) md += "---|";
  md += "\n";
  std::vector<std::pair<const KvRun*, std::string>> series;
  std::string cyc_dat = "# cycle";
  for (const KvRun& K : R->kv)
    for (const std::string& cn : a.codecs) {
      series.push_back({&K, cn});
      cyc_dat += " " + R->Label(K, cn) + "_mean " + R->Label(K, cn) + "_max";
    }
  cyc_dat += "\n";
  for (int cy = 0; cy < a.cycles; ++cy) {
    cyc_dat += std::to_string(cy + 1);
    for (const auto& [K, cn] : series) {
      const KlSummary s = SummarizeKl(K->cycles.at(cn)[size_t(cy)].vs_f16.kl);
      cyc_dat += Sprintf(" %.6e %.6e", s.mean, s.max);
    }
    cyc_dat += "\n";
  }
  for (const auto& [K, cn] : series) {
    md += std::string("| ") + K->name() + " | " + cn + " |";
    double mx = 0;
    bool same = true;
    nlohmann::json jc = nlohmann::json::array();
    for (const Cycle& c : K->cycles.at(cn)) {
      const KlSummary s = SummarizeKl(c.vs_f16.kl);
      md += Sprintf(" %.3e |", s.mean);
      mx = std::max(mx, s.max);
      same = same && c.same_kv_as_first;
      jc.push_back({{"mean_kl", s.mean}, {"max_kl", s.max}, {"top1_agree", c.vs_f16.agree}, {"kv_identical_to_first", c.same_kv_as_first},
                    {"stack_ratio", c.stack_ratio}, {"evict_s", c.evict_s}, {"restore_s", c.restore_s}});
    }
    md += Sprintf(" %.3e | %s |\n", mx, same ? "yes" : "NO");
    K->Doc(R->doc)["cycles"][cn] = jc;
  }
  WriteFile(a.out, "accuracy-cycles.dat", cyc_dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'accuracy-cycles.png'\nset title 'KL after each evict/restore "
                   "cycle (mean and max over " + std::to_string(R->P) + " positions)'\nset xlabel 'cycle'\nset ylabel 'KL (nats)'\n"
                   "set logscale y\nset xrange [0.5:" + std::to_string(a.cycles) + ".5]\nset key outside right\nplot ";
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string l = R->Label(*series[i].first, series[i].second);
    gp += Sprintf("%s'accuracy-cycles.dat' u 1:%zu w lp lc %zu pt 7 t '%s mean' noenhanced, '' u 1:%zu w lp lc %zu dt 2 pt 6 "
                  "t '%s max' noenhanced", i ? ", " : "", 2 + 2 * i, i + 1, l.c_str(), 3 + 2 * i, i + 1, l.c_str());
  }
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

// TTFT per KV type and codec into each KvRun's ttft and ttft_all_mem: every repetition runs the KV
// types in turn, each with its codecs (order rotated every rep), each on a fresh context loaded
// from the type's session of the ttft_ctx-token context (built by its own prefill on first use).
Status MeasureCodecTtft(AccRun* R, const std::vector<int32_t>& t2) {
  const AccArgs& a = R->a;
  const int N = a.ttft_ctx;
  const std::vector<int32_t> query(t2.begin() + N, t2.end());
  for (int rep = 0; rep < a.reps; ++rep) {
    for (KvRun& K : R->kv) {
      for (size_t k = 0; k < a.codecs.size(); ++k) {
        const std::string& cn = a.codecs[(k + size_t(rep)) % a.codecs.size()];  // rotate the order every rep
        ContextOptions cc;
        cc.n_ctx = N + a.query + 64;
        cc.n_threads = a.threads;
        cc.kv_codec = cn;
        cc.kv_type = K.type;
        cc.swap_path = R->co.swap_path;
        Context ctx(R->model.get(), cc);
        MZ_RETURN_IF_ERROR(ctx.Init());
        std::string s2;
        MZ_RETURN_IF_ERROR(EnsureSessionContext(ctx, R->path, t2, N, &s2));
        if (k == 0) {
          LevelRun r;
          MZ_RETURN_IF_ERROR(MeasureLevel(ctx, 1.0, query, N, &r));
          K.ttft_all_mem.push_back(r.ttft);
        }
        for (int lv : a.levels) {
          LevelRun r;
          MZ_RETURN_IF_ERROR(MeasureLevel(ctx, lv / 100.0, query, N, &r));
          K.ttft[cn][lv].push_back(r);
          std::fprintf(stderr, "  rep %d %-4s %-8s from %3d%%: TTFT %.3f s (remaining %.1f%%, %.0f MiB from storage, %.0f MiB decoded)\n",
                       rep + 1, K.name(), cn.c_str(), lv, r.ttft, 100 * r.remaining, r.bytes_from_storage / 1048576.0,
                       r.bytes_decoded / 1048576.0);
        }
      }
    }
  }
  return Status::Ok();
}

// The TTFT-per-codec section: table, JSON and plot.
void ReportCodecTtft(AccRun* R) {
  const AccArgs& a = R->a;
  const int N = a.ttft_ctx;
  std::string& md = R->md;
  md += "\n## TTFT per codec\n\n" + std::to_string(N) + "-token context, " + std::to_string(a.query) +
        "-token query, restore_generate after hybrid-swap eviction to the level; medians of " +
        std::to_string(a.reps) + " runs (min-max), codec order rotated every rep" +
        (R->multi() ? ", the KV types in turn within each rep" : "") + ". All in memory:";
  for (const KvRun& K : R->kv) {
    const Stats mem = Summarize(K.ttft_all_mem);
    md += Sprintf(" %s KV %.3f s%s", K.name(), mem.median, &K == &R->kv.back() ? ".\n\n" : ",");
    K.Doc(R->doc)["ttft_all_in_memory"] = {{"median", mem.median}, {"min", mem.min}, {"max", mem.max}, {"runs", K.ttft_all_mem}};
  }
  md += "| KV | codec |";
  for (int lv : a.levels) md += Sprintf(" TTFT from %d%% s | from storage / decoded MiB (%d%%) |", lv, lv);
  md += "\n|---|---|";
  for (size_t i = 0; i < a.levels.size(); ++i) md += "---|---|";
  md += "\n";
  std::string tt_dat = "# codec";
  for (int lv : a.levels) tt_dat += Sprintf(" ttft%d", lv);
  tt_dat += "\n";
  for (const KvRun& K : R->kv)
    for (const std::string& cn : a.codecs) {
      md += std::string("| ") + K.name() + " | " + cn + " |";
      tt_dat += R->Label(K, cn);
      for (int lv : a.levels) {
        std::vector<double> t;
        for (auto& r : K.ttft.at(cn).at(lv)) t.push_back(r.ttft);
        const Stats s = Summarize(t);
        const LevelRun& r0 = K.ttft.at(cn).at(lv).front();
        md += (t.size() > 1 ? Sprintf(" %.3f (%.3f-%.3f) |", s.median, s.min, s.max) : Sprintf(" %.3f |", s.median)) +
              Sprintf(" %.0f / %.0f |", r0.bytes_from_storage / 1048576.0, r0.bytes_decoded / 1048576.0);
        tt_dat += Sprintf(" %.4f", s.median);
        K.Doc(R->doc)["ttft"][cn][std::to_string(lv)] = {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", t},
                                                         {"remaining", r0.remaining}, {"bytes_from_storage", r0.bytes_from_storage},
                                                         {"bytes_decoded", r0.bytes_decoded}};
      }
      md += "\n";
      tt_dat += "\n";
    }
  R->doc["ttft_ctx"] = N;
  WriteFile(a.out, "accuracy-ttft.dat", tt_dat);
  std::string gp = "set terminal pngcairo size 700,450\nset output 'accuracy-ttft.png'\nset title 'TTFT per codec, " +
                   std::to_string(N) + "-token context'\nset ylabel 'TTFT (s)'\nset yrange [0:*]\nset style data histogram\n"
                   "set style histogram clustered gap 1\nset style fill solid 0.8 border -1\nset key top left\n"
                   "set xtics noenhanced" + std::string(R->multi() ? " rotate by -30" : "") + "\nplot ";
  for (size_t i = 0; i < a.levels.size(); ++i)
    gp += Sprintf("%s u %zu%s t 'from %d%% remaining'", i ? ", ''" : "'accuracy-ttft.dat'", i + 2,
                  i ? "" : ":xtic(1)", a.levels[i]);
  for (const KvRun& K : R->kv)
    gp += Sprintf(", %.4f w l dt %d t 'all in memory%s%s' noenhanced", Summarize(K.ttft_all_mem).median, 2 + int(&K - &R->kv[0]),
                  R->multi() ? ", " : "", R->multi() ? K.name() : "");
  const std::string png = PlotPng(a.out, "accuracy-ttft", gp + "\n");
  if (!png.empty()) md += "\n![TTFT per codec](" + png + ")\n";
}

Status CodecTtft(AccRun* R) {
  const int N = R->a.ttft_ctx;
  std::fprintf(stderr, "== TTFT per codec: %d-token context, %d-token query ==\n", N, R->a.query);
  std::vector<int32_t> t2;
  MZ_RETURN_IF_ERROR(RealTokens(R->path, N + R->a.query, &t2));
  MZ_RETURN_IF_ERROR(MeasureCodecTtft(R, t2));
  ReportCodecTtft(R);
  return Status::Ok();
}

// bench accuracy: the never-evicted contexts (f16 reference first), space savings, resident KV per
// token, accuracy and idempotence per KV type and codec, TTFT per KV type and codec, then the report.
Status RunAccuracy(AccArgs& a) {
  AccRun R(a);
  std::vector<KvType> types;
  MZ_RETURN_IF_ERROR(ParseKvTypeList(a.kv_types, "--kv-types", &types));
  types.erase(std::remove(types.begin(), types.end(), KvType::kF16), types.end());
  types.insert(types.begin(), KvType::kF16);  // always measured: the reference
  for (KvType t : types) R.kv.emplace_back().type = t;
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &R.path, &R.model));
  R.nv = int(R.model->hparams().n_vocab), R.n = a.ctx, R.P = a.positions;
  std::fprintf(stderr, "== %s: accuracy over %d teacher-forced positions after a %d-token context ==\n",
               ModelStem(R.path).c_str(), R.P, R.n);
  MZ_RETURN_IF_ERROR(RealTokens(R.path, R.n + R.P, &R.toks));
  R.co.n_ctx = R.n + R.P + 64;
  R.co.n_threads = a.threads;
  R.co.swap_path = a.swap_dir + "/mzcache-accuracy-" + std::to_string(getpid()) + ".swap";
  R.co.kv_codec = "none";
  for (KvRun& K : R.kv) {
    ContextOptions cc = R.co;
    cc.kv_type = K.type;
    Context ctx(R.model.get(), cc);
    MZ_RETURN_IF_ERROR(ctx.Init());
    MZ_RETURN_IF_ERROR(EnsureSessionContext(ctx, R.path, R.toks, R.n, &K.sess));
    if (&K == &R.kv.front()) MZ_RETURN_IF_ERROR(SpaceSavings(&R, ctx));
    MZ_RETURN_IF_ERROR(NeverEvicted(&R, ctx, &K));
  }
  std::vector<std::string> names;
  for (const KvRun& K : R.kv) names.push_back(K.name());
  R.doc["kv_types"] = names;
  ReportMemory(&R);
  MZ_RETURN_IF_ERROR(RunCycles(&R));
  ReportAccuracy(&R);
  if (a.cycles > 1) ReportIdempotence(&R);
  PlotSpaceSavings(&R);
  if (!a.no_ttft) MZ_RETURN_IF_ERROR(CodecTtft(&R));
  WriteReport(a.out, a.report, R.md, R.doc);
  std::fputs(R.md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/%s.{md,json} and plots\n", a.out.c_str(), a.report.c_str());
  return Status::Ok();
}

// The parsed command's checks, then the run; the exit code.
int CheckAndRun(AccArgs& a) {
  if (a.positions < 1 || a.ctx < 1 || a.cycles < 1 || a.codecs.empty() || a.reps < 1 || a.query < 1) {
    std::fprintf(stderr, "error: --ctx, --positions, --cycles, --reps, --query must be >= 1 and --codecs not empty\n");
    return 2;
  }
  Status st = RunAccuracy(a);
  return st.ok() ? 0 : Fail(st);
}

// The options both commands share, their help naming the defaults set in *a (with_quick: and the
// --quick ones of bench accuracy).
void AddCommonOptions(CLI::App* c, AccArgs* a, bool with_quick) {
  const auto dflt = [&](int v, int quick_v) {
    return with_quick ? Sprintf(" (default %d; --quick: %d)", v, quick_v) : Sprintf(" (default %d)", v);
  };
  c->add_option("-m,--model", a->model, "model shape (make-model --list) or GGUF path");
  c->add_option("--type", a->type, "weight type for a synthesized shape");
  c->add_option("--ctx", a->ctx, "context tokens before the teacher-forced positions" + dflt(a->ctx, 1024));
  c->add_option("--positions", a->positions, "teacher-forced positions compared, >= 200 recommended" + dflt(a->positions, 200));
  c->add_option("--ttft-ctx", a->ttft_ctx, "context tokens for the TTFT part" + dflt(a->ttft_ctx, 2048));
  c->add_option("-r,--reps", a->reps, "repetitions of the TTFT part" + dflt(a->reps, 1));
  c->add_option("-q,--query", a->query, "query tokens of the TTFT part");
  c->add_option("-t,--threads", a->threads, "compute threads");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_option("--swap-dir", a->swap_dir, "folder for the swap file (storage under test)");
  c->add_option("--levels", a->levels, "remaining-memory levels in percent for the TTFT part");
  c->add_flag("--no-ttft", a->no_ttft, "skip the TTFT part");
}

}  // namespace

void AddAccuracyBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<AccArgs>();
  auto* c = bench->add_subcommand("accuracy", "Fig. 14: KV codecs' space savings on real KV, KL and top-1 agreement vs "
                                              "fp16 over teacher-forced real text, idempotence over evict/restore "
                                              "cycles, TTFT from 50%/0% remaining per codec; --kv-types f16,q8_0: the "
                                              "same for live q8_0 KV, and its KV bytes per token");
  c->footer("With --kv-types f16,q8_0 the never-evicted f16 KV context stays the reference; a q8_0 KV context built by its "
            "own prefill of the same text (KV written live as q8 rows) adds: a `Resident KV per token` row per type "
            "(measured and formula); in the accuracy table a row `q8_0 | never evicted (live)` (live q8 KV against the f16 "
            "reference) and a row per codec and the control on the q8_0 context (evicted and restored through the codec: "
            "against the f16 reference, and in three more columns against the never-evicted q8_0 context, i.e. what "
            "eviction adds on top of q8 KV); idempotence rows per type; TTFT rows per type and codec (each type from its "
            "own session of the TTFT context, the types in turn within each repetition). f16 is always measured. JSON: f16 "
            "results where they are without the option, another type's under by_kv_type.<type>; memory.<type>.");
  AddCommonOptions(c, a.get(), true);
  c->add_option("--cycles", a->cycles, "evict/restore cycles for the idempotence check (1: no idempotence section)");
  c->add_option("--codecs", a->codecs, "lossy codecs to compare");
  c->add_option("--kv-types", a->kv_types, "KV types, comma-separated: f16 (always measured: the reference) and q8_0 "
                                           "(live q8 KV; see below)");
  c->add_flag("--quick", a->quick, "1024-token context, 200 positions, TTFT at 2048 tokens with 1 rep (unless given)");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    if (a->quick) {
      if (c->count("--ctx") == 0) a->ctx = 1024;
      if (c->count("--positions") == 0) a->positions = 200;
      if (c->count("--ttft-ctx") == 0) a->ttft_ctx = 2048;
      if (c->count("--reps") == 0) a->reps = 1;
    }
    return CheckAndRun(*a);
  });
}

// bench kv-type: bench accuracy --kv-types f16,q8_0 --codecs <--kv-codec> --cycles 1, with the
// defaults of the former standalone command and its report name (bench-kv-type.{md,json}).
void AddKvTypeBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<AccArgs>();
  a->kv_types = "f16,q8_0";
  a->codecs = {"q8"};
  a->cycles = 1;
  a->ctx = 1024;
  a->ttft_ctx = 2048;
  a->levels = {0, 50};
  a->threads = 1;
  a->out = "results/bench-kv-type";
  a->report = "bench-kv-type";
  a->title = "bench kv-type: q8_0 KV vs f16 KV (bench accuracy --kv-types f16,q8_0 --cycles 1)";
  auto codec = std::make_shared<std::string>("q8");
  auto* c = bench->add_subcommand("kv-type", "q8_0 KV vs f16 KV in one run: KV bytes per token, KL and top-1 over "
                                             "teacher-forced real text, TTFT after eviction (bench accuracy --kv-types "
                                             "f16,q8_0 --codecs <--kv-codec> --cycles 1)");
  AddCommonOptions(c, a.get(), false);
  c->add_option("--kv-codec", *codec, "swap codec when evicting (q8: the q8_0 rows stored as they are)");
  runners.push_back([c, a, codec]() -> int {
    if (!c->parsed()) return -1;
    a->codecs = {*codec};
    return CheckAndRun(*a);
  });
}

}  // namespace mz::cli
