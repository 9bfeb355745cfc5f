// Helpers shared by the pool's rooms (src/pool/pool*.cpp, conversation.cpp); not part of the pool's
// interface. A named namespace: unity builds put several of those files in one unit.
#pragma once
#include <cctype>
#include <string>

#include "memory/shared_chunks.h"
#include "runtime/context.h"
#include "runtime/session_file.h"

namespace mz {
namespace pool_internal {

constexpr const char* kStoredSuffix = ".mzs";
// <dir>/chunks/~partial-<n>: the hashes (16 hex digits a line) of chunk files that may be partial
// (their layers still arriving from the remote tier: pool_remote.cpp). Found at start, those chunk
// files are removed, then it.
constexpr const char* kPartialPrefix = "~partial-";

// A conversation id: letters, digits, '-', '_', '.', 1-128 chars, not starting with '.'.
inline bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (char ch : id)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) return false;
  return true;
}

inline bool EndsWith(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Where layer l of a chunk file's one chunk lies (SessionReader::ChunkPlace of chunk 0).
inline void PlaceOf(const SessionReader& r, int l, SharedChunkStore::FilePlace* p, int* enc_tokens) {
  r.ChunkPlace(l, 0, &p->off, &p->size, &p->hash, enc_tokens);
}

// A conversation's own RAM: borrowed shared chunks are the store's, counted once by the pool.
inline uint64_t RamOf(const MemoryReport& r) { return r.kv_resident + r.stack_mapped; }

}  // namespace pool_internal
}  // namespace mz
