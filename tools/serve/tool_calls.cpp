#include "tools/serve/tool_calls.h"

#include <algorithm>

namespace mz::serve {
namespace {

using ojson = nlohmann::ordered_json;  // the model's key order is kept in the arguments

constexpr const char kOpen[] = "<tool_call>";
constexpr const char kClose[] = "</tool_call>";
constexpr const char kPythonTag[] = "<|python_tag|>";

bool Blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool AllBlank(const std::string& s) { return std::all_of(s.begin(), s.end(), Blank); }

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && Blank(s[a])) ++a;
  while (b > a && Blank(s[b - 1])) --b;
  return s.substr(a, b - a);
}

// The length of the longest suffix of s that is a proper prefix of marker (text to hold back: it
// may be the start of the marker).
size_t HeldSuffix(const std::string& s, const std::string& marker) {
  for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) return k;
  return 0;
}

}  // namespace

ToolSyntax ToolSyntaxFor(const std::string& arch) { return arch == "llama" ? ToolSyntax::kLlama3 : ToolSyntax::kHermes; }

ToolCallStream::ToolCallStream(ToolSyntax syntax, std::function<std::string()> new_id)
    : syntax_(syntax), new_id_(std::move(new_id)) {}

// Content is released up to its last non-blank character; a trailing blank run (the newlines
// before a call) waits for the next content, and is dropped at the end if the reply made calls.
// So the content released does not depend on how the text was split.
void ToolCallStream::Content(std::string s, std::vector<ToolEvent>* out) {
  blank_ += s;
  const size_t last = blank_.find_last_not_of(" \n\t\r");
  if (last == std::string::npos) return;
  ToolEvent e;
  e.content = blank_.substr(0, last + 1);
  blank_.erase(0, last + 1);
  content_ += e.content;
  out->push_back(std::move(e));
}

void ToolCallStream::Call(ToolCall c, std::vector<ToolEvent>* out) {
  c.id = new_id_();
  ToolEvent e;
  e.is_call = true;
  e.index = int(calls_.size());
  e.call = c;
  calls_.push_back(std::move(c));
  out->push_back(std::move(e));
}

bool ToolCallStream::TryCall(const std::string& text, ToolCall* out) const {
  ojson j = ojson::parse(Trim(text), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto n = j.find("name");
  if (n == j.end() || !n->is_string() || n->get<std::string>().empty()) return false;
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  std::string args = "{}";
  if (a != j.end() && !a->is_null()) {
    if (a->is_object()) {
      args = a->dump(-1, ' ', false, ojson::error_handler_t::replace);
    } else if (a->is_string()) {  // arguments already as JSON text
      ojson inner = ojson::parse(a->get<std::string>(), nullptr, false);
      if (inner.is_discarded() || !inner.is_object()) return false;
      args = inner.dump(-1, ' ', false, ojson::error_handler_t::replace);
    } else {
      return false;
    }
  }
  out->name = n->get<std::string>();
  out->arguments = std::move(args);
  return true;
}

void ToolCallStream::Hermes(bool end, std::vector<ToolEvent>* out) {
  for (;;) {
    if (!in_call_) {
      const size_t at = buf_.find(kOpen);
      if (at != std::string::npos) {
        Content(buf_.substr(0, at), out);
        buf_.erase(0, at + sizeof(kOpen) - 1);
        in_call_ = true;
        continue;
      }
      const size_t hold = end ? 0 : HeldSuffix(buf_, kOpen);
      Content(buf_.substr(0, buf_.size() - hold), out);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    const size_t at = buf_.find(kClose);
    if (at == std::string::npos) {
      if (end) {  // an unclosed call: its text is content
        Content(kOpen + buf_, out);
        buf_.clear();
        in_call_ = false;
      }
      return;
    }
    const std::string body = buf_.substr(0, at);
    buf_.erase(0, at + sizeof(kClose) - 1);
    in_call_ = false;
    ToolCall c;
    if (TryCall(body, &c)) Call(std::move(c), out);
    else Content(kOpen + body + kClose, out);
  }
}

void ToolCallStream::Llama3(bool end, std::vector<ToolEvent>* out) {
  const std::string tag = kPythonTag;
  if (llama_mode_ == 0) {
    size_t i = 0;
    while (i < buf_.size() && Blank(buf_[i])) ++i;
    if (i == buf_.size()) {  // blanks only so far
      if (end) Content(buf_, out), buf_.clear();
      return;
    }
    if (buf_[i] == '{') {
      llama_mode_ = 2;
    } else if (buf_.compare(i, tag.size(), tag) == 0) {
      Content(buf_.substr(0, i), out);
      buf_.erase(0, i + tag.size());
      llama_mode_ = 3;
    } else if (!end && buf_.size() - i < tag.size() && tag.compare(0, buf_.size() - i, buf_, i) == 0) {
      return;  // may still become the tag
    } else {
      llama_mode_ = 1;
    }
  }
  if (llama_mode_ == 1) {
    const size_t at = buf_.find(tag);
    if (at != std::string::npos) {
      Content(buf_.substr(0, at), out);
      buf_.erase(0, at + tag.size());
      llama_mode_ = 3;
    } else {
      const size_t hold = end ? 0 : HeldSuffix(buf_, tag);
      Content(buf_.substr(0, buf_.size() - hold), out);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
  }
  if (!end) return;  // modes 2 and 3 are decided at the end of the reply
  ToolCall c;
  if (TryCall(buf_, &c)) {
    Call(std::move(c), out);
    buf_.clear();
    return;
  }
  if (llama_mode_ == 3) {  // several calls separated by ';'
    std::vector<ToolCall> cs;
    size_t from = 0;
    bool ok = true;
    while (ok && from <= buf_.size()) {
      size_t to = buf_.find(';', from);
      if (to == std::string::npos) to = buf_.size();
      const std::string part = buf_.substr(from, to - from);
      if (!AllBlank(part)) ok = TryCall(part, &c) && (cs.push_back(c), true);
      from = to + 1;
    }
    if (ok && !cs.empty()) {
      for (ToolCall& x : cs) Call(std::move(x), out);
      buf_.clear();
      return;
    }
    Content(tag + buf_, out);
  } else {
    Content(buf_, out);
  }
  buf_.clear();
}

void ToolCallStream::Push(const std::string& text, std::vector<ToolEvent>* out) {
  buf_ += text;
  if (syntax_ == ToolSyntax::kHermes) Hermes(false, out);
  else Llama3(false, out);
}

void ToolCallStream::Finish(std::vector<ToolEvent>* out) {
  if (syntax_ == ToolSyntax::kHermes) Hermes(true, out);
  else Llama3(true, out);
  if (!blank_.empty() && calls_.empty()) {  // without calls, the trailing blanks are content too
    ToolEvent e;
    e.content = std::move(blank_);
    content_ += e.content;
    out->push_back(std::move(e));
  }
  blank_.clear();
}

nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls) {
  nlohmann::json a = nlohmann::json::array();
  for (const ToolCall& c : calls)
    a.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

nlohmann::json ToolCallDeltaJson(int index, const ToolCall& c) {
  return nlohmann::json::array(
      {{{"index", index}, {"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}}});
}

}  // namespace mz::serve
