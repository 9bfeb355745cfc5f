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
  SwapExtent ext;           // stored copy in the store's swap file (valid while evicted there)
  SwapExtent fext;          // durable copy in a chunk file (valid once AdoptFile gave one)
  // The chunk file fext lies in, and its encoding: per unit, because a chunk file can be replaced
  // at the same path (its last name dropped, then written again) while units hold the old one open.
  std::shared_ptr<SwapFile> file;
  std::shared_ptr<KvCodec> file_codec;
  uint64_t file_gen = 0;  // the caller's name for that file (AdoptFile's gen)
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
  u.fext = SwapExtent();
  u.file.reset();
  u.file_codec.reset();
  u.file_gen = 0;
  u.refs = u.pins = 0;
  u.lost = false;
}

SharedChunkStore::ChunkMap::iterator SharedChunkStore::NewChunkLocked(uint64_t hash, uint64_t parent,
                                                                      const int32_t* tokens, int index) {
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
  return chunks_.emplace(hash, std::move(c)).first;
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
    it = NewChunkLocked(hash, parent, tokens, index);
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
  void* mem = env_->MapAnon(g_.chunk_bytes());
  if (!mem) return Status::NoMemory("restoring " + name);
  Status st = ReadStoredLocked(u, static_cast<uint16_t*>(mem));
  if (!st.ok()) {
    env_->Unmap(mem, g_.chunk_bytes());
    return st.With("restoring " + name);
  }
  if (u.ext.valid()) swap_->Free(u.ext);
  u.ext = SwapExtent();
  u.mem = static_cast<uint16_t*>(mem);
  return Status::Ok();
}

Status SharedChunkStore::ReadStoredLocked(Unit& u, uint16_t* dst) {
  const std::string name = "shared chunk " + std::to_string(u.chunk->hash) + " layer " + std::to_string(u.layer);
  if (u.lost) return Status::Corruption(name + " was lost (its stored copy failed verification)");
  // The store's own swap copy first (written by Evict from RAM), else the durable chunk file.
  const bool own = swap_ && u.ext.valid();
  const bool file = !own && u.file && u.fext.valid();
  if (!own && !file) return Status::Internal(name + ": neither resident nor stored");
  const SwapExtent& e = own ? u.ext : u.fext;
  std::vector<uint8_t> buf(e.size);
  Status st = own ? swap_->Read(e, buf.data()) : u.file->Read(e, buf.data());
  if (st.ok())
    st = (own ? *codec_ : *u.file_codec).Decode(Shape(u.layer), buf.data(), buf.size(), dst);
  if (st.code() == Status::kCorruption) {
    u.lost = true;
    const LostFile lf{u.chunk->hash, u.file_gen};
    if (file && std::find(lost_files_.begin(), lost_files_.end(), lf) == lost_files_.end()) lost_files_.push_back(lf);
  }
  return st.With(std::string("reading ") + name + (file ? " from its chunk file" : ""));
}

void SharedChunkStore::SetFileGate(FileGate gate) {
  std::lock_guard<std::mutex> lk(mu_);
  gate_ = std::move(gate);
}

Status SharedChunkStore::AwaitFile(Unit& u) {
  FileGate gate;
  uint64_t hash, gen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!gate_ || u.mem || u.lost || (swap_ && u.ext.valid()) || !u.file || !u.fext.valid()) return Status::Ok();
    gate = gate_;
    hash = u.chunk->hash;
    gen = u.file_gen;
  }
  Status st = gate(hash, gen, u.layer);
  if (st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  if (u.file_gen == gen && !u.mem && !(swap_ && u.ext.valid())) {
    u.lost = true;
    const LostFile lf{hash, gen};
    if (std::find(lost_files_.begin(), lost_files_.end(), lf) == lost_files_.end()) lost_files_.push_back(lf);
  }
  return Status::Corruption("shared chunk " + std::to_string(hash) + " layer " + std::to_string(u.layer) +
                            ": its chunk file never arrived whole: " + st.message());
}

Status SharedChunkStore::Pin(Ref r, uint16_t** out) {
  MZ_RETURN_IF_ERROR(AwaitFile(*r));
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
  MZ_RETURN_IF_ERROR(AwaitFile(*r));
  std::lock_guard<std::mutex> lk(mu_);
  if (r->mem) {
    std::memcpy(dst, r->mem, g_.chunk_bytes());
    return Status::Ok();
  }
  return ReadStoredLocked(*r, dst);
}

bool SharedChunkStore::Durable(const Unit& u) const {
  // Only a copy in the store's own encoding replaces writing one: a lossless store must not come
  // back through a lossy chunk file.
  return u.fext.valid() && u.file && u.file_codec->name() == codec_->name();
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
  bool need_swap = false;
  for (const Unit* u : order) need_swap = need_swap || !Durable(*u);
  if (need_swap) MZ_RETURN_IF_ERROR(EnsureSwap().With("evicting shared chunks"));
  const ChunkShape sh0 = Shape(0);
  std::vector<uint8_t> buf(codec_->MaxEncodedSize(sh0));
  for (Unit* u : order) {
    if (*freed >= bytes) break;
    if (Durable(*u)) {  // a durable copy in the same encoding exists: nothing to write
      env_->Unmap(u->mem, g_.chunk_bytes());
      u->mem = nullptr;
      *freed += g_.chunk_bytes();
      continue;
    }
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

Status SharedChunkStore::AdoptFile(uint64_t hash, uint64_t parent, const int32_t* tokens, int index,
                                   const std::string& path, const std::string& codec_name,
                                   const std::vector<FilePlace>& places, std::vector<Ref>* refs, uint64_t gen,
                                   bool replace) {
  if (refs) refs->clear();
  if (places.size() != size_t(g_.n_layer))
    return Status::InvalidArgument("chunk file " + path + ": " + std::to_string(places.size()) + " places for " +
                                   std::to_string(g_.n_layer) + " layers");
  std::shared_ptr<KvCodec> codec(MakeKvCodecFor(g_.kv_type, codec_name));
  if (!codec) return Status::InvalidArgument("chunk file " + path + ": unknown codec '" + codec_name + "'");
  for (int l = 0; l < g_.n_layer; ++l) {
    const FilePlace& p = places[size_t(l)];
    if (p.off % kDirectIoAlign || p.size == 0 || p.size > codec->MaxEncodedSize(Shape(l)))
      return Status::InvalidArgument("chunk file " + path + ": layer " + std::to_string(l) + " does not fit its place");
  }
  std::shared_ptr<SwapFile> f;
  {
    std::unique_ptr<SwapFile> uf;
    MZ_RETURN_IF_ERROR(SwapFile::OpenReadOnly(env_, path, opts_.direct_io, &uf));
    f = std::move(uf);
  }
  for (const FilePlace& p : places)
    if (p.off + AlignUp(p.size, kDirectIoAlign) > f->file_bytes())
      return Status::Corruption("chunk file " + path + ": a layer lies past its end (truncated?)");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = chunks_.find(hash);
  if (it != chunks_.end()) {
    const Chunk& c = *it->second;
    if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), tokens))
      return Status::InvalidArgument("shared chunk hash " + std::to_string(hash) + " names other tokens (collision)");
    for (const Unit& u : c.units)
      if (u.refs > 0 && u.lost) return Status::InvalidArgument("shared chunk hash " + std::to_string(hash) + " is lost");
  }
  if (it == chunks_.end() && !refs) return Status::Ok();  // nothing held, nobody to hold it for
  if (it == chunks_.end()) {
    it = NewChunkLocked(hash, parent, tokens, index);
  }
  Chunk& c = *it->second;
  for (int l = 0; l < g_.n_layer; ++l) {
    Unit& u = c.units[size_t(l)];
    if (!u.fext.valid() || replace) {  // else a unit that has a durable copy keeps it (and its file)
      const FilePlace& p = places[size_t(l)];
      u.fext.off = p.off;
      u.fext.len = AlignUp(p.size, kDirectIoAlign);
      u.fext.size = p.size;
      u.fext.hash = p.hash;
      u.file = f;
      u.file_codec = codec;
      u.file_gen = gen;
    }
    if (!refs) continue;
    if (u.refs == 0) c.live++;  // absent until now: held in the file only
    u.refs++;
    refs->push_back(&u);
  }
  return Status::Ok();
}

bool SharedChunkStore::HasFile(uint64_t hash) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = chunks_.find(hash);
  if (it == chunks_.end()) return false;
  for (const Unit& u : it->second->units)
    if (u.file) return true;
  return false;
}

std::vector<SharedChunkStore::LostFile> SharedChunkStore::TakeLostFiles() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<LostFile> out;
  out.swap(lost_files_);
  return out;
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
      } else if (u.fext.valid()) {
        r.units_stored++;
        r.units_file_only++;
      }
      if (u.fext.valid()) r.file_bytes += u.fext.len;
      r.bytes_if_copied += uint64_t(u.refs) * g_.chunk_bytes();
    }
    if (any) r.chunks++;
  }
  return r;
}

}  // namespace mz
