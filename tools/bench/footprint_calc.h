// Memory footprint of model shapes computed from their hyper-parameters alone (no file needed), for
// `bench footprint`: weight bytes of the GGUF that `make-model` would write for a shape and weight
// type, and fp16 KV bytes for a context length. tests/test_bench_tools.cpp checks the weight bytes
// against synthesized files, so this stays in step with src/model/synth.cpp.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/synth.h"

namespace mz::cli {

// Number of tokens in vocab_dir/ggml-vocab-<vocab>.gguf (the tokenizer synthesis copies).
Status VocabSize(const std::string& vocab_dir, const std::string& vocab, int64_t* n_vocab);

struct WeightBytes {
  uint64_t bytes = 0;       // all tensor bytes (what Model::tensor_bytes() reports for the file)
  uint64_t params = 0;      // all tensor elements (tied embeddings counted once)
  uint64_t embd_bytes = 0;  // token embeddings (the paper's "remaining" excludes them)
};
// Tensor bytes of SynthesizeModel(spec, type) with a vocabulary of n_vocab tokens: the same tensor
// list and the same fallback of matrix types whose rows do not divide the block size.
// kInvalidArgument for an unknown type (f16, q8_0, q4_0, q4_k are known).
Status SynthWeightBytes(const ModelSpec& spec, const std::string& type, int64_t n_vocab, WeightBytes* out);
// fp16 K + V bytes of `tokens` tokens over all layers: 2 x n_layer x n_kv_head x head_dim x 2 x tokens.
inline uint64_t KvBytesFor(const ModelSpec& s, uint64_t tokens) {
  return 2ull * uint64_t(s.n_layer) * uint64_t(s.n_head_kv) * uint64_t(s.head_dim) * 2ull * tokens;
}

}  // namespace mz::cli
