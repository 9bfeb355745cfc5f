// Context: one conversation. Owns the chunked KV cache, the forward pass and the token history;
// borrows the model (which must outlive it). Not thread-safe: one caller at a time.
#pragma once
#include <memory>
#include <vector>

#include "core/status.h"
#include "memory/kv_cache.h"
#include "model/model.h"
#include "runtime/forward.h"

namespace mz {

struct ContextOptions {
  int n_ctx = 8192;
  int kv_chunk_tokens = 256;
  int n_threads = 2;
  int n_ubatch = 512;
};

class Context {
 public:
  Context(Model* model, const ContextOptions& opts);

  // See Forward::Decode. Tokens are appended to history() on success only.
  Status Decode(const int32_t* tokens, int n, bool all_logits);
  const float* logits(int row) const;  // nullptr if out of range
  int n_logit_rows() const;
  void Truncate(int n_keep);

  Model* model() const { return model_; }
  KvCache& kv() { return *kv_; }
  Forward& forward() { return *fwd_; }
  const std::vector<int32_t>& history() const { return history_; }
  const ContextOptions& options() const { return opts_; }

 private:
  Model* model_;
  ContextOptions opts_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<Forward> fwd_;
  std::vector<int32_t> history_;
  std::vector<float> logits_;
};

}  // namespace mz
