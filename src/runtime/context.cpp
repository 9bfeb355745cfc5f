#include "runtime/context.h"

namespace mz {

Context::Context(Model* model, const ContextOptions& opts) : model_(model), opts_(opts) {
  const HParams& hp = model->hparams();
  KvGeometry g;
  g.n_layer = int(hp.n_layer);
  g.n_kv_head = int(hp.n_head_kv);
  g.head_dim = int(hp.head_dim);
  g.chunk_tokens = opts.kv_chunk_tokens;
  kv_ = std::make_unique<KvCache>(model->env(), g, opts.n_ctx);
  ForwardOptions fo;
  fo.n_threads = opts.n_threads;
  fo.n_ubatch = opts.n_ubatch;
  fwd_ = std::make_unique<Forward>(model, kv_.get(), fo);
}

Status Context::Decode(const int32_t* tokens, int n, bool all_logits) {
  MZ_RETURN_IF_ERROR(fwd_->Decode(tokens, n, all_logits, &logits_));
  history_.insert(history_.end(), tokens, tokens + n);
  return Status::Ok();
}

int Context::n_logit_rows() const {
  const size_t nv = model_->hparams().n_vocab;
  return int(logits_.size() / nv);
}

const float* Context::logits(int row) const {
  if (row < 0 || row >= n_logit_rows()) return nullptr;
  return logits_.data() + size_t(row) * model_->hparams().n_vocab;
}

void Context::Truncate(int n_keep) {
  if (n_keep < 0) n_keep = 0;
  if (n_keep >= int(history_.size())) return;
  history_.resize(size_t(n_keep));
  kv_->Truncate(n_keep);
  logits_.clear();
}

}  // namespace mz
