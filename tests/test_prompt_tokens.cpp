// tools/serve/prompt_tokens.h: a chat prompt's tokens, reusing a recent prompt's up to the last
// control token they share, are exactly the full tokenization's (TokenizeText(model, text, true,
// true)), with the real tokenizers of Qwen3 (qwen2 BPE) and Llama 3 (llama-bpe): conversations that
// grow turn by turn through the models' templates (the built-in ones and the Jinja ones with tools),
// edited histories, another system prompt, cuts inside and right after a special token, literal
// special tokens in user text, multi-byte text, random texts cut and extended at random places; and
// that the reuse actually happens (a test that only compared would pass with the cache off).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mzcache.h"
#include "test_util.h"
#include "chat_models.h"
#include "tools/cli/c_api_text.h"
#include "tools/serve/prompt_tokens.h"

namespace {

using mz::serve::PromptTokens;

using mz::test::ReadFile;

std::vector<mz_token> Full(const mz_model* m, const std::string& text) {
  std::vector<mz_token> t;
  EXPECT_EQ(mz::cli::TokenizeText(m, text, true, true, &t), MZ_OK);
  return t;
}

struct Msg {
  std::string role, content;
};
std::string Chat(const mz_model* m, const std::vector<Msg>& msgs) {
  std::string out;
  EXPECT_EQ(mz::cli::ApplyChatTemplate(m, msgs, true, &out), MZ_OK);
  return out;
}
std::string Jinja(const mz_model* m, const std::string& tmpl, const std::string& msgs, const std::string& tools) {
  return mz::test::RenderJinja(m, tmpl, msgs, tools);
}

// Words of varied shapes (spaces, punctuation, digits, newlines, multi-byte UTF-8).
std::string Words(std::mt19937& rng, int n) {
  static const char* w[] = {"the", " and", "Lord", "said,", "unto", "\n", "  ", "42", "1999.", "é", "über", "日本語",
                            "🙂", "\t", "it's", "<", "|", ">", "im", "_start", "don't", "HELLO", ":", "\n\n"};
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += w[rng() % (sizeof w / sizeof *w)];
    if (rng() % 3) s += ' ';
  }
  return s;
}

class PromptTokensTest : public mz::test::TwoChatModels {
 protected:
  // Tokenizes text through pt and checks it against the full tokenization; returns the stats.
  static PromptTokens::Stats Check(PromptTokens& pt, const mz_model* m, const std::string& text) {
    std::vector<mz_token> got;
    PromptTokens::Stats st;
    EXPECT_EQ(pt.Tokenize(m, text, &got, &st), MZ_OK);
    const std::vector<mz_token> want = Full(m, text);
    EXPECT_EQ(got, want) << "text: " << text;
    EXPECT_EQ(st.reused + st.tokenized, int(want.size()));
    return st;
  }
};

// A conversation of 6 turns through each model's own template: each return reuses all of the
// previous prompt but its last few tokens (the assistant header), and the cache holds one entry.
TEST_F(PromptTokensTest, GrowingConversationReusesThePreviousTurn) {
  for (mz_model* m : {qwen_, llama_}) {
    PromptTokens pt;
    std::mt19937 rng(7);
    std::vector<Msg> msgs = {{"system", "You are a helpful assistant."}};
    size_t prev = 0;
    for (int turn = 0; turn < 6; ++turn) {
      msgs.push_back({"user", Words(rng, 200)});
      const std::string text = Chat(m, msgs);
      const PromptTokens::Stats st = Check(pt, m, text);
      if (turn == 0) {
        EXPECT_EQ(st.reused, 0);
      } else {
        EXPECT_GE(st.reused, int(prev) - 8) << "turn " << turn;  // all but the assistant header's tokens
        EXPECT_LT(st.tokenized, int(Full(m, text).size() - prev) + 8);
      }
      EXPECT_EQ(pt.entries(), 1u);  // each turn's prompt replaced the one it extends
      prev = Full(m, text).size();
      msgs.push_back({"assistant", Words(rng, 60)});
    }
  }
}

// An edited message, another system prompt, a history cut short: exact, reusing only what the
// texts share up to a control token.
TEST_F(PromptTokensTest, EditedHistoryOtherSystemPromptAndShorterHistory) {
  for (mz_model* m : {qwen_, llama_}) {
    PromptTokens pt;
    std::mt19937 rng(11);
    std::vector<Msg> msgs = {{"system", "You are a helpful assistant."}};
    for (int i = 0; i < 4; ++i) {
      msgs.push_back({"user", Words(rng, 120)});
      msgs.push_back({"assistant", Words(rng, 40)});
    }
    msgs.push_back({"user", Words(rng, 50)});
    const std::string base = Chat(m, msgs);
    Check(pt, m, base);
    // Edited: the third message changed in its middle.
    std::vector<Msg> edited = msgs;
    edited[3].content.insert(edited[3].content.size() / 2, " EDITED ");
    const std::string edited_text = Chat(m, edited);
    PromptTokens::Stats st = Check(pt, m, edited_text);
    EXPECT_GT(st.reused, 0);
    // The reuse stops before the edited message: at most the tokens before its text.
    const size_t at = edited_text.find(" EDITED ");
    ASSERT_NE(at, std::string::npos);
    EXPECT_LE(st.reused, int(Full(m, edited_text.substr(0, at)).size()));
    // Another system prompt: nothing of the history is reused (at most the BOS and the first marker).
    std::vector<Msg> other = msgs;
    other[0].content = "You are a pirate.";
    st = Check(pt, m, Chat(m, other));
    EXPECT_LE(st.reused, 3);
    // A shorter history (the client dropped its last turns): the shared part is reused.
    std::vector<Msg> shorter(msgs.begin(), msgs.begin() + 4);
    st = Check(pt, m, Chat(m, shorter));
    EXPECT_GT(st.reused, 100);
    // The same text again: everything but the last control token's tail.
    st = Check(pt, m, base);
    EXPECT_GT(st.reused, int(Full(m, base).size()) - 8);
  }
}

// The Jinja templates with tools, tool calls and tool results (the tool-calling path of
// tools/serve/server.cpp Prompt): exact and reused as the conversation grows.
TEST_F(PromptTokensTest, JinjaTemplatesWithTools) {
  const auto req = nlohmann::ordered_json::parse(ReadFile(MZ_SOURCE_DIR "/tests/data/chat_render/req_tools.json"));
  const std::string tools = req["tools"].dump();
  struct Case {
    mz_model* m;
    std::string tmpl;
  };
  for (const Case& c : {Case{qwen_, ReadFile(MZ_LLAMA_SRC "/models/templates/Qwen-Qwen3-0.6B.jinja")},
                        Case{llama_, ReadFile(MZ_LLAMA_SRC "/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja")}}) {
    PromptTokens pt;
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    msgs.push_back(req["messages"][0]);
    msgs.push_back(req["messages"][1]);
    Check(pt, c.m, Jinja(c.m, c.tmpl, msgs.dump(), tools));
    msgs.push_back(req["messages"][2]);  // the assistant's tool call
    msgs.push_back(req["messages"][3]);  // the tool's result
    PromptTokens::Stats st = Check(pt, c.m, Jinja(c.m, c.tmpl, msgs.dump(), tools));
    EXPECT_GT(st.reused, 50);  // the system prompt with the tools' descriptions
    msgs.push_back({{"role", "assistant"}, {"content", "It is 21 degrees in Paris."}});
    msgs.push_back({{"role", "user"}, {"content", "And the time there? <|im_start|> <|eot_id|> literally."}});
    st = Check(pt, c.m, Jinja(c.m, c.tmpl, msgs.dump(), tools));
    EXPECT_GT(st.reused, 50);
    // The same history without tools: a different system prompt, exact.
    Check(pt, c.m, Jinja(c.m, c.tmpl, msgs.dump(), ""));
  }
}

// Cut points at every byte around a control token, and random extensions: the shared prefix ends
// inside a special token's text, right after it, inside a multi-byte character, in whitespace.
TEST_F(PromptTokensTest, CutsAroundSpecialTokensAndRandomExtensions) {
  for (mz_model* m : {qwen_, llama_}) {
    std::mt19937 rng(3);
    std::vector<Msg> msgs = {{"system", "Be brief."}, {"user", Words(rng, 80)}, {"assistant", Words(rng, 30)},
                             {"user", Words(rng, 80)}};
    const std::string base = Chat(m, msgs);
    static const char* ext[] = {"<|im_start|>user\nhi<|im_end|>\n", "<|start_header_id|>user<|end_header_id|>\n\nhi",
                                "<|eot_id|>", "im_start|>", "|>", " ", "\n\n", "é日", "🙂🙂", "tail words", ""};
    // Around the last control token's text (Qwen: <|im_start|>assistant; Llama 3: <|end_header_id|>).
    const size_t mark = base.rfind(m == qwen_ ? "<|im_start|>" : "<|start_header_id|>");
    ASSERT_NE(mark, std::string::npos);
    PromptTokens pt;
    Check(pt, m, base);
    for (size_t cut = mark > 4 ? mark - 4 : 0; cut <= base.size(); ++cut) {
      for (const char* e : ext) {
        PromptTokens fresh;  // each against the base alone
        Check(fresh, m, base);
        Check(fresh, m, base.substr(0, cut) + e);
      }
    }
    // Random texts: a base, then many texts cut from it at random and extended at random, all
    // through one cache (each also becomes a base for the next).
    for (int i = 0; i < 300; ++i) {
      const std::string& from = base;
      const size_t cut = rng() % (from.size() + 1);
      std::string t = from.substr(0, cut);
      const int parts = 1 + int(rng() % 4);
      for (int p = 0; p < parts; ++p) t += (rng() % 2) ? std::string(ext[rng() % (sizeof ext / sizeof *ext)]) : Words(rng, 5);
      Check(pt, m, t);
    }
  }
}

// Several threads at once on one cache, each its own conversation: every result exact.
TEST_F(PromptTokensTest, ConcurrentConversations) {
  PromptTokens pt;
  std::vector<std::thread> th;
  std::vector<int> bad(4, 0), reused(4, 0);
  for (int k = 0; k < 4; ++k) {
    th.emplace_back([&, k] {
      std::mt19937 rng(100 + k);
      std::vector<Msg> msgs = {{"system", "Thread " + std::to_string(k)}};
      for (int turn = 0; turn < 5; ++turn) {
        msgs.push_back({"user", Words(rng, 60)});
        const std::string text = Chat(qwen_, msgs);
        std::vector<mz_token> got;
        PromptTokens::Stats st;
        if (pt.Tokenize(qwen_, text, &got, &st) != MZ_OK || got != Full(qwen_, text)) bad[size_t(k)]++;
        reused[size_t(k)] += st.reused;
        msgs.push_back({"assistant", Words(rng, 20)});
      }
    });
  }
  for (auto& t : th) t.join();
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(bad[size_t(k)], 0) << k;
    EXPECT_GT(reused[size_t(k)], 0) << k;
  }
}

// Limits and the fallbacks: entries bounded; a second model is tokenized whole; a completion-style
// text without any special token is exact; a text that fails to tokenize gives the same error.
TEST_F(PromptTokensTest, LimitsAndFallbacks) {
  PromptTokens::Options o;
  o.max_entries = 2;
  PromptTokens pt(o);
  std::mt19937 rng(5);
  for (int k = 0; k < 5; ++k) Check(pt, qwen_, Chat(qwen_, {{"system", "S" + std::to_string(k)}, {"user", Words(rng, 20)}}));
  EXPECT_EQ(pt.entries(), 2u);
  // Another model through the same object: exact, not cached, nothing reused.
  const std::string l = Chat(llama_, {{"user", "hello"}});
  EXPECT_EQ(Check(pt, llama_, l).reused, 0);
  EXPECT_EQ(Check(pt, llama_, l).reused, 0);
  EXPECT_EQ(pt.entries(), 2u);
  // No special token at all.
  Check(pt, qwen_, "plain words only");
  Check(pt, qwen_, "plain words only, and more");
  // Invalid UTF-8 that the tokenizer refuses (fuzz_chat's finding): the full tokenization's status.
  const std::string good = Chat(qwen_, {{"user", "x"}});
  Check(pt, qwen_, good);  // then the bad text shares all of it: its tail is what fails
  const std::string bad = good + "\xF6\x93\x96\x8E";
  std::vector<mz_token> want, got;
  const int rc = mz::cli::TokenizeText(qwen_, bad, true, true, &want);
  EXPECT_EQ(pt.Tokenize(qwen_, bad, &got), rc);
  EXPECT_EQ(got, want);
  pt.Clear();
  EXPECT_EQ(pt.entries(), 0u);
}

// The vocabulary assumption the cut rests on (tools/serve/prompt_tokens.h): no control token's
// text holds another control token's text, in both vocabularies (every id checked).
TEST_F(PromptTokensTest, NoControlTokenTextHoldsAnother) {
  for (mz_model* m : {qwen_, llama_}) {
    mz_model_info info{};
    ASSERT_EQ(mz_model_get_info(m, &info), MZ_OK);
    std::vector<std::string> controls;
    for (mz_token t = 0; t < info.n_vocab; ++t) {
      const std::string p = mz::cli::TokenPiece(m, t);
      if (p.size() < 2) continue;
      std::vector<mz_token> a, b;
      if (mz::cli::TokenizeText(m, p, false, true, &a) != MZ_OK || a.size() != 1 || a[0] != t) continue;
      if (mz::cli::TokenizeText(m, p, false, false, &b) == MZ_OK && b.size() == 1 && b[0] == t) continue;
      controls.push_back(p);
    }
    EXPECT_GT(controls.size(), 2u);
    for (size_t i = 0; i < controls.size(); ++i)
      for (size_t j = 0; j < controls.size(); ++j)
        if (i != j) EXPECT_EQ(controls[i].find(controls[j]), std::string::npos) << controls[i] << " holds " << controls[j];
  }
}

}  // namespace
