// The tokens of a chat prompt, reusing those of a recent prompt that begins with the same text
// (issue 46): a returning user's client resends the whole history, which the chat template renders
// to the text of the previous turn's prompt and more (the reply, the new message), so only the text
// from the last special token the two share on is tokenized again. Built on the public C API only
// (include/mzcache.h).
//
// Exactness: the result is the tokens TokenizeText(model, text, add_special = true, parse_special =
// true) gives (tools/cli/c_api_text.h), never an approximation. llama.cpp's tokenizer first cuts the
// text at every special token it contains (the template's markers: Qwen's <|im_start|>, Llama 3's
// <|start_header_id|>) and tokenizes the pieces between them independently; so for text = A + B
// where B starts with a control token that the full tokenization reads as that token, the tokens
// are tokens(A) + tokens(B, add_special = false). A is a prefix of a cached prompt's text ending
// right before one of its control tokens, and the cached tokens of A are those of that prompt up to
// that token. Assumed of the vocabulary (true of Qwen3's and Llama 3's; tests/test_prompt_tokens.cpp
// checks both): no special token's text holds another's inside it, and no control token comes out
// of plain text (byte-pair merges never produce one). Whatever does not fit falls back to the full
// tokenization: a text that shares no special token with a cached one (a new conversation, another
// system prompt, an edit in the first message), a model whose tokenizer appends a token at the end
// (EOS) or whose token pieces do not spell the text (SentencePiece's leading space), a tail whose
// first token is not the control token expected, a tail that fails to tokenize (the full
// tokenization then gives its error).
//
// Memory: up to max_entries prompts (text, tokens, token ends) and max_bytes in all, least recently
// used dropped first; a prompt that extends a cached one replaces it (a conversation's turns keep
// one entry). Per-token kind (control or not) of the ids seen: one byte per vocabulary token.
//
// Thread-safety: Tokenize may be called from any number of threads at once (one mutex around the
// cache; tokenizing runs outside it). One object serves one model, the first it is called with:
// calls with another model are tokenized whole and not remembered.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mzcache.h"

namespace mz::serve {

class PromptTokens {
 public:
  struct Options {
    size_t max_entries = 64;
    size_t max_bytes = size_t(64) << 20;  // text + tokens + ends of every entry
  };
  PromptTokens() : PromptTokens(Options()) {}
  explicit PromptTokens(Options o) : opt_(o) {}

  // What the last Tokenize did (for tests and the response's phases).
  struct Stats {
    int reused = 0;     // tokens taken from a cached prompt (0: tokenized whole)
    int tokenized = 0;  // tokens that came out of the tokenizer in this call
  };
  // *out = the tokens of text as TokenizeText(model, text, true, true, out) gives them; returns its
  // status (MZ_OK, or mz_tokenize's, *out then empty). Remembers text and its tokens for later calls.
  int Tokenize(const mz_model* model, const std::string& text, std::vector<mz_token>* out, Stats* stats = nullptr);

  size_t entries() const;
  void Clear();

 private:
  struct Entry {
    std::string text;
    std::vector<mz_token> tokens;
    std::vector<uint32_t> ends;  // ends[i]: the text offset right after tokens[i] (an added BOS: 0)
    size_t bytes() const { return text.size() + tokens.size() * sizeof(mz_token) + ends.size() * sizeof(uint32_t); }
  };
  // Whether token t is a control token (special; parsed only with parse_special). Cached per id.
  bool IsControl(const mz_model* model, mz_token t, const std::string& piece);
  // The model's add_special behaviour, probed once: false if it appends tokens (incremental off).
  bool Probe(const mz_model* model);
  // ends of tokens[from..] laid over text from offset `at`; false if their pieces do not spell it.
  bool Walk(const mz_model* model, const std::string& text, const std::vector<mz_token>& tokens, size_t from,
            size_t at, std::vector<uint32_t>* ends);
  void Insert(std::shared_ptr<const Entry> e);

  const Options opt_;
  mutable std::mutex mu_;
  const mz_model* model_ = nullptr;  // guarded by mu_
  int probed_ = 0;                   // 0 not yet, 1 usable, -1 off (guarded by mu_)
  bool adds_bos_ = false;            // guarded by mu_
  std::list<std::shared_ptr<const Entry>> lru_;  // most recent first (guarded by mu_)
  size_t bytes_ = 0;                              // guarded by mu_
  // Per token id: 0 unknown, 1 control, 2 not. Sized at the probe; written racily (same value).
  std::unique_ptr<std::atomic<int8_t>[]> kind_;
  int32_t n_vocab_ = 0;
};

}  // namespace mz::serve
