// Tokenizer over llama.cpp's real vocabularies: text libllama cannot tokenize is a Status, never an
// exception escaping into the caller or a terminated process.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/tokenizer.h"

namespace mz {
namespace {

std::string Vocab(const std::string& name) { return std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab/ggml-vocab-" + name + ".gguf"; }

// Regression (fuzz/regressions/chat/invalid-codepoint-f6, found by fuzz/fuzz_chat.cpp): the 4-byte
// sequence F6 93 96 8E decodes to a code point above U+10FFFF; libllama's BPE pre-tokenizer threw
// std::invalid_argument("invalid codepoint") through llama_tokenize and the process terminated.
TEST(Tokenizer, InvalidUtf8IsAStatusNotATerminatedProcess) {
  for (const char* v : {"qwen2", "llama-bpe"}) {
    std::unique_ptr<Tokenizer> tok;
    ASSERT_TRUE(Tokenizer::Load(Vocab(v), &tok).ok()) << v;
    std::vector<int32_t> out;
    const std::string bad = "tabs\tand\xf6\x93\x96\x8e" "es";
    Status st = tok->Tokenize(bad, true, true, &out);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Status::kInvalidArgument) << v << ": " << st.ToString();
      EXPECT_TRUE(out.empty());
    }
    // The chat template over the same text, then its tokenization, the way the CLI does it.
    std::string chat;
    if (tok->ApplyChat({{"user", bad}}, true, &chat).ok()) (void)tok->Tokenize(chat, false, true, &out);
    // The tokenizer still works afterwards.
    ASSERT_TRUE(tok->Tokenize("hello world", false, false, &out).ok()) << v;
    EXPECT_FALSE(out.empty());
  }
}

}  // namespace
}  // namespace mz
