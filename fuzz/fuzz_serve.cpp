// Fuzz target: `mzcache serve`'s request bodies (tools/serve/openai_api.h: parsing and validation
// of /v1/chat/completions and /v1/completions) and the text stream the replies go through
// (tools/serve/text_stream.h). Contract checked: any bytes are either refused with a 400 and a
// message, or give a request within the documented bounds; the error and response bodies are
// valid JSON; the stream releases only valid UTF-8 that never contains a stop string, and
// releases everything it was given up to the first stop string. Tool calling: an accepted request's
// messages_json / tools_json are JSON arrays when it takes the Jinja path, tool_choice one of its
// values; the tool-call reader (tools/serve/tool_calls.h) fed the text in pieces gives the same
// content and calls as fed whole, and text without a call comes back whole as content.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tools/serve/openai_api.h"
#include "tools/serve/text_stream.h"
#include "tools/serve/tool_calls.h"
#include "tools/serve/tool_constraint.h"

namespace {
using mz::fuzz::Fail;

bool ValidUtf8(const std::string& s) { return mz::serve::SanitizeUtf8(s) == s; }

void CheckStream(const std::string& input, const std::vector<std::string>& stops) {
  mz::serve::TextStream ts(stops);
  bool stopped = false;
  std::string out;
  for (size_t i = 0; i < input.size() && !stopped;) {
    const size_t n = std::min<size_t>(1 + (uint8_t(input[i]) % 7), input.size() - i);  // pieces of 1-7 bytes
    const std::string got = ts.Push(std::string_view(input).substr(i, n), &stopped);
    if (!ValidUtf8(got)) Fail("the stream released invalid UTF-8");
    out += got;
    i += n;
  }
  out += ts.Finish();
  if (out != ts.released()) Fail("released() differs from what was returned");
  for (const auto& s : stops)
    if (out.find(s) != std::string::npos) Fail("a stop string was released");
  if (!stopped && out != mz::serve::SanitizeUtf8(input)) Fail("text without a stop string was not released whole");
}

// tool_choice "required" / named (tools/serve/tool_constraint.h) on the request's own tools: the
// input's bytes the constraint allows are taken, then the lowest allowed byte each step; the call
// must end within MaxChars bytes and read as exactly one call with JSON arguments.
void CheckConstraint(const std::string& tools_json, const std::string& name, const std::string& input) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
  for (auto syn : {mz::serve::ToolSyntax::kHermes, mz::serve::ToolSyntax::kLlama3}) {
    mz::serve::ToolCallConstraint k(syn, tools, name);
    std::string taken;
    for (char c : input)
      if (k.Allows(std::string(1, c))) k.Advance(std::string(1, c)), taken += c;
    while (!k.Complete()) {
      if (int(taken.size()) > k.MaxChars()) Fail("a constrained call longer than MaxChars");
      int c = 0x0a;
      if (!k.Allows("\n"))
        for (c = 0x20; c < 0x100 && !k.Allows(std::string(1, char(c))); ++c) {
        }
      if (c == 0x100) Fail("a constrained call stuck after: " + taken);
      k.Advance(std::string(1, char(c)));
      taken += char(c);
    }
    mz::serve::ToolCallStream s(syn, [] { return std::string("id"); });
    std::vector<mz::serve::ToolEvent> ev;
    s.Push(taken, &ev);
    s.Finish(&ev);
    if (s.calls().size() != 1) Fail("a complete constrained call that is not one call: " + taken);
    if (!nlohmann::json::parse(s.calls()[0].arguments, nullptr, false).is_object()) Fail("constrained arguments not an object");
  }
}

void CheckToolCalls(const std::string& input) {
  for (auto syn : {mz::serve::ToolSyntax::kHermes, mz::serve::ToolSyntax::kLlama3}) {
    auto run = [&](bool pieces, std::string* content, std::vector<mz::serve::ToolCall>* calls) {
      mz::serve::ToolCallStream s(syn, [] { return std::string("id"); });
      std::vector<mz::serve::ToolEvent> ev;
      for (size_t i = 0; i < input.size();) {
        const size_t n = pieces ? std::min<size_t>(1 + (uint8_t(input[i]) % 5), input.size() - i) : input.size();
        s.Push(input.substr(i, n), &ev);
        i += n;
      }
      s.Finish(&ev);
      for (auto& e : ev) {
        if (e.is_call) {
          if (nlohmann::json::parse(e.call.arguments, nullptr, false).is_discarded()) Fail("call arguments not JSON");
          calls->push_back(e.call);
        } else {
          *content += e.content;
        }
      }
    };
    std::string c1, c2;
    std::vector<mz::serve::ToolCall> k1, k2;
    run(false, &c1, &k1);
    run(true, &c2, &k2);
    if (c1 != c2 || k1.size() != k2.size()) Fail("the tool-call reader depends on how the text is split");
    if (k1.empty() && c1 != input) Fail("text without a call was not returned whole");
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) { return 0; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    mz::serve::ChatRequest r;
    mz::serve::ApiError e;
    if (!mz::serve::ParseRequest(body, chat, mz::serve::Limits(), &r, &e)) {
      if (e.http != 400 || e.message.empty()) Fail("a refusal without a 400 and a message");
      if (nlohmann::json::parse(mz::serve::ErrorBody(e), nullptr, false).is_discarded()) Fail("the error body is not JSON");
      continue;
    }
    if (chat && r.messages.empty()) Fail("a chat request without messages was accepted");
    if (!chat && r.prompt.empty()) Fail("a completion without a prompt was accepted");
    if (r.temperature < 0 || r.temperature > 2 || !(r.top_p > 0 && r.top_p <= 1) || r.max_tokens < 0 || r.stop.size() > 4)
      Fail("an accepted request out of bounds");
    if (!r.conversation.empty() && !mz::serve::ValidConversationId(r.conversation)) Fail("a bad conversation id accepted");
    for (const auto& m : r.messages)
      if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
        Fail("a bad role accepted: " + m.role);
    if (r.jinja) {
      const auto mj = nlohmann::json::parse(r.messages_json, nullptr, false);
      if (!mj.is_array() || mj.size() != r.messages.size()) Fail("messages_json is not the messages");
      if (!r.tools_json.empty() && !nlohmann::json::parse(r.tools_json, nullptr, false).is_array()) Fail("tools_json not an array");
    }
    if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required" && r.tool_choice != "function")
      Fail("a bad tool_choice accepted");
    if (r.parse_tool_calls && r.tools_json.empty()) Fail("tool calls read without tools");
    mz::serve::Usage u;
    mz::serve::TurnInfo info;
    const std::string text = chat && !r.messages.empty() ? r.messages.back().content : r.prompt;
    const std::string dumped = mz::serve::CompletionBody(r, "id", "model", 0, mz::serve::SanitizeUtf8(text), "stop", u, info)
                                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (nlohmann::json::parse(dumped, nullptr, false).is_discarded()) Fail("a response body that is not JSON");
    CheckStream(text, r.stop);
    if (chat) CheckToolCalls(text);
    if (r.parse_tool_calls && (r.tool_choice == "required" || r.tool_choice == "function"))
      CheckConstraint(r.tools_json, r.tool_choice_name, text);
  }
  // POST /tokenize, /detokenize and /slots/ID action bodies (issue 46): refused with a 400 naming a field, or within
  // bounds; the timings object of any figures is JSON.
  {
    mz::serve::TokenizeRequest t;
    mz::serve::ApiError e;
    if (!mz::serve::ParseTokenize(body, mz::serve::Limits(), &t, &e)) {
      if (e.http != 400 || e.message.empty()) Fail("a /tokenize refusal without a 400 and a message");
    } else {
      if (t.content.empty() && body.find('[') == std::string::npos) Fail("/tokenize accepted without content");
      for (const auto& part : t.content)
        if (part.is_id && part.id < 0) Fail("/tokenize accepted a negative token id");
    }
    constexpr int32_t kVocab = 1000;
    std::vector<int32_t> toks;
    mz::serve::ApiError e2;
    if (!mz::serve::ParseDetokenize(body, mz::serve::Limits(), kVocab, &toks, &e2)) {
      if (e2.http != 400 || e2.message.empty()) Fail("a /detokenize refusal without a 400 and a message");
    } else {
      for (int32_t id : toks)
        if (id < 0 || id >= kVocab) Fail("a token id out of the vocabulary accepted");
    }
    // POST /slots/ID?action=...: any body either passes (no "filename") or is a 400 with a message;
    // a "filename" is never accepted.
    for (const char* action : {"save", "restore", "erase", ""}) {
      mz::serve::SlotAction sa;
      mz::serve::ApiError e3;
      if (!mz::serve::ParseSlotAction(action, body, mz::serve::Limits(), &sa, &e3)) {
        if (e3.http != 400 || e3.message.empty()) Fail("a slot action refusal without a 400 and a message");
      } else {
        if (!*action) Fail("a slot action without an action accepted");
        const auto j = nlohmann::json::parse(body, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.contains("filename")) Fail("a slot action naming a file accepted");
      }
    }
    mz::serve::Timings tm;
    tm.set = true;
    tm.prompt_n = int(size % 1000);
    tm.prompt_ms = double(size) / 7;
    if (nlohmann::json::parse(mz::serve::TimingsJson(tm).dump(), nullptr, false).is_discarded())
      Fail("timings that are not JSON");
  }
  return 0;
}
