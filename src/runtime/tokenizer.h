// Tokenizer: text <-> tokens and chat templates through libllama's vocabulary (a vocab-only load of
// the same GGUF: no weights are read). Thread-safety: const methods are safe concurrently.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

struct llama_model;
struct llama_vocab;

namespace mz {

class Tokenizer {
 public:
  ~Tokenizer();
  static Status Load(const std::string& gguf_path, std::unique_ptr<Tokenizer>* out);

  // Text that libllama cannot tokenize (it throws on some invalid UTF-8) is kInvalidArgument, *out
  // then empty; never an exception or a terminated process.
  Status Tokenize(const std::string& text, bool add_special, bool parse_special, std::vector<int32_t>* out) const;
  std::string Piece(int32_t token) const;  // text of one token (special tokens rendered; "" if libllama fails)
  bool IsEog(int32_t token) const;
  int32_t n_vocab() const;
  // Applies the model's chat template to (role, content) messages; add_assistant opens the reply.
  Status ApplyChat(const std::vector<std::pair<std::string, std::string>>& msgs, bool add_assistant,
                   std::string* out) const;
  // For the Jinja path (runtime/chat_render.h): the GGUF tokenizer.chat_template ("" if the file has
  // none), the BOS/EOS tokens' text ("" if the vocabulary has none) and whether Tokenize with
  // add_special adds them.
  std::string ChatTemplateSource() const;
  std::string BosText() const;
  std::string EosText() const;
  bool AddsBos() const;
  bool AddsEos() const;

 private:
  // The calls into libllama, which may throw: the public methods above catch.
  Status TokenizeImpl(const std::string& text, bool add_special, bool parse_special, std::vector<int32_t>* out) const;
  std::string PieceImpl(int32_t token) const;
  Status ApplyChatImpl(const std::vector<std::pair<std::string, std::string>>& msgs, bool add_assistant,
                       std::string* out) const;
  Tokenizer() = default;
  llama_model* model_ = nullptr;
  const llama_vocab* vocab_ = nullptr;
};

}  // namespace mz
