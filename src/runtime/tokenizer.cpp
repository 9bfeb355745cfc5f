#include "runtime/tokenizer.h"

#include <exception>

#include "core/ggml_log.h"
#include "llama.h"

namespace mz {

Tokenizer::~Tokenizer() {
  if (model_) llama_model_free(model_);
}

Status Tokenizer::Load(const std::string& path, std::unique_ptr<Tokenizer>* out) {
  InitLibraryLogging();
  static bool backend_init = (llama_backend_init(), true);
  (void)backend_init;
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  {
    LogCapture cap;
    t->model_ = llama_model_load_from_file(path.c_str(), mp);
    if (!t->model_) return Status::Corruption(path + ": cannot load the tokenizer: " + cap.text());
  }
  t->vocab_ = llama_model_get_vocab(t->model_);
  *out = std::move(t);
  return Status::Ok();
}

Status Tokenizer::Tokenize(const std::string& text, bool add_special, bool parse_special,
                           std::vector<int32_t>* out) const {
  // libllama throws through its C API on some input (std::invalid_argument "invalid codepoint"
  // from its BPE pre-tokenizer for a 4-byte UTF-8 sequence above U+10FFFF, e.g. F6 93 96 8E): found
  // by fuzz/fuzz_chat.cpp, it terminated the process. Any exception is a Status here.
  try {
    return TokenizeImpl(text, add_special, parse_special, out);
  } catch (const std::exception& e) {
    out->clear();
    return Status::InvalidArgument(std::string("cannot tokenize the text: ") + e.what());
  }
}

Status Tokenizer::TokenizeImpl(const std::string& text, bool add_special, bool parse_special,
                               std::vector<int32_t>* out) const {
  int32_t cap = int32_t(text.size()) + 16;
  out->resize(size_t(cap));
  int32_t n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out->data(), cap, add_special, parse_special);
  if (n < 0) {
    out->resize(size_t(-n));
    n = llama_tokenize(vocab_, text.data(), int32_t(text.size()), out->data(), -n, add_special, parse_special);
  }
  if (n < 0) return Status::Internal("tokenization failed");
  out->resize(size_t(n));
  return Status::Ok();
}

std::string Tokenizer::Piece(int32_t token) const {
  try {
    return PieceImpl(token);
  } catch (const std::exception&) {  // as Tokenize: libllama may throw; no text for this token
    return std::string();
  }
}

std::string Tokenizer::PieceImpl(int32_t token) const {
  char buf[256];
  int32_t n = llama_token_to_piece(vocab_, token, buf, sizeof buf, 0, true);
  if (n < 0) {
    std::string s(size_t(-n), '\0');
    n = llama_token_to_piece(vocab_, token, s.data(), -n, 0, true);
    s.resize(size_t(std::max(0, n)));
    return s;
  }
  return std::string(buf, size_t(n));
}

bool Tokenizer::IsEog(int32_t token) const { return llama_vocab_is_eog(vocab_, token); }
int32_t Tokenizer::n_vocab() const { return llama_vocab_n_tokens(vocab_); }

std::string Tokenizer::ChatTemplateSource() const {
  const char* t = llama_model_chat_template(model_, nullptr);
  return t ? std::string(t) : std::string();
}
std::string Tokenizer::BosText() const {
  const int32_t t = llama_vocab_bos(vocab_);
  return t < 0 ? std::string() : Piece(t);
}
std::string Tokenizer::EosText() const {
  const int32_t t = llama_vocab_eos(vocab_);
  return t < 0 ? std::string() : Piece(t);
}
bool Tokenizer::AddsBos() const { return llama_vocab_get_add_bos(vocab_); }
bool Tokenizer::AddsEos() const { return llama_vocab_get_add_eos(vocab_); }

Status Tokenizer::ApplyChat(const std::vector<std::pair<std::string, std::string>>& msgs, bool add_assistant,
                            std::string* out) const {
  try {  // as Tokenize: an exception from libllama is a Status, not a terminated process
    return ApplyChatImpl(msgs, add_assistant, out);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("cannot apply the chat template: ") + e.what());
  }
}

Status Tokenizer::ApplyChatImpl(const std::vector<std::pair<std::string, std::string>>& msgs, bool add_assistant,
                                std::string* out) const {
  std::vector<llama_chat_message> m;
  for (const auto& [role, content] : msgs) m.push_back({role.c_str(), content.c_str()});
  const char* tmpl = llama_model_chat_template(model_, nullptr);
  if (!tmpl) tmpl = "chatml";
  std::string buf(4096, '\0');
  int32_t n = llama_chat_apply_template(tmpl, m.data(), m.size(), add_assistant, buf.data(), int32_t(buf.size()));
  if (n > int32_t(buf.size())) {
    buf.resize(size_t(n));
    n = llama_chat_apply_template(tmpl, m.data(), m.size(), add_assistant, buf.data(), int32_t(buf.size()));
  }
  if (n < 0) return Status::Unsupported("the model's chat template is not supported by llama_chat_apply_template");
  buf.resize(size_t(n));
  *out = std::move(buf);
  return Status::Ok();
}

}  // namespace mz
