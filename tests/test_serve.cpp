// `mzcache serve`'s pure parts: request validation (every refusal is a 400 naming its field), the
// text stream (UTF-8 and stop strings across token pieces), and the router (continuation vs fork,
// a conversation in use is never shared, nothing is cut that another history still needs).
// The HTTP server itself is tested end to end by tests/check_serve.sh (curl, the openai client).
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include "tools/serve/metrics.h"
#include "tools/serve/openai_api.h"
#include "tools/serve/router.h"
#include "tools/serve/text_stream.h"

namespace mz::serve {
namespace {

ChatRequest Parse(const std::string& body, bool ok = true, std::string param = "") {
  ChatRequest r;
  ApiError e;
  const bool got = ParseRequest(body, true, Limits(), &r, &e);
  EXPECT_EQ(got, ok) << body << " -> " << e.message;
  if (!ok) {
    EXPECT_EQ(e.http, 400);
    EXPECT_FALSE(e.message.empty());
    if (!param.empty()) EXPECT_EQ(e.param, param) << body;
  }
  return r;
}

TEST(ServeApi, AcceptsATypicalRequest) {
  ChatRequest r = Parse(R"({"model":"x","messages":[{"role":"developer","content":"be brief"},
    {"role":"user","content":[{"type":"text","text":"hi "},{"type":"text","text":"there"}]}],
    "stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":7,"temperature":0,
    "top_p":0.5,"seed":3,"stop":["\n\n","END"],"n":1,"unknown_field":{"a":[1,2]}})");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "hi there");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 3u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
}

TEST(ServeApi, RefusesWhatItCannotHonour) {
  Parse("", false);
  Parse("not json", false);
  Parse("[1,2]", false);
  Parse(R"({"messages":[]})", false, "messages");
  Parse(R"({"model":"x"})", false, "messages");
  Parse(R"({"messages":"hi"})", false, "messages");
  Parse(R"({"messages":[{"role":"tool","content":"x"}]})", false, "messages[0].tool_call_id");  // tools: test_tool_calls
  Parse(R"({"messages":[{"role":"user"}]})", false, "messages[0].content");
  Parse(R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})", false,
        "messages[0].content[0]");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"n":2})", false, "n");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":3})", false, "temperature");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", false, "temperature");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})", false, "max_tokens");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", false, "max_tokens");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]})", false, "stop");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"stop":[""]})", false, "stop");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"presence_penalty":0.5})", false, "presence_penalty");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":"yes"})", false, "logprobs");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", false, "top_logprobs");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})", false, "top_logprobs");
  EXPECT_EQ(Parse(R"({"messages":[{"role":"user","content":"x"}]})").top_logprobs, -1);
  EXPECT_EQ(Parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})").top_logprobs, 0);
  EXPECT_EQ(Parse(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20})").top_logprobs, 20);
  Parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", false, "tools[0].function");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"stream":"yes"})", false, "stream");
  // A conversation id can never name a file.
  Parse(R"({"messages":[{"role":"user","content":"x"}],"conversation":"../etc/passwd"})", false, "conversation");
  Parse(R"({"messages":[{"role":"user","content":"x"}],"conversation":".hidden"})", false, "conversation");
  EXPECT_EQ(Parse(R"({"messages":[{"role":"user","content":"x"}],"conversation":"my-chat_1.a"})").conversation,
            "my-chat_1.a");
}

TEST(ServeApi, DeepNestingIsRefusedBeforeParsing) {
  std::string deep = R"({"messages":[{"role":"user","content":"x"}],"x":)";
  for (int i = 0; i < 100000; ++i) deep += '[';
  for (int i = 0; i < 100000; ++i) deep += ']';
  deep += '}';
  Parse(deep, false);
  EXPECT_EQ(JsonDepth(R"({"a":"[[[[[[[[{{{{\"]]]","b":[{"c":[]}]})", 32), 4);  // brackets in strings do not count
  EXPECT_EQ(JsonDepth("[[[[[[", 3), 4);                                       // stops counting past the limit
}

TEST(ServeApi, CompletionsTakeAPrompt) {
  ChatRequest r;
  ApiError e;
  ASSERT_TRUE(ParseRequest(R"({"prompt":"Once upon","max_tokens":4})", false, Limits(), &r, &e)) << e.message;
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_FALSE(ParseRequest(R"({"prompt":["a","b"]})", false, Limits(), &r, &e));
  EXPECT_EQ(e.param, "prompt");
}

TEST(ServeApi, LogprobsInBothFormsKeepTheExactBytes) {
  ChatRequest r;
  ApiError e;
  // A piece that is half of a UTF-8 character: the token text is sanitized, the bytes are exact.
  std::vector<TokenLogprob> lps(2);
  lps[0].piece = "\xE2\x82";
  lps[0].logprob = -0.5f;
  lps[0].top = {{"\xE2\x82", -0.5f}, {"b", -1.5f}};
  lps[1].piece = "ok";
  lps[1].logprob = -0.25f;
  ASSERT_TRUE(ParseRequest(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2})", true,
                           Limits(), &r, &e));
  nlohmann::json j = LogprobsJson(r, lps);
  ASSERT_EQ(j["content"].size(), 2u);
  EXPECT_EQ(j["content"][0]["bytes"], nlohmann::json::array({0xE2, 0x82}));
  EXPECT_EQ(j["content"][0]["token"], "\xEF\xBF\xBD\xEF\xBF\xBD");  // two U+FFFD: valid JSON text
  EXPECT_FLOAT_EQ(j["content"][0]["top_logprobs"][1]["logprob"].get<float>(), -1.5f);
  EXPECT_TRUE(j["refusal"].is_null());
  (void)j.dump();  // would throw on invalid UTF-8
  ASSERT_TRUE(ParseRequest(R"({"prompt":"x","logprobs":1})", false, Limits(), &r, &e));
  EXPECT_EQ(r.top_logprobs, 1);
  j = LogprobsJson(r, lps, 10);
  EXPECT_EQ(j["text_offset"], nlohmann::json::array({10, 12}));
  EXPECT_FLOAT_EQ(j["token_logprobs"][1].get<float>(), -0.25f);
  // A streamed chunk continues the offsets of the chunks before it.
  const nlohmann::json chunk = ChunkBody(r, "id", "m", 0, nullptr, nullptr, false, &lps, 7);
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"], nlohmann::json::array({7, 9}));
  EXPECT_FALSE(ParseRequest(R"({"prompt":"x","logprobs":6})", false, Limits(), &r, &e));
  EXPECT_EQ(e.param, "logprobs");
  ASSERT_TRUE(ParseRequest(R"({"messages":[{"role":"user","content":"x"}]})", true, Limits(), &r, &e));
  EXPECT_TRUE(LogprobsJson(r, lps).is_null());  // not asked for: null, as OpenAI
}

TEST(ServeApi, ErrorBodyIsOpenAIs) {
  ApiError e;
  e.http = 401;
  e.message = "incorrect API key";
  e.code = "invalid_api_key";
  const auto j = nlohmann::json::parse(ErrorBody(e));
  EXPECT_EQ(j["error"]["message"], "incorrect API key");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(j["error"]["param"].is_null());
}

TEST(ServeText, SplitsUtf8OnlyAtCharacterBoundaries) {
  TextStream ts({});
  bool stopped = false;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, three bytes
  EXPECT_EQ(ts.Push("a" + euro.substr(0, 1), &stopped), "a");
  EXPECT_EQ(ts.Push(euro.substr(1, 1), &stopped), "");
  EXPECT_EQ(ts.Push(euro.substr(2, 1) + "b", &stopped), euro + "b");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(ts.Finish(), "");
  EXPECT_EQ(ts.released(), "a" + euro + "b");
}

TEST(ServeText, InvalidBytesBecomeReplacementCharacters) {
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");          // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");          // U+1F600 stays
  // A truncated sequence at the very end is held by the stream, and sanitized only at Finish.
  TextStream ts({});
  bool stopped = false;
  EXPECT_EQ(ts.Push("x\xF0\x9F", &stopped), "x");
  EXPECT_EQ(ts.Finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // A lead byte that can never start a valid sequence is not held.
  TextStream ts2({});
  EXPECT_EQ(ts2.Push("y\xC1", &stopped), "y\xEF\xBF\xBD");
}

TEST(ServeText, StopStringsAcrossPiecesAreNeverShown) {
  TextStream ts({"STOP", "\n\n"});
  bool stopped = false;
  EXPECT_EQ(ts.Push("hello S", &stopped), "hello ");  // "S" may begin STOP: held
  EXPECT_EQ(ts.Push("T", &stopped), "");
  EXPECT_EQ(ts.Push("x", &stopped), "STx");           // it did not: released
  EXPECT_EQ(ts.Push(" ST", &stopped), " ");
  EXPECT_EQ(ts.Push("OP and more", &stopped), "");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(ts.Push("later", &stopped), "");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(ts.Finish(), "");
  EXPECT_EQ(ts.released(), "hello STx ");
  TextStream nl({"\n\n"});
  EXPECT_EQ(nl.Push("a\n", &stopped), "a");
  EXPECT_EQ(nl.Push("\nb", &stopped), "");
  EXPECT_TRUE(stopped);
}

std::vector<int32_t> Seq(int from, int n) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}
std::vector<int32_t> Cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The pool's side of the router (histories and turn marks), as the server reads them.
struct FakePool {
  std::map<std::string, std::pair<std::vector<int32_t>, int>> convs;
  std::mutex mu;
  int lookups = 0;
  Router::Lookup Lookup() {
    return [this](const std::string& id, std::vector<int32_t>* h, int* mark) {
      std::lock_guard<std::mutex> lk(mu);
      ++lookups;
      auto it = convs.find(id);
      if (it == convs.end()) return false;
      *h = it->second.first;
      *mark = it->second.second;
      return true;
    };
  }
  // A turn ended: the pool holds its new history and mark; the router's claim ends.
  void Turn(Router& r, const std::string& id, std::vector<int32_t> history, int mark) {
    {
      std::lock_guard<std::mutex> lk(mu);
      convs[id] = {std::move(history), mark};
    }
    r.Release(id);
  }
};

TEST(ServeRouter, ContinuesTheConversationWhoseHistoryTheRequestResends) {
  FakePool pool;
  Router r(pool.Lookup());
  const auto sys = Seq(1000, 50), q1 = Seq(2000, 10), reply = Seq(3000, 20), q2 = Seq(4000, 8);
  Router::Claim c = r.Acquire(Cat(sys, q1), "A");
  EXPECT_TRUE(c.is_new);
  pool.Turn(r, "A", Cat(Cat(sys, q1), reply), int(sys.size() + q1.size()));
  // Turn 2 resends the reply: all of it is kept.
  c = r.Acquire(Cat(Cat(Cat(sys, q1), reply), q2), "B");
  EXPECT_FALSE(c.is_new);
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, int(sys.size() + q1.size() + reply.size()));
  EXPECT_EQ(c.expected, Cat(Cat(sys, q1), reply));
  pool.Turn(r, "A", Cat(Cat(Cat(sys, q1), reply), q2), 88);
  // A client that re-tokenized the reply differently: kept up to where they differ (past the prompt).
  FakePool pool2;
  Router r2(pool2.Lookup());
  r2.Acquire(Cat(sys, q1), "A");
  pool2.Turn(r2, "A", Cat(Cat(sys, q1), reply), 60);
  auto other_reply = reply;
  other_reply[5] = 7;
  c = r2.Acquire(Cat(Cat(Cat(sys, q1), other_reply), q2), "B");
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, 65);
}

TEST(ServeRouter, AHistoryThatDivergesEarlierForksInsteadOfCutting) {
  FakePool pool;
  Router r(pool.Lookup());
  const auto sys = Seq(1000, 50);
  r.Acquire(Cat(sys, Seq(2000, 10)), "A");
  pool.Turn(r, "A", Cat(Cat(sys, Seq(2000, 10)), Seq(3000, 20)), 60);
  // Another user with the same system prompt: a new conversation (the pool shares the prefix
  // chunks); A keeps its whole history.
  Router::Claim c = r.Acquire(Cat(sys, Seq(5000, 10)), "B");
  EXPECT_TRUE(c.is_new);
  EXPECT_EQ(c.id, "B");
  pool.Turn(r, "B", Cat(sys, Seq(5000, 12)), 60);
  // An edit of A's first question forks too.
  auto edited = Cat(sys, Seq(2000, 10));
  edited[55] = 1;
  c = r.Acquire(edited, "C");
  EXPECT_TRUE(c.is_new);
  // Regenerating A's reply (the same prompt again) continues A, cutting only its last reply.
  c = r.Acquire(Cat(sys, Seq(2000, 10)), "D");
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, 59);  // one prompt token is always computed
}

TEST(ServeRouter, AReplyWhoseFirstTokenMergesWithThePromptsLastContinues) {
  // Qwen3 through the openai client: the prompt ends "...assistant" "\n", the reply starts "\n";
  // resent, "\n" + "\n" tokenize as one "\n\n" token, so the history differs from the mark's last
  // token on. Before this rule every such second turn started a new conversation (0 cached).
  FakePool pool;
  Router r(pool.Lookup());
  const auto prompt = Seq(1000, 16);
  r.Acquire(prompt, "A");
  pool.Turn(r, "A", Cat(prompt, Seq(3000, 16)), 16);
  auto resent = Cat(Seq(1000, 15), Seq(4000, 30));  // token 15 merged with the reply's first
  Router::Claim c = r.Acquire(resent, "B");
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, 15);
  r.Release("A");
  // Diverging two tokens before the mark is another conversation.
  c = r.Acquire(Cat(Seq(1000, 14), Seq(4000, 30)), "C");
  EXPECT_TRUE(c.is_new);
}

TEST(ServeRouter, AConversationInUseIsNeverShared) {
  FakePool pool;
  Router r(pool.Lookup());
  r.Acquire(Seq(1, 10), "A");
  pool.Turn(r, "A", Seq(1, 30), 10);
  Router::Claim a = r.Acquire(Seq(1, 40), "X");
  EXPECT_EQ(a.id, "A");
  Router::Claim b = r.Acquire(Seq(1, 40), "Y");  // the same history while A generates: a fork
  EXPECT_EQ(b.id, "Y");
  EXPECT_TRUE(b.is_new);
  std::string why;
  Router::Claim c;
  EXPECT_FALSE(r.AcquireId("A", Seq(1, 40), &c, &why));
  EXPECT_NE(why.find("in use"), std::string::npos);
  r.Abandon("A", /*damaged=*/false);
  EXPECT_TRUE(r.AcquireId("A", Seq(1, 40), &c, &why));
  EXPECT_EQ(c.keep, 30);
  r.Abandon("A", /*damaged=*/true);
  EXPECT_FALSE(r.AcquireId("A", Seq(1, 40), &c, &why));
  EXPECT_NE(why.find("damaged"), std::string::npos);
  // A damaged conversation is not matched implicitly either.
  Router::Claim d = r.Acquire(Seq(1, 40), "Z");
  EXPECT_NE(d.id, "A");
}

TEST(ServeRouter, AResendWaitsForAConversationBeingReleasedInsteadOfForking) {
  FakePool pool;
  Router r(pool.Lookup());
  r.Acquire(Seq(1, 10), "A");
  pool.Turn(r, "A", Seq(1, 30), 10);
  Router::Claim a = r.Acquire(Seq(1, 40), "X");  // a turn on A; its client goes away
  ASSERT_EQ(a.id, "A");
  Router::Wait wait;
  wait.busy = std::chrono::milliseconds(5000);
  wait.releasing = std::chrono::milliseconds(5000);
  std::thread turn([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.Releasing("A");  // its write failed
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pool.Turn(r, "A", Seq(1, 45), 40);  // the cancelled turn committed
  });
  const auto t0 = std::chrono::steady_clock::now();
  Router::Claim b = r.Acquire(Seq(1, 40), "Y", wait);  // the same history again, at once
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  turn.join();
  EXPECT_EQ(b.id, "A");
  EXPECT_EQ(b.keep, 39);
  EXPECT_LT(s, 4.0);
  // A claim that never ends: the request forks once its wait is over.
  Router::Wait brief;
  brief.busy = std::chrono::milliseconds(20);
  Router::Claim c = r.Acquire(Seq(1, 40), "Z", brief);
  EXPECT_EQ(c.id, "Z");
  EXPECT_TRUE(c.is_new);
  // Without a wait (the default) a claimed conversation forks at once; a first turn still running
  // (no history yet) is never waited for.
  r.Acquire(Seq(500, 5), "N");
  const auto t1 = std::chrono::steady_clock::now();
  Router::Claim d = r.Acquire(Seq(500, 5), "M", wait);
  EXPECT_EQ(d.id, "M");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 1.0);
}

TEST(ServeRouter, NamedConversationsAreReachedByNameOnly) {
  FakePool pool;
  Router r(pool.Lookup(), [](const std::string& id) { return id.rfind("c-", 0) == 0; });
  std::string why;
  Router::Claim c;
  ASSERT_TRUE(r.AcquireId("mine", Seq(1, 10), &c, &why));
  EXPECT_TRUE(c.is_new);
  pool.Turn(r, "mine", Seq(1, 20), 10);
  c = r.Acquire(Seq(1, 30), "c-1");  // mine's history, but mine was named: not routed there
  EXPECT_EQ(c.id, "c-1");
  pool.Turn(r, "c-1", Seq(1, 31), 30);
  c = r.Acquire(Seq(1, 40), "c-2");
  EXPECT_EQ(c.id, "c-1");
  EXPECT_EQ(c.keep, 31);
}

TEST(ServeRouter, WithoutATurnMarkOnlyWholeExtensionsContinue) {
  FakePool pool;
  Router r(pool.Lookup());
  pool.convs["A"] = {Seq(1, 30), -1};  // stored before turn marks were the pool's
  r.Put("A");
  Router::Claim c = r.Acquire(Cat(Seq(1, 25), Seq(100, 5)), "B");  // diverges inside A's history
  EXPECT_TRUE(c.is_new);
  c = r.Acquire(Cat(Seq(1, 30), Seq(100, 5)), "C");
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, 30);
  pool.convs["E"] = {Seq(1, 10), 99};  // a mark past the history counts as its end
  r.Put("E");
  c = r.Acquire(Cat(Seq(1, 10), Seq(7, 3)), "F");
  EXPECT_EQ(c.id, "E");
}

TEST(ServeRouter, KeepsNoHistoryOfItsOwnTheNextRequestSeesThePoolsChange) {
  // The pool is the one owner: a history changed behind the router (a truncate, a conversation
  // cut by another path) is what the next request is matched against.
  FakePool pool;
  Router r(pool.Lookup());
  r.Acquire(Seq(1, 10), "A");
  pool.Turn(r, "A", Seq(1, 30), 10);
  pool.convs["A"] = {Seq(1, 12), 10};  // the pool now holds less
  Router::Claim c = r.Acquire(Seq(1, 40), "B");
  EXPECT_EQ(c.id, "A");
  EXPECT_EQ(c.keep, 12);
  EXPECT_EQ(c.expected, Seq(1, 12));
  r.Release("A");
  pool.convs.erase("A");  // unreadable (gone from the pool): not matched
  c = r.Acquire(Seq(1, 40), "G");
  EXPECT_EQ(c.id, "G");
  EXPECT_GT(pool.lookups, 0);
}

TEST(ServeMetrics, RendersTheTextFormat) {
  MetricsRegistry m;
  m.Add("a_total", "help with \\ and\nnewline", 2, {{"k", "q\"uo\\te\nnl"}});
  m.Add("a_total", "", 3, {{"k", "q\"uo\\te\nnl"}});
  m.Add("a_total", "", -1);  // ignored
  m.Set("g", "a gauge", 0.25);
  m.Observe("h_seconds", "a histogram", {0.1, 1}, 0.05);
  m.Observe("h_seconds", "a histogram", {0.1, 1}, 0.1);  // le: inclusive
  m.Observe("h_seconds", "a histogram", {0.1, 1}, 5);
  m.Add("bad name", "x", 1);                 // invalid: ignored
  m.Add("g", "x", 1);                        // another type: ignored
  m.Observe("h_seconds", "x", {0.2}, 1);     // other buckets: ignored
  m.Add("l_total", "x", 1, {{"le", "1"}});   // reserved label: ignored
  EXPECT_EQ(m.Value("a_total", {{"k", "q\"uo\\te\nnl"}}), 5);
  const std::string t = m.Render();
  EXPECT_EQ(t,
            "# HELP a_total help with \\\\ and\\nnewline\n"
            "# TYPE a_total counter\n"
            "a_total{k=\"q\\\"uo\\\\te\\nnl\"} 5\n"
            "# HELP g a gauge\n# TYPE g gauge\ng 0.25\n"
            "# HELP h_seconds a histogram\n# TYPE h_seconds histogram\n"
            "h_seconds_bucket{le=\"0.1\"} 2\nh_seconds_bucket{le=\"1\"} 2\nh_seconds_bucket{le=\"+Inf\"} 3\n"
            "h_seconds_sum 5.15\nh_seconds_count 3\n");
  EXPECT_EQ(MetricsRegistry::FormatValue(1e300 * 1e300), "+Inf");
  EXPECT_EQ(MetricsRegistry::FormatValue(123456789), "123456789");
}

TEST(ServeApi, TokenizeAndDetokenizeBodies) {
  TokenizeRequest t;
  ApiError e;
  ASSERT_TRUE(ParseTokenize(R"({"content":"hi","with_pieces":true})", Limits(), &t, &e));
  ASSERT_EQ(t.content.size(), 1u);
  EXPECT_FALSE(t.content[0].is_id);
  EXPECT_EQ(t.content[0].text, "hi");
  EXPECT_TRUE(t.with_pieces);
  EXPECT_FALSE(t.add_special);
  // llama-server's mixed arrays: strings and ids in order (ids checked against the vocabulary later).
  ASSERT_TRUE(ParseTokenize(R"({"content":["a",7,"b",18446744073709551615]})", Limits(), &t, &e));
  ASSERT_EQ(t.content.size(), 4u);
  EXPECT_TRUE(!t.content[0].is_id && t.content[0].text == "a");
  EXPECT_TRUE(t.content[1].is_id && t.content[1].id == 7);
  EXPECT_TRUE(!t.content[2].is_id && t.content[2].text == "b");
  EXPECT_TRUE(t.content[3].is_id && t.content[3].id > 0);  // clamped, then out of any vocabulary
  for (auto [body, param] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "content"}, {R"({"content":1})", "content"}, {R"({"content":["a",-1]})", "content[1]"},
           {R"({"content":[1.5]})", "content[0]"}, {R"({"content":[null]})", "content[0]"},
           {R"({"content":[["a"]]})", "content[0]"}, {R"({"content":"a","add_special":"y"})", "add_special"},
           {R"({"content":"a","with_pieces":0})", "with_pieces"}, {"[]", ""}, {"nope", ""}}) {
    EXPECT_FALSE(ParseTokenize(body, Limits(), &t, &e)) << body;
    EXPECT_EQ(e.http, 400);
    EXPECT_EQ(e.param, param) << body;
  }
  std::vector<int32_t> toks;
  ASSERT_TRUE(ParseDetokenize(R"({"tokens":[0,5,9]})", Limits(), 10, &toks, &e));
  EXPECT_EQ(toks, (std::vector<int32_t>{0, 5, 9}));
  for (auto [body, param] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "tokens"}, {R"({"tokens":3})", "tokens"}, {R"({"tokens":[1,10]})", "tokens[1]"},
           {R"({"tokens":[-1]})", "tokens[0]"}, {R"({"tokens":[1.5]})", "tokens[0]"},
           {R"({"tokens":[18446744073709551615]})", "tokens[0]"}}) {
    EXPECT_FALSE(ParseDetokenize(body, Limits(), 10, &toks, &e)) << body;
    EXPECT_EQ(e.param, param) << body;
  }
  EXPECT_EQ(PieceJson("ok"), "ok");
  EXPECT_EQ(PieceJson("\xe4"), nlohmann::json::array({0xe4}));
}

// POST /slots/ID?action=...: the three actions, an empty or object body; a filename (llama-server's
// file for save/restore) is refused naming it, whatever it says; anything else is a 400 too.
TEST(ServeApi, SlotActionBodies) {
  SlotAction a;
  ApiError e;
  EXPECT_TRUE(ParseSlotAction("save", "", Limits(), &a, &e));
  EXPECT_EQ(a, SlotAction::kSave);
  EXPECT_TRUE(ParseSlotAction("restore", " \n", Limits(), &a, &e));
  EXPECT_EQ(a, SlotAction::kRestore);
  EXPECT_TRUE(ParseSlotAction("erase", "{}", Limits(), &a, &e));
  EXPECT_EQ(a, SlotAction::kErase);
  EXPECT_TRUE(ParseSlotAction("save", R"({"other":1})", Limits(), &a, &e));
  const std::vector<std::tuple<std::string, std::string, std::string>> bad = {
      {"", "", "action"}, {"load", "", "action"}, {"SAVE", "", "action"},
      {"save", R"({"filename":"slot0.bin"})", "filename"}, {"restore", R"({"filename":"../../x"})", "filename"},
      {"erase", R"({"filename":null})", "filename"}, {"save", "not json", ""}, {"save", "[]", ""},
      {"save", std::string(100, '[') + std::string(100, ']'), ""}};
  for (const auto& [action, body, param] : bad) {
    ApiError err;
    EXPECT_FALSE(ParseSlotAction(action, body, Limits(), &a, &err)) << action << " " << body;
    EXPECT_EQ(err.http, 400) << body;
    EXPECT_EQ(err.param, param) << action << " " << body << ": " << err.message;
    EXPECT_FALSE(err.message.empty());
  }
}

TEST(ServeApi, TimingsAsLlamaServer) {
  Timings t;
  t.set = true;
  t.prompt_n = 10;
  t.cache_n = 4;
  t.prompt_ms = 20;
  t.predicted_n = 5;
  t.predicted_ms = 50;
  const nlohmann::json j = TimingsJson(t);
  EXPECT_EQ(j["prompt_n"], 10);
  EXPECT_EQ(j["cache_n"], 4);
  EXPECT_DOUBLE_EQ(j["prompt_per_token_ms"].get<double>(), 2);
  EXPECT_DOUBLE_EQ(j["prompt_per_second"].get<double>(), 500);
  EXPECT_DOUBLE_EQ(j["predicted_per_token_ms"].get<double>(), 10);
  EXPECT_DOUBLE_EQ(j["predicted_per_second"].get<double>(), 100);
  t.predicted_ms = 0;
  EXPECT_EQ(TimingsJson(t)["predicted_per_second"], 0.0);
}

// The usage chunk's "mzcache" object carries the turn's phases in the order they ran (where the
// time to the first token went), and none when the turn reported none.
TEST(ServeApi, TurnPhasesInTheirOrder) {
  ChatRequest req;
  req.chat = true;
  Usage u;
  TurnInfo info;
  info.conversation = "c-1";
  info.bytes_read_compressed = 7;
  nlohmann::json j = UsageChunkBody(req, "id", "m", 1, u, info);
  EXPECT_FALSE(j["mzcache"].contains("phases_ms"));
  EXPECT_EQ(j["mzcache"]["bytes_read_compressed"], 7);
  info.phases_ms = {{"parse", 0.5}, {"restore_generate", 120.0}, {"first_text", 1.5}};
  j = UsageChunkBody(req, "id", "m", 1, u, info);
  const nlohmann::json& ph = j["mzcache"]["phases_ms"];
  ASSERT_TRUE(ph.is_array());
  std::vector<std::string> names;
  for (const auto& p : ph) names.push_back(p.at(0).get<std::string>());
  EXPECT_EQ(names, (std::vector<std::string>{"parse", "restore_generate", "first_text"}));
  EXPECT_DOUBLE_EQ(ph.at(1).at(1).get<double>(), 120.0);
}

}  // namespace

}  // namespace mz::serve
