#include "runtime/sampler.h"

#include <cmath>
#include <random>
#include <vector>

#include "kernels/sample_row.h"
#include "llama.h"

namespace mz {

Sampler::Sampler(const SamplerParams& p) : p_(p) {
  if (p.temperature <= 0) return;
  if (p.top_k <= 0 && p.top_p >= 1.0f) {
    row_ = true;
    rng_.seed(p.seed == LLAMA_DEFAULT_SEED ? std::random_device{}() : p.seed);
    return;
  }
  chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
  if (p.top_k > 0) llama_sampler_chain_add(chain_, llama_sampler_init_top_k(p.top_k));
  if (p.top_p < 1.0f) llama_sampler_chain_add(chain_, llama_sampler_init_top_p(p.top_p, 1));
  llama_sampler_chain_add(chain_, llama_sampler_init_temp(p.temperature));
  llama_sampler_chain_add(chain_, llama_sampler_init_dist(p.seed));
}

Sampler::~Sampler() {
  if (chain_) llama_sampler_free(chain_);
}

int32_t ArgMax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

int32_t Sampler::SampleRow(const float* logits, int32_t n_vocab) {
  const float mx = kern::RowMax(logits, n_vocab);
  if (!std::isfinite(mx)) return ArgMax(logits, n_vocab);
  if (weights_.size() != size_t(n_vocab)) weights_.resize(size_t(n_vocab));
  const double sum = kern::ExpWeights(logits, n_vocab, mx, 1.0f / p_.temperature, weights_.data());
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  const int32_t i = kern::DrawIndex(weights_.data(), n_vocab, u * sum);
  return i >= 0 ? i : ArgMax(logits, n_vocab);
}

int32_t Sampler::Sample(const float* logits, int32_t n_vocab) {
  if (row_) return SampleRow(logits, n_vocab);
  if (!chain_) return ArgMax(logits, n_vocab);
  if (cand_.size() != size_t(n_vocab)) cand_.resize(size_t(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand_[size_t(i)] = {i, logits[i], 0.0f};
  llama_token_data_array arr{cand_.data(), cand_.size(), -1, false};
  llama_sampler_apply(chain_, &arr);
  return arr.data[arr.selected].id;
}

}  // namespace mz
