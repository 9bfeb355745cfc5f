// mz_chat_render (include/mzcache.h) and runtime/chat_render.h: OpenAI messages and tools rendered
// through real chat templates (Qwen3-0.6B's and Llama-3.2-3B-Instruct's, from the pinned llama.cpp
// source's models/templates) give exactly the text llama-server --jinja renders for the same
// request (its /apply-template endpoint; stored in tests/data/chat_render/, made by
// llama-server of the pinned llama.cpp on 2026-12-06 with qwen3-0.6b-q8_0.gguf and tiny-llama-q8_0.gguf).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ctime>
#include <string>

#include "mzcache.h"
#include "runtime/chat_render.h"
#include "test_util.h"
#include "chat_models.h"

namespace {

std::string Data(const std::string& name) { return mz::test::ReadFile(std::string(MZ_SOURCE_DIR "/tests/data/chat_render/") + name); }
std::string Template(const std::string& name) { return mz::test::ReadFile(std::string(MZ_LLAMA_SRC "/models/templates/") + name); }

// A request file's messages and tools, as JSON text (key order kept).
void Request(const std::string& name, std::string* messages, std::string* tools) {
  const auto j = nlohmann::ordered_json::parse(Data(name));
  *messages = j["messages"].dump();
  *tools = j.contains("tools") ? j["tools"].dump() : "";
}

std::string Render(const mz_model* m, const std::string& tmpl, const std::string& msgs, const std::string& tools) {
  return mz::test::RenderJinja(m, tmpl, msgs, tools);
}

class ChatRender : public mz::test::TwoChatModels {};

TEST_F(ChatRender, Qwen3MatchesLlamaServer) {
  const std::string tmpl = Template("Qwen-Qwen3-0.6B.jinja");
  for (const char* r : {"tools", "first", "plain"}) {
    std::string msgs, tools;
    Request(std::string("req_") + r + ".json", &msgs, &tools);
    EXPECT_EQ(Render(qwen_, tmpl, msgs, tools), Data(std::string("qwen3_") + r + ".txt")) << r;
  }
}

// Llama 3.2's template writes today's date: rendered at the date llama-server's text was made.
TEST(ChatRenderFixedClock, Llama32MatchesLlamaServer) {
  mz::ChatRenderInput in;
  in.tmpl = Template("meta-llama-Llama-3.2-3B-Instruct.jinja");
  in.bos_token = "<|begin_of_text|>";
  in.eos_token = "<|eot_id|>";
  in.add_bos = true;
  std::tm tm{};
  tm.tm_year = 2026 - 1900, tm.tm_mon = 11, tm.tm_mday = 6, tm.tm_hour = 12;
  in.now = std::mktime(&tm);  // noon local time: 06 Dec 2026 in any time zone
  for (const char* r : {"tools", "first", "plain"}) {
    Request(std::string("req_") + r + ".json", &in.messages_json, &in.tools_json);
    std::string out;
    ASSERT_TRUE(mz::RenderChatTemplate(in, &out).ok()) << r;
    EXPECT_EQ(out, Data(std::string("llama32_") + r + ".txt")) << r;
  }
}

// One path or two (tools/serve/server.cpp Prompt): for a plain chat, Qwen3's real template through
// Jinja gives the text the built-in heuristics give today (the synthesized models carry a ChatML
// template); Llama 3.2's adds its dated system header, which the heuristic path does not write.
TEST_F(ChatRender, PlainChatAgainstHeuristicPath) {
  std::string msgs, tools;
  Request("req_plain.json", &msgs, &tools);
  const auto j = nlohmann::json::parse(msgs);
  std::vector<mz_chat_message> cm;
  for (const auto& m : j) cm.push_back({m["role"].get_ref<const std::string&>().c_str(), m["content"].get_ref<const std::string&>().c_str()});
  char buf[4096];
  ASSERT_GT(mz_chat_apply_template(qwen_, cm.data(), cm.size(), true, buf, sizeof buf), 0);
  EXPECT_EQ(Render(qwen_, Template("Qwen-Qwen3-0.6B.jinja"), msgs, ""), std::string(buf));
  ASSERT_GT(mz_chat_apply_template(llama_, cm.data(), cm.size(), true, buf, sizeof buf), 0);
  const std::string jinja = Render(llama_, Template("meta-llama-Llama-3.2-3B-Instruct.jinja"), msgs, "");
  EXPECT_NE(jinja, std::string(buf));
  EXPECT_NE(jinja.find("Cutting Knowledge Date"), std::string::npos);
  EXPECT_EQ(std::string(buf).find("Cutting Knowledge Date"), std::string::npos);
}

TEST_F(ChatRender, ModelsOwnTemplateAndErrors) {
  // NULL template: the GGUF's own (the synthesized models' ChatML one, no tool syntax).
  const std::string msgs = R"([{"role":"user","content":"hi"}])";
  const std::string own = Render(qwen_, "", msgs, "");
  const std::string tail = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_TRUE(own.size() >= tail.size() && own.compare(own.size() - tail.size(), tail.size(), tail) == 0) << own;
  // Errors are codes with a message, never exceptions.
  const std::string tmpl = Template("Qwen-Qwen3-0.6B.jinja");
  EXPECT_EQ(mz_chat_render(qwen_, tmpl.c_str(), "not json", nullptr, true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_chat_render(qwen_, tmpl.c_str(), R"({"role":"user"})", nullptr, true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_chat_render(qwen_, tmpl.c_str(), msgs.c_str(), "{}", true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_chat_render(qwen_, "{% for x in %}", msgs.c_str(), nullptr, true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mz_last_error()).find("chat template"), std::string::npos) << mz_last_error();
  // A template that raises: its message in mz_last_error.
  EXPECT_EQ(mz_chat_render(qwen_, "{{ raise_exception('no such role') }}", msgs.c_str(), nullptr, true, nullptr, 0),
            MZ_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mz_last_error()).find("no such role"), std::string::npos) << mz_last_error();
  EXPECT_EQ(mz_chat_render(nullptr, nullptr, msgs.c_str(), nullptr, true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_chat_render(qwen_, nullptr, nullptr, nullptr, true, nullptr, 0), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_chat_render(qwen_, nullptr, msgs.c_str(), nullptr, true, nullptr, -1), MZ_ERR_INVALID_ARG);
  // Truncation: the full length back, the text cut NUL-terminated.
  char small[8];
  const int32_t n = mz_chat_render(qwen_, nullptr, msgs.c_str(), nullptr, true, small, sizeof small);
  EXPECT_GT(n, int32_t(sizeof small));
  EXPECT_EQ(std::string(small), "<|im_st");
}

}  // namespace
