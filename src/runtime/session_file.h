// Session files: a context (tokens + every KV chunk, raw or encoded by a KV codec) saved to a file
// and loaded back in another process, so a long context is built once and a killed process resumes
// its conversation without recompute.
//
// Format (little-endian), version 1:
//   [0, 4096)  header: magic "MZSESS01", u32 version, u32 reserved, u64 model header hash,
//              u32 n_layer, n_kv_head, head_dim, chunk_tokens, u32 codec id, u32 n_tokens,
//              u32 n_chunks (per layer), u32 reserved, u64 index_offset, u64 index_bytes,
//              u64 data_offset, u64 xxh64 of the header bytes before this field
//   index      n_tokens x i32 tokens, then n_layer x n_chunks records {u64 offset, u64 size,
//              u64 xxh64, u32 enc_tokens, u32 reserved}, then u64 xxh64 of the index
//   data       chunk payloads, each at a 4096-aligned offset (direct-I/O friendly)
// Writing is crash-safe: a temporary name, fsync, rename over the target, fsync of the directory.
// Loading verifies every checksum, the model identity and the KV geometry before touching the
// context; on any error the context is left unchanged (kCorruption names what is wrong).
#pragma once
#include <string>

#include "core/status.h"

namespace mz {

class Context;

struct SessionInfo {
  int n_tokens = 0;
  int n_chunks = 0;
  std::string codec;
  uint64_t file_bytes = 0;
};

// Saves ctx with the given codec ("none" for a lossless raw copy).
Status SaveSession(Context& ctx, const std::string& path, const std::string& codec, SessionInfo* info = nullptr);
// Replaces ctx's conversation with the one in path. REQUIRES: ctx uses the same model file content.
Status LoadSession(Context& ctx, const std::string& path, SessionInfo* info = nullptr);

}  // namespace mz
