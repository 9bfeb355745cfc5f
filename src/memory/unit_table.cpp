#include "memory/unit_table.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/sync_point.h"
#include "core/touch.h"
#include "store/q8_kv.h"

namespace mz {

double MemoryReport::remaining(bool exclude_base) const {
  double num = double(in_memory()), den = double(footprint());
  if (exclude_base) num -= double(base_resident), den -= double(base_total);
  return den > 0 ? num / den : 1.0;
}

UnitTable::UnitTable(Model* model, KvCache* kv, const UnitTableOptions& opts)
    : model_(model), kv_(kv), opts_(opts), slots_(size_t(kv->geometry().n_layer)) {
  stack_ = std::make_unique<CompressedStack>(model->env(), CompressedStack::kDefaultSegmentBytes, opts_.segment_cache);
}

UnitTable::~UnitTable() {
  // Borrowed chunks go back to their store (the KvCache, destroyed after this table, must not
  // unmap the store's memory).
  for (int l = 0; l < int(slots_.size()); ++l)
    for (int c = 0; c < int(slots_[size_t(l)].size()); ++c) {
      KvSlot& s = slots_[size_t(l)][size_t(c)];
      if (s.shared) DropShared(l, c, s);
    }
}

Status UnitTable::Init() {
  codec_ = MakeKvCodecFor(kv_->geometry().kv_type, opts_.codec);  // q8_0 KV: the adapter (store/q8_kv.h)
  if (!codec_) return Status::InvalidArgument("unknown KV codec '" + opts_.codec + "'");
  if (opts_.swap_path.empty()) {
    std::string t;
    MZ_RETURN_IF_ERROR(model_->env()->GetEnvVar("TMPDIR", &t).With("choosing the swap file's folder"));
    opts_.swap_path = (t.empty() ? std::string("/var/tmp") : t) + "/mzcache-" + std::to_string(reinterpret_cast<uintptr_t>(this)) +
                      ".swap";
  }
  return Status::Ok();
}

Status UnitTable::EnsureSwap() {
  if (swap_) return Status::Ok();
  return SwapFile::Create(model_->env(), opts_.swap_path, opts_.direct_io, &swap_);
}

UnitTable::KvSlot& UnitTable::slot(int layer, int chunk) {
  auto& v = slots_[size_t(layer)];
  if (int(v.size()) <= chunk) v.resize(size_t(chunk) + 1);
  return v[size_t(chunk)];
}

const UnitTable::KvSlot* UnitTable::find_slot(int layer, int chunk) const {
  if (layer < 0 || layer >= int(slots_.size())) return nullptr;
  const auto& v = slots_[size_t(layer)];
  return chunk < int(v.size()) ? &v[size_t(chunk)] : nullptr;
}

ChunkShape UnitTable::shape(int layer, int chunk) const {
  const KvGeometry& g = kv_->geometry();
  ChunkShape s;
  s.n_kv_head = g.n_kv_head;
  s.chunk_tokens = g.chunk_tokens;
  s.head_dim = g.head_dim;
  s.n_tokens = std::clamp(kv_->n_tokens() - chunk * g.chunk_tokens, 1, g.chunk_tokens);
  s.layer = layer;
  s.n_layer = g.n_layer;
  return s;
}

UnitState UnitTable::state(const UnitRef& u) const {
  if (u.kind == UnitRef::kWeights)
    return model_->unit(weight_unit(u.layer)).resident() ? UnitState::kResident : UnitState::kWeightsDropped;
  const KvSlot* s = find_slot(u.layer, u.chunk);
  return s ? s->state : UnitState::kResident;
}

UnitState UnitTable::policy_state(const UnitRef& u) const {
  if (u.kind == UnitRef::kKv) {
    const KvSlot* s = find_slot(u.layer, u.chunk);
    if (s && s->shared) return UnitState::kKvShared;
  }
  return state(u);
}

bool UnitTable::shared(int layer, int chunk) const {
  const KvSlot* s = find_slot(layer, chunk);
  return s && s->shared;
}

void UnitTable::DropShared(int layer, int chunk, KvSlot& s) {
  if (s.attached) {
    if (chunk < kv_->n_chunks()) kv_->ReleaseChunk(layer, chunk);
    store_->Unpin(s.shared);
  }
  store_->Release(s.shared);
  s.shared = nullptr;
  s.attached = false;
}

int UnitTable::DetachShared() {
  int n = 0;
  for (int l = 0; l < int(slots_.size()); ++l)
    for (int c = 0; c < int(slots_[size_t(l)].size()); ++c) {
      KvSlot& s = slots_[size_t(l)][size_t(c)];
      if (!s.shared || !s.attached) continue;
      kv_->ReleaseChunk(l, c);
      store_->Unpin(s.shared);
      s.attached = false;
      s.state = UnitState::kKvShared;
      ++n;
    }
  return n;
}

void UnitTable::ForgetSlot(int l, int c, KvSlot& s) {
  if (s.shared) {
    DropShared(l, c, s);
  } else if (s.state == UnitState::kKvMemCompressed) {
    if (c < kv_->n_chunks()) kv_->SetCompressedView(l, c, nullptr, 0);
    stack_->Free(s.h);
  } else if (s.state == UnitState::kKvStorageRaw || s.state == UnitState::kKvStorageCompressed) {
    file_for(s.ext)->Free(s.ext);
  } else if (s.mapped && c < kv_->n_chunks()) {
    UnmapFromSwap(s, /*free_extent=*/true, kv_->ReleaseChunk(l, c));
  }
  // A plain resident chunk's memory is the KvCache's (unmapped by KvCache::Truncate, or by the
  // caller); an evicted chunk's pointer is null.
}

Status UnitTable::ShareChunk(int layer, int chunk, const std::shared_ptr<SharedChunkStore>& store,
                             SharedChunkStore::Ref ref, bool attach) {
  const UnitRef u = UnitRef::Kv(layer, chunk);
  if (!store || !ref) return Status::InvalidArgument("ShareChunk: no store or reference");
  if (store_ && store_ != store) {
    store->Release(ref);
    return Status::InvalidArgument("ShareChunk: " + UnitName(u) + ": the table borrows from another store");
  }
  const KvGeometry& g = kv_->geometry();
  if (!has_chunk(layer, chunk) || (chunk + 1) * g.chunk_tokens > kv_->n_tokens()) {
    store->Release(ref);
    return Status::InvalidArgument("ShareChunk: " + UnitName(u) + " is not a full chunk of the context");
  }
  KvSlot& s = slot(layer, chunk);
  if (s.shared == ref) {  // borrowed already
    store->Release(ref);
    return Status::Ok();
  }
  uint16_t* p = nullptr;
  if (attach) {
    Status st = store->Pin(ref, &p);
    if (!st.ok()) {
      store->Release(ref);
      return st.With("sharing " + UnitName(u));
    }
  }
  store_ = store;
  ForgetSlot(layer, chunk, s);
  if (uint16_t* own = kv_->ReleaseChunk(layer, chunk)) kv_->env()->Unmap(own, g.chunk_bytes());
  s = KvSlot();
  s.shared = ref;
  if (attach) {
    kv_->SetChunk(layer, chunk, p);
    s.attached = true;
    s.state = UnitState::kResident;
  } else {
    s.state = UnitState::kKvShared;
  }
  return Status::Ok();
}

Status UnitTable::AdoptShared(int n_tokens, const std::shared_ptr<SharedChunkStore>& store,
                              const std::vector<SharedChunkStore::Ref>& refs) {
  const KvGeometry& g = kv_->geometry();
  auto release_all = [&] {
    for (auto r : refs)
      if (r && store) store->Release(r);
  };
  const int n = n_tokens < 0 ? -1 : n_tokens / g.chunk_tokens;
  Status bad;
  if (!store || (store_ && store_ != store)) bad = Status::InvalidArgument("AdoptShared: no store, or another store");
  else if (n < 0 || n_tokens % g.chunk_tokens != 0 || refs.size() != size_t(g.n_layer) * size_t(n))
    bad = Status::InvalidArgument("AdoptShared: " + std::to_string(refs.size()) + " chunks for " +
                                  std::to_string(n_tokens) + " tokens of " + std::to_string(g.n_layer) + " layers");
  else if (n_tokens > kv_->n_ctx_max())
    bad = Status::ContextFull("AdoptShared: " + std::to_string(n_tokens) + " tokens exceed n_ctx " +
                              std::to_string(kv_->n_ctx_max()));
  else if (store->geometry().chunk_bytes() != g.chunk_bytes() || store->geometry().n_layer != g.n_layer ||
           store->geometry().chunk_tokens != g.chunk_tokens)
    bad = Status::InvalidArgument("AdoptShared: the store's KV geometry is not the context's");
  for (auto r : refs)
    if (bad.ok() && !r) bad = Status::InvalidArgument("AdoptShared: a null reference");
  if (!bad.ok()) {
    release_all();
    return bad;
  }
  ForgetChunksFrom(0);
  kv_->Truncate(0);
  MZ_RETURN_IF_ERROR(kv_->ReserveUnbacked(n_tokens));  // cannot fail: n_ctx checked above
  store_ = store;
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < n; ++c) {
      KvSlot& s = slot(l, c);
      s = KvSlot();
      s.shared = refs[size_t(l) * size_t(n) + size_t(c)];
      s.state = UnitState::kKvShared;
    }
  kv_->SetTokens(n_tokens);
  return Status::Ok();
}

Status UnitTable::Unshare(int chunk) {
  const KvGeometry& g = kv_->geometry();
  Env* env = kv_->env();
  std::vector<std::pair<int, uint16_t*>> copies;  // (layer, own copy)
  auto free_copies = [&] {
    for (auto& e : copies) env->Unmap(e.second, g.chunk_bytes());
  };
  for (int l = 0; l < g.n_layer; ++l) {
    const KvSlot* s = find_slot(l, chunk);
    if (!s || !s->shared) continue;
    void* p = env->MapAnon(g.chunk_bytes());
    if (!p) {
      free_copies();
      return Status::NoMemory("copying shared " + UnitName(UnitRef::Kv(l, chunk)) + " to write it");
    }
    copies.emplace_back(l, static_cast<uint16_t*>(p));
    Status st = store_->Read(s->shared, copies.back().second);
    if (!st.ok()) {
      free_copies();
      return st.With("copying shared " + UnitName(UnitRef::Kv(l, chunk)) + " to write it");
    }
  }
  for (auto& e : copies) {
    KvSlot& s = slot(e.first, chunk);
    DropShared(e.first, chunk, s);
    s = KvSlot();
    kv_->SetChunk(e.first, chunk, e.second);
  }
  return Status::Ok();
}

KvChunkMemory UnitTable::LocateKv(int layer, int chunk) const {
  KvChunkMemory m;
  const KvSlot* s = find_slot(layer, chunk);
  m.state = s ? s->state : UnitState::kResident;
  m.lost = s && s->lost;
  if (s && s->shared) {  // the store's bytes, not this context's
    m.shared = true;
    m.state = UnitState::kKvShared;
    return m;
  }
  if (m.state == UnitState::kResident) {
    m.addr = kv_->chunk(layer, chunk);
    m.bytes = m.addr ? kv_->geometry().chunk_bytes() : 0;
    m.mapped_from_swap = s && s->mapped;
    m.clean = s && s->mapped && s->clean;
  } else if (m.state == UnitState::kKvMemCompressed) {
    size_t n = 0;
    m.addr = stack_->Get(s->h, &n);
    m.bytes = m.addr ? n : 0;
  }
  if (s && s->ext.valid() && (m.mapped_from_swap || m.state == UnitState::kKvStorageRaw ||
                              m.state == UnitState::kKvStorageCompressed)) {
    const SwapFile* sf = file_for(s->ext);
    m.stored_file = sf ? sf->file() : nullptr;
    m.stored_off = s->ext.off;
    m.stored_len = s->ext.len;
  }
  return m;
}

bool UnitTable::lost(int layer, int chunk) const {
  const KvSlot* s = find_slot(layer, chunk);
  return s && s->lost;
}

Status UnitTable::EvictKv(int layer, int chunk, UnitState target) {
  KvSlot& s = slot(layer, chunk);
  const KvGeometry& g = kv_->geometry();
  const size_t raw = g.chunk_bytes();
  if (s.shared) {
    // A borrowed chunk leaves this context by detaching, whatever the target: its bytes are the
    // store's, which moves them once no borrower has them attached.
    if (s.attached) {
      kv_->ReleaseChunk(layer, chunk);
      store_->Unpin(s.shared);
      s.attached = false;
    }
    s.state = UnitState::kKvShared;
    return Status::Ok();
  }
  if (s.state == UnitState::kKvMemCompressed && target == UnitState::kKvStorageCompressed) {
    // CompKV: move the encoded bytes from the stack to storage.
    MZ_RETURN_IF_ERROR(EnsureSwap());
    size_t n = 0;
    const uint8_t* p = stack_->Get(s.h, &n);
    if (!p) return Status::Internal("swap stack entry missing for " + UnitName(UnitRef::Kv(layer, chunk)));
    SwapExtent e;
    MZ_RETURN_IF_ERROR(swap_->Write(p, n, &e));
    kv_->SetCompressedView(layer, chunk, nullptr, 0);
    stack_->Free(s.h);
    s.h = -1;
    s.ext = e;
    s.state = target;
    return Status::Ok();
  }
  if (s.state != UnitState::kResident)
    return Status::InvalidArgument(UnitName(UnitRef::Kv(layer, chunk)) + ": cannot move from " +
                                   UnitStateName(s.state) + " to " + UnitStateName(target));
  uint16_t* data = kv_->chunk(layer, chunk);
  if (!data) return Status::Internal("resident chunk without memory");
  if (s.mapped && s.clean && target == UnitState::kKvStorageRaw) {
    // The stored copy still equals the chunk: give the memory back, write nothing.
    kv_->ReleaseChunk(layer, chunk);
    UnmapFromSwap(s, /*free_extent=*/false, data);
    s.state = target;
    return Status::Ok();
  }
  // A mapped chunk going elsewhere: its old extent is released once the new copy exists.
  const bool was_mapped = s.mapped;
  const SwapExtent old_ext = s.ext;  // the branches below replace s.ext only once they succeed
  const ChunkShape sh = shape(layer, chunk);
  if (target == UnitState::kKvStorageRaw) {
    MZ_RETURN_IF_ERROR(EnsureSwap());
    SwapExtent e;
    MZ_RETURN_IF_ERROR(swap_->Write(data, raw, &e));
    s.ext = e;
    s.enc_bytes = raw;
  } else if (target == UnitState::kKvMemCompressed || target == UnitState::kKvStorageCompressed) {
    std::vector<uint8_t> buf(codec_->MaxEncodedSize(sh));
    size_t n = 0;
    MZ_RETURN_IF_ERROR(codec_->Encode(sh, data, buf.data(), buf.size(), &n).With(UnitName(UnitRef::Kv(layer, chunk))));
    if (target == UnitState::kKvMemCompressed) {
      MZ_RETURN_IF_ERROR(stack_->Push(buf.data(), n, &s.h));
      if (codec_readable_in_place()) {
        // Compute can read a q8 chunk in place (KvLayerView::q8_chunks): no restore needed first.
        size_t held = 0;
        const uint8_t* p = stack_->Get(s.h, &held);
        if (p && held == n) kv_->SetCompressedView(layer, chunk, p + kKvCodecHeaderBytes, sh.n_tokens);
      }
    } else {
      MZ_RETURN_IF_ERROR(EnsureSwap());
      SwapExtent e;
      MZ_RETURN_IF_ERROR(swap_->Write(buf.data(), n, &e));
      s.ext = e;
    }
    s.enc_bytes = n;
  } else {
    return Status::InvalidArgument("KV chunks cannot be placed in state " + std::string(UnitStateName(target)));
  }
  s.enc_tokens = sh.n_tokens;
  kv_->ReleaseChunk(layer, chunk);
  if (was_mapped) {
    const SwapExtent new_ext = target == UnitState::kKvMemCompressed ? SwapExtent() : s.ext;
    s.ext = old_ext;
    UnmapFromSwap(s, /*free_extent=*/true, data);
    s.ext = new_ext;
  } else {
    kv_->env()->Unmap(data, raw);
  }
  s.state = target;
  return Status::Ok();
}

namespace {
// Each thread's buffer for a blob read from storage before its decode: aligned for direct I/O, so
// the read lands in it in place (SwapFile::ReadPadded), grown to the largest extent seen and kept
// until the thread exits. Per chunk, no fresh zero-filled vector and no bounce buffer (each a new
// mapping whose pages a VM pays for), nor the copy between them. nullptr if it cannot grow.
uint8_t* BlobReadBuffer(size_t n) {
  struct Buf {
    uint8_t* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf b;
  if (b.n < n) {
    std::free(b.p);
    const size_t m = (n + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign;
    b.p = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlign, m));
    b.n = b.p ? m : 0;
  }
  return b.p;
}
}  // namespace

Status UnitTable::RestoreKv(int layer, int chunk, void* mem) {
  KvSlot& s = slot(layer, chunk);
  const KvGeometry& g = kv_->geometry();
  const size_t raw = g.chunk_bytes();
  if (s.state == UnitState::kResident || s.lost) {
    if (mem) kv_->env()->Unmap(mem, raw);
    if (s.lost)
      return Status::Corruption(UnitName(UnitRef::Kv(layer, chunk)) + " was lost (its stored copy failed verification)");
    return Status::Ok();
  }
  if (s.shared) {  // attach: the store's unit, pinned in RAM (restored by the store if it was evicted)
    if (mem) kv_->env()->Unmap(mem, raw);
    uint16_t* p = nullptr;
    Status st = store_->Pin(s.shared, &p);
    if (!st.ok()) {
      if (st.code() == Status::kCorruption) s.lost = true;
      return st.With("attaching shared " + UnitName(UnitRef::Kv(layer, chunk)));
    }
    kv_->SetChunk(layer, chunk, p);
    s.attached = true;
    s.state = UnitState::kResident;
    return Status::Ok();
  }
  if (s.state == UnitState::kKvStorageRaw && RestoresByMapping(UnitRef::Kv(layer, chunk))) {
    // Map the extent over `mem` (address space only: never populated as anonymous memory) and
    // read it through the page cache; verify before compute may see it.
    Env* env = kv_->env();
    if (!mem) mem = env->MapAnon(raw);
    if (!mem) return Status::NoMemory("mapping a KV chunk to restore " + UnitName(UnitRef::Kv(layer, chunk)));
    SwapFile* const sf = file_for(s.ext);
    File* file = sf->file();
    Status st = env->MapFileAt(file, s.ext.off, raw, mem, true);
    if (st.ok()) st = env->PopulateMapped(file, mem, raw, Env::kPopulateSmallPages);
    if (st.ok()) st = sf->Verify(s.ext, mem);
    if (!st.ok()) {
      env->Unmap(mem, raw);
      (void)env->DropCached(file, s.ext.off, s.ext.len);
      if (st.code() == Status::kCorruption) s.lost = true;
      return st.With("restoring " + UnitName(UnitRef::Kv(layer, chunk)));
    }
    kv_->SetChunk(layer, chunk, static_cast<uint16_t*>(mem));
    s.state = UnitState::kResident;
    s.mapped = true;
    s.clean = !s.will_rewrite;  // the extent stays allocated while mapped
    s.will_rewrite = false;
    if (opts_.touch_restored) TouchPages(mem, raw);
    return Status::Ok();
  }
  if (!mem) mem = kv_->env()->MapAnon(raw);
  if (!mem) return Status::NoMemory("allocating a KV chunk to restore " + UnitName(UnitRef::Kv(layer, chunk)));
  uint16_t* dst = static_cast<uint16_t*>(mem);
  ChunkShape sh = shape(layer, chunk);
  sh.n_tokens = s.enc_tokens;
  // The pages this restore and the next pass use (all of them unless the blob is partial), taken
  // before the state changes below. mem is unwritten (RestoreInto's contract): decoding only the
  // valid rows leaves the others reading as zeros, Decode's chunk without touching their pages.
  const std::vector<std::pair<size_t, size_t>> ranges = RestoreRanges(UnitRef::Kv(layer, chunk));
  Status st;
  if (s.state == UnitState::kKvMemCompressed) {
    size_t n = 0;
    const uint8_t* p = stack_->Get(s.h, &n);
    st = p ? codec_->DecodeValid(sh, p, n, dst) : Status::Internal("swap stack entry missing");
  } else if (s.state == UnitState::kKvStorageRaw) {
    st = file_for(s.ext)->Read(s.ext, dst);
  } else {
    uint8_t* buf = BlobReadBuffer(s.ext.len);
    st = buf ? file_for(s.ext)->ReadPadded(s.ext, buf) : Status::NoMemory("a read buffer for a stored KV chunk");
    if (st.ok()) st = codec_->DecodeValid(sh, buf, s.ext.size, dst);
  }
  if (!st.ok()) {
    kv_->env()->Unmap(mem, raw);
    if (st.code() == Status::kCorruption) {
      s.lost = true;
      kv_->SetCompressedView(layer, chunk, nullptr, 0);  // never read a copy that failed its checks
    }
    return st.With("restoring " + UnitName(UnitRef::Kv(layer, chunk)));
  }
  // Install the fp16 chunk (which also clears a compressed view) before freeing the stored copy.
  kv_->SetChunk(layer, chunk, dst);
  if (s.state == UnitState::kKvMemCompressed) stack_->Free(s.h);
  else file_for(s.ext)->Free(s.ext);
  s.h = -1;
  s.ext = SwapExtent();
  s.enc_bytes = 0;
  s.state = UnitState::kResident;
  s.will_rewrite = false;  // an anonymous chunk is written whole at its next eviction anyway
  if (opts_.touch_restored)
    for (const auto& [off, len] : ranges) TouchPages(reinterpret_cast<const char*>(dst) + off, len);
  return Status::Ok();
}

Status UnitTable::ReserveLoad(int layer, int chunk, LoadSlot* out) {
  *out = LoadSlot();
  const KvSlot* s = find_slot(layer, chunk);
  if (!s || s->state != UnitState::kKvStorageCompressed)
    return Status::InvalidArgument(UnitName(UnitRef::Kv(layer, chunk)) + ": not compressed on storage");
  MZ_RETURN_IF_ERROR(stack_->Reserve(s->ext.size, s->ext.len, kDirectIoAlign, &out->h, &out->p));
  out->cap = s->ext.len;
  return Status::Ok();
}

void UnitTable::CancelLoad(LoadSlot* slot) {
  if (slot && slot->h >= 0) stack_->Free(slot->h);
  if (slot) *slot = LoadSlot();
}

Status UnitTable::PrepareLoad(int layer, int chunk, LoadSlot* reserved) {
  const UnitRef u = UnitRef::Kv(layer, chunk);
  if (!codec_readable_in_place()) return Status::InvalidArgument("the codec cannot be read in place");
  KvSlot& s = slot(layer, chunk);
  if (s.lost) return Status::Corruption(UnitName(u) + " was lost (its stored copy failed verification)");
  if (s.state != UnitState::kKvStorageCompressed)
    return Status::InvalidArgument(UnitName(u) + ": not compressed on storage (" + UnitStateName(s.state) + ")");
  ChunkShape sh = shape(layer, chunk);
  sh.n_tokens = s.enc_tokens;
  if (s.ext.size != codec_->MaxEncodedSize(sh))
    return Status::Corruption(UnitName(u) + ": stored size " + std::to_string(s.ext.size) + " does not match its shape");
  if (reserved->h < 0 || reserved->cap != s.ext.len) {
    CancelLoad(reserved);
    MZ_RETURN_IF_ERROR(ReserveLoad(layer, chunk, reserved).With("loading " + UnitName(u)));
  }
  kv_->env()->Prefault(reserved->p, reserved->cap);
  return Status::Ok();
}

Status UnitTable::FinishLoad(int layer, int chunk, LoadSlot* reserved, Status st) {
  const UnitRef u = UnitRef::Kv(layer, chunk);
  KvSlot& s = slot(layer, chunk);
  uint8_t* const p = reserved->p;
  if (st.ok() && p[0] != codec_->id()) st = Status::Corruption("stored blob is not of codec " + std::string(codec_->name()));
  if (!st.ok()) {
    if (st.code() == Status::kCorruption) s.lost = true;
    CancelLoad(reserved);
    return st.With("loading " + UnitName(u));
  }
  s.h = reserved->h;
  *reserved = LoadSlot();  // the entry now belongs to the chunk
  file_for(s.ext)->Free(s.ext);
  s.ext = SwapExtent();
  s.state = UnitState::kKvMemCompressed;
  kv_->SetCompressedView(layer, chunk, p + kKvCodecHeaderBytes, s.enc_tokens);
  if (opts_.touch_restored) TouchPages(p, s.enc_bytes);  // compute reads it in place
  return Status::Ok();
}

Status UnitTable::LoadCompressed(int layer, int chunk, LoadSlot* reserved) {
  LoadSlot mine;
  if (!reserved) reserved = &mine;
  return LoadCompressedRun(layer, &chunk, &reserved, 1);  // a run of one chunk
}

bool UnitTable::StoredExtent(int layer, int chunk, uint64_t* off, uint64_t* len) const {
  const KvSlot* s = find_slot(layer, chunk);
  if (!s || (s->state != UnitState::kKvStorageCompressed && s->state != UnitState::kKvStorageRaw) || !s->ext.valid() ||
      s->lost)
    return false;
  *off = s->ext.off;
  *len = s->ext.len;
  return true;
}

Status UnitTable::LoadCompressedRun(int layer, const int* chunks, LoadSlot* const* slots, int n) {
  Status first;
  auto note = [&](const Status& st) {
    if (!st.ok() && first.ok()) first = st;
  };
  // The chunks prepared so far whose extents are back to back: read with one request, then each
  // installed (or failed) on its own.
  std::vector<SwapExtent> ext;
  std::vector<void*> dst;
  std::vector<int> run_chunks;
  std::vector<LoadSlot*> run_slots;
  auto flush = [&] {
    if (ext.empty()) return;
    std::vector<Status> each(ext.size());
    Status rd = file_for(ext[0])->ReadPaddedRun(ext.data(), dst.data(), int(ext.size()), each.data());
    for (size_t i = 0; i < ext.size(); ++i) note(FinishLoad(layer, run_chunks[i], run_slots[i], rd.ok() ? each[i] : rd));
    ext.clear(), dst.clear(), run_chunks.clear(), run_slots.clear();
  };
  for (int i = 0; i < n; ++i) {
    // A chunk that cannot be loaded (lost, not on storage, no room) fails alone; one not stored
    // right after the one before it starts a new request. Either way the others still load, as
    // one LoadCompressed each would.
    Status st = PrepareLoad(layer, chunks[i], slots[i]);
    if (!st.ok()) {
      CancelLoad(slots[i]);
      note(st);
      continue;
    }
    const SwapExtent& e = slot(layer, chunks[i]).ext;
    if (!ext.empty() && (ext.back().off + ext.back().len != e.off || ext.back().file != e.file)) flush();
    ext.push_back(e);
    dst.push_back(slots[i]->p);
    run_chunks.push_back(chunks[i]);
    run_slots.push_back(slots[i]);
  }
  flush();
  return first;
}

Status UnitTable::ReadChunk(int layer, int chunk, uint16_t* dst) const {
  const KvSlot* s = find_slot(layer, chunk);
  const size_t raw = kv_->geometry().chunk_bytes();
  if (s && s->shared) {
    if (s->lost) return Status::Corruption(UnitName(UnitRef::Kv(layer, chunk)) + " was lost");
    return store_->Read(s->shared, dst);
  }
  if (!s || s->state == UnitState::kResident) {
    std::memcpy(dst, kv_->chunk(layer, chunk), raw);
    return Status::Ok();
  }
  if (s->lost) return Status::Corruption(UnitName(UnitRef::Kv(layer, chunk)) + " was lost");
  ChunkShape sh = shape(layer, chunk);
  sh.n_tokens = s->enc_tokens;
  if (s->state == UnitState::kKvMemCompressed) {
    size_t n = 0;
    const uint8_t* p = stack_->Get(s->h, &n);
    return p ? codec_->Decode(sh, p, n, dst) : Status::Internal("swap stack entry missing");
  }
  if (s->state == UnitState::kKvStorageRaw) return file_for(s->ext)->Read(s->ext, dst);
  std::vector<uint8_t> buf(s->ext.size);
  MZ_RETURN_IF_ERROR(file_for(s->ext)->Read(s->ext, buf.data()));
  return codec_->Decode(sh, buf.data(), buf.size(), dst);
}

Status UnitTable::Move(const Placement& p) {
  const UnitRef& u = p.unit;
  if (u.kind == UnitRef::kWeights) {
    if (u.layer < -1 || u.layer >= int(model_->hparams().n_layer))
      return Status::InvalidArgument("no weight unit for layer " + std::to_string(u.layer));
    if (p.target == UnitState::kResident) return LoadWeights(weight_unit(u.layer), nullptr);
    if (p.target != UnitState::kWeightsDropped)
      return Status::InvalidArgument(UnitName(u) + ": weights can only be resident or dropped");
    model_->DropUnit(weight_unit(u.layer));
    return Status::Ok();
  }
  if (u.layer < 0 || u.layer >= kv_->geometry().n_layer || u.chunk < 0 || u.chunk >= kv_->n_chunks())
    return Status::InvalidArgument("no KV chunk " + UnitName(u) + " (the context has " +
                                   std::to_string(kv_->n_chunks()) + " chunks per layer)");
  if (p.target == UnitState::kResident) return RestoreKv(u.layer, u.chunk);
  if (state(u) == p.target) return Status::Ok();
  return EvictKv(u.layer, u.chunk, p.target);
}

Status UnitTable::Apply(const Plan& plan, uint64_t bytes, uint64_t* freed) {
  if (!codec_) return Status::Internal("UnitTable::Init was not called");
  const uint64_t before = Report().in_memory();
  Status st;
  for (const Placement& p : plan) {
    st = Move(p);
    if (!st.ok()) break;
    if (bytes > 0) {
      const uint64_t now = Report().in_memory();
      if (before > now && before - now >= bytes) break;
    }
  }
  const uint64_t after = Report().in_memory();
  if (freed) *freed = before > after ? before - after : 0;
  return st;
}


size_t UnitTable::RestoreBytes(const UnitRef& u) const {
  return u.kind == UnitRef::kWeights ? model_->unit(weight_unit(u.layer)).region_bytes : kv_->geometry().chunk_bytes();
}

Env* UnitTable::env() const { return kv_->env(); }

void* UnitTable::AllocateFor(const UnitRef& u, size_t* bytes) {
  *bytes = 0;
  if (state(u) == UnitState::kResident) return nullptr;
  if (u.kind == UnitRef::kWeights && model_->file_backed()) return nullptr;  // mapped from the file on restore
  if (RestoresByMapping(u)) return nullptr;  // mapped from the swap file on restore
  *bytes = RestoreBytes(u);
  void* p = kv_->env()->MapAnon(*bytes);
  if (p) PrefaultFor(u, p);
  return p;
}

int UnitTable::RestoreRows(int layer, int chunk) const {
  const int T = kv_->geometry().chunk_tokens;
  const KvSlot* s = find_slot(layer, chunk);
  // Only a chunk decoded from a blob (in memory or on storage) is written row by row; a raw read
  // or mapping, an attached shared chunk, or a resident one is whole.
  if (!s || s->shared || s->lost ||
      (s->state != UnitState::kKvMemCompressed && s->state != UnitState::kKvStorageCompressed) || s->enc_tokens <= 0)
    return T;
  const int64_t ahead = int64_t(write_until_) - int64_t(chunk) * T;
  return int(std::clamp<int64_t>(std::max<int64_t>(s->enc_tokens, ahead), 1, T));
}

std::vector<std::pair<size_t, size_t>> UnitTable::RestoreRanges(const UnitRef& u) const {
  const size_t bytes = RestoreBytes(u);
  std::vector<std::pair<size_t, size_t>> out;
  if (bytes == 0) return out;
  const KvGeometry& g = kv_->geometry();
  const int rows = u.kind == UnitRef::kKv ? RestoreRows(u.layer, u.chunk) : g.chunk_tokens;
  if (u.kind != UnitRef::kKv || rows >= g.chunk_tokens) {
    out.emplace_back(0, bytes);
    return out;
  }
  constexpr size_t kPage = 4096;
  auto add = [&](size_t b, size_t e) {  // [b, e), rounded out to pages, merged with the last range
    b = b / kPage * kPage;
    e = std::min(bytes, (e + kPage - 1) / kPage * kPage);
    if (b >= e) return;
    if (!out.empty() && out.back().first + out.back().second >= b)
      out.back().second = std::max(out.back().first + out.back().second, e) - out.back().first;
    else
      out.emplace_back(b, e - b);
  };
  const size_t T = size_t(g.chunk_tokens), D = size_t(g.head_dim), r = size_t(rows);
  for (size_t j = 0; j < 2 * size_t(g.n_kv_head); ++j) {
    if (g.q8()) {  // segment: amax[T] (2 bytes each), then codes[T][D]
      const size_t base = j * T * (2 + D);
      add(base, base + 2 * r);
      add(base + 2 * T, base + 2 * T + r * D);
    } else {  // segment: [T][D] fp16
      add(j * T * D * 2, (j * T + r) * D * 2);
    }
  }
  return out;
}

void UnitTable::PrefaultFor(const UnitRef& u, void* mem) const {
  if (!mem) return;
  for (const auto& [off, len] : RestoreRanges(u)) kv_->env()->Prefault(static_cast<char*>(mem) + off, len);
}

Status UnitTable::RestoreInto(const UnitRef& u, void* mem) {
  if (u.kind == UnitRef::kWeights) return LoadWeights(weight_unit(u.layer), mem);
  return RestoreKv(u.layer, u.chunk, mem);
}

Status UnitTable::LoadWeights(int unit, void* mem) {
  const bool was = model_->unit(unit).resident();
  MZ_RETURN_IF_ERROR(model_->LoadUnit(unit, mem));
  const WeightUnit& w = model_->unit(unit);
  // OS Paging units fault in lazily by design (the baseline): never touched.
  if (!was && opts_.touch_restored && w.backing != WeightMemory::kOsPaging)
    for (const ReadRun& r : w.runs)  // the mapped part of each run (a mapping past end of file faults)
      TouchPages(static_cast<const char*>(w.region) + r.region_off, std::min<uint64_t>(r.need, r.len));
  return Status::Ok();
}

bool UnitTable::AllResident() const {
  for (int u = 0; u < model_->n_units(); ++u)
    if (!model_->unit(u).resident()) return false;
  for (const auto& l : slots_)
    for (const auto& s : l)
      if (s.state != UnitState::kResident) return false;
  return true;
}

std::vector<std::vector<int>> UnitTable::LoadRuns(int layer, const std::vector<int>& chunks,
                                                      uint64_t max_bytes) const {
  struct E {
    int file;
    uint64_t off, len;
    int c;
  };
  std::vector<E> ext;
  std::vector<std::vector<int>> runs;
  for (int c : chunks) {
    uint64_t off = 0, len = 0;
    if (StoredExtent(layer, c, &off, &len)) ext.push_back({find_slot(layer, c)->ext.file, off, len, c});
    else runs.push_back({c});
  }
  std::sort(ext.begin(), ext.end(), [](const E& x, const E& y) { return x.file != y.file ? x.file < y.file : x.off < y.off; });
  uint64_t bytes = 0;
  for (size_t i = 0; i < ext.size(); ++i) {
    const bool joins = i > 0 && ext[i - 1].file == ext[i].file && ext[i - 1].off + ext[i - 1].len == ext[i].off &&
                       bytes + ext[i].len <= max_bytes;
    if (!joins) {
      runs.push_back({});
      bytes = 0;
    }
    runs.back().push_back(ext[i].c);
    bytes += ext[i].len;
  }
  return runs;
}

bool UnitTable::CanMapSwap() const { return swap_ && MapsSwapWith(swap_->direct()); }

bool UnitTable::MapsSwapWith(bool swap_direct) const {
  // Extents are 4096-aligned; mapping them needs 4 KiB pages. On tmpfs (no direct I/O) the page
  // cache is the file: mapping would not free anything on eviction, so chunks are read as before.
  return opts_.map_swap && swap_direct && kv_->env()->PageSize() == kDirectIoAlign &&
         kv_->geometry().chunk_bytes() % kDirectIoAlign == 0;
}

bool UnitTable::KvStorageMapped() const { return MapsSwapWith(swap_ ? swap_->direct() : opts_.direct_io); }

bool UnitTable::RestoresByMapping(const UnitRef& u) const {
  if (u.kind != UnitRef::kKv) return false;
  const KvSlot* s = find_slot(u.layer, u.chunk);
  if (s && s->shared) return true;  // attached from the store: no memory of this context's
  // Only full chunks: their rows are never written again unless the context is truncated inside
  // them (WillRewriteChunk), so the extent stays a valid copy while mapped.
  const SwapFile* sf = s ? file_for(s->ext) : nullptr;
  return sf && MapsSwapWith(sf->direct()) && s->state == UnitState::kKvStorageRaw && !s->lost &&
         s->enc_tokens == kv_->geometry().chunk_tokens && s->ext.size == kv_->geometry().chunk_bytes();
}

void UnitTable::UnmapFromSwap(KvSlot& s, bool free_extent, void* data, bool drop_cached) {
  Env* env = kv_->env();
  env->Unmap(data, kv_->geometry().chunk_bytes());
  // Pages written since the mapping were private copies, gone with the mapping; the file's pages
  // leave the page cache now (no other mapping holds them), so the RAM really goes back.
  if (drop_cached) (void)env->DropCached(file_for(s.ext)->file(), s.ext.off, s.ext.len);
  if (free_extent) {
    file_for(s.ext)->Free(s.ext);
    s.ext = SwapExtent();
  }
  s.mapped = false;
  s.clean = false;
}

Status UnitTable::SwapBytesCached(uint64_t* out) const {
  *out = 0;
  for (const auto& l : slots_)
    for (const KvSlot& s : l) {
      if (s.state != UnitState::kKvStorageRaw && s.state != UnitState::kKvStorageCompressed) continue;
      uint64_t n = 0;
      SwapFile* const sf = file_for(s.ext);
      if (!sf || !s.ext.valid()) continue;
      MZ_RETURN_IF_ERROR(kv_->env()->CachedBytes(sf->file(), s.ext.off, s.ext.len, &n));
      *out += n;
    }
  return Status::Ok();
}

void UnitTable::WillRewriteChunk(int chunk) {
  for (int l = 0; l < int(slots_.size()); ++l) {
    KvSlot* s = chunk >= 0 && chunk < int(slots_[size_t(l)].size()) ? &slots_[size_t(l)][size_t(chunk)] : nullptr;
    if (!s) continue;
    if (s->mapped) s->clean = false;
    if (s->state != UnitState::kResident) s->will_rewrite = true;
  }
}

void UnitTable::ForgetChunksFrom(int first_chunk) {
  for (int l = 0; l < int(slots_.size()); ++l) {
    auto& v = slots_[size_t(l)];
    for (int c = int(v.size()) - 1; c >= first_chunk && c >= 0; --c) ForgetSlot(l, c, v[size_t(c)]);
    if (int(v.size()) > first_chunk) v.resize(size_t(std::max(0, first_chunk)));
  }
  if (first_chunk <= 0) origin_.reset();  // no chunk refers to it any more
}

Status UnitTable::AdoptStored(const std::string& path, int n_tokens, const std::vector<StoredChunk>& chunks) {
  return AdoptStored(path, n_tokens, chunks, SharedPrefix());
}

Status UnitTable::AdoptStored(const std::string& path, int n_tokens, const std::vector<StoredChunk>& chunks,
                              const SharedPrefix& prefix) {
  const KvGeometry& g = kv_->geometry();
  const int n = n_tokens < 0 ? -1 : kv_->n_chunks_for(n_tokens);
  const int k = prefix.n_chunks;
  auto release_prefix = [&] {
    for (auto r : prefix.refs)
      if (r && prefix.store) prefix.store->Release(r);
  };
  auto fail = [&](Status st) {
    release_prefix();
    return st;
  };
  if (n < 0 || chunks.size() != size_t(g.n_layer) * size_t(n))
    return fail(Status::InvalidArgument("AdoptStored: " + std::to_string(chunks.size()) + " chunks for " +
                                        std::to_string(n_tokens) + " tokens of " + std::to_string(g.n_layer) +
                                        " layers"));
  if (n_tokens > kv_->n_ctx_max())
    return fail(Status::ContextFull("stored context of " + std::to_string(n_tokens) + " tokens exceeds n_ctx " +
                                    std::to_string(kv_->n_ctx_max())));
  if (k < 0 || int64_t(k) * g.chunk_tokens > n_tokens || prefix.refs.size() != size_t(g.n_layer) * size_t(k) ||
      (k > 0 && (!prefix.store || (store_ && store_ != prefix.store) ||
                 prefix.store->geometry().chunk_bytes() != g.chunk_bytes() ||
                 prefix.store->geometry().n_layer != g.n_layer ||
                 prefix.store->geometry().chunk_tokens != g.chunk_tokens)))
    return fail(Status::InvalidArgument("AdoptStored: a shared prefix of " + std::to_string(k) + " chunks (" +
                                        std::to_string(prefix.refs.size()) + " references) does not fit " +
                                        std::to_string(n_tokens) + " tokens, or its store is not this table's"));
  for (auto r : prefix.refs)
    if (!r) return fail(Status::InvalidArgument("AdoptStored: a null shared reference"));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int l = int(i / size_t(n)), c = int(i % size_t(n));
    if (c < k) continue;
    const StoredChunk& sc = chunks[i];
    ChunkShape sh = shape(l, c);
    sh.n_tokens = std::min(g.chunk_tokens, n_tokens - c * g.chunk_tokens);
    if (sc.enc_tokens != sh.n_tokens || sc.off % kDirectIoAlign || sc.size == 0 || sc.size > codec_->MaxEncodedSize(sh))
      return fail(Status::InvalidArgument("AdoptStored: " + UnitName(UnitRef::Kv(l, c)) + " in " + path + " (" +
                                          std::to_string(sc.size) + " bytes of " + std::to_string(sc.enc_tokens) +
                                          " rows at " + std::to_string(sc.off) + ") does not fit its place"));
  }
  std::unique_ptr<SwapFile> origin;
  if (k < n) {
    Status st = SwapFile::OpenReadOnly(kv_->env(), path, opts_.direct_io, &origin);
    if (!st.ok()) return fail(st);
    for (size_t i = 0; i < chunks.size(); ++i)
      if (int(i % size_t(n)) >= k && chunks[i].off + AlignUp(chunks[i].size, kDirectIoAlign) > origin->file_bytes())
        return fail(Status::InvalidArgument("AdoptStored: a chunk lies past the end of " + path));
  }
  ForgetChunksFrom(0);
  kv_->Truncate(0);
  MZ_RETURN_IF_ERROR(kv_->ReserveUnbacked(n_tokens));  // cannot fail: n_ctx checked above
  origin_ = std::move(origin);
  if (k > 0) store_ = prefix.store;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int l = int(i / size_t(n)), c = int(i % size_t(n));
    KvSlot& s = slot(l, c);
    s = KvSlot();
    if (c < k) {
      s.shared = prefix.refs[size_t(l) * size_t(k) + size_t(c)];
      s.state = UnitState::kKvShared;
      continue;
    }
    const StoredChunk& sc = chunks[i];
    s.state = UnitState::kKvStorageCompressed;
    s.ext.off = sc.off;
    s.ext.len = AlignUp(sc.size, kDirectIoAlign);
    s.ext.size = sc.size;
    s.ext.hash = sc.hash;
    s.ext.file = 1;
    s.enc_bytes = sc.size;
    s.enc_tokens = sc.enc_tokens;
  }
  kv_->SetTokens(n_tokens);
  return Status::Ok();
}

Status UnitTable::ReplaceKv(int n_tokens, std::vector<uint16_t*> chunks) {
  Env* env = kv_->env();
  const size_t cb = kv_->geometry().chunk_bytes();
  const int n_layer = kv_->geometry().n_layer;
  const int n = n_tokens < 0 ? -1 : kv_->n_chunks_for(n_tokens);
  auto free_all = [&] {
    for (uint16_t* p : chunks)
      if (p) env->Unmap(p, cb);
  };
  if (n < 0 || chunks.size() != size_t(n_layer) * size_t(n)) {
    free_all();
    return Status::InvalidArgument("ReplaceKv: " + std::to_string(chunks.size()) + " chunks for " +
                                   std::to_string(n_tokens) + " tokens of " + std::to_string(n_layer) + " layers");
  }
  ForgetChunksFrom(0);
  kv_->Truncate(0);
  Status st = kv_->Reserve(n_tokens);
  if (!st.ok()) {
    kv_->Truncate(0);
    free_all();
    return st;
  }
  for (int l = 0; l < n_layer; ++l)
    for (int c = 0; c < n; ++c) {
      env->Unmap(kv_->ReleaseChunk(l, c), cb);
      kv_->SetChunk(l, c, chunks[size_t(l) * size_t(n) + size_t(c)]);
    }
  kv_->SetTokens(n_tokens);
  return Status::Ok();
}

Status UnitTable::MeasureInRam(KernelResidency* out) const {
  *out = KernelResidency();
  for (int u = 0; u < model_->n_units(); ++u) {
    uint64_t in = 0, n = 0;
    MZ_RETURN_IF_ERROR(model_->UnitInRam(u, &in, &n));
    out->weights_counted += n;
    out->weights_in_ram += in;
  }
  Env* env = kv_->env();
  const uint64_t cb = kv_->geometry().chunk_bytes();
  for (int l = 0; l < kv_->geometry().n_layer; ++l)
    for (int c = 0; c < kv_->n_chunks(); ++c) {
      const uint16_t* p = kv_->chunk(l, c);
      if (!p || shared(l, c)) continue;  // a borrowed chunk is the store's
      uint64_t in = 0;
      MZ_RETURN_IF_ERROR(env->ResidentBytes(p, cb, &in).With(UnitName(UnitRef::Kv(l, c))));
      out->kv_counted += cb;
      out->kv_in_ram += in;
    }
  return Status::Ok();
}

Status UnitTable::Reconcile(uint64_t min_missing, ReconcileStats* out, bool weights) {
  *out = ReconcileStats();
  min_missing = std::max<uint64_t>(min_missing, 1);
  for (int u = 0; weights && u < model_->n_units(); ++u) {
    const WeightUnit& w = model_->unit(u);
    if (!w.resident()) continue;
    uint64_t in = 0, n = 0;
    MZ_RETURN_IF_ERROR(model_->UnitInRam(u, &in, &n));
    if (n - in < min_missing || w.backing != WeightMemory::kPageCache) {
      out->unreconciled_missing += n - in;
      continue;
    }
    out->weight_units++;
    out->bytes += w.region_bytes;
    out->missing += n - in;
    model_->DropUnit(u, /*drop_cached=*/false);
  }
  Env* env = kv_->env();
  const uint64_t cb = kv_->geometry().chunk_bytes();
  for (int l = 0; l < kv_->geometry().n_layer; ++l)
    for (int c = 0; c < kv_->n_chunks(); ++c) {
      uint16_t* p = kv_->chunk(l, c);
      if (!p || shared(l, c)) continue;  // a borrowed chunk is the store's (anonymous, never reclaimed)
      uint64_t in = 0;
      MZ_RETURN_IF_ERROR(env->ResidentBytes(p, cb, &in).With(UnitName(UnitRef::Kv(l, c))));
      const KvSlot* fs = find_slot(l, c);
      if (cb - in < min_missing || !fs || !fs->mapped || !fs->clean || fs->lost) {
        out->unreconciled_missing += cb - in;
        continue;
      }
      KvSlot& s = slot(l, c);
      kv_->ReleaseChunk(l, c);
      UnmapFromSwap(s, /*free_extent=*/false, p, /*drop_cached=*/false);
      s.state = UnitState::kKvStorageRaw;
      s.enc_bytes = cb;
      out->kv_chunks++;
      out->bytes += cb;
      out->missing += cb - in;
    }
  return Status::Ok();
}

MemoryReport UnitTable::Report() const {
  MemoryReport r;
  for (int u = 0; u < model_->n_units(); ++u) {
    const WeightUnit& w = model_->unit(u);
    r.weights_total += w.region_bytes;
    const bool res = w.resident();
    (res ? r.weights_resident : r.weights_dropped) += w.region_bytes;
    r.n_weight_units[int(res ? UnitState::kResident : UnitState::kWeightsDropped)]++;
    if (u == model_->base_unit()) {
      r.base_total = w.region_bytes;
      r.base_resident = res ? w.region_bytes : 0;
    }
  }
  const uint64_t cb = kv_->geometry().chunk_bytes();
  for (int l = 0; l < kv_->geometry().n_layer; ++l) {
    for (int c = 0; c < kv_->n_chunks(); ++c) {
      const KvSlot* s = find_slot(l, c);
      if (s && s->shared) {  // the store's bytes: counted apart (once, by the store)
        r.kv_shared += cb;
        if (s->attached) r.kv_shared_attached += cb;
        r.n_kv_chunks[int(UnitState::kKvShared)]++;
        if (s->lost) r.n_kv_lost++;
        continue;
      }
      const UnitState st = s ? s->state : UnitState::kResident;
      r.kv_total += cb;
      r.n_kv_chunks[int(st)]++;
      if (s && s->lost) r.n_kv_lost++;
      switch (st) {
        case UnitState::kResident:
          r.kv_resident += cb;
          if (s && s->mapped) r.kv_resident_mapped += cb;
          break;
        case UnitState::kKvMemCompressed: r.kv_mem_compressed_raw += cb, r.kv_mem_compressed += s->enc_bytes; break;
        case UnitState::kKvStorageRaw: r.kv_storage_raw += cb; break;
        case UnitState::kKvStorageCompressed:
          r.kv_storage_compressed_raw += cb, r.kv_storage_compressed += s->enc_bytes;
          break;
        default: break;
      }
    }
  }
  r.stack_mapped = stack_->mapped_bytes();
  r.swap_file_used = swap_ ? swap_->used_bytes() : 0;
  return r;
}

}  // namespace mz
