// Long real text for building contexts: the King James Bible from Debian's bible-kjv package
// (public domain), cached as plain text. Falls back to Debian's license texts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "store/kv_codec.h"

namespace mz::cli {
// Returns at least `min_bytes` of real English prose (repeating the corpus if it is shorter).
Status RealText(size_t min_bytes, std::string* out);
// Real KV: prefill of 512 tokens of real text on the model; returns chunks 0 and 1 of every layer
// (in layer order, 2 per layer) as raw fp16 chunks and their shape (full chunks); *n_head (if
// given) receives the model's query heads.
Status RealKvChunks(const std::string& model_path, std::vector<std::vector<uint16_t>>* chunks, ChunkShape* shape,
                    int* n_head = nullptr);
}  // namespace mz::cli
