// Sampler: greedy, or temperature / top-k / top-p with a seed, over one row of logits. Built on
// libllama's sampler chain. Not thread-safe (keeps RNG state).
#pragma once
#include <cstdint>
#include <vector>

struct llama_sampler;
struct llama_token_data;

namespace mz {

struct SamplerParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 40;        // <= 0: disabled
  float top_p = 0.95f;       // >= 1: disabled
  uint32_t seed = 42;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  int32_t Sample(const float* logits, int32_t n_vocab);

 private:
  SamplerParams p_;
  llama_sampler* chain_ = nullptr;
  // The candidates of the last Sample (n_vocab entries: 1.8 MB for Qwen3's 152k), kept so that a
  // token costs no allocation and no zero-fill of a vocabulary-sized array.
  std::vector<llama_token_data> cand_;
};

// Index of the largest logit (lowest index on ties).
int32_t ArgMax(const float* logits, int32_t n);

}  // namespace mz
