// Sampler: greedy, or temperature / top-k / top-p with a seed, over one row of logits. With a top-k
// or top-p cut it is libllama's sampler chain; with neither (temperature alone: OpenAI's defaults)
// it draws from the whole row itself (kernels/sample_row.h: no copy into token records, no sort,
// vectorized exp), with the same law: token i with probability exp(l_i / T) / sum_j exp(l_j / T),
// a NaN logit never drawn. The draw takes one uniform double from a std::mt19937 seeded with
// `seed` (0xFFFFFFFF: a random seed, as libllama's LLAMA_DEFAULT_SEED), so a seed gives the same
// tokens run after run on one build. A row with no finite maximum (+inf, or every logit -inf or
// NaN) gives ArgMax. Not thread-safe (keeps RNG state).
#pragma once
#include <cstdint>
#include <random>
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
  int32_t SampleRow(const float* logits, int32_t n_vocab);

  SamplerParams p_;
  llama_sampler* chain_ = nullptr;  // with a top-k or top-p cut
  bool row_ = false;                // temperature alone: SampleRow
  std::mt19937 rng_;                // SampleRow's
  std::vector<float> weights_;      // SampleRow's (n_vocab entries, kept between tokens)
  // The candidates of the last Sample (n_vocab entries: 1.8 MB for Qwen3's 152k), kept so that a
  // token costs no allocation and no zero-fill of a vocabulary-sized array.
  std::vector<llama_token_data> cand_;
};

// Index of the largest logit (lowest index on ties).
int32_t ArgMax(const float* logits, int32_t n);

}  // namespace mz
