#include "runtime/session_file.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>

#include "runtime/context.h"
#include "store/kv_codec.h"

namespace mz {
namespace {

constexpr char kMagic[8] = {'M', 'Z', 'S', 'E', 'S', 'S', '0', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 4096;

#pragma pack(push, 1)
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t reserved0;
  uint64_t model_hash;
  uint32_t n_layer, n_kv_head, head_dim, chunk_tokens;
  uint32_t codec_id, n_tokens, n_chunks, reserved1;
  uint64_t index_offset, index_bytes, data_offset;
  uint64_t header_hash;  // xxh64 of the bytes above
};
struct ChunkRecord {
  uint64_t offset, size, hash;
  uint32_t enc_tokens, reserved;
};
#pragma pack(pop)

struct Aligned {
  explicit Aligned(size_t n) : n(AlignUp(std::max<size_t>(n, 1), kDirectIoAlign)) {
    p = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlign, this->n));
    if (p) std::memset(p, 0, this->n);
  }
  ~Aligned() { std::free(p); }
  size_t n;
  uint8_t* p;
};

}  // namespace

Status SaveSession(Context& ctx, const std::string& path, const std::string& codec_name, SessionInfo* info) {
  Context::ForegroundLock lk(&ctx);
  auto codec = MakeKvCodec(codec_name);
  if (!codec) return Status::InvalidArgument("unknown KV codec '" + codec_name + "'");
  Env* env = ctx.model_->env();
  const KvCache& kv = *ctx.kv_;
  const KvGeometry& g = kv.geometry();
  const int n_tokens = int(ctx.history_.size());
  const int n_chunks = kv.n_chunks_for(n_tokens);

  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kVersion;
  h.model_hash = ctx.model_->identity().header_hash;
  h.n_layer = uint32_t(g.n_layer);
  h.n_kv_head = uint32_t(g.n_kv_head);
  h.head_dim = uint32_t(g.head_dim);
  h.chunk_tokens = uint32_t(g.chunk_tokens);
  h.codec_id = codec->id();
  h.n_tokens = uint32_t(n_tokens);
  h.n_chunks = uint32_t(n_chunks);
  h.index_offset = kHeaderBytes;
  h.index_bytes = uint64_t(n_tokens) * 4 + uint64_t(g.n_layer) * n_chunks * sizeof(ChunkRecord) + 8;
  h.data_offset = AlignUp(h.index_offset + h.index_bytes, kDirectIoAlign);

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
  ChunkShape sh0;
  Aligned enc(codec->MaxEncodedSize(ChunkShape{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer}));
  (void)sh0;
  if (!raw.p || !enc.p) return fail(Status::NoMemory("session buffers"));
  uint64_t off = h.data_offset;
  for (int l = 0; l < g.n_layer; ++l) {
    for (int c = 0; c < n_chunks; ++c) {
      Status st = ctx.units_->ReadChunk(l, c, reinterpret_cast<uint16_t*>(raw.p));
      if (!st.ok()) return fail(st);
      ChunkShape sh = ctx.units_->shape(l, c);
      size_t n = 0;
      st = codec->Encode(sh, reinterpret_cast<uint16_t*>(raw.p), enc.p, enc.n, &n);
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
  if (n_tokens > 0) std::memcpy(idx.p, ctx.history_.data(), size_t(n_tokens) * 4);
  if (!recs.empty()) std::memcpy(idx.p + size_t(n_tokens) * 4, recs.data(), recs.size() * sizeof(ChunkRecord));
  const uint64_t ih = XXH64(idx.p, h.index_bytes - 8, 0);
  std::memcpy(idx.p + h.index_bytes - 8, &ih, 8);
  Status st = f->Write(idx.p, idx.n, h.index_offset);
  if (!st.ok()) return fail(st);
  // Header last: a file without a valid header is never mistaken for a session.
  Aligned hb(kHeaderBytes);
  h.header_hash = XXH64(&h, offsetof(Header, header_hash), 0);
  std::memcpy(hb.p, &h, sizeof h);
  st = f->Write(hb.p, kHeaderBytes, 0);
  if (st.ok()) st = f->Sync();
  if (!st.ok()) return fail(st);
  f.reset();
  MZ_RETURN_IF_ERROR(env->Rename(tmp, path));
  MZ_RETURN_IF_ERROR(env->SyncDir(path));
  if (info) {
    info->n_tokens = n_tokens;
    info->n_chunks = n_chunks;
    info->codec = codec->name();
    info->file_bytes = off;
  }
  return Status::Ok();
}

Status LoadSession(Context& ctx, const std::string& path, SessionInfo* info) {
  Context::ForegroundLock lk(&ctx);
  Env* env = ctx.model_->env();
  const KvCache& kv = *ctx.kv_;
  const KvGeometry& g = kv.geometry();
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kRead, /*direct=*/true, &f));
  FileInfo fi;
  MZ_RETURN_IF_ERROR(f->Stat(&fi));
  auto bad = [&](const std::string& why) { return Status::Corruption("session " + path + ": " + why); };
  if (fi.size < kHeaderBytes) return bad("file too small to be a session (" + std::to_string(fi.size) + " bytes)");
  Aligned hb(kHeaderBytes);
  if (!hb.p) return Status::NoMemory("session header buffer");
  MZ_RETURN_IF_ERROR(ReadFully(f.get(), hb.p, kHeaderBytes, 0, path));
  Header h;
  std::memcpy(&h, hb.p, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) return bad("bad magic (not an mzcache session file)");
  if (h.version != kVersion) return bad("unsupported version " + std::to_string(h.version));
  if (XXH64(&h, offsetof(Header, header_hash), 0) != h.header_hash) return bad("header checksum mismatch");
  if (h.model_hash != ctx.model_->identity().header_hash) return bad("saved with a different model");
  if (int(h.n_layer) != g.n_layer || int(h.n_kv_head) != g.n_kv_head || int(h.head_dim) != g.head_dim ||
      int(h.chunk_tokens) != g.chunk_tokens)
    return bad("KV geometry differs from this context (n_layer/n_kv_head/head_dim/chunk_tokens)");
  auto codec = MakeKvCodecById(uint8_t(h.codec_id));
  if (!codec || h.codec_id > 255) return bad("unknown codec id " + std::to_string(h.codec_id));
  if (int64_t(h.n_tokens) > kv.n_ctx_max())
    return Status::ContextFull("session holds " + std::to_string(h.n_tokens) + " tokens, more than n_ctx " +
                               std::to_string(kv.n_ctx_max()));
  if (int(h.n_chunks) != kv.n_chunks_for(int(h.n_tokens))) return bad("chunk count inconsistent with token count");
  const uint64_t want_index = uint64_t(h.n_tokens) * 4 + uint64_t(h.n_layer) * h.n_chunks * sizeof(ChunkRecord) + 8;
  if (h.index_bytes != want_index || h.index_offset != kHeaderBytes || h.index_offset + h.index_bytes > fi.size)
    return bad("index out of range (file truncated?)");
  Aligned idx(AlignUp(h.index_offset + h.index_bytes, kDirectIoAlign) - h.index_offset);
  if (!idx.p) return Status::NoMemory("session index buffer");
  size_t got = 0;
  MZ_RETURN_IF_ERROR(f->Read(idx.p, idx.n, h.index_offset, &got));
  if (got < h.index_bytes) return bad("index truncated");
  uint64_t ih;
  std::memcpy(&ih, idx.p + h.index_bytes - 8, 8);
  if (XXH64(idx.p, h.index_bytes - 8, 0) != ih) return bad("index checksum mismatch");
  std::vector<int32_t> tokens(h.n_tokens);
  // A session of 0 tokens (and 0 records) is valid: no memcpy into an empty vector's null data().
  if (!tokens.empty()) std::memcpy(tokens.data(), idx.p, size_t(h.n_tokens) * 4);
  const int32_t nv = int32_t(ctx.model_->hparams().n_vocab);
  for (int32_t t : tokens)
    if (t < 0 || t >= nv) return bad("token id out of range");
  std::vector<ChunkRecord> recs(size_t(h.n_layer) * h.n_chunks);
  if (!recs.empty()) std::memcpy(recs.data(), idx.p + size_t(h.n_tokens) * 4, recs.size() * sizeof(ChunkRecord));

  // Decode every chunk into fresh memory before touching the context.
  const size_t cb = g.chunk_bytes();
  std::vector<uint16_t*> chunks(recs.size(), nullptr);
  auto free_all = [&] {
    for (auto* p : chunks) env->Unmap(p, cb);
  };
  Aligned buf(codec->MaxEncodedSize(ChunkShape{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer}));
  for (size_t i = 0; i < recs.size(); ++i) {
    const ChunkRecord& r = recs[i];
    const int l = int(i / h.n_chunks), c = int(i % h.n_chunks);
    const std::string what = "chunk (" + std::to_string(l) + "," + std::to_string(c) + ")";
    if (r.size > buf.n || r.offset % kDirectIoAlign || r.offset < h.data_offset || r.offset > fi.size ||
        AlignUp(r.size, kDirectIoAlign) > fi.size - r.offset || r.enc_tokens == 0 || r.enc_tokens > h.chunk_tokens) {
      free_all();
      return bad(what + " record out of range (file truncated?)");
    }
    Status st = f->Read(buf.p, AlignUp(r.size, kDirectIoAlign), r.offset, &got);
    if (st.ok() && got < r.size) st = bad(what + " truncated");
    if (st.ok() && XXH64(buf.p, r.size, 0) != r.hash) st = bad(what + " checksum mismatch");
    chunks[i] = st.ok() ? static_cast<uint16_t*>(env->MapAnon(cb)) : nullptr;
    if (st.ok() && !chunks[i]) st = Status::NoMemory("KV chunk");
    if (st.ok()) {
      ChunkShape sh{g.n_kv_head, g.chunk_tokens, g.head_dim, int(r.enc_tokens), l, g.n_layer};
      st = codec->Decode(sh, buf.p, r.size, chunks[i]);
    }
    if (!st.ok()) {
      free_all();
      return st;
    }
  }
  // Commit: replace the conversation (the unit table takes the chunks, freeing them on failure).
  MZ_RETURN_IF_ERROR(ctx.units_->ReplaceKv(int(h.n_tokens), std::move(chunks)));
  ctx.history_ = std::move(tokens);
  ctx.logits_.clear();
  if (info) {
    info->n_tokens = int(h.n_tokens);
    info->n_chunks = int(h.n_chunks);
    info->codec = codec->name();
    info->file_bytes = fi.size;
  }
  return Status::Ok();
}

}  // namespace mz
