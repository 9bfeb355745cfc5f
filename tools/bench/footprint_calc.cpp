#include "tools/bench/footprint_calc.h"

#include <vector>

#include "core/ggml_log.h"
#include "ggml.h"
#include "gguf.h"

namespace mz::cli {

Status VocabSize(const std::string& vocab_dir, const std::string& vocab, int64_t* n_vocab) {
  InitLibraryLogging();
  const std::string path = vocab_dir + "/ggml-vocab-" + vocab + ".gguf";
  gguf_init_params p{true, nullptr};
  LogCapture cap;
  gguf_context* g = gguf_init_from_file(path.c_str(), p);
  if (!g) return Status::IOError("cannot read vocabulary " + path + ": " + cap.text());
  const int64_t k = gguf_find_key(g, "tokenizer.ggml.tokens");
  *n_vocab = k < 0 ? 0 : int64_t(gguf_get_arr_n(g, k));
  gguf_free(g);
  if (k < 0) return Status::Corruption(path + " has no tokenizer.ggml.tokens");
  return Status::Ok();
}

Status SynthWeightBytes(const ModelSpec& s, const std::string& type, int64_t n_vocab, WeightBytes* out) {
  ggml_type want;
  if (type == "f16") want = GGML_TYPE_F16;
  else if (type == "q8_0") want = GGML_TYPE_Q8_0;
  else if (type == "q4_0") want = GGML_TYPE_Q4_0;
  else if (type == "q4_k") want = GGML_TYPE_Q4_K;
  else return Status::InvalidArgument("weight type '" + type + "' (use f16, q8_0, q4_0 or q4_k)");
  *out = WeightBytes();
  auto add = [&](ggml_type t, int64_t ne0, int64_t ne1) {
    const uint64_t b = uint64_t(ggml_row_size(t, ne0)) * uint64_t(ne1);
    out->bytes += b;
    out->params += uint64_t(ne0) * uint64_t(ne1);
    return b;
  };
  // Matrices: rows not divisible by the block size fall back as llama.cpp's quantizer (and synth) do.
  auto mat = [&](int64_t ne0, int64_t ne1) {
    ggml_type t = want;
    if (ne0 % ggml_blck_size(t) != 0) t = (ne0 % 32 == 0) ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
    return add(t, ne0, ne1);
  };
  auto vec = [&](int64_t n) { add(GGML_TYPE_F32, n, 1); };
  const int64_t E = s.n_embd, Q = int64_t(s.n_head) * s.head_dim, KV = int64_t(s.n_head_kv) * s.head_dim,
                F = s.n_ff, D = s.head_dim;
  out->embd_bytes = mat(E, n_vocab);
  if (s.llama3_rope) vec(D / 2);
  vec(E);  // output_norm
  if (!s.tied) mat(E, n_vocab);
  for (int il = 0; il < s.n_layer; ++il) {
    vec(E);  // attn_norm
    mat(E, Q);
    mat(E, KV);
    mat(E, KV);
    if (s.arch == "qwen2") vec(Q), vec(KV), vec(KV);
    if (s.arch == "qwen3") vec(D), vec(D);
    mat(Q, E);
    vec(E);  // ffn_norm
    mat(E, F);
    mat(E, F);
    mat(F, E);
  }
  return Status::Ok();
}

}  // namespace mz::cli
