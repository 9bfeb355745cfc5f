// Token pieces to the text a client may see: valid UTF-8 only, and never any part of a stop string.
//
// A token's piece can end inside a multi-byte UTF-8 character (the next token completes it), and a
// stop string can span tokens. TextStream holds back exactly what may still turn out to be either
// (an incomplete character at the end; an end that is the start of a stop string) and releases
// the rest at once. Bytes that can never be valid UTF-8 (random weights produce them) become
// U+FFFD, so a JSON encoder never sees invalid text. Not thread-safe (one per generation).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace mz::serve {

// s with every byte that does not start or belong to a well-formed UTF-8 sequence (RFC 3629: no
// overlongs, no surrogates, at most U+10FFFF) replaced by U+FFFD.
std::string SanitizeUtf8(std::string_view s);
// The end e <= s.size() such that s[0:e] does not end in a truncated (but so far valid) UTF-8
// sequence: at most 3 bytes are held.
size_t Utf8CompleteEnd(std::string_view s);

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Adds a token's piece. Returns the text that may be shown now (possibly empty). Once a stop
  // string appears, returns the text before it, sets *stopped, and every later call returns "".
  std::string Push(std::string_view piece, bool* stopped);
  // The end of the generation (no stop found): everything held back, sanitized.
  std::string Finish();
  // All text released so far (Push and Finish results, in order).
  const std::string& released() const { return released_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string released_;
  bool stopped_ = false;
};

}  // namespace mz::serve
