// make-model, info
#include <cstdio>
#include <memory>

#include "model/model.h"
#include "model/synth.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

// make-model: a synthesized GGUF (no C API equivalent: synthesis is a tool, not part of the runtime).
void AddMakeModel(CLI::App& app, Runners& runners) {
  struct MakeArgs {
    std::string shape = "qwen3-0.6b", type = "q8_0", out, vocab_dir;
    uint64_t seed = 1;
    int threads = 2;
    bool list = false, plan = false;
  };
  auto ma = std::make_shared<MakeArgs>();
  auto* mk = app.add_subcommand("make-model",
                                "write a GGUF with a real model's shapes, seeded random weights, its real tokenizer and "
                                "its real chat template (read from the pinned llama.cpp source's models/templates, "
                                "$MZ_LLAMA_SRC overrides; without it a plain template, with a note)");
  mk->add_option("--shape", ma->shape, "model shape (see --list)");
  mk->add_option("--type", ma->type,
                 "weight recipe: f16, q8_0, q4_k (every matrix in that type); q4_0 (every matrix but a Q6_K output "
                 "head), q4_k_m, q3_k_m (llama.cpp's recipes: src/model/synth.cpp)")
      ->check(CLI::IsMember({"f16", "q8_0", "q4_0", "q4_k", "q4_k_m", "q3_k_m"}));
  mk->add_option("-o,--out", ma->out, "output path (default: <cache>/models/<shape>-<type>.gguf)");
  mk->add_option("--seed", ma->seed, "random seed");
  mk->add_option("--threads", ma->threads, "threads");
  mk->add_option("--vocab-dir", ma->vocab_dir, "folder with llama.cpp's ggml-vocab-*.gguf");
  mk->add_flag("--list", ma->list, "list known shapes and exit");
  mk->add_flag("--plan", ma->plan, "print the file's size, bits per weight and bytes per type, and write nothing");
  runners.push_back([mk, ma]() -> int {
    if (!mk->parsed()) return -1;
    if (ma->list) {
      std::printf("%-14s %-6s %-14s %6s %6s %5s %5s %5s %6s %s\n", "shape", "arch", "real model", "n_embd", "layers",
                  "heads", "kv", "hdim", "ffn", "vocab");
      for (const auto& s : KnownModelSpecs())
        std::printf("%-14s %-6s %-14s %6d %6d %5d %5d %5d %6d %s\n", s.id.c_str(), s.arch.c_str(), s.real_name.c_str(),
                    s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.vocab.c_str());
      return 0;
    }
    const ModelSpec* spec = FindModelSpec(ma->shape);
    if (!spec) return Fail(Status::InvalidArgument("unknown shape '" + ma->shape + "' (see --list)"));
    std::string out = ma->out;
    if (out.empty()) {
      std::string dir = CacheDir() + "/models";
      std::system(("mkdir -p '" + dir + "'").c_str());
      out = dir + "/" + ma->shape + "-" + ma->type + ".gguf";
    }
    SynthOptions o;
    o.type = ma->type;
    o.seed = ma->seed;
    o.threads = ma->threads;
    o.vocab_dir = ma->vocab_dir.empty() ? VocabDir() : ma->vocab_dir;
    const std::string tmpl = UseFamilyChatTemplate(*spec, &o, ma->plan);
    if (ma->plan) {
      ModelFilePlan p;
      if (Status st = PlanModelFile(*spec, o, &p); !st.ok()) return Fail(st);
      std::printf("%s %s: %.3f GB (%.2f GiB), %.3f B params, %.2f bits per weight\n", ma->shape.c_str(),
                  ma->type.c_str(), double(p.file_bytes) / 1e9, double(p.file_bytes) / 1073741824.0,
                  double(p.params) / 1e9, p.bits_per_weight);
      for (const auto& [type, bytes] : p.bytes_by_type) std::printf("  %-5s %10.1f MB\n", type.c_str(), double(bytes) / 1e6);
      return 0;
    }
    o.progress = [](uint64_t d, uint64_t t) { Progress("writing", d, t); };
    Status st = SynthesizeModel(Env::Default(), *spec, o, out);
    if (!st.ok()) return Fail(st);
    if (!tmpl.empty()) std::fprintf(stderr, "chat template: %s\n", tmpl.c_str());
    std::printf("%s\n", out.c_str());
    return 0;
  });
}

// info: shapes and unit sizes. Needs what the C API does not expose (rope, the weight units and
// their mappings, a model parsed without its weights), so it reads the internal Model.
void AddInfo(CLI::App& app, Runners& runners) {
  auto model_path = std::make_shared<std::string>();
  auto* info = app.add_subcommand("info", "model shapes, unit sizes, KV bytes per token and per chunk");
  info->add_option("-m,--model", *model_path, "GGUF path (default: the synthesized Qwen3-0.6B q8_0)");
  auto chunk = std::make_shared<int>(256);
  info->add_option("--chunk-tokens", *chunk, "tokens per KV chunk");
  runners.push_back([info, model_path, chunk]() -> int {
    if (!info->parsed()) return -1;
    std::string path = *model_path;
    if (path.empty()) {
      Status st = EnsureDefaultModel(&path);
      if (!st.ok()) return Fail(st);
    }
    ModelOptions o;
    o.load_weights = false;
    std::unique_ptr<Model> m;
    Status st = Model::Load(Env::Default(), path, o, &m);
    if (!st.ok()) return Fail(st);
    const HParams& hp = m->hparams();
    std::printf("model        %s\narch         %s\nname         %s\n", path.c_str(), ArchName(hp.arch), hp.name.c_str());
    std::printf("n_vocab      %u\nn_embd       %u\nn_layer      %u\nn_head       %u (kv %u, head_dim %u)\nn_ff         %u\n",
                hp.n_vocab, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff);
    std::printf("n_ctx_train  %u\nrope         base %.0f, %s%s\n", hp.n_ctx_train, hp.rope_freq_base,
                hp.rope_type == RopeType::kNeox ? "neox" : "norm", hp.rope_freqs ? ", llama3 freq factors" : "");
    std::printf("output       %s\n", hp.tied_output ? "tied to token_embd" : "separate");
    std::printf("weights      %.1f MiB in %d units\n", double(m->tensor_bytes()) / 1048576.0, m->n_units());
    const uint64_t chunk_bytes = 2ull * hp.n_head_kv * hp.head_dim * 2 * uint64_t(*chunk);
    std::printf("KV (fp16)    %.1f KiB/token, %.1f KiB per layer-chunk of %d tokens (%.1f MiB per chunk row over all layers)\n",
                double(hp.kv_bytes_per_token()) / 1024.0, double(chunk_bytes) / 1024.0, *chunk,
                double(chunk_bytes) * hp.n_layer / 1048576.0);
    for (int ctx : {8192, 16384, 32768})
      std::printf("KV @%-6d   %.1f MiB\n", ctx, double(hp.kv_bytes_per_token()) * ctx / 1048576.0);
    std::printf("\n%-6s %-6s %12s %12s %5s\n", "unit", "layer", "tensor MiB", "mapped MiB", "runs");
    for (int u = 0; u < m->n_units(); ++u) {
      const WeightUnit& w = m->unit(u);
      std::printf("%-6d %-6s %12.2f %12.2f %5zu\n", u, w.layer < 0 ? "base" : std::to_string(w.layer).c_str(),
                  double(w.tensor_bytes) / 1048576.0, double(w.region_bytes) / 1048576.0, w.runs.size());
    }
    return 0;
  });
}

}  // namespace

void AddModelCommands(CLI::App& app, Runners& runners) {
  AddMakeModel(app, runners);
  AddInfo(app, runners);
}

}  // namespace mz::cli
