// Chained chunk hashes: the identity of a full KV chunk for prefix sharing across conversations.
//
// A chunk's KV depends on every token before it (causal attention), so a full chunk of T tokens
// is named by a chain: h_0 = H(model, 0, tokens[0, T)), h_c = H(model, h_{c-1}, tokens[cT, (c+1)T)),
// with H = xxh64 over (model fingerprint, parent hash, the chunk's tokens). Two conversations whose
// histories agree on their first (c+1)T tokens have the same h_c; a match is confirmed by
// comparing the tokens themselves before any KV is shared, so a hash collision costs a lookup,
// never a wrong context. Only full chunks are hashed: the partial last one is still being written.
#pragma once
#include <cstdint>
#include <vector>

namespace mz {

// Hashes of the full chunks of tokens[0, n): floor(n / chunk_tokens) values. model: the model's
// fingerprint (FileIdentity::header_hash), so chunks of different models never match.
std::vector<uint64_t> ChainHashes(uint64_t model, const int32_t* tokens, int n, int chunk_tokens);
// Appends to *hashes the hashes of the full chunks of tokens[0, n) past the ones already there,
// which must be the chain of tokens' first hashes->size() chunks (a history that only grew since):
// ChainHashes without hashing those again.
void ExtendChainHashes(uint64_t model, const int32_t* tokens, int n, int chunk_tokens, std::vector<uint64_t>* hashes);

}  // namespace mz
