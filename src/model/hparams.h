// Hyper-parameters of a decoder-only transformer, read from GGUF metadata.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

struct gguf_context;

namespace mz {

enum class Arch { kLlama, kQwen2, kQwen3 };
const char* ArchName(Arch a);

// RoPE flavour, as ggml's `mode` argument: llama rotates adjacent pairs (0), qwen rotates halves (NEOX, 2).
enum class RopeType : int { kNorm = 0, kNeox = 2 };

struct HParams {
  Arch arch = Arch::kLlama;
  std::string name;          // general.name
  uint32_t n_vocab = 0;      // rows of token_embd
  uint32_t n_ctx_train = 0;
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;     // key_length == value_length (required equal here)
  uint32_t n_ff = 0;
  uint32_t n_rot = 0;        // rope dimension count (== head_dim for supported models)
  float rms_eps = 1e-6f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  RopeType rope_type = RopeType::kNorm;
  bool qk_norm = false;      // qwen3: RMSNorm on q and k per head
  bool qkv_bias = false;     // qwen2: bias on q, k, v projections
  bool tied_output = false;  // no output.weight: token_embd is the output head
  bool rope_freqs = false;   // llama3: rope_freqs.weight frequency factors

  uint32_t n_embd_q() const { return n_head * head_dim; }
  uint32_t n_embd_kv() const { return n_head_kv * head_dim; }
  // fp16 K+V bytes one token costs over all layers.
  uint64_t kv_bytes_per_token() const { return 2ull * n_layer * n_head_kv * head_dim * 2; }
};

// Reads and validates hyper-parameters. Unsupported architecture or inconsistent values are a
// clear error (kUnsupported / kCorruption).
Status ReadHParams(const gguf_context* g, HParams* hp);

}  // namespace mz
