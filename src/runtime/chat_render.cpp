// See chat_render.h. The preparation of the messages follows llama.cpp's common/chat.cpp
// (common_chat_msgs_parse_oaicompat, common_chat_msg::to_json_oaicompat, the workarounds of
// common_chat_templates_apply_jinja and common_chat_template_direct_apply) for the parts that
// concern OpenAI messages and tools; the engine itself is llama.cpp's, called as chat.cpp calls it.
#include "runtime/chat_render.h"

#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

// llama.cpp's engine (MZ_LLAMA_SRC/common: a per-file include path, see CMakeLists.txt).
#include "jinja/caps.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "json.h"

namespace mz {
namespace {

using ojson = nlohmann::ordered_json;  // key order kept: a tool's schema renders as the client sent it

std::string FormatTime(std::time_t t, const char* fmt) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof(buf), fmt, &tm);
  return std::string(buf, n);
}

// Text of a content value: a string, null (""), or an array of {type:"text", text} parts joined by
// "\n" (llama.cpp's concat for string-only templates; Qwen3's and Llama 3.x's are).
Status ContentText(const ojson& c, const std::string& where, std::string* out) {
  out->clear();
  if (c.is_null()) return Status::Ok();
  if (c.is_string()) { *out = c.get<std::string>(); return Status::Ok(); }
  if (!c.is_array()) return Status::InvalidArgument(where + ": must be a string, an array of text parts or null");
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    if (!p.is_object() || p.value("type", "") != "text" || !p.contains("text") || !p["text"].is_string())
      return Status::InvalidArgument(where + "[" + std::to_string(i) + "]: must be {\"type\":\"text\",\"text\":string}");
    if (!out->empty()) *out += '\n';
    *out += p["text"].get<std::string>();
  }
  return Status::Ok();
}

// One message in llama-server's canonical shape (to_json_oaicompat).
Status Canonical(const ojson& m, size_t i, ojson* out) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return Status::InvalidArgument(where + ": must be an object");
  if (!m.contains("role") || !m["role"].is_string()) return Status::InvalidArgument(where + ".role: must be a string");
  ojson j = ojson::object();
  std::string role = m["role"].get<std::string>();
  j["role"] = role;
  std::string content;
  if (m.contains("content")) MZ_RETURN_IF_ERROR(ContentText(m["content"], where + ".content", &content));
  j["content"] = content;
  if (m.contains("reasoning_content") && m["reasoning_content"].is_string() &&
      !m["reasoning_content"].get<std::string>().empty())
    j["reasoning_content"] = m["reasoning_content"];
  if (m.contains("name") && m["name"].is_string() && !m["name"].get<std::string>().empty()) j["name"] = m["name"];
  if (m.contains("tool_call_id") && m["tool_call_id"].is_string() && !m["tool_call_id"].get<std::string>().empty())
    j["tool_call_id"] = m["tool_call_id"];
  if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    const ojson& tcs = m["tool_calls"];
    if (!tcs.is_array()) return Status::InvalidArgument(where + ".tool_calls: must be an array");
    ojson arr = ojson::array();
    for (size_t k = 0; k < tcs.size(); ++k) {
      const std::string w = where + ".tool_calls[" + std::to_string(k) + "]";
      const ojson& tc = tcs[k];
      if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
        return Status::InvalidArgument(w + ".function: must be an object");
      const ojson& f = tc["function"];
      if (!f.contains("name") || !f["name"].is_string()) return Status::InvalidArgument(w + ".function.name: must be a string");
      std::string args;
      if (f.contains("arguments")) {
        if (f["arguments"].is_string()) args = f["arguments"].get<std::string>();
        else if (!f["arguments"].is_null()) args = f["arguments"].dump();
      }
      ojson t = ojson::object();
      t["type"] = "function";
      t["function"] = ojson::object();
      t["function"]["name"] = f["name"];
      t["function"]["arguments"] = args;
      if (tc.contains("id") && tc["id"].is_string() && !tc["id"].get<std::string>().empty()) t["id"] = tc["id"];
      arr.push_back(std::move(t));
    }
    if (!arr.empty()) j["tool_calls"] = std::move(arr);
  }
  *out = std::move(j);
  return Status::Ok();
}

struct Parsed {
  std::string src;  // the lexer's source (what chat.cpp keeps and hands the context)
  jinja::program prog;
  jinja::caps caps;
};

// Parsing and the capability probe (which runs the template a few times) once per template text.
std::shared_ptr<const Parsed> ParseCached(const std::string& tmpl) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Parsed>> cache;  // a process serves one or a few models
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = cache.find(tmpl);
    if (it != cache.end()) return it->second;
  }
  auto p = std::make_shared<Parsed>();
  jinja::lexer lexer;
  auto lexed = lexer.tokenize(tmpl);
  p->prog = jinja::parse_from_tokens(lexed);
  p->src = lexed.source;
  p->caps = jinja::caps_get(p->prog);
  std::lock_guard<std::mutex> l(mu);
  if (cache.size() >= 16) cache.clear();
  cache.emplace(tmpl, p);
  return p;
}

Status RenderImpl(const ChatRenderInput& in, std::string* out) {
  if (in.tmpl.empty()) return Status::Unsupported("the model has no chat template (tokenizer.chat_template)");
  ojson msgs_in = ojson::parse(in.messages_json, nullptr, /*allow_exceptions=*/false);
  if (msgs_in.is_discarded() || !msgs_in.is_array()) return Status::InvalidArgument("messages: must be a JSON array");
  ojson tools = ojson();
  if (!in.tools_json.empty()) {
    tools = ojson::parse(in.tools_json, nullptr, false);
    if (tools.is_discarded() || !(tools.is_array() || tools.is_null()))
      return Status::InvalidArgument("tools: must be a JSON array");
    if (tools.is_array() && tools.empty()) tools = ojson();  // llama.cpp: no tools is no "tools" variable
  }
  auto parsed = ParseCached(in.tmpl);
  const jinja::caps& caps = parsed->caps;

  ojson messages = ojson::array();
  for (size_t i = 0; i < msgs_in.size(); ++i) {
    ojson m;
    MZ_RETURN_IF_ERROR(Canonical(msgs_in[i], i, &m));
    messages.push_back(std::move(m));
  }
  // The workarounds of common_chat_templates_apply_jinja, in its order.
  if (parsed->src.find("<|channel|>") == std::string::npos)
    for (auto& m : messages)
      if (m["role"] == "developer") m["role"] = "system";
  if (!caps.supports_system_role && !messages.empty() && messages[0]["role"] == "system") {
    if (messages.size() > 1)
      messages[1]["content"] = messages[0]["content"].get<std::string>() + "\n" + messages[1]["content"].get<std::string>();
    messages.erase(messages.begin());
  }
  if (caps.supports_object_arguments)
    for (auto& m : messages)
      if (m.contains("tool_calls"))
        for (auto& tc : m["tool_calls"]) {
          auto& a = tc["function"]["arguments"];
          ojson parsed_args = ojson::parse(a.get<std::string>(), nullptr, false);
          if (parsed_args.is_discarded())
            return Status::InvalidArgument("tool call arguments must be JSON for this template: " + a.get<std::string>());
          a = std::move(parsed_args);
        }

  const std::time_t now = in.now;
  ojson inp = ojson::object();
  inp["messages"] = std::move(messages);
  inp["bos_token"] = in.bos_token;
  inp["eos_token"] = in.eos_token;
  inp["enable_thinking"] = true;  // llama-server's default
  if (tools.is_array()) inp["tools"] = std::move(tools);
  inp["datetime"] = FormatTime(now, "%b %d %Y");
  inp["date_string"] = FormatTime(now, "%d %b %Y");
  if (in.add_generation_prompt) inp["add_generation_prompt"] = true;

  jinja::context ctx(parsed->src);
  ctx.current_time = now;
  jinja::global_from_json(ctx, common_json::parse(inp.dump()), /*mark_input=*/true);
  jinja::runtime runtime(ctx);
  const jinja::value results = runtime.execute(parsed->prog);
  auto parts = jinja::runtime::gather_string_parts(results);
  std::string text = parts->as_string().str();
  // As llama.cpp: the tokenizer adds BOS/EOS itself when the vocabulary says so.
  if (in.add_bos && !in.bos_token.empty() && text.compare(0, in.bos_token.size(), in.bos_token) == 0)
    text.erase(0, in.bos_token.size());
  if (in.add_eos && !in.eos_token.empty() && text.size() >= in.eos_token.size() &&
      text.compare(text.size() - in.eos_token.size(), in.eos_token.size(), in.eos_token) == 0)
    text.resize(text.size() - in.eos_token.size());
  *out = std::move(text);
  return Status::Ok();
}

}  // namespace

Status RenderChatTemplate(const ChatRenderInput& in, std::string* out) {
  out->clear();
  try {
    return RenderImpl(in, out);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("chat template: ") + e.what());
  } catch (...) {
    return Status::InvalidArgument("chat template: unknown error");
  }
}

}  // namespace mz
