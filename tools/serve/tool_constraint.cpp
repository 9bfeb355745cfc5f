// See tool_constraint.h.
#include "tools/serve/tool_constraint.h"

#include <algorithm>

namespace mz::serve {

using json = nlohmann::json;

void ToolCallConstraint::AddLiteral(std::vector<Segment>* out, const std::string& text) {
  if (text.empty()) return;
  if (!out->empty() && out->back().kind == Kind::kLiteral) {
    out->back().text += text;
    return;
  }
  Segment s;
  s.kind = Kind::kLiteral;
  s.text = text;
  out->push_back(std::move(s));
}

void ToolCallConstraint::AddValue(std::vector<Segment>* out, const json& schema) {
  Segment s;
  if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    s.kind = Kind::kChoice;
    for (const json& v : schema["enum"]) s.choices.push_back(v.dump());
    out->push_back(std::move(s));
    return;
  }
  std::string type;
  if (schema.is_object() && schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) type = t.get<std::string>();
    if (t.is_array())  // ["string", "null"]: the first that is not "null"
      for (const json& x : t)
        if (x.is_string() && x != "null") { type = x.get<std::string>(); break; }
  }
  if (type == "integer" || type == "number") s.kind = Kind::kInteger;
  else if (type == "boolean") s.kind = Kind::kChoice, s.choices = {"true", "false"};
  else if (type == "null") return AddLiteral(out, "null");
  else if (type == "object") return AddLiteral(out, "{}");
  else if (type == "array") return AddLiteral(out, "[]");
  else s.kind = Kind::kString;  // "string", none or one this acceptor does not know
  out->push_back(std::move(s));
}

int ToolCallConstraint::MaxLength(const std::vector<Segment>& segs) {
  int n = 0;
  for (const Segment& s : segs) {
    switch (s.kind) {
      case Kind::kLiteral: n += int(s.text.size()); break;
      case Kind::kString: n += 4 * kMaxStringChars + 2; break;  // UTF-8: up to 4 bytes a character
      case Kind::kInteger: n += kMaxDigits + 1; break;           // and a '-'
      case Kind::kChoice: {
        size_t m = 0;
        for (const std::string& c : s.choices) m = std::max(m, c.size());
        n += int(m);
        break;
      }
    }
  }
  return n;
}

ToolCallConstraint::ToolCallConstraint(ToolSyntax syntax, const json& tools, const std::string& name) {
  const bool hermes = syntax == ToolSyntax::kHermes;
  AddLiteral(&head_, hermes ? "<tool_call>\n{\"name\": \"" : "{\"name\": \"");
  Segment names;
  names.kind = Kind::kChoice;
  for (const json& tool : tools) {
    if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) continue;
    const json& f = tool["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    const std::string n = f["name"].get<std::string>();
    if (!name.empty() && n != name) continue;
    names_.push_back(n);
    names.choices.push_back(n + "\"");  // the closing quote: no name is a prefix of another's choice
    std::vector<Segment> b;
    AddLiteral(&b, hermes ? ", \"arguments\": {" : ", \"parameters\": {");
    const json* params = f.contains("parameters") && f["parameters"].is_object() ? &f["parameters"] : nullptr;
    const json* props = params && params->contains("properties") && (*params)["properties"].is_object()
                            ? &(*params)["properties"] : nullptr;
    bool first = true;
    if (params && params->contains("required") && (*params)["required"].is_array()) {
      for (const json& k : (*params)["required"]) {
        if (!k.is_string()) continue;
        // Hermes: compact, as the call comes back in the next request (arguments as the reply reader
        // serializes them, rendered verbatim by Qwen's template): the conversation continues past it.
        AddLiteral(&b, std::string(first ? "" : (hermes ? "," : ", ")) + k.dump() + (hermes ? ":" : ": "));
        first = false;
        static const json kNone = json::object();
        const std::string key = k.get<std::string>();
        AddValue(&b, props && props->contains(key) ? (*props)[key] : kNone);
      }
    }
    AddLiteral(&b, hermes ? "}}\n</tool_call>" : "}}");
    branches_.push_back(std::move(b));
  }
  head_.push_back(std::move(names));
  int longest = 0;
  for (const auto& b : branches_) longest = std::max(longest, MaxLength(b));
  max_chars_ = MaxLength(head_) + longest;
}

const ToolCallConstraint::Segment* ToolCallConstraint::Seg(const State& s) const {
  if (s.seg < int(head_.size())) return &head_[size_t(s.seg)];
  if (s.tool < 0) return nullptr;
  const auto& b = branches_[size_t(s.tool)];
  const size_t i = size_t(s.seg) - head_.size();
  return i < b.size() ? &b[i] : nullptr;
}

void ToolCallConstraint::Next(State* s) const {
  if (s->seg == int(head_.size()) - 1) {  // the name was chosen: its arguments follow
    const auto& c = head_.back().choices;
    s->tool = int(std::find(c.begin(), c.end(), s->taken) - c.begin());
  }
  ++s->seg;
  s->n = 0;
  s->cont = 0;
  s->taken.clear();
}

bool ToolCallConstraint::Step(State* s, char c) const {
  for (;;) {
    const Segment* g = Seg(*s);
    if (!g) return false;  // complete: nothing more
    switch (g->kind) {
      case Kind::kLiteral:
        if (g->text[size_t(s->n)] != c) return false;
        if (size_t(++s->n) == g->text.size()) Next(s);
        return true;
      case Kind::kChoice: {
        const std::string want = s->taken + c;
        bool prefix = false, longer = false;
        for (const std::string& ch : g->choices)
          if (ch.compare(0, want.size(), want) == 0) {
            prefix = true;
            if (ch.size() > want.size()) longer = true;
          }
        if (prefix) {
          s->taken = want;
          if (!longer) Next(s);  // exactly one choice, nothing longer shares it
          return true;
        }
        // A choice that is a prefix of a longer one (enum 1 and 10) ends at the first other character.
        if (std::find(g->choices.begin(), g->choices.end(), s->taken) == g->choices.end()) return false;
        Next(s);
        continue;
      }
      case Kind::kString:
        return StringStep(s, static_cast<unsigned char>(c));
      case Kind::kInteger: {
        const bool digit = c >= '0' && c <= '9';
        const int digits = int(s->taken.size()) - (!s->taken.empty() && s->taken[0] == '-' ? 1 : 0);
        if (s->taken.empty() && c == '-') {
          s->taken = "-";
          return true;
        }
        if (digit) {
          if (digits == 0 && c == '0') {  // no leading zero: "0" (or "-0") is the whole number
            Next(s);
            return true;
          }
          s->taken += c;
          if (digits + 1 >= kMaxDigits) Next(s);
          return true;
        }
        if (digits == 0) return false;
        Next(s);  // the number ends at the first other character, which the next segment takes
        continue;
      }
    }
  }
}

// A JSON string without escapes: '"', then printable ASCII other than '"', '\\' and '<' (a string
// holding "</tool_call>" would end a Hermes call early, and "<|...|>" re-tokenizes as a special
// token when the call is rendered back into the conversation) or well-formed
// UTF-8 (no overlong forms, surrogates or code points above U+10FFFF: nlohmann's parser and
// OpenAI's clients accept it), at most kMaxStringChars characters, then '"' (not inside a character).
bool ToolCallConstraint::StringStep(State* s, unsigned char c) const {
  if (s->n == 0) {
    if (c != '"') return false;
    s->n = 1;
    return true;
  }
  if (s->cont > 0) {  // inside a multi-byte character
    if (c < s->lo || c > s->hi) return false;
    --s->cont;
    s->lo = 0x80, s->hi = 0xBF;
    return true;
  }
  if (c == '"') {
    Next(s);
    return true;
  }
  if (s->n - 1 >= kMaxStringChars) return false;
  if (c >= 0x20 && c <= 0x7e && c != '\\' && c != '<') {
    ++s->n;
    return true;
  }
  int cont = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) cont = 1;
  else if (c >= 0xE0 && c <= 0xEF) cont = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) cont = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return false;  // control characters, '\\' (no escapes), stray continuation bytes, 0xC0-0xC1, 0xF5-0xFF
  ++s->n;
  s->cont = cont, s->lo = lo, s->hi = hi;
  return true;
}

bool ToolCallConstraint::Allows(const std::string& text) const {
  if (text.empty()) return false;
  State s = state_;
  for (char c : text)
    if (!Step(&s, c)) return false;
  return true;
}

void ToolCallConstraint::Advance(const std::string& text) {
  for (char c : text) Step(&state_, c);
}

}  // namespace mz::serve
