// Long real text for building contexts: the King James Bible from Debian's bible-kjv package
// (public domain), cached as plain text. Falls back to Debian's license texts.
#pragma once
#include <string>

#include "core/status.h"

namespace mz::cli {
// Returns at least `min_bytes` of real English prose (repeating the corpus if it is shorter).
Status RealText(size_t min_bytes, std::string* out);
}  // namespace mz::cli
