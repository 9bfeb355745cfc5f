// Model synthesis: writes a GGUF with the exact tensor shapes and metadata of a named real model,
// deterministic seeded random weights, and the real tokenizer copied from one of llama.cpp's
// models/ggml-vocab-*.gguf files. The result loads in llama.cpp unchanged.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"

namespace mz {

struct ModelSpec {
  std::string id;         // "qwen3-0.6b"
  std::string arch;       // "qwen3" | "llama" | "qwen2"
  std::string real_name;  // "Qwen3-0.6B"
  std::string vocab;      // "qwen2" | "llama-bpe" (file ggml-vocab-<vocab>.gguf)
  int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
  float rope_base, rms_eps;
  bool tied;
  bool llama3_rope;       // rope_freqs.weight with llama3 scaling factors
};

// Bumped whenever a recipe's output changes (a file made before may differ from one made now):
// caches of synthesized files (tests/test_util.cpp) check it. 2: llama.cpp's Q4_0 recipe (Q6_K
// output head) and its per-type row fallbacks (session 32). 3: the real family's chat template
// (FamilyChatTemplateFile) instead of a plain one (session 33).
constexpr int kSynthRecipeRevision = 3;

const std::vector<ModelSpec>& KnownModelSpecs();
const ModelSpec* FindModelSpec(const std::string& id);

struct SynthOptions {
  std::string type = "q8_0";   // f16 | q8_0 | q4_0 | q4_k | q4_k_m | q3_k_m (synth.cpp: the recipes)
  uint64_t seed = 1;
  std::string vocab_dir;       // folder holding ggml-vocab-*.gguf
  // The Jinja chat template written as tokenizer.chat_template (ReadFamilyChatTemplate gives the
  // real family's). Empty: a plain ChatML / Llama 3 template without tool syntax.
  std::string chat_template;
  int threads = 2;
  // Progress: called with (bytes written, total bytes) now and then.
  std::function<void(uint64_t, uint64_t)> progress;
};

// The file name, in llama.cpp's models/templates folder, of the chat template the real model of
// spec ships (Qwen3 -> Qwen-Qwen3-0.6B.jinja, Llama 3.2 -> meta-llama-Llama-3.2-3B-Instruct.jinja,
// ...); empty for a family without one.
std::string FamilyChatTemplateFile(const ModelSpec& spec);

// Reads the real family's chat template of spec from templates_dir (the pinned llama.cpp source's
// models/templates: read at synthesis time, never copied into this repository) through env into
// *tmpl, and its path into *path. Errors: Unsupported when the family has none, the read's IOError
// (ENOENT when the source is absent); *tmpl is then empty and the caller keeps the plain template.
Status ReadFamilyChatTemplate(Env* env, const ModelSpec& spec, const std::string& templates_dir, std::string* tmpl,
                              std::string* path);

// The file a recipe makes, without writing it (the vocabulary file is read for its size).
struct PlannedTensor {
  std::string name;   // "blk.0.attn_q.weight"
  std::string type;   // ggml type name: "q4_K"
  int64_t ne0 = 0;    // row length (elements)
  int64_t ne1 = 1;    // rows
  uint64_t bytes = 0;
};
struct ModelFilePlan {
  uint64_t file_bytes = 0;    // the whole GGUF: metadata, tokenizer, tensors, padding
  uint64_t tensor_bytes = 0;  // the tensors' data
  uint64_t params = 0;        // tensor elements (a tied embedding counted once)
  double bits_per_weight = 0; // 8 * tensor_bytes / params (what llama.cpp's loader prints as BPW)
  int64_t n_vocab = 0;        // tokens in the vocabulary copied
  uint64_t token_embd_bytes = 0;  // token_embd.weight
  std::map<std::string, uint64_t> bytes_by_type;  // ggml type name -> tensor bytes
  std::vector<PlannedTensor> tensors;              // in file order
};
// Errors: InvalidArgument (unknown recipe), the vocabulary's IOError / Corruption.
Status PlanModelFile(const ModelSpec& spec, const SynthOptions& opts, ModelFilePlan* out);

// Writes the model to path (via a temporary name + rename: a partial file is never left behind).
Status SynthesizeModel(Env* env, const ModelSpec& spec, const SynthOptions& opts, const std::string& path);

}  // namespace mz
