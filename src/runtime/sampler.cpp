#include "runtime/sampler.h"

#include <vector>

#include "llama.h"

namespace mz {

Sampler::Sampler(const SamplerParams& p) : p_(p) {
  if (p.temperature <= 0) return;
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

int32_t Sampler::Sample(const float* logits, int32_t n_vocab) {
  if (!chain_) return ArgMax(logits, n_vocab);
  if (cand_.size() != size_t(n_vocab)) cand_.resize(size_t(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) cand_[size_t(i)] = {i, logits[i], 0.0f};
  llama_token_data_array arr{cand_.data(), cand_.size(), -1, false};
  llama_sampler_apply(chain_, &arr);
  return arr.data[arr.selected].id;
}

}  // namespace mz
