#include "tools/cli/c_api_text.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <utility>

namespace mz::cli {

int TokenizeText(const mz_model* model, const std::string& text, bool add_special, bool parse_special,
                 std::vector<mz_token>* out) {
  // One call with room for what text almost always gives (a token covers at least one byte; the
  // model's BOS/EOS and the like come on top): each mz_tokenize call tokenizes the whole text, so a
  // sizing call first would double the cost (a returning chat's 30 KB history: ~15 ms more per turn).
  // A second call only when the first reports more tokens than that room (MZ_ERR_INVALID_ARG, n > cap).
  int32_t cap = int32_t(std::min<size_t>(text.size() + 16, size_t(INT32_MAX)));
  out->resize(size_t(cap));
  int32_t n = 0;
  int rc = mz_tokenize(model, text.c_str(), add_special, parse_special, out->data(), cap, &n);
  if (rc != MZ_OK && n > cap) {
    cap = n;
    out->resize(size_t(cap));
    rc = mz_tokenize(model, text.c_str(), add_special, parse_special, out->data(), cap, &n);
  }
  if (rc != MZ_OK) {
    out->clear();
    return rc;
  }
  out->resize(size_t(n));
  return rc;
}

int ApplyChatTemplate(const mz_model* model, const std::vector<mz_chat_message>& msgs, bool add_assistant,
                      std::string* out) {
  out->clear();
  const int32_t n = mz_chat_apply_template(model, msgs.data(), msgs.size(), add_assistant, nullptr, 0);
  if (n < 0) return n;
  std::string text(size_t(n) + 1, '\0');  // room for the NUL it writes
  const int32_t m = mz_chat_apply_template(model, msgs.data(), msgs.size(), add_assistant, text.data(), n + 1);
  if (m < 0) return m;
  if (m > n) return MZ_ERR_INTERNAL;  // the same call reported a shorter text a moment ago
  text.resize(size_t(m));
  *out = std::move(text);
  return MZ_OK;
}

std::string TokenPiece(const mz_model* model, mz_token t) {
  char buf[256];
  const int32_t n = mz_token_to_piece(model, t, buf, int32_t(sizeof buf));
  if (n <= 0) return {};
  if (n < int32_t(sizeof buf)) return std::string(buf, size_t(n));
  std::string big(size_t(n) + 1, '\0');
  mz_token_to_piece(model, t, big.data(), n + 1);
  big.resize(size_t(n));
  return big;
}

int CFail(const std::string& what, int rc) {
  const char* msg = mz_last_error();
  std::fprintf(stderr, "error: %s: %s (%s)\n", what.c_str(), msg && *msg ? msg : "failed", mz_status_str(rc));
  return 1;
}

std::string CError(int rc) {
  const char* msg = mz_last_error();
  return std::string(mz_status_str(rc)) + (msg && *msg ? std::string(": ") + msg : "");
}

}  // namespace mz::cli
