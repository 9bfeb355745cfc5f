#include "tools/serve/text_stream.h"

#include <algorithm>

namespace mz::serve {
namespace {

// Length of the well-formed sequence starting at s[i] (1-4), or 0 if none starts there. Truncated
// sequences (valid so far, cut by the end of s) are 0 too.
size_t SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;       // no overlongs
    if (c == 0xED) hi = 0x9F;       // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;       // no overlongs
    if (c == 0xF4) hi = 0x8F;       // <= U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// Whether s[i:] is the start of a well-formed sequence that the end of s cut short.
bool TruncatedAt(std::string_view s, size_t i) {
  std::string padded(s.substr(i));
  const unsigned char c = static_cast<unsigned char>(padded[0]);
  const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
  if (need <= padded.size()) return false;
  // Complete it with the smallest continuation bytes the lead allows and check it would be valid.
  const unsigned char second_lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
  if (padded.size() == 1) padded.push_back(char(second_lo));
  while (padded.size() < need) padded.push_back(char(0x80));
  return SequenceLength(padded, 0) == need;
}

}  // namespace

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

size_t Utf8CompleteEnd(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= std::min<size_t>(3, n); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back for its lead
    return TruncatedAt(s, n - k) ? n - k : n;
  }
  return n;
}

std::string TextStream::Push(std::string_view piece, bool* stopped) {
  *stopped = stopped_;
  if (stopped_) return {};
  pending_.append(piece);
  size_t first = std::string::npos;
  for (const auto& st : stops_) first = std::min(first, pending_.find(st));
  if (first != std::string::npos) {
    stopped_ = *stopped = true;
    std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, first));
    pending_.clear();
    released_ += out;
    return out;
  }
  // Hold back the longest end of pending_ that begins some stop string.
  size_t hold = 0;
  for (const auto& st : stops_)
    for (size_t k = std::min(st.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, st, 0, k) == 0) {
        hold = k;
        break;
      }
  size_t end = Utf8CompleteEnd(std::string_view(pending_).substr(0, pending_.size() - hold));
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, end));
  pending_.erase(0, end);
  released_ += out;
  return out;
}

std::string TextStream::Finish() {
  if (stopped_) return {};
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  released_ += out;
  return out;
}

}  // namespace mz::serve
