// Text over the public C API (include/mzcache.h) for the commands built on it (tools/cli,
// tools/serve, the benches): the tokens of a text, a model's chat template over messages, a
// token's text piece, and a failed call reported on stderr. The one owner of these: the commands
// call them rather than sizing mz_tokenize / mz_chat_apply_template / mz_token_to_piece's buffers
// themselves. Includes only mzcache.h and the standard library.
//
// Ownership: nothing here keeps or frees the model or the messages; they are only read during the
// call. Thread-safety: the model is only read (mzcache.h: a model may be shared across threads for
// tokenize, piece and info), so several threads may call these on one model at once; a failure's
// text is mz_last_error() of the calling thread, set by the failing call and kept until this
// thread's next C call.
#pragma once
#include <string>
#include <vector>

#include "mzcache.h"

namespace mz::cli {

// The tokens of text. add_special: the model's BOS (and the like) first; parse_special: special
// tokens written in the text (the chat template's markers, e.g. <|im_start|>) are read as those
// tokens, not as their characters. Returns MZ_OK with *out the tokens (empty when text tokenizes
// to nothing), or mz_tokenize's negative status with *out empty (mz_last_error says why).
int TokenizeText(const mz_model* model, const std::string& text, bool add_special, bool parse_special,
                 std::vector<mz_token>* out);

// The model's chat template over msgs (add_assistant: the assistant's prompt appended), however
// long. Returns MZ_OK with *out the text, or mz_chat_apply_template's negative status
// (MZ_ERR_UNSUPPORTED: a template this build cannot apply; MZ_ERR_INVALID_ARG: a NULL model, role
// or content) with *out empty (mz_last_error says why); MZ_ERR_INTERNAL, *out empty, if the
// second call of mz_chat_apply_template needed more than the first reported (never cut silently).
int ApplyChatTemplate(const mz_model* model, const std::vector<mz_chat_message>& msgs, bool add_assistant,
                      std::string* out);
// The same over any container of messages with std::string members role and content.
template <class Messages>
int ApplyChatTemplate(const mz_model* model, const Messages& msgs, bool add_assistant, std::string* out) {
  std::vector<mz_chat_message> cm;
  cm.reserve(msgs.size());
  for (const auto& m : msgs) cm.push_back({m.role.c_str(), m.content.c_str()});
  return ApplyChatTemplate(model, cm, add_assistant, out);
}

// The text of token t, whole however long, as raw bytes (a piece may be part of a multi-byte UTF-8
// character). "" for a token outside the model's vocabulary, or one without text.
std::string TokenPiece(const mz_model* model, mz_token t);

// A failed C API call that ends the command: prints "error: <what>: <mz_last_error(), or "failed"
// when it is empty> (<mz_status_str(rc)>)" on stderr and returns 1, the command's exit code. Call it
// right after the failing call: any C call in between replaces mz_last_error().
int CFail(const std::string& what, int rc);
// The text of a failed call, for messages that do not end the command: "<mz_status_str(rc)>", then
// ": <mz_last_error()>" when that is not empty.
std::string CError(int rc);

}  // namespace mz::cli
