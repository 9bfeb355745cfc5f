#include "runtime/session_file.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/sync_point.h"
#include "model/model.h"
#include "runtime/context.h"
#include "store/kv_codec.h"
#include "store/q8_kv.h"

namespace mz {
namespace {

constexpr char kMagic[8] = {'M', 'Z', 'S', 'E', 'S', 'S', '0', '1'};
// Version 1: every chunk in the file. Version 2: chunks 0..n_external-1 (full chunks, every layer)
// live in chunk files (a pool's shared prefix stored once, SaveChunkFile); their records are zero.
constexpr uint32_t kVersion = 1;
constexpr uint32_t kVersionExternal = 2;
constexpr size_t kHeaderBytes = 4096;

}  // namespace
// The file's layout types, in a named namespace: SessionReader::Impl holds them, and a class with
// external linkage must not have members of anonymous-namespace types (gcc's -Wsubobject-linkage,
// which a unity build reports since the .cpp is then an included file).
namespace session_format {
#pragma pack(push, 1)
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t n_external;  // version 2: leading chunks stored in chunk files (0 in version 1)
  uint64_t model_hash;
  uint32_t n_layer, n_kv_head, head_dim, chunk_tokens;
  uint32_t codec_id, n_tokens, n_chunks;
  uint32_t kv_type;  // KvType of the context that saved it (0 before 0.9: f16); informational
  uint64_t index_offset, index_bytes, data_offset;
  uint64_t header_hash;  // xxh64 of the bytes above
};
struct ChunkRecord {
  uint64_t offset, size, hash;
  uint32_t enc_tokens, reserved;
};
// The header's extension (since 0.17), at kExtOffset inside the header block, which earlier
// writers left zero: a file without it (magic absent) has no turn mark. Its own checksum, so the
// header's stays what version-1/2 readers check.
struct HeaderExt {
  char magic[8];      // kExtMagic
  int32_t turn_mark;  // where the last turn's prompt ended (0..n_tokens), or -1: none
  uint32_t reserved;  // 0
  uint64_t hash;      // xxh64 of the bytes above
};
#pragma pack(pop)
constexpr size_t kExtOffset = 512;
constexpr char kExtMagic[8] = {'M', 'Z', 'S', 'E', 'X', 'T', '0', '1'};
static_assert(sizeof(Header) <= kExtOffset, "the header extension follows the header");

// Writes the extension into a header block (a turn mark of -1 writes none: the block stays zero).
void PutHeaderExt(uint8_t* block, int turn_mark) {
  if (turn_mark < 0) return;
  HeaderExt e{};
  std::memcpy(e.magic, kExtMagic, 8);
  e.turn_mark = turn_mark;
  e.hash = XXH64(&e, offsetof(HeaderExt, hash), 0);
  std::memcpy(block + kExtOffset, &e, sizeof e);
}

struct Aligned {
  explicit Aligned(size_t n) : n(AlignUp(std::max<size_t>(n, 1), kDirectIoAlign)) {
    p = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlign, this->n));
    if (p) std::memset(p, 0, this->n);
  }
  ~Aligned() { std::free(p); }
  size_t n;
  uint8_t* p;
};
}  // namespace session_format
namespace {
using session_format::Aligned;
using session_format::ChunkRecord;
using session_format::Header;
using session_format::kExtMagic;
using session_format::kExtOffset;
using session_format::PutHeaderExt;

// The header of a session file of n_tokens tokens (its first n_external chunks named, not held):
// the geometry, codec and model, and where the index and the data start. One writer of it for
// SaveSession and BuildSessionBytes.
Header MakeHeader(uint64_t model_hash, const KvGeometry& g, uint32_t codec_id, int n_tokens, int n_external) {
  const int T = g.chunk_tokens;
  const int n_chunks = (n_tokens + T - 1) / T;
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = n_external > 0 ? kVersionExternal : kVersion;
  h.n_external = uint32_t(n_external);
  h.model_hash = model_hash;
  h.n_layer = uint32_t(g.n_layer);
  h.n_kv_head = uint32_t(g.n_kv_head);
  h.head_dim = uint32_t(g.head_dim);
  h.chunk_tokens = uint32_t(T);
  h.codec_id = codec_id;
  h.n_tokens = uint32_t(n_tokens);
  h.n_chunks = uint32_t(n_chunks);
  h.kv_type = uint32_t(g.kv_type);
  h.index_offset = kHeaderBytes;
  h.index_bytes = uint64_t(n_tokens) * 4 + uint64_t(g.n_layer) * n_chunks * sizeof(ChunkRecord) + 8;
  h.data_offset = AlignUp(h.index_offset + h.index_bytes, kDirectIoAlign);
  return h;
}

// Writes a session file: tokens[0, n_tokens), and for every layer l and chunk c >= n_external the
// resident form read(l, c, dst) encoded by codec. Crash-safe (temporary name, fsync, rename, fsync of
// the folder); on error the temporary file is removed and path is untouched, except when only the
// folder's fsync failed: then the new file is at path (info->replaced).
Status WriteSessionFile(Env* env, uint64_t model_hash, const KvGeometry& g, const std::string& path, KvCodec& codec,
                        const int32_t* tokens, int n_tokens, int n_external, int turn_mark,
                        const std::function<Status(int, int, uint16_t*)>& read, SessionInfo* info,
                        std::vector<SharedChunkStore::FilePlace>* places = nullptr,
                        const std::function<void()>& between = nullptr) {
  if (info) info->replaced = false;
  const int T = g.chunk_tokens;
  const int n_chunks = (n_tokens + T - 1) / T;
  if (n_external < 0 || int64_t(n_external) * T > n_tokens)
    return Status::InvalidArgument("saving session " + path + ": " + std::to_string(n_external) +
                                   " external chunks, only " + std::to_string(n_tokens / T) + " full ones");
  Header h = MakeHeader(model_hash, g, codec.id(), n_tokens, n_external);

  const std::string tmp = path + ".tmp";
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(tmp, OpenMode::kCreateTrunc, /*direct=*/true, &f));
  auto fail = [&](Status st) {
    f.reset();
    env->Remove(tmp);
    return st.With("saving session " + path);
  };

  std::vector<ChunkRecord> recs(size_t(g.n_layer) * size_t(n_chunks));
  Aligned raw(g.chunk_bytes());
  Aligned enc(codec.MaxEncodedSize(ChunkShape{g.n_kv_head, T, g.head_dim, T, 0, g.n_layer}));
  if (!raw.p || !enc.p) return fail(Status::NoMemory("session buffers"));
  uint64_t off = h.data_offset;
  for (int l = 0; l < g.n_layer; ++l) {
    for (int c = n_external; c < n_chunks; ++c) {
      if (between) between();
      Status st = read(l, c, reinterpret_cast<uint16_t*>(raw.p));
      if (!st.ok()) return fail(st);
      const ChunkShape sh{g.n_kv_head, T, g.head_dim, std::min(T, n_tokens - c * T), l, g.n_layer};
      size_t n = 0;
      st = codec.Encode(sh, reinterpret_cast<uint16_t*>(raw.p), enc.p, enc.n, &n);
      if (!st.ok()) return fail(st);
      std::memset(enc.p + n, 0, AlignUp(n, kDirectIoAlign) - n);
      st = f->Write(enc.p, AlignUp(n, kDirectIoAlign), off);
      if (!st.ok()) return fail(st);
      ChunkRecord& r = recs[size_t(l) * n_chunks + c];
      r.offset = off;
      r.size = n;
      r.hash = XXH64(enc.p, n, 0);
      r.enc_tokens = uint32_t(sh.n_tokens);
      off += AlignUp(n, kDirectIoAlign);
    }
  }
  // Index.
  Aligned idx(h.index_bytes);
  if (!idx.p) return fail(Status::NoMemory("session index buffer"));
  // An empty conversation has no tokens and no records: their data() may be null, which memcpy
  // must not be given even for 0 bytes (found by fuzzing: fuzz/corpus/session/empty.mzs).
  if (n_tokens > 0) std::memcpy(idx.p, tokens, size_t(n_tokens) * 4);
  if (!recs.empty()) std::memcpy(idx.p + size_t(n_tokens) * 4, recs.data(), recs.size() * sizeof(ChunkRecord));
  const uint64_t ih = XXH64(idx.p, h.index_bytes - 8, 0);
  std::memcpy(idx.p + h.index_bytes - 8, &ih, 8);
  Status st = f->Write(idx.p, idx.n, h.index_offset);
  if (!st.ok()) return fail(st);
  // Header last: a file without a valid header is never mistaken for a session.
  Aligned hb(kHeaderBytes);
  h.header_hash = XXH64(&h, offsetof(Header, header_hash), 0);
  std::memcpy(hb.p, &h, sizeof h);
  PutHeaderExt(hb.p, turn_mark <= n_tokens ? turn_mark : -1);
  st = f->Write(hb.p, kHeaderBytes, 0);
  if (st.ok()) st = f->Sync();
  if (!st.ok()) return fail(st);
  f.reset();
  MZ_RETURN_IF_ERROR(env->Rename(tmp, path));
  if (info) {
    info->n_tokens = n_tokens;
    info->n_chunks = n_chunks;
    info->n_external = n_external;
    info->codec = codec.name();
    info->file_bytes = off;
    info->replaced = true;
  }
  if (places) {  // chunk 0 of every layer (SaveChunkFile)
    places->assign(size_t(g.n_layer), SharedChunkStore::FilePlace());
    for (int l = 0; l < g.n_layer && n_chunks > 0; ++l) {
      const ChunkRecord& r = recs[size_t(l) * size_t(n_chunks)];
      (*places)[size_t(l)] = {r.offset, r.size, r.hash};
    }
  }
  // The new file is in place from here: an error now is of durability only (info->replaced tells).
  return env->SyncDir(path).With("saving session " + path + " (the new file replaced the old one; the rename may not be durable)");
}

}  // namespace

Status SaveSession(Context& ctx, const std::string& path, const std::string& codec_name, SessionInfo* info,
                   int n_external, const std::function<void()>& between) {
  Context::ForegroundLock lk(&ctx);
  MZ_SYNC_POINT("session:save_locked", 0);  // tests: a save in progress (the context is busy)
  const KvGeometry& g = ctx.kv_->geometry();
  // Chunks are read in their resident form (q8_0 KV: q8) and written as the codec's ordinary blobs.
  auto codec = MakeKvCodecFor(g.kv_type, codec_name);
  if (!codec) return Status::InvalidArgument("unknown KV codec '" + codec_name + "'");
  return WriteSessionFile(
      ctx.model_->env(), ctx.model_->identity().header_hash, g, path, *codec, ctx.history_.data(),
      int(ctx.history_.size()), n_external, ctx.turn_mark(),
      [&](int l, int c, uint16_t* dst) { return ctx.units_->ReadChunk(l, c, dst); }, info, nullptr, between);
}

Status SaveChunkFile(const Model& model, const KvGeometry& g, const std::string& path, const std::string& codec_name,
                     const int32_t* tokens, const std::function<Status(int, uint16_t*)>& read, SessionInfo* info,
                     std::vector<SharedChunkStore::FilePlace>* places) {
  if (info) info->replaced = false;
  auto codec = MakeKvCodecFor(g.kv_type, codec_name);
  if (!codec) return Status::InvalidArgument("unknown KV codec '" + codec_name + "'");
  return WriteSessionFile(
      model.env(), model.identity().header_hash, g, path, *codec, tokens, g.chunk_tokens, 0, /*turn_mark=*/-1,
      [&](int l, int, uint16_t* dst) { return read(l, dst); }, info, places);
}

struct SessionReader::Impl {
  Env* env = nullptr;
  std::string path;
  std::unique_ptr<File> f;
  Header h{};
  KvGeometry g;
  std::unique_ptr<KvCodec> codec;
  std::vector<ChunkRecord> recs;
  std::unique_ptr<Aligned> buf;
  Status Bad(const std::string& why) const { return Status::Corruption("session " + path + ": " + why); }
  // Reads record r's encoded bytes into buf (checked against the file's bounds and the record's
  // checksum): kCorruption naming `what` when anything is off, the File's error on a failed read.
  Status ReadRecord(const ChunkRecord& r, uint64_t file_bytes, const std::string& what) {
    if (r.size > buf->n || r.offset % kDirectIoAlign || r.offset < h.data_offset || r.offset > file_bytes ||
        AlignUp(r.size, kDirectIoAlign) > file_bytes - r.offset || r.enc_tokens == 0 || r.enc_tokens > h.chunk_tokens)
      return Bad(what + " record out of range (file truncated?)");
    size_t got = 0;
    MZ_RETURN_IF_ERROR(f->Read(buf->p, AlignUp(r.size, kDirectIoAlign), r.offset, &got));
    if (got < r.size) return Bad(what + " truncated");
    if (XXH64(buf->p, r.size, 0) != r.hash) return Bad(what + " checksum mismatch");
    return Status::Ok();
  }
};

SessionReader::~SessionReader() = default;

std::string SessionReader::codec() const { return impl_->codec->name(); }

Status SessionReader::Open(const Model& model, int chunk_tokens, const std::string& path,
                           std::unique_ptr<SessionReader>* out, KvType kv_type) {
  std::unique_ptr<SessionReader> r(new SessionReader());
  r->impl_ = std::make_unique<Impl>();
  Impl& m = *r->impl_;
  m.env = model.env();
  m.path = path;
  const HParams& hp = model.hparams();
  m.g.n_layer = int(hp.n_layer);
  m.g.n_kv_head = int(hp.n_head_kv);
  m.g.head_dim = int(hp.head_dim);
  m.g.chunk_tokens = chunk_tokens;
  m.g.kv_type = kv_type;
  MZ_RETURN_IF_ERROR(m.env->Open(path, OpenMode::kRead, /*direct=*/true, &m.f));
  FileInfo fi;
  MZ_RETURN_IF_ERROR(m.f->Stat(&fi));
  r->file_bytes_ = fi.size;
  if (fi.size < kHeaderBytes) return m.Bad("file too small to be a session (" + std::to_string(fi.size) + " bytes)");
  Aligned hb(kHeaderBytes);
  if (!hb.p) return Status::NoMemory("session header buffer");
  MZ_RETURN_IF_ERROR(ReadFully(m.f.get(), hb.p, kHeaderBytes, 0, path));
  Header& h = m.h;
  std::memcpy(&h, hb.p, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) return m.Bad("bad magic (not an mzcache session file)");
  if (h.version != kVersion && h.version != kVersionExternal) return m.Bad("unsupported version " + std::to_string(h.version));
  if (XXH64(&h, offsetof(Header, header_hash), 0) != h.header_hash) return m.Bad("header checksum mismatch");
  // Version 1 files had a reserved field where n_external now is: ignored there, whatever it holds.
  if (h.version == kVersion) h.n_external = 0;
  if (h.version == kVersionExternal && h.n_external == 0) return m.Bad("version 2 without external chunks");
  if (h.model_hash != model.identity().header_hash) return m.Bad("saved with a different model");
  {
    session_format::HeaderExt e;
    std::memcpy(&e, hb.p + kExtOffset, sizeof e);
    if (std::memcmp(e.magic, kExtMagic, 8) == 0) {
      if (XXH64(&e, offsetof(session_format::HeaderExt, hash), 0) != e.hash) return m.Bad("header extension checksum mismatch");
      if (e.turn_mark < 0 || uint32_t(e.turn_mark) > h.n_tokens) return m.Bad("turn mark beyond the tokens");
      r->turn_mark_ = e.turn_mark;
    }
  }
  const KvGeometry& g = m.g;
  if (int(h.n_layer) != g.n_layer || int(h.n_kv_head) != g.n_kv_head || int(h.head_dim) != g.head_dim ||
      int(h.chunk_tokens) != g.chunk_tokens)
    return m.Bad("KV geometry differs from this context (n_layer/n_kv_head/head_dim/chunk_tokens)");
  m.codec = h.codec_id > 255 ? nullptr : MakeKvCodecByIdFor(g.kv_type, uint8_t(h.codec_id));
  if (!m.codec) return m.Bad("unknown codec id " + std::to_string(h.codec_id));
  if (uint64_t(h.n_chunks) != (uint64_t(h.n_tokens) + h.chunk_tokens - 1) / h.chunk_tokens)
    return m.Bad("chunk count inconsistent with token count");
  if (uint64_t(h.n_external) * h.chunk_tokens > h.n_tokens)
    return m.Bad("more external chunks (" + std::to_string(h.n_external) + ") than full chunks");
  const uint64_t want_index = uint64_t(h.n_tokens) * 4 + uint64_t(h.n_layer) * h.n_chunks * sizeof(ChunkRecord) + 8;
  if (h.index_bytes != want_index || h.index_offset != kHeaderBytes || h.index_offset + h.index_bytes > fi.size)
    return m.Bad("index out of range (file truncated?)");
  Aligned idx(AlignUp(h.index_offset + h.index_bytes, kDirectIoAlign) - h.index_offset);
  if (!idx.p) return Status::NoMemory("session index buffer");
  size_t got = 0;
  MZ_RETURN_IF_ERROR(m.f->Read(idx.p, idx.n, h.index_offset, &got));
  if (got < h.index_bytes) return m.Bad("index truncated");
  uint64_t ih;
  std::memcpy(&ih, idx.p + h.index_bytes - 8, 8);
  if (XXH64(idx.p, h.index_bytes - 8, 0) != ih) return m.Bad("index checksum mismatch");
  r->tokens_.resize(h.n_tokens);
  // A session of 0 tokens (and 0 records) is valid: no memcpy into an empty vector's null data().
  if (!r->tokens_.empty()) std::memcpy(r->tokens_.data(), idx.p, size_t(h.n_tokens) * 4);
  const int32_t nv = int32_t(hp.n_vocab);
  for (int32_t t : r->tokens_)
    if (t < 0 || t >= nv) return m.Bad("token id out of range");
  m.recs.resize(size_t(h.n_layer) * h.n_chunks);
  if (!m.recs.empty()) std::memcpy(m.recs.data(), idx.p + size_t(h.n_tokens) * 4, m.recs.size() * sizeof(ChunkRecord));
  // Every chunk's record must lie inside the file: a truncated file is found here, before any
  // chunk is read (a bit flip inside a payload is found by its checksum when the chunk is read).
  for (size_t i = 0; i < m.recs.size(); ++i) {
    const ChunkRecord& rc = m.recs[i];
    if (i % h.n_chunks < h.n_external) {  // in a chunk file: no payload here
      if (rc.offset || rc.size || rc.hash || rc.enc_tokens)
        return m.Bad("chunk (" + std::to_string(i / h.n_chunks) + "," + std::to_string(i % h.n_chunks) +
                     ") is external but has a record");
      continue;
    }
    if (rc.offset % kDirectIoAlign || rc.offset < h.data_offset || rc.offset > fi.size ||
        AlignUp(rc.size, kDirectIoAlign) > fi.size - rc.offset)
      return m.Bad("chunk (" + std::to_string(i / h.n_chunks) + "," + std::to_string(i % h.n_chunks) +
                   ") lies past the end of the file (" + std::to_string(fi.size) + " bytes; truncated?)");
  }
  m.buf = std::make_unique<Aligned>(
      m.codec->MaxEncodedSize(ChunkShape{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer}));
  if (!m.buf->p) return Status::NoMemory("session chunk buffer");
  r->n_chunks_ = int(h.n_chunks);
  r->n_external_ = int(h.n_external);
  *out = std::move(r);
  return Status::Ok();
}

Status SessionReader::ReadChunk(int l, int c, uint16_t* dst) {
  Impl& m = *impl_;
  if (l < 0 || l >= m.g.n_layer || c < 0 || c >= n_chunks_)
    return Status::InvalidArgument("session chunk (" + std::to_string(l) + "," + std::to_string(c) + ") out of range");
  if (c < n_external_)
    return Status::InvalidArgument("session chunk (" + std::to_string(l) + "," + std::to_string(c) +
                                   ") is stored in a chunk file, not in " + m.path);
  const ChunkRecord& r = m.recs[size_t(l) * size_t(n_chunks_) + size_t(c)];
  const std::string what = "chunk (" + std::to_string(l) + "," + std::to_string(c) + ")";
  MZ_RETURN_IF_ERROR(m.ReadRecord(r, file_bytes_, what));
  Aligned& buf = *m.buf;
  ChunkShape sh{m.g.n_kv_head, m.g.chunk_tokens, m.g.head_dim, int(r.enc_tokens), l, m.g.n_layer};
  return m.codec->Decode(sh, buf.p, r.size, dst);
}

void SessionReader::ChunkPlace(int layer, int chunk, uint64_t* off, uint64_t* size, uint64_t* hash,
                               int* enc_tokens) const {
  const ChunkRecord& r = impl_->recs[size_t(layer) * size_t(n_chunks_) + size_t(chunk)];
  *off = r.offset;
  *size = r.size;
  *hash = r.hash;
  *enc_tokens = int(r.enc_tokens);
}

uint32_t SessionReader::codec_id() const { return impl_->h.codec_id; }

Status SessionReader::ReadPayload(int l, int c, std::string* out, int* enc_tokens) {
  Impl& m = *impl_;
  if (l < 0 || l >= m.g.n_layer || c < n_external_ || c >= n_chunks_)
    return Status::InvalidArgument("session chunk (" + std::to_string(l) + "," + std::to_string(c) +
                                   ") out of range or stored in a chunk file");
  const ChunkRecord& r = m.recs[size_t(l) * size_t(n_chunks_) + size_t(c)];
  const std::string what = "chunk (" + std::to_string(l) + "," + std::to_string(c) + ")";
  MZ_RETURN_IF_ERROR(m.ReadRecord(r, file_bytes_, what));
  Aligned& buf = *m.buf;
  out->assign(reinterpret_cast<const char*>(buf.p), size_t(r.size));
  *enc_tokens = int(r.enc_tokens);
  return Status::Ok();
}

Status BuildSessionBytes(uint64_t model_hash, const KvGeometry& g, uint32_t codec_id, const int32_t* tokens,
                         int n_tokens, int n_external,
                         const std::function<Status(int, int, std::string*, int*)>& payload, std::string* out,
                         int turn_mark) {
  const int T = g.chunk_tokens;
  if (T <= 0 || n_tokens < 0 || n_external < 0 || int64_t(n_external) * T > n_tokens)
    return Status::InvalidArgument("session bytes: " + std::to_string(n_external) + " external chunks, only " +
                                   std::to_string(T > 0 ? n_tokens / T : 0) + " full ones");
  const int n_chunks = (n_tokens + T - 1) / T;
  Header h = MakeHeader(model_hash, g, codec_id, n_tokens, n_external);
  std::string data;  // payloads from data_offset on
  std::vector<ChunkRecord> recs(size_t(g.n_layer) * size_t(n_chunks));
  std::string p;
  for (int l = 0; l < g.n_layer; ++l) {
    for (int c = n_external; c < n_chunks; ++c) {
      int enc = 0;
      p.clear();
      MZ_RETURN_IF_ERROR(payload(l, c, &p, &enc));
      if (p.empty() || enc <= 0 || enc > T)
        return Status::InvalidArgument("session bytes: chunk (" + std::to_string(l) + "," + std::to_string(c) +
                                       ") has an empty payload or a bad row count");
      ChunkRecord& r = recs[size_t(l) * size_t(n_chunks) + size_t(c)];
      r.offset = h.data_offset + data.size();
      r.size = p.size();
      r.hash = XXH64(p.data(), p.size(), 0);
      r.enc_tokens = uint32_t(enc);
      data += p;
      data.resize(AlignUp(data.size(), kDirectIoAlign), '\0');
    }
  }
  h.header_hash = XXH64(&h, offsetof(Header, header_hash), 0);
  out->assign(size_t(h.data_offset), '\0');
  std::memcpy(&(*out)[0], &h, sizeof h);
  PutHeaderExt(reinterpret_cast<uint8_t*>(&(*out)[0]), turn_mark <= n_tokens ? turn_mark : -1);
  char* idx = &(*out)[kHeaderBytes];
  if (n_tokens > 0) std::memcpy(idx, tokens, size_t(n_tokens) * 4);
  if (!recs.empty()) std::memcpy(idx + size_t(n_tokens) * 4, recs.data(), recs.size() * sizeof(ChunkRecord));
  const uint64_t ih = XXH64(idx, h.index_bytes - 8, 0);
  std::memcpy(idx + h.index_bytes - 8, &ih, 8);
  *out += data;
  return Status::Ok();
}

namespace {

// SessionReader::Open for a context of this model and KV cache, refusing a session longer than its
// n_ctx (kContextFull): the first step of LoadSession and OpenSessionAsStorage.
Status OpenFor(const Model& model, const KvCache& kv, const std::string& path, std::unique_ptr<SessionReader>* out) {
  MZ_RETURN_IF_ERROR(SessionReader::Open(model, kv.geometry().chunk_tokens, path, out, kv.geometry().kv_type));
  const int n_tokens = int((*out)->tokens().size());
  if (n_tokens > kv.n_ctx_max()) {
    out->reset();
    return Status::ContextFull("session holds " + std::to_string(n_tokens) + " tokens, more than n_ctx " +
                               std::to_string(kv.n_ctx_max()));
  }
  return Status::Ok();
}

void Describe(const SessionReader& r, SessionInfo* info) {
  if (!info) return;
  info->n_tokens = int(r.tokens().size());
  info->n_chunks = r.n_chunks();
  info->n_external = r.n_external();
  info->codec = r.codec();
  info->file_bytes = r.file_bytes();
}

}  // namespace

namespace {

// The external chunks of reader's file through resolve: *store and refs (reference owned here).
Status ResolveExternal(const SessionReader& reader, const std::string& path, const ExternalChunkResolver& resolve,
                       const KvGeometry& g, std::shared_ptr<SharedChunkStore>* store,
                       std::vector<SharedChunkStore::Ref>* refs) {
  const int k = reader.n_external();
  if (k == 0) return Status::Ok();
  if (!resolve)
    return Status::InvalidArgument("session " + path + " keeps its first " + std::to_string(k) +
                                   " chunks in chunk files: open it through the pool that stored it");
  MZ_RETURN_IF_ERROR(resolve(reader, store, refs).With("session " + path + ": its chunk files"));
  if (!*store || refs->size() != size_t(g.n_layer) * size_t(k)) {
    for (auto r : *refs)
      if (r && *store) (*store)->Release(r);
    refs->clear();
    return Status::Internal("session " + path + ": the external chunks were not resolved");
  }
  return Status::Ok();
}

}  // namespace

Status OpenSessionAsStorage(Context& ctx, const std::string& path, SessionInfo* info,
                            const ExternalChunkResolver& resolve) {
  Context::ForegroundLock lk(&ctx);
  const KvGeometry& g = ctx.kv_->geometry();
  std::unique_ptr<SessionReader> reader;
  MZ_RETURN_IF_ERROR(OpenFor(*ctx.model_, *ctx.kv_, path, &reader));
  const int n_tokens = int(reader->tokens().size());
  if (reader->codec() != ctx.units_->codec().name())
    return Status::InvalidArgument("session " + path + " was stored with codec " + reader->codec() +
                                   ", the context's KV codec is " + ctx.units_->codec().name() +
                                   ": it cannot serve as its storage (LoadSession reads it)");
  const int n_chunks = reader->n_chunks();
  std::vector<UnitTable::StoredChunk> chunks(size_t(g.n_layer) * size_t(n_chunks));
  for (size_t i = 0; i < chunks.size(); ++i) {
    UnitTable::StoredChunk& sc = chunks[i];
    reader->ChunkPlace(int(i / size_t(n_chunks)), int(i % size_t(n_chunks)), &sc.off, &sc.size, &sc.hash, &sc.enc_tokens);
  }
  UnitTable::SharedPrefix prefix;
  MZ_RETURN_IF_ERROR(ResolveExternal(*reader, path, resolve, g, &prefix.store, &prefix.refs));
  prefix.n_chunks = reader->n_external();
  // AdoptStored takes the references in every case.
  MZ_RETURN_IF_ERROR(ctx.units_->AdoptStored(path, n_tokens, chunks, prefix).With("opening session " + path));
  ctx.history_ = reader->tokens();
  ctx.turn_mark_ = reader->turn_mark();
  ctx.logits_.clear();
  Describe(*reader, info);
  return Status::Ok();
}

Status LoadSession(Context& ctx, const std::string& path, SessionInfo* info, const ExternalChunkResolver& resolve) {
  Context::ForegroundLock lk(&ctx);
  Env* env = ctx.model_->env();
  const KvCache& kv = *ctx.kv_;
  const KvGeometry& g = kv.geometry();
  std::unique_ptr<SessionReader> reader;
  MZ_RETURN_IF_ERROR(OpenFor(*ctx.model_, kv, path, &reader));
  const int n_tokens = int(reader->tokens().size());
  const int n_chunks = reader->n_chunks();
  const int k = reader->n_external();
  std::shared_ptr<SharedChunkStore> store;
  std::vector<SharedChunkStore::Ref> refs;
  MZ_RETURN_IF_ERROR(ResolveExternal(*reader, path, resolve, g, &store, &refs));
  // Decode every chunk into fresh memory before touching the context (external ones copied out of
  // the store: this context holds its own copies).
  const size_t cb = g.chunk_bytes();
  std::vector<uint16_t*> chunks(size_t(g.n_layer) * size_t(n_chunks), nullptr);
  auto free_all = [&] {
    for (auto* p : chunks) env->Unmap(p, cb);
  };
  Status st;
  for (size_t i = 0; i < chunks.size() && st.ok(); ++i) {
    const int l = int(i / size_t(n_chunks)), c = int(i % size_t(n_chunks));
    chunks[i] = static_cast<uint16_t*>(env->MapAnon(cb));
    if (!chunks[i]) st = Status::NoMemory("KV chunk");
    else if (c < k) st = store->Read(refs[size_t(l) * size_t(k) + size_t(c)], chunks[i]);
    else st = reader->ReadChunk(l, c, chunks[i]);
  }
  for (auto r : refs) store->Release(r);
  if (!st.ok()) {
    free_all();
    return st;
  }
  // Commit: replace the conversation (the unit table takes the chunks, freeing them on failure).
  MZ_RETURN_IF_ERROR(ctx.units_->ReplaceKv(n_tokens, std::move(chunks)));
  ctx.history_ = reader->tokens();
  ctx.turn_mark_ = reader->turn_mark();
  ctx.logits_.clear();
  Describe(*reader, info);
  return Status::Ok();
}

}  // namespace mz
