#include "memory/shared_chunks.h"

#include <algorithm>
#include <cstring>

#include "store/q8_kv.h"

namespace mz {

struct SharedChunkStore::Unit {
  Chunk* chunk = nullptr;
  int layer = 0;
  int refs = 0, pins = 0;
  uint16_t* mem = nullptr;  // resident form, or nullptr while on storage
  SwapExtent ext;           // stored copy (valid while on storage)
  bool lost = false;
};

struct SharedChunkStore::Chunk {
  uint64_t hash = 0, parent = 0;
  int index = 0;
  std::vector<int32_t> tokens;
  std::vector<Unit> units;  // [layer]; a unit with refs == 0 is absent
  int live = 0;             // units with refs > 0
};

SharedChunkStore::SharedChunkStore(Env* env, const KvGeometry& g, const SharedChunkOptions& o)
    : env_(env), g_(g), opts_(o) {}

SharedChunkStore::~SharedChunkStore() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& kv : chunks_)
    for (Unit& u : kv.second->units)
      if (u.refs > 0) FreeUnitLocked(u);
  chunks_.clear();
}

Status SharedChunkStore::Init() {
  codec_ = MakeKvCodecFor(g_.kv_type, opts_.codec);
  if (!codec_) return Status::InvalidArgument("unknown KV codec '" + opts_.codec + "' for shared chunks");
  if (opts_.swap_path.empty()) return Status::InvalidArgument("shared chunks: no swap path");
  return Status::Ok();
}

ChunkShape SharedChunkStore::Shape(int layer) const {
  ChunkShape s;
  s.n_kv_head = g_.n_kv_head;
  s.chunk_tokens = g_.chunk_tokens;
  s.head_dim = g_.head_dim;
  s.n_tokens = g_.chunk_tokens;  // shared chunks are full
  s.layer = layer;
  s.n_layer = g_.n_layer;
  return s;
}

Status SharedChunkStore::EnsureSwap() {
  if (swap_) return Status::Ok();
  return SwapFile::Create(env_, opts_.swap_path, opts_.direct_io, &swap_);
}

void SharedChunkStore::FreeUnitLocked(Unit& u) {
  if (u.mem) env_->Unmap(u.mem, g_.chunk_bytes());
  if (u.ext.valid() && swap_) swap_->Free(u.ext);
  u.mem = nullptr;
  u.ext = SwapExtent();
  u.refs = u.pins = 0;
  u.lost = false;
}

SharedChunkStore::Ref SharedChunkStore::Find(uint64_t hash, uint64_t parent, const int32_t* tokens, int layer) {
  if (layer < 0 || layer >= g_.n_layer) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return nullptr;
  Chunk& c = *it->second;
  if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens)) return nullptr;
  Unit& u = c.units[size_t(layer)];
  if (u.refs == 0 || u.lost) return nullptr;
  u.refs++;
  return &u;
}

Status SharedChunkStore::Insert(uint64_t hash, uint64_t parent, const int32_t* tokens, int index, int layer,
                                uint16_t* data, Ref* out) {
  *out = nullptr;
  if (layer < 0 || layer >= g_.n_layer) {
    if (data) env_->Unmap(data, g_.chunk_bytes());
    return Status::InvalidArgument("shared chunk: no layer " + std::to_string(layer));
  }
  std::lock_guard<std::mutex> lk(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) {
    auto c = std::make_unique<Chunk>();
    c->hash = hash;
    c->parent = parent;
    c->index = index;
    c->tokens.assign(tokens, tokens + g_.chunk_tokens);
    c->units.resize(size_t(g_.n_layer));
    for (int l = 0; l < g_.n_layer; ++l) {
      c->units[size_t(l)].chunk = c.get();
      c->units[size_t(l)].layer = l;
    }
    it = chunks_.emplace(hash, std::move(c)).first;
  }
  Chunk& c = *it->second;
  if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens)) {
    env_->Unmap(data, g_.chunk_bytes());
    return Status::InvalidArgument("shared chunk hash " + std::to_string(hash) + " names other tokens (collision)");
  }
  Unit& u = c.units[size_t(layer)];
  if (u.refs > 0) {
    env_->Unmap(data, g_.chunk_bytes());  // added meanwhile: the one copy stays
    // A lost unit stays lost while its borrowers hold it (they report kCorruption): not shared again.
    if (u.lost) return Status::InvalidArgument("shared chunk hash " + std::to_string(hash) + " is lost");
  } else {
    u.mem = data;
    c.live++;
  }
  u.refs++;
  *out = &u;
  return Status::Ok();
}

void SharedChunkStore::AddRef(Ref r) {
  std::lock_guard<std::mutex> lk(mu_);
  r->refs++;
}

void SharedChunkStore::Release(Ref r) {
  std::lock_guard<std::mutex> lk(mu_);
  if (--r->refs > 0) return;
  Chunk* c = r->chunk;
  FreeUnitLocked(*r);
  if (--c->live == 0) chunks_.erase(c->hash);  // the last unit of the chunk: forgotten
}

Status SharedChunkStore::LoadLocked(Unit& u) {
  if (u.mem) return Status::Ok();
  const std::string name = "shared chunk " + std::to_string(u.chunk->hash) + " layer " + std::to_string(u.layer);
  if (u.lost) return Status::Corruption(name + " was lost (its stored copy failed verification)");
  if (!swap_ || !u.ext.valid()) return Status::Internal(name + ": neither resident nor stored");
  void* mem = env_->MapAnon(g_.chunk_bytes());
  if (!mem) return Status::NoMemory("restoring " + name);
  std::vector<uint8_t> buf(u.ext.size);
  Status st = swap_->Read(u.ext, buf.data());
  if (st.ok()) st = codec_->Decode(Shape(u.layer), buf.data(), buf.size(), static_cast<uint16_t*>(mem));
  if (!st.ok()) {
    env_->Unmap(mem, g_.chunk_bytes());
    if (st.code() == Status::kCorruption) u.lost = true;
    return st.With("restoring " + name);
  }
  swap_->Free(u.ext);
  u.ext = SwapExtent();
  u.mem = static_cast<uint16_t*>(mem);
  return Status::Ok();
}

Status SharedChunkStore::Pin(Ref r, uint16_t** out) {
  std::lock_guard<std::mutex> lk(mu_);
  MZ_RETURN_IF_ERROR(LoadLocked(*r));
  r->pins++;
  *out = r->mem;
  return Status::Ok();
}

void SharedChunkStore::Unpin(Ref r) {
  std::lock_guard<std::mutex> lk(mu_);
  r->pins--;
}

Status SharedChunkStore::Read(Ref r, uint16_t* dst) {
  std::lock_guard<std::mutex> lk(mu_);
  if (r->mem) {
    std::memcpy(dst, r->mem, g_.chunk_bytes());
    return Status::Ok();
  }
  const std::string name = "shared chunk " + std::to_string(r->chunk->hash) + " layer " + std::to_string(r->layer);
  if (r->lost) return Status::Corruption(name + " was lost (its stored copy failed verification)");
  if (!swap_ || !r->ext.valid()) return Status::Internal(name + ": neither resident nor stored");
  std::vector<uint8_t> buf(r->ext.size);
  Status st = swap_->Read(r->ext, buf.data());
  if (st.ok()) st = codec_->Decode(Shape(r->layer), buf.data(), buf.size(), dst);
  if (st.code() == Status::kCorruption) r->lost = true;
  return st.With("reading " + name);
}

Status SharedChunkStore::Evict(uint64_t bytes, uint64_t* freed) {
  *freed = 0;
  std::lock_guard<std::mutex> lk(mu_);
  // Rear chunks first (the front of a prefix is what every borrower reads first), rear layers
  // first within a chunk: backward-out, as the contexts evict.
  std::vector<Unit*> order;
  for (auto& kv : chunks_)
    for (Unit& u : kv.second->units)
      if (u.refs > 0 && u.mem && u.pins == 0) order.push_back(&u);
  std::sort(order.begin(), order.end(), [](const Unit* a, const Unit* b) {
    return a->chunk->index != b->chunk->index ? a->chunk->index > b->chunk->index : a->layer > b->layer;
  });
  if (!order.empty()) MZ_RETURN_IF_ERROR(EnsureSwap().With("evicting shared chunks"));
  const ChunkShape sh0 = Shape(0);
  std::vector<uint8_t> buf(codec_->MaxEncodedSize(sh0));
  for (Unit* u : order) {
    if (*freed >= bytes) break;
    const ChunkShape sh = Shape(u->layer);
    buf.resize(codec_->MaxEncodedSize(sh));
    size_t n = 0;
    MZ_RETURN_IF_ERROR(codec_->Encode(sh, u->mem, buf.data(), buf.size(), &n).With("evicting a shared chunk"));
    SwapExtent e;
    MZ_RETURN_IF_ERROR(swap_->Write(buf.data(), n, &e).With("evicting a shared chunk"));
    env_->Unmap(u->mem, g_.chunk_bytes());
    u->mem = nullptr;
    u->ext = e;
    *freed += g_.chunk_bytes();
  }
  return Status::Ok();
}

SharedChunkReport SharedChunkStore::Report() const {
  SharedChunkReport r;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& kv : chunks_) {
    bool any = false;
    for (const Unit& u : kv.second->units) {
      if (u.refs == 0) continue;
      any = true;
      r.units++;
      r.refs += uint64_t(u.refs);
      r.pins += uint64_t(u.pins);
      if (u.lost) r.units_lost++;
      if (u.mem) {
        r.units_resident++;
        r.resident_bytes += g_.chunk_bytes();
      } else if (u.ext.valid()) {
        r.units_stored++;
        r.storage_bytes += u.ext.len;
      }
      r.bytes_if_copied += uint64_t(u.refs) * g_.chunk_bytes();
    }
    if (any) r.chunks++;
  }
  return r;
}

}  // namespace mz
