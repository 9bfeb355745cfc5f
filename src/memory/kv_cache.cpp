#include "memory/kv_cache.h"

namespace mz {

KvCache::KvCache(Env* env, const KvGeometry& g, int n_ctx_max)
    : env_(env), g_(g), n_ctx_max_(n_ctx_max), chunks_(size_t(g.n_layer)), kptr_(size_t(g.n_layer)),
      vptr_(size_t(g.n_layer)), qptr_(size_t(g.n_layer)), qrows_(size_t(g.n_layer)) {}

KvCache::~KvCache() { Truncate(0); }

void KvCache::RefreshView(int layer, int c) {
  uint16_t* p = chunks_[layer][c];
  if (g_.q8()) {  // a resident q8 chunk is read in place with rows = chunk_tokens
    kptr_[layer][c] = vptr_[layer][c] = nullptr;
    if (p) {
      qptr_[layer][c] = reinterpret_cast<const uint8_t*>(p);
      qrows_[layer][c] = g_.chunk_tokens;
    }
    return;
  }
  kptr_[layer][c] = p;
  vptr_[layer][c] = p ? p + g_.block_elems() : nullptr;
  if (p) {
    qptr_[layer][c] = nullptr;
    qrows_[layer][c] = 0;
  }
}

bool KvCache::any_compressed(int layer) const {
  for (const uint8_t* q : qptr_[layer])
    if (q) return true;
  return false;
}

Status KvCache::Reserve(int tokens) {
  if (tokens > n_ctx_max_)
    return Status::ContextFull("context of " + std::to_string(tokens) + " tokens exceeds n_ctx " +
                               std::to_string(n_ctx_max_));
  const int need = n_chunks_for(tokens);
  for (int l = 0; l < g_.n_layer; ++l) {
    while (int(chunks_[l].size()) < need) {
      void* p = env_->MapAnon(g_.chunk_bytes());
      if (!p) return Status::NoMemory("allocating a KV chunk of " + std::to_string(g_.chunk_bytes()) + " bytes");
      chunks_[l].push_back(static_cast<uint16_t*>(p));
      kptr_[l].push_back(nullptr);
      vptr_[l].push_back(nullptr);
      qptr_[l].push_back(nullptr);
      qrows_[l].push_back(0);
      RefreshView(l, int(chunks_[l].size()) - 1);
    }
  }
  return Status::Ok();
}

Status KvCache::ReserveUnbacked(int tokens) {
  if (tokens > n_ctx_max_)
    return Status::ContextFull("context of " + std::to_string(tokens) + " tokens exceeds n_ctx " +
                               std::to_string(n_ctx_max_));
  const size_t need = size_t(n_chunks_for(tokens));
  for (int l = 0; l < g_.n_layer; ++l) {
    chunks_[l].resize(need, nullptr);
    kptr_[l].resize(need, nullptr);
    vptr_[l].resize(need, nullptr);
    qptr_[l].resize(need, nullptr);
    qrows_[l].resize(need, 0);
  }
  return Status::Ok();
}

void KvCache::Truncate(int tokens) {
  const int keep = n_chunks_for(tokens);
  for (int l = 0; l < g_.n_layer; ++l) {
    while (int(chunks_[l].size()) > keep) {
      env_->Unmap(chunks_[l].back(), g_.chunk_bytes());
      chunks_[l].pop_back();
      kptr_[l].pop_back();
      vptr_[l].pop_back();
      qptr_[l].pop_back();
      qrows_[l].pop_back();
    }
  }
  if (n_tokens_ > tokens) n_tokens_ = tokens;
}

uint16_t* KvCache::ReleaseChunk(int layer, int c) {
  uint16_t* p = chunks_[layer][c];
  chunks_[layer][c] = nullptr;
  if (p && qptr_[layer][c] == reinterpret_cast<const uint8_t*>(p)) {  // q8: the view of the chunk itself
    qptr_[layer][c] = nullptr;
    qrows_[layer][c] = 0;
  }
  RefreshView(layer, c);
  return p;
}

KvLayerView KvCache::view(int layer, int n_kv) const {
  KvLayerView v;
  v.k_chunks = kptr_[layer].data();
  v.v_chunks = vptr_[layer].data();
  v.n_chunks = int(kptr_[layer].size());
  v.chunk_tokens = g_.chunk_tokens;
  v.n_kv_head = g_.n_kv_head;
  v.head_dim = g_.head_dim;
  v.n_kv = n_kv;
  if (g_.q8() || any_compressed(layer)) {
    v.q8_chunks = qptr_[layer].data();
    v.q8_rows = qrows_[layer].data();
  }
  return v;
}

uint64_t KvCache::resident_bytes() const {
  uint64_t n = 0;
  for (const auto& l : chunks_)
    for (auto* p : l) n += p ? g_.chunk_bytes() : 0;
  return n;
}

}  // namespace mz
