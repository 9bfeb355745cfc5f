// Shared by the chat tests (test_chat_render.cpp, test_prompt_tokens.cpp): a suite with the tiny
// Qwen3 and Llama 3 test models loaded once through the C API, a file read whole, and one
// mz_chat_render call's text. Header-only; include after test_util.h.
#pragma once
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "mzcache.h"
#include "test_util.h"

namespace mz::test {

// The whole file at path ("" and a test failure if it cannot be opened).
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// mz_chat_render of msgs (and tools, "" for none) through the Jinja template tmpl, with the
// generation prompt; "" and a test failure if it fails.
inline std::string RenderJinja(const mz_model* m, const std::string& tmpl, const std::string& msgs,
                               const std::string& tools) {
  const char* t = tools.empty() ? nullptr : tools.c_str();
  const int32_t n = mz_chat_render(m, tmpl.c_str(), msgs.c_str(), t, true, nullptr, 0);
  EXPECT_GE(n, 0) << mz_last_error();
  if (n < 0) return "";
  std::string out(size_t(n) + 1, '\0');
  EXPECT_EQ(mz_chat_render(m, tmpl.c_str(), msgs.c_str(), t, true, out.data(), int32_t(out.size())), n);
  out.resize(size_t(n));
  return out;
}

// A suite whose tests share tiny-qwen3 (qwen_) and tiny-llama (llama_), loaded once per suite.
class TwoChatModels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_EQ(mz_model_load(ModelPath("tiny-qwen3").c_str(), nullptr, &qwen_), MZ_OK) << mz_last_error();
    ASSERT_EQ(mz_model_load(ModelPath("tiny-llama").c_str(), nullptr, &llama_), MZ_OK) << mz_last_error();
  }
  static void TearDownTestSuite() {
    mz_model_free(qwen_);
    mz_model_free(llama_);
    qwen_ = llama_ = nullptr;
  }
  inline static mz_model* qwen_ = nullptr;
  inline static mz_model* llama_ = nullptr;
};

}  // namespace mz::test
