#include "pool/chunk_hash.h"

#include <xxhash.h>

#include <cstring>

namespace mz {

std::vector<uint64_t> ChainHashes(uint64_t model, const int32_t* tokens, int n, int chunk_tokens) {
  std::vector<uint64_t> out;
  if (chunk_tokens <= 0 || n < chunk_tokens) return out;
  out.reserve(size_t(n / chunk_tokens));
  uint64_t parent = 0;
  std::vector<uint8_t> buf;
  for (int c = 0; (c + 1) * chunk_tokens <= n; ++c) {
    // One buffer: model fingerprint, parent hash, the chunk's tokens (little-endian in memory).
    buf.resize(2 * sizeof(uint64_t) + size_t(chunk_tokens) * sizeof(int32_t));
    std::memcpy(buf.data(), &model, sizeof model);
    std::memcpy(buf.data() + sizeof model, &parent, sizeof parent);
    std::memcpy(buf.data() + 2 * sizeof(uint64_t), tokens + size_t(c) * size_t(chunk_tokens),
                size_t(chunk_tokens) * sizeof(int32_t));
    parent = XXH64(buf.data(), buf.size(), 0);
    out.push_back(parent);
  }
  return out;
}

}  // namespace mz
