// Fuzz target: the chat template applied to arbitrary messages, and tokenization of arbitrary
// bytes, through mz::Tokenizer over real vocabularies (llama.cpp's ggml-vocab-qwen2.gguf and
// ggml-vocab-llama-bpe.gguf, the two the synthesized models carry). Input layout:
//   byte 0  bit 0: vocabulary (qwen2 / llama-bpe); bit 1: add_assistant; bit 2: add_special;
//           bit 3: parse_special
//   rest    messages separated by '\0': role, content, role, content, ... (a last role without
//           content gets an empty content)
// Contracts: ApplyChat and Tokenize return a Status (never crash, never read out of bounds); every
// token is a valid id whose piece renders; the raw bytes tokenize too.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "runtime/tokenizer.h"

namespace {
mz::Tokenizer* g_tok[2] = {nullptr, nullptr};

void CheckTokens(const mz::Tokenizer& t, const std::vector<int32_t>& toks) {
  for (int32_t id : toks) {
    if (id < 0 || id >= t.n_vocab()) mz::fuzz::Fail("token id out of range: " + std::to_string(id));
    (void)t.Piece(id);
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* names[2] = {"qwen2", "llama-bpe"};
  for (int i = 0; i < 2; ++i) {
    std::unique_ptr<mz::Tokenizer> t;
    mz::Status st = mz::Tokenizer::Load(mz::fuzz::VocabDir() + "/ggml-vocab-" + names[i] + ".gguf", &t);
    if (!st.ok()) mz::fuzz::Fail("harness: " + st.ToString());
    g_tok[i] = t.release();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const mz::Tokenizer& tok = *g_tok[flags & 1];
  const bool add_assistant = flags & 2, add_special = flags & 4, parse_special = flags & 8;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == '\0') {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  std::vector<std::pair<std::string, std::string>> msgs;
  for (size_t i = 0; i < parts.size(); i += 2) msgs.push_back({parts[i], i + 1 < parts.size() ? parts[i + 1] : ""});

  std::string chat;
  std::vector<int32_t> toks;
  if (tok.ApplyChat(msgs, add_assistant, &chat).ok() && tok.Tokenize(chat, add_special, parse_special, &toks).ok())
    CheckTokens(tok, toks);
  toks.clear();
  if (tok.Tokenize(text, add_special, parse_special, &toks).ok()) CheckTokens(tok, toks);
  return 0;
}
