// bench footprint: the paper's Table 1 / Table 3 for our model shapes. For every shape of
// src/model/synth.h: weight bytes per weight type planned by PlanModelFile (the GGUF
// make-model would write; checked against the file where one exists in <cache>/models) and fp16 KV
// bytes at 8k/16k/32k, next to the paper's printed figures in columns labeled as the paper's.
// Nothing is synthesized; it takes a second.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "model/model.h"
#include "model/synth.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/footprint_calc.h"
#include "tools/bench/peers_common.h"

namespace mz::cli {
namespace {

// The paper's figures, copied as printed (unit "GB" in the paper). Table 1: weights, maximum
// context, KV at that context, weights + KV. Table 3: weights and KV at 8k / 16k / 32k.
struct PaperRow {
  const char* shape;       // our spec id, or "" when we have no shape for it
  const char* paper_name;
  const char* weights;     // Table 1
  const char* max_ctx;
  int max_ctx_tokens;
  const char* kv_max;
  const char* footprint;
  const char* t3_weights;  // Table 3 ("" if the model is not in Table 3)
  const char* t3_kv;       // "8k / 16k / 32k"
};
const PaperRow kPaper[] = {
    {"", "EXAONE-4.0-1.2B", "2.6 GB", "64k", 65536, "3.8 GB", "6.4 GB", "2.6 GB", "0.5 GB / 1.0 GB / 1.9 GB"},
    {"", "Gemma2-2B", "4.9 GB", "8k", 8192, "0.8 GB", "5.7 GB", "", ""},
    {"llama3.2-1b", "Llama3.2-1B", "2.5 GB", "128k", 131072, "4 GB", "6.5 GB", "", ""},
    {"qwen3-0.6b", "Qwen3-0.6B", "1.2 GB", "32k", 32768, "3.5 GB", "4.7 GB", "1.2 GB", "0.9 GB / 1.8 GB / 3.5 GB"},
    {"qwen3-1.7b", "Qwen3-1.7B", "3.5 GB", "32k", 32768, "3.5 GB", "7.0 GB", "", ""},
};

std::string GbGib(uint64_t b) { return Sprintf("%.2f GB / %.2f GiB", double(b) / 1e9, double(b) / double(1ull << 30)); }
double MiB(uint64_t b) { return double(b) / 1048576.0; }

struct FootprintArgs {
  std::vector<std::string> types{"f16", "q8_0", "q4_0"};
  std::vector<int> ctxs{8192, 16384, 32768};
  std::string out = "results/bench-footprint";
  bool quick = false;
};

// The report's opening and the shapes table's header.
std::string FootprintHeader(const FootprintArgs& a) {
  std::string md = "# bench footprint\n\nComputed from each shape's hyper-parameters (src/model/synth.h) and its "
                   "real vocabulary size: weights = tensor bytes of the GGUF `mzcache make-model` writes for the "
                   "type (no file needed); KV = fp16 K + V = 2 x n_layer x n_kv_head x head_dim x 2 bytes x tokens. "
                   "Where the GGUF exists in " + CacheDir() + "/models its tensor bytes are read from the file "
                   "and must agree (column `file check`). MiB = 2^20 bytes.\n\n";
  md += "| shape | arch | params | n_vocab |";
  for (const auto& t : a.types) md += " weights " + t + " MiB |";
  md += " KV/token KiB |";
  for (int n : a.ctxs) md += " KV " + std::to_string(n / 1024) + "k MiB |";
  md += " file check |\n|---|---|---|---|";
  for (size_t i = 0; i < a.types.size() + a.ctxs.size() + 2; ++i) md += "---|";
  md += "\n";
  return md;
}

// The planned file of shape s with recipe t (PlanModelFile: the recipes of make-model).
Status PlanShape(const std::string& vdir, const ModelSpec& s, const std::string& t, ModelFilePlan* out) {
  SynthOptions o;
  o.type = t;
  o.vocab_dir = vdir;
  UseFamilyChatTemplate(s, &o, true);  // as make-model writes it
  return PlanModelFile(s, o, out);
}

// The file check of one shape and type: the GGUF in <cache>/models, if there, must hold wb's
// bytes (a mismatch counts in *mismatches).
std::string FileCheck(const ModelSpec& s, const std::string& t, const ModelFilePlan& wb, nlohmann::json* js, int* mismatches) {
  const std::string f = CacheDir() + "/models/" + s.id + "-" + t + ".gguf";
  FileInfo fi;
  if (!Env::Default()->StatPath(f, &fi).ok()) return "";
  ModelOptions mo;
  mo.load_weights = false;
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), f, mo, &m);
  if (!st.ok()) return t + ": unreadable (" + st.ToString() + ") ";
  const bool ok = m->tensor_bytes() == wb.tensor_bytes && m->hparams().kv_bytes_per_token() == KvBytesFor(s, 1);
  *mismatches += !ok;
  (*js)["weights"][t]["file_bytes"] = m->tensor_bytes();
  return t + (ok ? " file agrees " : Sprintf(" FILE DIFFERS (%llu bytes) ", (unsigned long long)m->tensor_bytes()));
}

// One shape's row (*md), JSON entry (*shapes) and plot line (*dat, real shapes only).
Status ShapeRow(const FootprintArgs& a, const std::string& vdir, const ModelSpec& s, std::string* md,
                nlohmann::json* shapes, std::string* dat, int* mismatches) {
  ModelFilePlan first;
  MZ_RETURN_IF_ERROR(PlanShape(vdir, s, "f16", &first));
  const int64_t nv = first.n_vocab;
  nlohmann::json js{{"shape", s.id}, {"arch", s.arch}, {"real_name", s.real_name}, {"n_vocab", nv},
                    {"n_layer", s.n_layer}, {"n_head_kv", s.n_head_kv}, {"head_dim", s.head_dim},
                    {"kv_bytes_per_token", KvBytesFor(s, 1)}};
  *md += "| " + s.id + " | " + s.arch + " |";
  std::string file_check;
  uint64_t params = 0;
  std::vector<std::string> cells;
  for (const auto& t : a.types) {
    ModelFilePlan wb;
    MZ_RETURN_IF_ERROR(PlanShape(vdir, s, t, &wb));
    params = wb.params;
    js["weights"][t] = {{"bytes", wb.tensor_bytes}, {"token_embd_bytes", wb.token_embd_bytes}};
    cells.push_back(Sprintf(" %.1f |", MiB(wb.tensor_bytes)));
    file_check += FileCheck(s, t, wb, &js, mismatches);
  }
  js["params"] = params;
  *md += Sprintf(" %.3f B | %lld |", double(params) / 1e9, (long long)nv);
  for (auto& x : cells) *md += x;
  *md += Sprintf(" %.0f |", double(KvBytesFor(s, 1)) / 1024.0);
  std::string kvdat;
  for (int n : a.ctxs) {
    *md += Sprintf(" %.0f |", MiB(KvBytesFor(s, uint64_t(n))));
    js["kv_bytes"][std::to_string(n)] = KvBytesFor(s, uint64_t(n));
    kvdat += Sprintf(" %.4f", double(KvBytesFor(s, uint64_t(n))) / double(1ull << 30));
  }
  *md += " " + (file_check.empty() ? std::string("no file ") : file_check) + "|\n";
  shapes->push_back(js);
  if (s.id.rfind("tiny-", 0) != 0) {
    ModelFilePlan q8;
    MZ_RETURN_IF_ERROR(PlanShape(vdir, s, "q8_0", &q8));
    *dat += "\"" + s.id + "\"" + Sprintf(" %.4f %.4f", double(first.tensor_bytes) / double(1ull << 30), double(q8.tensor_bytes) / double(1ull << 30)) + kvdat + "\n";
  }
  return Status::Ok();
}

// Comparison with the paper (Table 1 and Table 3): rows into *md, JSON returned.
nlohmann::json PaperComparison(const std::string& vdir, std::string* md) {
  *md += "\n## Next to the paper (Table 1 and Table 3)\n\nOurs: f16 weights (the paper's models ship in 16-bit), "
         "each figure in GB (10^9) and GiB (2^30) because the paper writes \"GB\" for both (its KV figures match "
         "GiB, e.g. Qwen3-0.6B 32k = 3.5 GiB; its weights match GB). Columns titled \"paper\" are copied from the "
         "paper as printed; nothing else is.\n\n"
         "| model | ours: weights f16 | paper: weights (Table 1) | paper: max context | ours: KV at that context | "
         "paper: KV max (Table 1) | ours: weights + KV | paper: max footprint (Table 1) | ours: KV 8k / 16k / 32k | "
         "paper: KV 8k / 16k / 32k (Table 3) |\n|---|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::json paper = nlohmann::json::array();
  for (const PaperRow& p : kPaper) {
    const ModelSpec* s = p.shape[0] ? FindModelSpec(p.shape) : nullptr;
    nlohmann::json jp{{"paper_model", p.paper_name}, {"paper_weights", p.weights}, {"paper_max_ctx", p.max_ctx},
                      {"paper_kv_max", p.kv_max}, {"paper_footprint", p.footprint},
                      {"paper_table3_weights", p.t3_weights}, {"paper_table3_kv", p.t3_kv}};
    if (!s) {
      *md += std::string("| ") + p.paper_name + " | no shape in src/model/synth.h | " + p.weights + " | " + p.max_ctx +
             " | - | " + p.kv_max + " | - | " + p.footprint + " | - | " + (p.t3_kv[0] ? p.t3_kv : "-") + " |\n";
      paper.push_back(jp);
      continue;
    }
    ModelFilePlan f16;
    PlanShape(vdir, *s, "f16", &f16);
    const uint64_t wbytes = f16.tensor_bytes;
    const uint64_t kvmax = KvBytesFor(*s, uint64_t(p.max_ctx_tokens));
    const std::string kv3 = Sprintf("%.2f / %.2f / %.2f GB (%.2f / %.2f / %.2f GiB)", KvBytesFor(*s, 8192) / 1e9,
                                    KvBytesFor(*s, 16384) / 1e9, KvBytesFor(*s, 32768) / 1e9,
                                    double(KvBytesFor(*s, 8192)) / double(1ull << 30),
                                    double(KvBytesFor(*s, 16384)) / double(1ull << 30),
                                    double(KvBytesFor(*s, 32768)) / double(1ull << 30));
    *md += std::string("| ") + p.paper_name + " (`" + s->id + "`) | " + GbGib(wbytes) + " | " + p.weights + " | " +
           p.max_ctx + " | " + GbGib(kvmax) + " | " + p.kv_max + " | " + GbGib(wbytes + kvmax) + " | " +
           p.footprint + " | " + kv3 + " | " + (p.t3_kv[0] ? p.t3_kv : "-") + " |\n";
    jp["shape"] = s->id;
    jp["ours_weights_f16_bytes"] = wbytes;
    jp["ours_kv_at_max_ctx_bytes"] = kvmax;
    jp["ours_footprint_bytes"] = wbytes + kvmax;
    paper.push_back(jp);
  }
  return paper;
}

void PlotFootprint(const FootprintArgs& a, const std::string& dat, std::string* md) {
  WriteFile(a.out, "footprint.dat", dat);
  std::string hdr = "set terminal pngcairo size 1000,500\nset output 'footprint.png'\nset title 'Memory footprint per "
                    "model shape'\nset style data histogram\nset style histogram clustered gap 1\nset style fill "
                    "solid 0.8 border -1\nset ylabel 'GiB'\nset yrange [0:*]\nset key top left\nset xtics rotate by -20\n"
                    "plot 'footprint.dat' u 2:xtic(1) t 'weights f16', '' u 3 t 'weights q8\\_0'";
  for (size_t i = 0; i < a.ctxs.size(); ++i) hdr += Sprintf(", '' u %zu t 'KV %dk'", 4 + i, a.ctxs[i] / 1024);
  const std::string png = PlotPng(a.out, "footprint", hdr + "\n");
  if (!png.empty()) *md += "\n![footprint](" + png + ")\n";
}

// bench footprint; exit code 1 when a GGUF on disk disagrees with the computed bytes.
int RunFootprint(const FootprintArgs& a) {
  const std::string vdir = VocabDir();
  nlohmann::json shapes = nlohmann::json::array();
  std::string md = FootprintHeader(a), dat;
  int mismatches = 0;
  for (const ModelSpec& s : KnownModelSpecs())
    if (Status st = ShapeRow(a, vdir, s, &md, &shapes, &dat, &mismatches); !st.ok()) return Fail(st);
  const nlohmann::json paper = PaperComparison(vdir, &md);
  md += "\nOur shapes have exact tensor shapes but synthesized (random) weights; the byte counts do not depend on "
        "the values.\n";
  PlotFootprint(a, dat, &md);
  nlohmann::json doc{{"shapes", shapes}, {"paper", paper}, {"vocab_dir", vdir}, {"file_mismatches", mismatches}};
  WriteReport(a.out, "bench-footprint", md, doc);
  std::fputs(md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/bench-footprint.{md,json} and footprint.png\n", a.out.c_str());
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

void AddFootprintBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<FootprintArgs>();
  auto* c = bench->add_subcommand("footprint", "Table 1/3: weight bytes per type and fp16 KV bytes at 8k/16k/32k for "
                                               "every model shape (from hyper-parameters), next to the paper's figures");
  c->add_option("--types", a->types, "weight types (f16, q8_0, q4_0, q4_k)");
  c->add_option("--ctx", a->ctxs, "context lengths for the KV columns");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_flag("--quick", a->quick, "accepted for uniformity with the other benches (this one is always quick)");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunFootprint(*a);
  });
}

}  // namespace mz::cli
