// Session files: a context (tokens + every KV chunk, raw or encoded by a KV codec) saved to a file
// and loaded back in another process, so a long context is built once and a killed process resumes
// its conversation without recompute.
//
// Format (little-endian), version 1 (and 2, below):
//   [0, 4096)  header: magic "MZSESS01", u32 version, u32 n_external (0 in version 1), u64 model header hash,
//              u32 n_layer, n_kv_head, head_dim, chunk_tokens, u32 codec id, u32 n_tokens,
//              u32 n_chunks (per layer), u32 KV type of the saving context (0 f16, 1 q8_0; 0 in
//              files before 0.9, which were all f16), u64 index_offset, u64 index_bytes,
//              u64 data_offset, u64 xxh64 of the header bytes before this field
//   index      n_tokens x i32 tokens, then n_layer x n_chunks records {u64 offset, u64 size,
//              u64 xxh64, u32 enc_tokens, u32 reserved}, then u64 xxh64 of the index
//   data       chunk payloads, each at a 4096-aligned offset (direct-I/O friendly)
//   Since 0.17 the header block holds, at offset 512 (zero in older files), an extension: magic
//   "MZSEXT01", i32 turn mark (where the last turn's prompt ended, 0..n_tokens: Context::turn_mark),
//   u32 reserved, u64 xxh64 of those 16 bytes. Absent: no mark (-1). Readers before 0.17 ignore it;
//   a bad extension checksum or a mark beyond the tokens is kCorruption.
// Version 2 (a pool's conversation whose first n_external chunks are a shared prefix): those chunks'
//   records are all zero and their payloads live in chunk files (SaveChunkFile), named by the chained
//   hash of the file's own tokens (pool/chunk_hash.h); version 1 readers refuse it. A chunk file is a
//   version-1 session of exactly one full chunk (its T tokens, every layer).
// Writing is crash-safe: a temporary name, fsync, rename over the target, fsync of the directory.
// Loading verifies every checksum, the model identity and the KV geometry before touching the
// context; on any error the context is left unchanged (kCorruption names what is wrong).
// KV type (store/q8_kv.h): chunk blobs are the codec's ordinary blobs whatever the KV type of the
// context that saved them, so a session loads into a context of either KV type, converted: a q8_0
// context q8-encodes fp16 rows, an fp16 context gets the q8 decode of q8 rows. Same type: exact
// for lossless codecs and for q8 from a q8_0 context.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <functional>

#include "core/status.h"
#include "memory/kv_cache.h"
#include "memory/shared_chunks.h"
#include "store/q8_kv.h"

namespace mz {

class Context;
class Model;

struct SessionInfo {
  int n_tokens = 0;
  int n_chunks = 0;
  int n_external = 0;  // leading chunks stored in chunk files (version 2), not in this file
  std::string codec;
  uint64_t file_bytes = 0;
  // True once the new file replaced the old one at its path (the rename done): also when the save
  // then fails (the folder's fsync), the file at path is the new one. False on every other error:
  // the file at path (if any) is untouched.
  bool replaced = false;
};

// Saves ctx with the given codec ("none" for a lossless raw copy). n_external > 0: ctx's first
// n_external chunks (full) are not written; the file (version 2) names them by the chain hashes of
// its tokens, and the caller must have stored each in its chunk file (SaveChunkFile) before this
// call. kInvalidArgument if ctx has fewer full chunks. between (optional): called before each
// chunk is read and written, with ctx locked (a pool's write-behind waits there while a generation
// needs the cores: Pool::YieldToCalls); it must not use ctx.
Status SaveSession(Context& ctx, const std::string& path, const std::string& codec, SessionInfo* info = nullptr,
                   int n_external = 0, const std::function<void()>& between = nullptr);

// Writes a chunk file: one full chunk of geometry g (tokens: its chunk_tokens tokens; read(l, dst):
// its resident form for layer l) encoded by codec, as a version-1 session of one chunk (crash-safe
// as SaveSession). SessionReader opens it (tokens(): the chunk's tokens, one chunk per layer).
// places (optional): where each layer's payload lies, once the file is in place (info->replaced),
// as SessionReader::ChunkPlace would give them.
Status SaveChunkFile(const Model& model, const KvGeometry& g, const std::string& path, const std::string& codec,
                     const int32_t* tokens, const std::function<Status(int, uint16_t*)>& read,
                     SessionInfo* info = nullptr, std::vector<SharedChunkStore::FilePlace>* places = nullptr);

// A session file opened for reading without a context: its tokens, and any chunk decoded on
// demand (a pool's index rebuilt at start, and shared prefix chunks copied out of a stored
// conversation). Open verifies the header, the index checksum, the model identity and the KV
// geometry, and that every chunk record lies inside the file (a truncated file): kCorruption
// naming what is wrong (kContextFull is never returned: there is no n_ctx here). ReadChunk
// verifies that chunk's checksum (a bit flip in a payload is found there). The file stays open until the reader is
// destroyed. Not thread-safe (one reader per thread).
class SessionReader {
 public:
  ~SessionReader();
  // model: the model the session must have been saved with (identity and geometry checked).
  // chunk_tokens: the reading context's chunk size (must equal the file's). kv_type: the form
  // ReadChunk decodes chunks into (the reading context's KV type).
  static Status Open(const Model& model, int chunk_tokens, const std::string& path,
                     std::unique_ptr<SessionReader>* out, KvType kv_type = KvType::kF16);
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The saved context's turn mark (Context::turn_mark; 0..tokens().size()), or -1: none saved.
  int turn_mark() const { return turn_mark_; }
  int n_chunks() const { return n_chunks_; }
  // Leading chunks stored in chunk files (version 2; 0 in version 1): ReadChunk refuses them
  // (kInvalidArgument) and ChunkPlace gives zeros.
  int n_external() const { return n_external_; }
  std::string codec() const;
  uint64_t file_bytes() const { return file_bytes_; }
  // Decodes chunk (layer, chunk) into dst (chunk_bytes() of fp16 K then V; q8_0: of the resident q8
  // layout). kCorruption on a bad
  // record or checksum, kIOError on a read error.
  Status ReadChunk(int layer, int chunk, uint16_t* dst);
  // Where chunk (layer, chunk) lies in the file, as Open verified it (inside the file, aligned):
  // offset, payload bytes, the payload's xxh64 (not verified here) and its encoded rows.
  void ChunkPlace(int layer, int chunk, uint64_t* off, uint64_t* size, uint64_t* hash, int* enc_tokens) const;
  // The encoded payload of chunk (layer, chunk) as stored (not decoded), verified against its
  // checksum, and its encoded rows: what BuildSessionBytes copies into another file unchanged (a
  // pool's remote tier, pool/remote_tier.h). kCorruption / kIOError as ReadChunk; kInvalidArgument
  // for an external chunk.
  Status ReadPayload(int layer, int chunk, std::string* out, int* enc_tokens);
  uint32_t codec_id() const;

 private:
  SessionReader() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<int32_t> tokens_;
  int n_chunks_ = 0;
  int n_external_ = 0;
  int turn_mark_ = -1;
  uint64_t file_bytes_ = 0;
};
// The bytes of a session file (the layout SaveSession writes, checksums included) built from
// payloads already encoded by codec codec_id: tokens[0, n_tokens), and for every layer l and chunk
// c >= n_external, payload(l, c, &bytes, &enc_tokens) (SessionReader::ReadPayload of another file
// with the same codec and geometry). Written to a file, SessionReader opens it. n_external > 0
// makes a version-2 file naming its first n_external full chunks (their chunk files hold them).
// turn_mark (0..n_tokens, else none) is written in the header's extension, as SaveSession does.
// In memory: meant for one chunk or one conversation's tail (a pool's remote blobs). Errors:
// kInvalidArgument (more external chunks than full ones, a payload of the wrong size), or
// payload's own error.
Status BuildSessionBytes(uint64_t model_hash, const KvGeometry& g, uint32_t codec_id, const int32_t* tokens,
                         int n_tokens, int n_external,
                         const std::function<Status(int, int, std::string*, int*)>& payload, std::string* out,
                         int turn_mark = -1);

// A version-2 session's external chunks (its first r.n_external() chunks, full, every layer) as
// references of a store of shared chunks: *store, and refs[l * n_external + c], one new reference
// each, owned by the caller of the resolver (released by it on every path). An error (a chunk file
// missing or damaged) fails the open that asked; nothing is changed then.
using ExternalChunkResolver = std::function<Status(const SessionReader& r, std::shared_ptr<SharedChunkStore>* store,
                                                   std::vector<SharedChunkStore::Ref>* refs)>;

// Replaces ctx's conversation with the one in path. REQUIRES: ctx uses the same model file content.
// Reads and verifies every chunk before it returns (the context then holds them resident; external
// chunks are copied out of the store resolve gives). A version-2 file without resolve:
// kInvalidArgument.
Status LoadSession(Context& ctx, const std::string& path, SessionInfo* info = nullptr,
                   const ExternalChunkResolver& resolve = nullptr);

// Replaces ctx's conversation with the one in path WITHOUT reading its chunks: the file becomes
// the storage tier of ctx (UnitTable::AdoptStored), so the next restore_generate restores it front
// layers first, overlapped with prefill, like any conversation evicted to storage, and memory is
// spent only on what is restored. Open's checks (header, index, model identity, geometry, every
// record inside the file) come first; a chunk's checksum is verified when that chunk is read (a
// bit flip: that chunk is lost, the context reports kCorruption, never a wrong chunk).
// kInvalidArgument if the file's codec is not ctx's KV codec (LoadSession reads such a file);
// kContextFull past n_ctx; kCorruption for a damaged header or index. On error ctx is unchanged.
// The file may be rewritten (rename over it) or deleted afterwards: ctx keeps the open descriptor.
// A version-2 file's external chunks are borrowed from the store resolve gives, detached (the next
// call attaches them as it restores); without resolve such a file is refused (kInvalidArgument).
Status OpenSessionAsStorage(Context& ctx, const std::string& path, SessionInfo* info = nullptr,
                            const ExternalChunkResolver& resolve = nullptr);

}  // namespace mz
