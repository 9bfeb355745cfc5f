// Fuzz target: `mzcache serve`'s request bodies (tools/serve/openai_api.h: parsing and validation
// of /v1/chat/completions and /v1/completions) and the text stream the replies go through
// (tools/serve/text_stream.h). Contract checked: any bytes are either refused with a 400 and a
// message, or give a request within the documented bounds; the error and response bodies are
// valid JSON; the stream releases only valid UTF-8 that never contains a stop string, and
// releases everything it was given up to the first stop string.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tools/serve/openai_api.h"
#include "tools/serve/text_stream.h"

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
      if (m.role != "system" && m.role != "user" && m.role != "assistant") Fail("a bad role accepted: " + m.role);
    mz::serve::Usage u;
    mz::serve::TurnInfo info;
    const std::string text = chat && !r.messages.empty() ? r.messages.back().content : r.prompt;
    const std::string dumped = mz::serve::CompletionBody(r, "id", "model", 0, mz::serve::SanitizeUtf8(text), "stop", u, info)
                                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (nlohmann::json::parse(dumped, nullptr, false).is_discarded()) Fail("a response body that is not JSON");
    CheckStream(text, r.stop);
  }
  // POST /tokenize and /detokenize bodies (issue 46): refused with a 400 naming a field, or within
  // bounds; the timings object of any figures is JSON.
  {
    mz::serve::TokenizeRequest t;
    mz::serve::ApiError e;
    if (!mz::serve::ParseTokenize(body, mz::serve::Limits(), &t, &e)) {
      if (e.http != 400 || e.message.empty()) Fail("a /tokenize refusal without a 400 and a message");
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
    mz::serve::Timings tm;
    tm.set = true;
    tm.prompt_n = int(size % 1000);
    tm.prompt_ms = double(size) / 7;
    if (nlohmann::json::parse(mz::serve::TimingsJson(tm).dump(), nullptr, false).is_discarded())
      Fail("timings that are not JSON");
  }
  return 0;
}
