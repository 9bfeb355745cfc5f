#include "tools/serve/openai_api.h"

#include "tools/serve/text_stream.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

namespace mz::serve {
namespace {

using nlohmann::json;

bool Fail(ApiError* err, std::string message, std::string param = "", int http = 400) {
  err->http = http;
  err->message = std::move(message);
  err->param = std::move(param);
  return false;
}

// Reads an optional number field within [lo, hi].
bool Number(const json& j, const char* key, double lo, double hi, double* out, ApiError* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number()) return Fail(err, std::string("'") + key + "' must be a number", key);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return Fail(err, std::string("'") + key + "' must be within [" + json(lo).dump() + ", " + json(hi).dump() + "]", key);
  *out = v;
  return true;
}

bool Integer(const json& j, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out, ApiError* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number_integer() && !it->is_number_unsigned())
    return Fail(err, std::string("'") + key + "' must be an integer", key);
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    return Fail(err, std::string("'") + key + "' is out of range", key);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return Fail(err, std::string("'") + key + "' must be within [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                key);
  *out = v;
  return true;
}

bool Bool(const json& j, const char* key, bool* out, ApiError* err) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_boolean()) return Fail(err, std::string("'") + key + "' must be a boolean", key);
  *out = it->get<bool>();
  return true;
}

bool Content(const json& c, const std::string& param, std::string* out, ApiError* err) {
  if (c.is_string()) {
    *out = c.get<std::string>();
    return true;
  }
  if (!c.is_array()) return Fail(err, "'content' must be a string or an array of text parts", param);
  out->clear();
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    const std::string pp = param + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return Fail(err, "a content part must be an object with a 'type'", pp);
    if (p["type"] != "text") return Fail(err, "content parts of type '" + p["type"].get<std::string>() + "' are not supported (text only)", pp);
    if (!p.contains("text") || !p["text"].is_string()) return Fail(err, "a text part needs a string 'text'", pp);
    *out += p["text"].get<std::string>();
  }
  return true;
}

// An assistant message's tool_calls (*calls: it has at least one); other roles may not have them.
bool ToolCallsField(const json& m, const std::string& role, const std::string& p, bool* calls, ApiError* err) {
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return true;
  const std::string f = p + ".tool_calls";
  if (role != "assistant") return Fail(err, "only an assistant message may have 'tool_calls'", f);
  if (!it->is_array()) return Fail(err, "'tool_calls' must be an array", f);
  for (size_t k = 0; k < it->size(); ++k) {
    const json& tc = (*it)[k];
    const std::string q = f + "[" + std::to_string(k) + "]";
    if (!tc.is_object()) return Fail(err, "a tool call must be an object", q);
    auto id = tc.find("id");
    if (id != tc.end() && !id->is_null() && !id->is_string()) return Fail(err, "a tool call's 'id' must be a string", q + ".id");
    auto type = tc.find("type");
    if (type != tc.end() && !type->is_null() && *type != "function")
      return Fail(err, "a tool call's 'type' must be \"function\"", q + ".type");
    auto fn = tc.find("function");
    if (fn == tc.end() || !fn->is_object()) return Fail(err, "a tool call needs a 'function' object", q + ".function");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      return Fail(err, "a tool call's function needs a non-empty string 'name'", q + ".function.name");
    auto args = fn->find("arguments");
    if (args != fn->end() && !args->is_null() && !args->is_string() && !args->is_object())
      return Fail(err, "a tool call's 'arguments' must be a string (JSON) or an object", q + ".function.arguments");
  }
  *calls = !it->empty();
  return true;
}

bool ValidToolName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  for (unsigned char c : n)
    if (!(std::isalnum(c) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// tools, tool_choice, parallel_tool_calls; and whether the request takes the Jinja path.
bool Tools(const std::string& body, const json& j, ChatRequest* out, ApiError* err) {
  std::vector<std::string> names;
  auto t = j.find("tools");
  const bool has_tools = t != j.end() && !t->is_null() && !(t->is_array() && t->empty());
  if (t != j.end() && !t->is_null()) {
    if (!t->is_array()) return Fail(err, "'tools' must be an array", "tools");
    if (t->size() > 128) return Fail(err, "at most 128 tools", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object()) return Fail(err, "a tool must be an object", p);
      if (!tool.contains("type") || tool["type"] != "function")
        return Fail(err, "a tool's 'type' must be \"function\"", p + ".type");
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) return Fail(err, "a tool needs a 'function' object", p + ".function");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !ValidToolName(name->get<std::string>()))
        return Fail(err, "a function's 'name' must be 1-64 of [A-Za-z0-9_.-]", p + ".function.name");
      if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end())
        return Fail(err, "two tools are named '" + name->get<std::string>() + "'", p + ".function.name");
      names.push_back(name->get<std::string>());
      auto d = fn->find("description");
      if (d != fn->end() && !d->is_null() && !d->is_string())
        return Fail(err, "a function's 'description' must be a string", p + ".function.description");
      auto ps = fn->find("parameters");
      if (ps != fn->end() && !ps->is_null() && !ps->is_object())
        return Fail(err, "a function's 'parameters' must be a JSON Schema object", p + ".function.parameters");
    }
  }
  auto c = j.find("tool_choice");
  if (c != j.end() && !c->is_null()) {
    if (c->is_string()) {
      const std::string v = c->get<std::string>();
      if (v != "none" && v != "auto" && v != "required")
        return Fail(err, "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\":\"function\",\"function\":{\"name\"}}", "tool_choice");
      out->tool_choice = v;
    } else if (c->is_object()) {
      if (!c->contains("type") || (*c)["type"] != "function")
        return Fail(err, "'tool_choice.type' must be \"function\"", "tool_choice.type");
      auto fn = c->find("function");
      if (fn == c->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        return Fail(err, "'tool_choice.function.name' must be a string", "tool_choice.function.name");
      out->tool_choice = "function";
      out->tool_choice_name = (*fn)["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), out->tool_choice_name) == names.end())
        return Fail(err, "'tool_choice' names '" + out->tool_choice_name + "', which is not in 'tools'",
                    "tool_choice.function.name");
    } else {
      return Fail(err, "'tool_choice' must be a string or an object", "tool_choice");
    }
    if (!has_tools && out->tool_choice != "none" && out->tool_choice != "auto")
      return Fail(err, "'tool_choice' \"" + out->tool_choice + "\" needs 'tools'", "tool_choice");
  }
  bool parallel = true;
  if (!Bool(j, "parallel_tool_calls", &parallel, err)) return false;
  bool tool_messages = false;
  for (const json& m : j["messages"])
    if ((m.contains("tool_calls") && !m["tool_calls"].is_null()) || m["role"] == "tool") tool_messages = true;
  out->jinja = has_tools || tool_messages;
  out->parse_tool_calls = has_tools && out->tool_choice != "none";
  if (!out->jinja) return true;
  // Key order as sent (a tool's schema renders in the client's order): the body once more.
  const nlohmann::ordered_json o = nlohmann::ordered_json::parse(body, nullptr, false);
  out->messages_json = o["messages"].dump(-1, ' ', false, json::error_handler_t::replace);
  if (out->parse_tool_calls) {
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (const auto& tool : o["tools"])
      if (out->tool_choice != "function" || tool["function"]["name"] == out->tool_choice_name) ts.push_back(tool);
    out->tools_json = ts.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return true;
}

bool Messages(const json& j, const Limits& limits, std::vector<ChatMessage>* out, ApiError* err) {
  auto it = j.find("messages");
  if (it == j.end()) return Fail(err, "'messages' is required", "messages");
  if (!it->is_array() || it->empty()) return Fail(err, "'messages' must be a non-empty array", "messages");
  if (int(it->size()) > limits.max_messages)
    return Fail(err, "at most " + std::to_string(limits.max_messages) + " messages", "messages");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Fail(err, "a message must be an object", p);
    auto r = m.find("role");
    if (r == m.end() || !r->is_string()) return Fail(err, "a message needs a string 'role'", p + ".role");
    std::string role = r->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return Fail(err, "role '" + role + "' is not supported (system, developer, user, assistant, tool)", p + ".role");
    bool calls = false;
    if (!ToolCallsField(m, role, p, &calls, err)) return false;
    if (role == "tool") {
      auto id = m.find("tool_call_id");
      if (id == m.end() || !id->is_string() || id->get<std::string>().empty())
        return Fail(err, "a 'tool' message needs a non-empty string 'tool_call_id'", p + ".tool_call_id");
    }
    auto c = m.find("content");
    ChatMessage msg;
    msg.role = role;
    if (c == m.end() || c->is_null()) {
      if (!calls) return Fail(err, "a message needs 'content'", p + ".content");
    } else if (!Content(*c, p + ".content", &msg.content, err)) {
      return false;
    }
    out->push_back(std::move(msg));
  }
  return true;
}

bool Stop(const json& j, const Limits& limits, std::vector<std::string>* out, ApiError* err) {
  auto it = j.find("stop");
  if (it == j.end() || it->is_null()) return true;
  std::vector<std::string> v;
  if (it->is_string()) {
    v.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& s : *it) {
      if (!s.is_string()) return Fail(err, "'stop' must be a string or an array of strings", "stop");
      v.push_back(s.get<std::string>());
    }
  } else {
    return Fail(err, "'stop' must be a string or an array of strings", "stop");
  }
  if (v.size() > limits.max_stop) return Fail(err, "at most " + std::to_string(limits.max_stop) + " stop sequences", "stop");
  for (const auto& s : v)
    if (s.empty() || s.size() > limits.max_stop_bytes)
      return Fail(err, "a stop sequence must have 1 to " + std::to_string(limits.max_stop_bytes) + " bytes", "stop");
  *out = std::move(v);
  return true;
}

// chat: logprobs (bool) and top_logprobs (0..20, needs logprobs); completions: logprobs (0..5).
bool Logprobs(const json& j, bool chat, ChatRequest* out, ApiError* err) {
  out->top_logprobs = -1;
  std::optional<int64_t> n;
  if (!chat) {
    if (!Integer(j, "logprobs", 0, 5, &n, err)) return false;
    if (n) out->top_logprobs = int(*n);
    return true;
  }
  bool on = false;
  if (!Bool(j, "logprobs", &on, err)) return false;
  if (!Integer(j, "top_logprobs", 0, 20, &n, err)) return false;
  if (n && !on) return Fail(err, "'top_logprobs' requires 'logprobs': true", "top_logprobs");
  if (on) out->top_logprobs = n ? int(*n) : 0;
  return true;
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(int(c));
  return b;
}

std::string Object(const ChatRequest& req, bool chunk) {
  if (!req.chat) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json InfoJson(const TurnInfo& t) {
  json out = {{"conversation", t.conversation},
              {"new_conversation", t.new_conversation},
              {"ttft_s", t.ttft_s},
              {"reload_s", t.reload_s},
              {"wait_s", t.wait_s},
              {"alloc_s", t.alloc_s},
              {"restore_cpu_s", t.restore_cpu_s},
              {"bytes_from_storage", t.bytes_from_storage},
              {"bytes_decoded", t.bytes_decoded},
              {"bytes_read_compressed", t.bytes_read_compressed},
              {"units_restored", t.units_restored}};
  if (!t.phases_ms.empty()) {  // [[name, ms], ...] in the order they ran (an object's keys would be sorted)
    json ph = json::array();
    for (const auto& [name, ms] : t.phases_ms) ph.push_back({name, ms});
    out["phases_ms"] = ph;
  }
  return out;
}

}  // namespace

std::string ErrorBody(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

int JsonDepth(const std::string& text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escape = false;
  for (char ch : text) {
    if (in_string) {
      if (escape) escape = false;
      else if (ch == '\\') escape = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (ch == ']' || ch == '}') {
      if (depth > 0) --depth;
    }
  }
  return deepest;
}

bool ValidConversationId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (unsigned char c : id)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

bool ParseRequest(const std::string& body, bool chat, const Limits& limits, ChatRequest* out, ApiError* err) {
  *out = ChatRequest();
  out->chat = chat;
  if (JsonDepth(body, limits.max_depth) > limits.max_depth)
    return Fail(err, "the body nests deeper than " + std::to_string(limits.max_depth) + " levels");
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Fail(err, "the body is not valid JSON");
  if (!j.is_object()) return Fail(err, "the body must be a JSON object");
  if (chat) {
    if (!Messages(j, limits, &out->messages, err)) return false;
  } else {
    auto p = j.find("prompt");
    if (p == j.end() || !p->is_string()) return Fail(err, "'prompt' is required and must be a string (one prompt)", "prompt");
    out->prompt = p->get<std::string>();
    if (out->prompt.empty()) return Fail(err, "'prompt' is empty", "prompt");
  }
  auto m = j.find("model");
  if (m != j.end() && !m->is_null()) {
    if (!m->is_string()) return Fail(err, "'model' must be a string", "model");
    out->model = m->get<std::string>();
  }
  if (!Bool(j, "stream", &out->stream, err)) return false;
  auto so = j.find("stream_options");
  if (so != j.end() && !so->is_null()) {
    if (!so->is_object()) return Fail(err, "'stream_options' must be an object", "stream_options");
    if (!Bool(*so, "include_usage", &out->include_usage, err)) return false;
  }
  std::optional<int64_t> n;
  if (!Integer(j, "max_tokens", 1, 1 << 24, &n, err)) return false;
  if (!Integer(j, "max_completion_tokens", 1, 1 << 24, &n, err)) return false;
  if (n) out->max_tokens = int(*n);
  double t = out->temperature, tp = out->top_p;
  if (!Number(j, "temperature", 0, 2, &t, err)) return false;
  if (!Number(j, "top_p", std::numeric_limits<double>::min(), 1, &tp, err)) return false;
  out->temperature = float(t);
  out->top_p = float(tp);
  std::optional<int64_t> k, seed, count;
  if (!Integer(j, "top_k", 0, 1 << 20, &k, err)) return false;
  if (k) out->top_k = int(*k);
  if (!Integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &seed, err))
    return false;
  if (seed) out->seed = uint32_t(uint64_t(*seed));
  if (!Integer(j, "n", 1, 1, &count, err)) return false;
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    double v = 0;
    if (!Number(j, key, -2, 2, &v, err)) return false;
    if (v != 0) return Fail(err, std::string("'") + key + "' is not supported (only 0)", key);
  }
  if (!Logprobs(j, chat, out, err)) return false;
  if (chat) {
    if (!Tools(body, j, out, err)) return false;
  } else if (j.contains("tools") && !j["tools"].is_null() && !(j["tools"].is_array() && j["tools"].empty())) {
    return Fail(err, "tools need /v1/chat/completions", "tools");
  }
  if (!Stop(j, limits, &out->stop, err)) return false;
  auto c = j.find("conversation");
  if (c != j.end() && !c->is_null()) {
    if (!c->is_string() || !ValidConversationId(c->get<std::string>()))
      return Fail(err, "'conversation' must be 1-128 of [A-Za-z0-9._-], not starting with '.'", "conversation");
    out->conversation = c->get<std::string>();
  }
  return true;
}

json TimingsJson(const Timings& t) {
  auto per_token = [](double ms, int n) { return n > 0 ? ms / n : 0.0; };
  auto per_second = [](double ms, int n) { return ms > 0 ? 1e3 * n / ms : 0.0; };
  return {{"cache_n", t.cache_n},
          {"prompt_n", t.prompt_n},
          {"prompt_ms", t.prompt_ms},
          {"prompt_per_token_ms", per_token(t.prompt_ms, t.prompt_n)},
          {"prompt_per_second", per_second(t.prompt_ms, t.prompt_n)},
          {"predicted_n", t.predicted_n},
          {"predicted_ms", t.predicted_ms},
          {"predicted_per_token_ms", per_token(t.predicted_ms, t.predicted_n)},
          {"predicted_per_second", per_second(t.predicted_ms, t.predicted_n)},
          {"ttft_ms", t.ttft_ms},
          {"restore_ms", t.restore_ms},
          {"restore_bytes_from_storage", t.restore_bytes_from_storage}};
}

namespace {

// The body of a small request: depth-checked, parsed, an object (else false with *err).
bool ObjectBody(const std::string& body, const Limits& limits, json* j, ApiError* err) {
  if (JsonDepth(body, limits.max_depth) > limits.max_depth)
    return Fail(err, "the body nests deeper than " + std::to_string(limits.max_depth) + " levels");
  *j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j->is_discarded()) return Fail(err, "the body is not valid JSON");
  if (!j->is_object()) return Fail(err, "the body must be a JSON object");
  return true;
}

}  // namespace

bool ParseTokenize(const std::string& body, const Limits& limits, TokenizeRequest* out, ApiError* err) {
  *out = TokenizeRequest();
  json j;
  if (!ObjectBody(body, limits, &j, err)) return false;
  auto c = j.find("content");
  if (c == j.end() || c->is_null()) return Fail(err, "'content' is required (a string or an array)", "content");
  if (c->is_string()) {
    out->content.push_back({false, c->get<std::string>(), 0});
  } else if (c->is_array()) {
    for (size_t i = 0; i < c->size(); ++i) {
      const json& v = (*c)[i];
      const std::string p = "content[" + std::to_string(i) + "]";
      if (v.is_string()) out->content.push_back({false, v.get<std::string>(), 0});
      else if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))
        out->content.push_back({true, {}, v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX)) : v.get<int64_t>()});
      else
        return Fail(err, "an element of 'content' must be a string or a token id (an integer >= 0)", p);
    }
  } else {
    return Fail(err, "'content' must be a string or an array of strings and token ids", "content");
  }
  return Bool(j, "add_special", &out->add_special, err) && Bool(j, "parse_special", &out->parse_special, err) &&
         Bool(j, "with_pieces", &out->with_pieces, err);
}

bool ParseDetokenize(const std::string& body, const Limits& limits, int32_t n_vocab, std::vector<int32_t>* out,
                     ApiError* err) {
  out->clear();
  json j;
  if (!ObjectBody(body, limits, &j, err)) return false;
  auto t = j.find("tokens");
  if (t == j.end() || t->is_null()) return Fail(err, "'tokens' is required (an array of token ids)", "tokens");
  if (!t->is_array()) return Fail(err, "'tokens' must be an array of token ids", "tokens");
  for (size_t i = 0; i < t->size(); ++i) {
    const json& v = (*t)[i];
    const std::string p = "tokens[" + std::to_string(i) + "]";
    if (!v.is_number_integer() && !v.is_number_unsigned()) return Fail(err, "a token id must be an integer", p);
    if (v.is_number_unsigned() ? v.get<uint64_t>() >= uint64_t(std::max(n_vocab, 0))
                               : (v.get<int64_t>() < 0 || v.get<int64_t>() >= n_vocab))
      return Fail(err, "a token id must be within [0, " + std::to_string(n_vocab) + ")", p);
    out->push_back(int32_t(v.get<int64_t>()));
  }
  return true;
}

bool ParseSlotAction(const std::string& action, const std::string& body, const Limits& limits, SlotAction* out,
                     ApiError* err) {
  if (action == "save") *out = SlotAction::kSave;
  else if (action == "restore") *out = SlotAction::kRestore;
  else if (action == "erase") *out = SlotAction::kErase;
  else return Fail(err, "'action' must be save, restore or erase (?action=...)", "action");
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return true;
  json j;
  if (!ObjectBody(body, limits, &j, err)) return false;
  if (j.contains("filename"))
    return Fail(err,
                "'filename' is not accepted: no request names a file. A slot's conversation is saved to and restored "
                "from the pool's own file (its conversation id); send the action without 'filename'",
                "filename");
  return true;
}

json PieceJson(const std::string& piece) {
  if (SanitizeUtf8(piece) == piece) return piece;
  return Bytes(piece);
}

json LogprobsJson(const ChatRequest& req, const std::vector<TokenLogprob>& lps, size_t text_offset0) {
  if (req.top_logprobs < 0) return nullptr;
  if (req.chat) {
    json content = json::array();
    for (const TokenLogprob& t : lps) {
      json top = json::array();
      for (const auto& [piece, lp] : t.top)
        top.push_back({{"token", SanitizeUtf8(piece)}, {"logprob", lp}, {"bytes", Bytes(piece)}});
      content.push_back({{"token", SanitizeUtf8(t.piece)}, {"logprob", t.logprob}, {"bytes", Bytes(t.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), lp = json::array(), top = json::array(), off = json::array();
  size_t at = text_offset0;
  for (const TokenLogprob& t : lps) {
    tokens.push_back(SanitizeUtf8(t.piece));
    lp.push_back(t.logprob);
    json alt = json::object();
    for (const auto& [piece, l] : t.top) alt[SanitizeUtf8(piece)] = l;
    top.push_back(alt);
    off.push_back(at);
    at += t.piece.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", off}};
}

json CompletionBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
                    const std::string& text, const std::string& finish_reason, const Usage& u, const TurnInfo& info,
                    const std::vector<TokenLogprob>& logprobs) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason}, {"logprobs", LogprobsJson(req, logprobs)}};
  if (req.chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  json out = {{"id", id},         {"object", Object(req, false)}, {"created", created},
          {"model", model},   {"choices", json::array({choice})}, {"usage", UsageJson(u)},
          {"mzcache", InfoJson(info)}};
  if (info.timings.set) out["timings"] = TimingsJson(info.timings);
  return out;
}

json ChunkBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
               const std::string* delta, const std::string* finish_reason, bool role_only,
               const std::vector<TokenLogprob>* logprobs, size_t text_offset0) {
  json choice = {{"index", 0},
                 {"finish_reason", finish_reason ? json(*finish_reason) : json(nullptr)},
                 {"logprobs", logprobs ? LogprobsJson(req, *logprobs, text_offset0) : json(nullptr)}};
  if (req.chat) {
    json d = json::object();
    if (role_only) d["role"] = "assistant";
    if (delta) d["content"] = *delta;
    choice["delta"] = d;
  } else {
    choice["text"] = delta ? *delta : std::string();
  }
  return {{"id", id}, {"object", Object(req, true)}, {"created", created}, {"model", model}, {"choices", json::array({choice})}};
}

json UsageChunkBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
                    const Usage& u, const TurnInfo& info) {
  json out = {{"id", id},       {"object", Object(req, true)}, {"created", created}, {"model", model},
          {"choices", json::array()}, {"usage", UsageJson(u)}, {"mzcache", InfoJson(info)}};
  if (info.timings.set) out["timings"] = TimingsJson(info.timings);
  return out;
}

std::string SseEvent(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace mz::serve
