#include "pool/chunk_hash.h"

#include <xxhash.h>

#include <cstring>

namespace mz {

std::vector<uint64_t> ChainHashes(uint64_t model, const int32_t* tokens, int n, int chunk_tokens) {
  std::vector<uint64_t> out;
  ExtendChainHashes(model, tokens, n, chunk_tokens, &out);
  return out;
}

void ExtendChainHashes(uint64_t model, const int32_t* tokens, int n, int chunk_tokens, std::vector<uint64_t>* hashes) {
  if (chunk_tokens <= 0 || n < chunk_tokens) return;
  hashes->reserve(size_t(n / chunk_tokens));
  uint64_t parent = hashes->empty() ? 0 : hashes->back();
  std::vector<uint8_t> buf(2 * sizeof(uint64_t) + size_t(chunk_tokens) * sizeof(int32_t));
  for (int c = int(hashes->size()); (c + 1) * chunk_tokens <= n; ++c) {
    // One buffer: model fingerprint, parent hash, the chunk's tokens (little-endian in memory).
    std::memcpy(buf.data(), &model, sizeof model);
    std::memcpy(buf.data() + sizeof model, &parent, sizeof parent);
    std::memcpy(buf.data() + 2 * sizeof(uint64_t), tokens + size_t(c) * size_t(chunk_tokens),
                size_t(chunk_tokens) * sizeof(int32_t));
    parent = XXH64(buf.data(), buf.size(), 0);
    hashes->push_back(parent);
  }
}

}  // namespace mz
