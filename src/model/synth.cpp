#include "model/synth.h"

#include <atomic>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "core/ggml_log.h"
#include "ggml.h"
#include "gguf.h"

namespace mz {

const std::vector<ModelSpec>& KnownModelSpecs() {
  // Shapes from the models' published config.json files.
  static const std::vector<ModelSpec> specs = {
      {"qwen3-0.6b", "qwen3", "Qwen3-0.6B", "qwen2", 1024, 28, 16, 8, 128, 3072, 40960, 1e6f, 1e-6f, true, false},
      {"qwen3-1.7b", "qwen3", "Qwen3-1.7B", "qwen2", 2048, 28, 16, 8, 128, 6144, 40960, 1e6f, 1e-6f, true, false},
      {"qwen3-4b", "qwen3", "Qwen3-4B", "qwen2", 2560, 36, 32, 8, 128, 9728, 40960, 1e6f, 1e-6f, true, false},
      {"llama3.2-1b", "llama", "Llama-3.2-1B", "llama-bpe", 2048, 16, 32, 8, 64, 8192, 131072, 5e5f, 1e-5f, true, true},
      {"llama3.2-3b", "llama", "Llama-3.2-3B", "llama-bpe", 3072, 28, 24, 8, 128, 8192, 131072, 5e5f, 1e-5f, true, true},
      // The field notes' case (issue 49: an 8B on an 8 GB phone): untied embeddings, 128,256-token vocabulary.
      {"llama3.1-8b", "llama", "Llama-3.1-8B", "llama-bpe", 4096, 32, 32, 8, 128, 14336, 131072, 5e5f, 1e-5f, false, true},
      {"qwen3-8b", "qwen3", "Qwen3-8B", "qwen2", 4096, 36, 32, 8, 128, 12288, 40960, 1e6f, 1e-6f, false, false},
      {"qwen2.5-0.5b", "qwen2", "Qwen2.5-0.5B", "qwen2", 896, 24, 14, 2, 64, 4864, 32768, 1e6f, 1e-6f, true, false},
      // Tiny test shapes (real vocabularies, small layers).
      {"tiny-qwen3", "qwen3", "tiny-qwen3", "qwen2", 256, 4, 4, 2, 64, 768, 40960, 1e6f, 1e-6f, true, false},
      {"tiny-llama", "llama", "tiny-llama", "llama-bpe", 256, 4, 8, 2, 32, 768, 131072, 5e5f, 1e-5f, false, true},
      {"tiny-qwen2", "qwen2", "tiny-qwen2", "qwen2", 256, 3, 4, 2, 64, 512, 32768, 1e6f, 1e-6f, true, false},
  };
  return specs;
}

std::string FamilyChatTemplateFile(const ModelSpec& spec) {
  const std::string& n = spec.real_name;
  if (spec.arch == "qwen3") return "Qwen-Qwen3-0.6B.jinja";  // every Qwen3 size ships the same template
  if (spec.arch == "qwen2") return "Qwen-Qwen2.5-7B-Instruct.jinja";
  if (spec.arch == "llama") {
    if (n.rfind("Llama-3.1", 0) == 0) return "meta-llama-Llama-3.1-8B-Instruct.jinja";
    return "meta-llama-Llama-3.2-3B-Instruct.jinja";  // Llama 3.2 and the tiny llama3-rope shape
  }
  return "";
}

Status ReadFamilyChatTemplate(Env* env, const ModelSpec& spec, const std::string& templates_dir, std::string* tmpl,
                              std::string* path) {
  tmpl->clear();
  path->clear();
  const std::string file = FamilyChatTemplateFile(spec);
  if (file.empty()) return Status::Unsupported("no real chat template known for " + spec.id);
  *path = templates_dir + "/" + file;
  Status st = env->ReadSmallFile(*path, tmpl);
  if (st.ok() && tmpl->empty()) st = Status::Corruption(*path + " is empty");
  if (!st.ok()) tmpl->clear();
  return st;
}

const ModelSpec* FindModelSpec(const std::string& id) {
  for (const auto& s : KnownModelSpecs())
    if (s.id == id) return &s;
  return nullptr;
}

namespace {

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

enum class Init { kUniform, kNorm, kConst };

struct TensorPlan {
  std::string name;
  ggml_type type;
  std::vector<int64_t> ne;
  Init init;
  float scale;  // uniform half-width (kUniform), noise half-width around 1 (kNorm)
  std::vector<float> values;  // kConst: explicit values
};

const char* kChatmlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
const char* kLlama3Template =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// The weight recipes, as llama.cpp's quantizer chooses per-tensor types (src/llama-quant.cpp,
// llama_tensor_get_type_impl and tensor_type_fallback, at the pinned commit) for a dense model
// without an importance matrix:
//   "f16": every matrix F16 (llama.cpp applies no per-tensor rules to an unquantized target).
//   "q8_0": every matrix Q8_0 (its output rule keeps Q8_0).
//   "q4_0": every matrix Q4_0 but output.weight (and a tied token_embd) at Q6_K, as LLAMA_FTYPE_MOSTLY_Q4_0.
//   "q4_k": every matrix Q4_K (mzcache's own pure recipe, tagged Q4_K_M as before 0.14; what
//           llama-quantize --pure writes).
//   "q4_k_m", "q3_k_m": the mixed recipes:
//     output.weight (and a tied token_embd)  Q6_K
//     q4_k_m: attn_v and ffn_down Q6_K on the layers use_more_bits picks (the first and last eighth,
//             and every third between: 16 of 32), Q4_K elsewhere; every other matrix Q4_K
//     q3_k_m: attn_v Q5_K on layers 0-1 and Q4_K after; ffn_down Q5_K on the first sixteenth, Q4_K
//             after; attn_output Q4_K; every other matrix Q3_K
// The output rule only bumps to Q6_K when the rows divide the recipe's own block (else Q8_0).
// Rows not divisible by the chosen type's block then fall back as llama.cpp's quantizer does:
// Q6_K -> Q8_0, Q5_K -> Q5_1, Q4_K -> Q5_0, Q3_K -> Q4_0, and to F16 when that still does not divide.
bool KnownRecipe(const std::string& t) {
  return t == "f16" || t == "q8_0" || t == "q4_0" || t == "q4_k" || t == "q4_k_m" || t == "q3_k_m";
}

bool UseMoreBits(int il, int n) { return il < n / 8 || il >= 7 * n / 8 || (il - n / 8) % 3 == 2; }

// The type of matrix `name` (il: its layer, -1 for token_embd/output) of a model of n_layer layers.
ggml_type MatrixType(const std::string& t, const std::string& name, int il, int n_layer, bool tied, int64_t ne0) {
  auto ends = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  ggml_type want = GGML_TYPE_Q8_0;
  if (t == "f16") want = GGML_TYPE_F16;
  else if (t == "q8_0") want = GGML_TYPE_Q8_0;
  else if (t == "q4_0") want = GGML_TYPE_Q4_0;
  else if (t == "q4_k") want = GGML_TYPE_Q4_K;
  else if (t == "q4_k_m") want = GGML_TYPE_Q4_K;
  else if (t == "q3_k_m") want = GGML_TYPE_Q3_K;
  const bool mixed = t == "q4_0" || t == "q4_k_m" || t == "q3_k_m";  // the recipes with per-tensor rules
  if (mixed && (name == "output.weight" || (tied && name == "token_embd.weight"))) {
    want = ne0 % ggml_blck_size(want) != 0 ? GGML_TYPE_Q8_0 : GGML_TYPE_Q6_K;
  } else if (t == "q4_k_m" || t == "q3_k_m") {
    const bool q4 = t == "q4_k_m";
    if (ends("attn_v.weight"))
      want = q4 ? (UseMoreBits(il, n_layer) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K) : (il < 2 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K);
    else if (ends("ffn_down.weight"))
      want = q4 ? (UseMoreBits(il, n_layer) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K)
                : (il < n_layer / 16 ? GGML_TYPE_Q5_K : GGML_TYPE_Q4_K);
    else if (!q4 && ends("attn_output.weight")) want = GGML_TYPE_Q4_K;
  }
  // Rows not divisible by the block size fall back as llama.cpp's quantizer does.
  if (ne0 % ggml_blck_size(want) != 0) {
    switch (want) {
      case GGML_TYPE_Q6_K: want = GGML_TYPE_Q8_0; break;
      case GGML_TYPE_Q5_K: want = GGML_TYPE_Q5_1; break;
      case GGML_TYPE_Q4_K: want = GGML_TYPE_Q5_0; break;
      case GGML_TYPE_Q3_K: want = GGML_TYPE_Q4_0; break;
      default: break;
    }
    if (ne0 % ggml_blck_size(want) != 0) want = GGML_TYPE_F16;
  }
  return want;
}

int FileType(const std::string& t) {
  if (t == "f16") return 1;
  if (t == "q4_0") return 2;
  if (t == "q8_0") return 7;
  if (t == "q3_k_m") return 12;  // LLAMA_FTYPE_MOSTLY_Q3_K_M
  if (t == "q4_k" || t == "q4_k_m") return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  return 0;
}

std::vector<float> Llama3RopeFactors(int head_dim, float base) {
  const float factor = 32.0f, low = 1.0f, high = 4.0f, old_ctx = 8192.0f;
  const float low_wl = old_ctx / low, high_wl = old_ctx / high;
  std::vector<float> f;
  for (int i = 0; i < head_dim; i += 2) {
    float freq = 1.0f / std::pow(base, float(i) / float(head_dim));
    float wl = 2.0f * float(M_PI) / freq;
    if (wl < high_wl) f.push_back(1.0f);
    else if (wl > low_wl) f.push_back(factor);
    else {
      float smooth = (old_ctx / wl - low) / (high - low);
      f.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return f;
}

// Reads the vocabulary file of spec s and returns, in *out, a new gguf context holding only its
// tokenizer keys, with chat_template as tokenizer.chat_template (empty: the vocabulary's own, or a
// plain ChatML / Llama 3 one when it has none); *n_vocab is its token count.
// IOError when the file cannot be read, Corruption when it has no token list; *out is then null.
// The caller owns *out (gguf_free).
Status OpenVocabulary(const ModelSpec& s, const std::string& vocab_path, const std::string& chat_template,
                      gguf_context** out, int64_t* n_vocab) {
  *out = nullptr;
  gguf_init_params vp{true, nullptr};
  gguf_context* vocab = nullptr;
  {
    LogCapture cap;
    vocab = gguf_init_from_file(vocab_path.c_str(), vp);
    if (!vocab) return Status::IOError("cannot read vocabulary " + vocab_path + ": " + cap.text());
  }
  int64_t tok_key = gguf_find_key(vocab, "tokenizer.ggml.tokens");
  if (tok_key < 0) {
    gguf_free(vocab);
    return Status::Corruption(vocab_path + " has no tokenizer.ggml.tokens");
  }
  *n_vocab = int64_t(gguf_get_arr_n(vocab, tok_key));

  gguf_context* g = gguf_init_empty();
  gguf_set_kv(g, vocab);
  gguf_free(vocab);
  // Keep only the tokenizer from the vocabulary file.
  for (int64_t i = gguf_get_n_kv(g) - 1; i >= 0; --i) {
    std::string k = gguf_get_key(g, i);
    if (k.rfind("tokenizer.", 0) != 0) gguf_remove_key(g, k.c_str());
  }
  if (!chat_template.empty())
    gguf_set_val_str(g, "tokenizer.chat_template", chat_template.c_str());
  else if (gguf_find_key(g, "tokenizer.chat_template") < 0)
    gguf_set_val_str(g, "tokenizer.chat_template", s.vocab == "llama-bpe" ? kLlama3Template : kChatmlTemplate);
  *out = g;
  return Status::Ok();
}

// The general.* and <arch>.* keys of spec s, in the order llama.cpp's converter writes them.
void SetHyperParams(gguf_context* g, const ModelSpec& s, const SynthOptions& o, int64_t n_vocab) {
  const std::string a = s.arch + ".";
  gguf_set_val_str(g, "general.architecture", s.arch.c_str());
  gguf_set_val_str(g, "general.name", (s.real_name + " (mzcache synthetic, random weights)").c_str());
  gguf_set_val_u32(g, "general.file_type", uint32_t(FileType(o.type)));
  gguf_set_val_u32(g, "general.quantization_version", 2);
  gguf_set_val_u32(g, (a + "context_length").c_str(), uint32_t(s.n_ctx_train));
  gguf_set_val_u32(g, (a + "embedding_length").c_str(), uint32_t(s.n_embd));
  gguf_set_val_u32(g, (a + "block_count").c_str(), uint32_t(s.n_layer));
  gguf_set_val_u32(g, (a + "feed_forward_length").c_str(), uint32_t(s.n_ff));
  gguf_set_val_u32(g, (a + "attention.head_count").c_str(), uint32_t(s.n_head));
  gguf_set_val_u32(g, (a + "attention.head_count_kv").c_str(), uint32_t(s.n_head_kv));
  gguf_set_val_u32(g, (a + "attention.key_length").c_str(), uint32_t(s.head_dim));
  gguf_set_val_u32(g, (a + "attention.value_length").c_str(), uint32_t(s.head_dim));
  gguf_set_val_u32(g, (a + "rope.dimension_count").c_str(), uint32_t(s.head_dim));
  gguf_set_val_f32(g, (a + "rope.freq_base").c_str(), s.rope_base);
  gguf_set_val_f32(g, (a + "attention.layer_norm_rms_epsilon").c_str(), s.rms_eps);
  if (s.arch == "llama") gguf_set_val_u32(g, (a + "vocab_size").c_str(), uint32_t(n_vocab));
}

// Tensor plan, in the order llama.cpp's converter writes them (base tensors, then layer by layer).
std::vector<TensorPlan> PlanTensors(const ModelSpec& s, const SynthOptions& o, int64_t n_vocab) {
  const int64_t E = s.n_embd, Q = int64_t(s.n_head) * s.head_dim, KV = int64_t(s.n_head_kv) * s.head_dim,
                F = s.n_ff, D = s.head_dim;
  std::vector<TensorPlan> plan;
  int il = -1;  // the layer of the matrices being planned (-1: token_embd, output)
  auto mat = [&](const std::string& name, int64_t ne0, int64_t ne1, float stdev) {
    plan.push_back({name, MatrixType(o.type, name, il, s.n_layer, s.tied, ne0), {ne0, ne1}, Init::kUniform,
                    stdev * std::sqrt(3.0f), {}});
  };
  auto vec = [&](const std::string& name, int64_t n, Init init, float w) {
    plan.push_back({name, GGML_TYPE_F32, {n}, init, w, {}});
  };
  // Logit scale ~4 (std of the output head times sqrt(E)) keeps top-1 margins well above kernel
  // rounding differences, so greedy generation is a meaningful comparison.
  mat("token_embd.weight", E, n_vocab, 4.0f / std::sqrt(float(E)));
  if (s.llama3_rope) {
    plan.push_back({"rope_freqs.weight", GGML_TYPE_F32, {D / 2}, Init::kConst, 0, Llama3RopeFactors(s.head_dim, s.rope_base)});
  }
  vec("output_norm.weight", E, Init::kNorm, 0.1f);
  if (!s.tied) mat("output.weight", E, n_vocab, 4.0f / std::sqrt(float(E)));
  for (il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    vec(p + "attn_norm.weight", E, Init::kNorm, 0.1f);
    mat(p + "attn_q.weight", E, Q, 1.0f / std::sqrt(float(E)));
    mat(p + "attn_k.weight", E, KV, 1.0f / std::sqrt(float(E)));
    mat(p + "attn_v.weight", E, KV, 1.0f / std::sqrt(float(E)));
    if (s.arch == "qwen2") {
      vec(p + "attn_q.bias", Q, Init::kUniform, 0.2f);
      vec(p + "attn_k.bias", KV, Init::kUniform, 0.2f);
      vec(p + "attn_v.bias", KV, Init::kUniform, 0.2f);
    }
    if (s.arch == "qwen3") {
      vec(p + "attn_q_norm.weight", D, Init::kNorm, 0.1f);
      vec(p + "attn_k_norm.weight", D, Init::kNorm, 0.1f);
    }
    mat(p + "attn_output.weight", Q, E, 1.0f / std::sqrt(float(Q)));
    vec(p + "ffn_norm.weight", E, Init::kNorm, 0.1f);
    mat(p + "ffn_gate.weight", E, F, 1.0f / std::sqrt(float(E)));
    mat(p + "ffn_up.weight", E, F, 1.0f / std::sqrt(float(E)));
    mat(p + "ffn_down.weight", F, E, 1.0f / std::sqrt(float(F)));
  }
  return plan;
}

// Rows [a0, a1) of tensor t as f32 into buf ((a1 - a0) * ne0 floats), each row from its own seed
// (tseed and the row index), so the values do not depend on how rows are split among threads.
void FillRows(const TensorPlan& t, uint64_t tseed, int64_t ne0, int64_t a0, int64_t a1, float* buf) {
  for (int64_t r = a0; r < a1; ++r) {
    uint64_t rs = tseed + uint64_t(r) * 0x2545f4914f6cdd1dull;
    float* row = buf + (r - a0) * ne0;
    for (int64_t i = 0; i < ne0; ++i) {
      float u = float(SplitMix(rs) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
      switch (t.init) {
        case Init::kUniform: row[i] = u * t.scale; break;
        case Init::kNorm: row[i] = 1.0f + u * t.scale; break;
        case Init::kConst: row[i] = t.values[size_t(i)]; break;
      }
    }
  }
}

// Fills, converts to t.type and writes tensor x (plan entry t) at file offset off, in batches of
// block_rows rows per thread over o.threads threads. Adds the bytes written to *written and reports
// o.progress(*written, total) after each batch. Stops at the first failing write and returns it.
Status WriteTensor(Env* env, File* f, const TensorPlan& t, const ggml_tensor* x, uint64_t off, uint64_t tseed,
                   const SynthOptions& o, uint64_t total, uint64_t* written) {
  const int nthreads = std::max(1, o.threads);
  const int64_t ne0 = t.ne[0], nrows = ggml_nrows(x);
  const int64_t block_rows = std::max<int64_t>(1, (int64_t(4) << 20) / (ne0 * 4));
  const size_t row_bytes = ggml_row_size(t.type, ne0);
  std::vector<uint8_t> out;
  Status st = Status::Ok();
  for (int64_t r0 = 0; st.ok() && r0 < nrows; r0 += block_rows * nthreads) {
    const int64_t r1 = std::min(nrows, r0 + block_rows * nthreads);
    out.resize(size_t(r1 - r0) * row_bytes);
    auto slice = [&](int th) {
      std::vector<float> buf(size_t(block_rows * ne0));
      const int64_t a0 = r0 + th * block_rows, a1 = std::min(r1, a0 + block_rows);
      if (a0 >= a1) return;
      FillRows(t, tseed, ne0, a0, a1, buf.data());
      uint8_t* dst = out.data() + size_t(a0 - r0) * row_bytes;
      if (t.type == GGML_TYPE_F32) std::memcpy(dst, buf.data(), size_t(a1 - a0) * ne0 * 4);
      else if (t.type == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(buf.data(), reinterpret_cast<ggml_fp16_t*>(dst), (a1 - a0) * ne0);
      else ggml_quantize_chunk(t.type, buf.data(), dst, 0, a1 - a0, ne0, nullptr);
    };
    ggml_quantize_init(t.type);
    // Slices are pulled from a counter, so a thread the OS refuses leaves none undone.
    std::atomic<int> next_slice{0};
    RunOnThreads(env, nthreads, [&](int) {
      for (int th; (th = next_slice.fetch_add(1)) < nthreads;) slice(th);
    });
    st = f->Write(out.data(), out.size(), off + uint64_t(r0) * row_bytes);
    *written += out.size();
    if (o.progress) o.progress(*written, total);
  }
  return st;
}

}  // namespace

namespace {
// The GGUF of spec s with recipe o.type, planned: *g its metadata and tensor infos (the caller frees
// *g and *meta), *plan and *tensors in file order, *total the tensors' bytes.
Status PlanFile(const ModelSpec& s, const SynthOptions& o, gguf_context** g, ggml_context** meta,
                std::vector<TensorPlan>* plan, std::vector<ggml_tensor*>* tensors, uint64_t* total) {
  InitLibraryLogging();
  if (!KnownRecipe(o.type))
    return Status::InvalidArgument("weight type '" + o.type + "' (use f16, q8_0, q4_0, q4_k, q4_k_m or q3_k_m)");
  int64_t n_vocab = 0;
  MZ_RETURN_IF_ERROR(OpenVocabulary(s, o.vocab_dir + "/ggml-vocab-" + s.vocab + ".gguf", o.chat_template, g, &n_vocab));
  SetHyperParams(*g, s, o, n_vocab);
  *plan = PlanTensors(s, o, n_vocab);
  ggml_init_params ip{(plan->size() + 4) * ggml_tensor_overhead(), nullptr, true};
  *meta = ggml_init(ip);
  *total = 0;
  for (const auto& t : *plan) {
    ggml_tensor* x = ggml_new_tensor(*meta, t.type, int(t.ne.size()), t.ne.data());
    ggml_set_name(x, t.name.c_str());
    gguf_add_tensor(*g, x);
    tensors->push_back(x);
    *total += ggml_nbytes(x);
  }
  return Status::Ok();
}
}  // namespace

Status PlanModelFile(const ModelSpec& s, const SynthOptions& o, ModelFilePlan* out) {
  gguf_context* g = nullptr;
  ggml_context* meta = nullptr;
  std::vector<TensorPlan> plan;
  std::vector<ggml_tensor*> tensors;
  uint64_t total = 0;
  Status st = PlanFile(s, o, &g, &meta, &plan, &tensors, &total);
  if (st.ok()) {
    *out = ModelFilePlan();
    const uint64_t data_off = gguf_get_meta_size(g);
    const uint64_t last = data_off + gguf_get_tensor_offset(g, int64_t(plan.size() - 1)) + ggml_nbytes(tensors.back());
    out->file_bytes = AlignUp(last, gguf_get_alignment(g));
    out->tensor_bytes = total;
    for (size_t i = 0; i < plan.size(); ++i) {
      const uint64_t b = ggml_nbytes(tensors[i]);
      out->params += uint64_t(ggml_nelements(tensors[i]));
      out->bytes_by_type[ggml_type_name(plan[i].type)] += b;
      out->tensors.push_back({plan[i].name, ggml_type_name(plan[i].type), tensors[i]->ne[0], tensors[i]->ne[1], b});
      if (plan[i].name == "token_embd.weight") out->token_embd_bytes = b, out->n_vocab = tensors[i]->ne[1];
    }
    out->bits_per_weight = out->params ? 8.0 * double(total) / double(out->params) : 0.0;
  }
  if (meta) ggml_free(meta);
  if (g) gguf_free(g);
  return st;
}

Status SynthesizeModel(Env* env, const ModelSpec& s, const SynthOptions& o, const std::string& path) {
  gguf_context* g = nullptr;
  ggml_context* meta = nullptr;
  std::vector<TensorPlan> plan;
  std::vector<ggml_tensor*> tensors;
  uint64_t total = 0;
  if (Status ps = PlanFile(s, o, &g, &meta, &plan, &tensors, &total); !ps.ok()) {
    if (meta) ggml_free(meta);
    if (g) gguf_free(g);
    return ps;
  }

  const std::string tmp = path + ".tmp";
  std::unique_ptr<File> f;
  Status st = env->Open(tmp, OpenMode::kCreateTrunc, false, &f);
  std::vector<uint8_t> header(gguf_get_meta_size(g));
  gguf_get_meta_data(g, header.data());
  if (st.ok()) st = f->Write(header.data(), header.size(), 0);
  const uint64_t data_off = header.size();

  uint64_t written = 0;
  for (size_t ti = 0; st.ok() && ti < plan.size(); ++ti) {
    const uint64_t off = data_off + gguf_get_tensor_offset(g, int64_t(ti));
    const uint64_t tseed = o.seed * 0x9e3779b97f4a7c15ull ^ HashName(plan[ti].name);
    st = WriteTensor(env, f.get(), plan[ti], tensors[ti], off, tseed, o, total, &written);
  }
  if (st.ok()) {
    // Pad to the alignment so every tensor's padded extent lies inside the file.
    const uint64_t last = data_off + gguf_get_tensor_offset(g, int64_t(plan.size() - 1)) + ggml_nbytes(tensors.back());
    st = f->Truncate(AlignUp(last, gguf_get_alignment(g)));
  }
  if (st.ok()) st = f->Sync();
  f.reset();
  ggml_free(meta);
  gguf_free(g);
  if (st.ok()) st = env->Rename(tmp, path);
  if (!st.ok()) {
    env->Remove(tmp);
    return st.With("writing " + path);
  }
  return Status::Ok();
}

}  // namespace mz
