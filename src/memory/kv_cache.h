// KvCache: per-layer K/V storage in fixed-size chunks, each its own anonymous mapping.
//
// Chunk c of layer l holds tokens [c*T, (c+1)*T) with T = chunk_tokens. One chunk is one allocation
// of chunk_bytes(). KV type f16 (the default): the K block followed by the V block, each laid out
// head-major [n_kv_head][T][head_dim] in fp16. KV type q8_0 (store/q8_kv.h): the q8 codec payload
// layout with rows = T (kernels/q8_block.h), which the attention kernel reads in place; its chunk
// pointers are still handed out as uint16_t* (cast them to uint8_t*), k_block / v_block are f16 only. Chunks are allocated as the context grows (Reserve), never n_ctx
// up front. A chunk pointer may be null while its unit is evicted (later issues); compute requires
// every chunk it reads to be resident.
//
// Thread-safety: external synchronization; the compute threads only read chunk pointers and write
// rows of chunks that Reserve made resident.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "kernels/attention.h"
#include "store/q8_kv.h"

namespace mz {

struct KvGeometry {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int chunk_tokens = 256;
  KvType kv_type = KvType::kF16;  // resident chunk format (see above)
  bool q8() const { return kv_type == KvType::kQ8; }
  // One resident chunk (K+V) in bytes: fp16, or the q8 layout (about half) for q8_0.
  uint64_t chunk_bytes() const { return KvChunkBytes(kv_type, n_kv_head, chunk_tokens, head_dim); }
  // One fp16 chunk in bytes, whatever the KV type (the codecs' raw form).
  uint64_t f16_chunk_bytes() const { return KvChunkBytes(KvType::kF16, n_kv_head, chunk_tokens, head_dim); }
  uint64_t block_elems() const { return uint64_t(n_kv_head) * chunk_tokens * head_dim; }
};

class KvCache {
 public:
  KvCache(Env* env, const KvGeometry& g, int n_ctx_max);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvGeometry& geometry() const { return g_; }
  int n_ctx_max() const { return n_ctx_max_; }
  int n_tokens() const { return n_tokens_; }     // valid tokens (positions 0..n_tokens-1)
  int n_chunks() const { return int(chunks_[0].size()); }  // chunks allocated per layer
  int n_chunks_for(int tokens) const { return (tokens + g_.chunk_tokens - 1) / g_.chunk_tokens; }

  // Makes room for `tokens` valid tokens in every layer (allocating chunks). kContextFull past
  // n_ctx_max, kNoMemory if a mapping fails (what was allocated stays, consistent).
  Status Reserve(int tokens);
  // Sets the valid token count (after a successful forward pass). REQUIRES: tokens <= capacity.
  void SetTokens(int tokens) { n_tokens_ = tokens; }
  // Drops tokens >= tokens and frees chunks no longer needed.
  void Truncate(int tokens);

  // A resident chunk's memory (nullptr while evicted). Through a const KvCache (what Context
  // hands out) it is read-only; the forward pass writes rows of resident chunks through its own
  // non-const pointer.
  const uint16_t* chunk(int layer, int c) const { return chunks_[layer][c]; }
  uint16_t* chunk(int layer, int c) { return chunks_[layer][c]; }
  // f16 KV only.
  uint16_t* k_block(int layer, int c) const { return chunks_[layer][c]; }
  uint16_t* v_block(int layer, int c) const { return chunks_[layer][c] + g_.block_elems(); }
  bool chunk_resident(int layer, int c) const { return chunks_[layer][c] != nullptr; }
  // The chunk is evicted but held compressed in memory in a form the attention kernel reads in
  // place (KvLayerView::q8_chunks). Set and cleared by the UnitTable only. (A resident chunk of a
  // q8_0 cache is read through the same view, but is resident, not this.)
  bool chunk_compressed_view(int layer, int c) const { return !chunks_[layer][c] && qptr_[layer][c] != nullptr; }
  // Compute can read chunk c of layer (resident, or a compressed view).
  bool chunk_readable(int layer, int c) const { return chunk_resident(layer, c) || chunk_compressed_view(layer, c); }

  // View for the attention kernel; pointers stay valid until the chunk set changes.
  KvLayerView view(int layer, int n_kv) const;
  uint64_t resident_bytes() const;
  Env* env() const { return env_; }

 private:
  // A chunk's residency and its compressed view are unit state: only the UnitTable (the sole
  // mutator of unit state, memory/unit_table.h) changes them, under the Context's lock.
  friend class UnitTable;
  // Installs / removes a chunk's memory. Set takes ownership of an Env mapping of chunk_bytes()
  // (and clears a compressed view); Release returns the pointer (caller frees or keeps it).
  void SetChunk(int layer, int c, uint16_t* p) { chunks_[layer][c] = p; RefreshView(layer, c); }
  uint16_t* ReleaseChunk(int layer, int c);
  // Compressed view of an evicted chunk (the q8 chunks of the UnitTable's in-memory swap): payload
  // is the q8 codec payload (past the header), owned by the caller and valid until cleared; rows:
  // encoded token rows. SetCompressedView(l, c, nullptr, 0) clears it; SetChunk clears it too.
  void SetCompressedView(int layer, int c, const uint8_t* payload, int rows) {
    qptr_[layer][c] = payload;
    qrows_[layer][c] = payload ? rows : 0;
  }
  void RefreshView(int layer, int c);
  // Extends every layer to the chunks of `tokens` tokens without memory (each new chunk evicted:
  // its pointer null, its unit state the UnitTable's). kContextFull past n_ctx_max. REQUIRES: the
  // cache is empty.
  Status ReserveUnbacked(int tokens);
  Env* env_;
  KvGeometry g_;
  int n_ctx_max_;
  int n_tokens_ = 0;
  std::vector<std::vector<uint16_t*>> chunks_;        // [layer][chunk] -> the chunk: f16, K block then V; q8_0, the q8 payload (kernels/q8_block.h)
  std::vector<std::vector<const uint16_t*>> kptr_, vptr_;  // views for the kernel
  std::vector<std::vector<const uint8_t*>> qptr_;          // compressed views (nullptr: none)
  std::vector<std::vector<int>> qrows_;
  bool any_compressed(int layer) const;
};

}  // namespace mz
