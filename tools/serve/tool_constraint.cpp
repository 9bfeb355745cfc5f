// See tool_constraint.h.
#include "tools/serve/tool_constraint.h"

#include <algorithm>
#include <climits>
#include <string_view>

namespace mz::serve {

using ojson = nlohmann::ordered_json;

namespace tool_constraint_detail {

int HexValue(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A schema's integer field clamped to [lo, hi]; def when absent or not an integer.
int IntField(const ojson& schema, const char* key, int def, int lo, int hi) {
  if (!schema.is_object() || !schema.contains(key)) return def;
  const ojson& v = schema[key];
  if (!v.is_number_integer()) return def;
  const long long x = v.get<long long>();
  return int(std::clamp<long long>(x, lo, hi));
}

bool Overlaps(const std::string& a, const std::string& b) {
  return a.find_first_of(b) != std::string::npos;
}

}  // namespace tool_constraint_detail

using namespace tool_constraint_detail;

std::string ToolCallConstraint::FirstBytes(const Node& n) {
  return n.kind == Kind::kLiteral ? n.text.substr(0, 1) : n.text;
}

int ToolCallConstraint::Add(Node n) {
  nodes_.push_back(std::move(n));
  return int(nodes_.size()) - 1;
}

int ToolCallConstraint::Literal(const std::string& text) {
  Node n;
  n.kind = Kind::kLiteral;
  n.text = text;
  return Add(std::move(n));
}

// One value's schema to a node (the rules in tool_constraint.h). depth: objects/arrays above it
// below the arguments object (the arguments object itself is depth 0).
int ToolCallConstraint::Compile(const ojson& schema, int depth) {
  const bool obj = schema.is_object();
  if (obj && schema.contains("const")) return Literal(schema["const"].dump());
  if (obj && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    Node n;
    n.kind = Kind::kChoice;
    for (const ojson& v : schema["enum"]) {
      std::string t = v.dump();
      if (std::find(n.choices.begin(), n.choices.end(), t) == n.choices.end()) n.choices.push_back(std::move(t));
    }
    for (const std::string& c : n.choices)
      if (n.text.find(c[0]) == std::string::npos) n.text += c[0];
    return Add(std::move(n));
  }
  // Alternatives: anyOf / oneOf, or a list of types.
  if (nodes_.size() >= kMaxNodes) return Literal("null");  // an absurd schema: still valid JSON
  std::vector<ojson> alts;
  for (const char* k : {"anyOf", "oneOf"})
    if (obj && schema.contains(k) && schema[k].is_array() && !schema[k].empty())
      for (const ojson& a : schema[k]) alts.push_back(a);
  if (alts.empty() && obj && schema.contains("type") && schema["type"].is_array() && !schema["type"].empty()) {
    std::vector<ojson> seen;  // each type once: a repeated "object" would compile its properties again
    for (const ojson& t : schema["type"]) {
      if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
      seen.push_back(t);
      ojson one = schema;
      one["type"] = t;
      alts.push_back(std::move(one));
    }
  }
  if (!alts.empty()) {
    Node u;
    u.kind = Kind::kUnion;
    for (const ojson& a : alts) {
      const int k = Compile(a, depth);
      const std::string first = FirstBytes(nodes_[size_t(k)]);
      if (Overlaps(first, u.text)) continue;  // could start like an earlier one
      u.kids.push_back(k);
      u.text += first;
    }
    if (u.kids.size() == 1) return u.kids[0];
    return Add(std::move(u));
  }
  std::string type;
  if (obj && schema.contains("type") && schema["type"].is_string()) type = schema["type"].get<std::string>();
  if (type.empty() && obj && (schema.contains("properties") || schema.contains("required"))) type = "object";
  if (type.empty() && obj && schema.contains("items")) type = "array";

  Node n;
  if (type == "integer" || type == "number") {
    n.kind = Kind::kNumber;
    n.integer = type == "integer";
    n.text = "-0123456789";
    return Add(std::move(n));
  }
  if (type == "boolean") {
    n.kind = Kind::kChoice;
    n.choices = {"true", "false"};
    n.text = "tf";
    return Add(std::move(n));
  }
  if (type == "null") return Literal("null");
  if (type == "object") {
    const ojson* props = schema.contains("properties") && schema["properties"].is_object() ? &schema["properties"] : nullptr;
    std::vector<std::string> keys;
    if (props)
      for (auto it = props->begin(); it != props->end(); ++it) keys.push_back(it.key());
    std::vector<bool> required(keys.size(), false);
    if (schema.contains("required") && schema["required"].is_array())
      for (const ojson& k : schema["required"]) {
        if (!k.is_string()) continue;
        const std::string key = k.get<std::string>();
        const size_t i = size_t(std::find(keys.begin(), keys.end(), key) - keys.begin());
        if (i == keys.size()) keys.push_back(key), required.push_back(true);
        else required[i] = true;
      }
    if (keys.empty() || depth > kMaxDepth) return Literal("{}");
    n.kind = Kind::kObject;
    n.text = "{";
    static const ojson kNone = ojson::object();
    for (size_t i = 0; i < keys.size(); ++i) {
      n.choices.push_back(ojson(keys[i]).dump() + (spaced_ ? ": " : ":"));
      const ojson& v = props && props->contains(keys[i]) ? (*props)[keys[i]] : kNone;
      n.kids.push_back(Compile(v, depth + 1));
    }
    n.req_from.assign(keys.size() + 1, int(keys.size()));
    for (size_t i = keys.size(); i-- > 0;) n.req_from[i] = required[i] ? int(i) : n.req_from[i + 1];
    return Add(std::move(n));
  }
  if (type == "array") {
    if (!schema.contains("items") || depth > kMaxDepth) return Literal("[]");
    n.kind = Kind::kArray;
    n.text = "[";
    const int item = Compile(schema["items"], depth + 1);
    n.kids = {item};
    const long long len = MaxLength(item) + 2;  // and a separator
    n.max = IntField(schema, "maxItems", kMaxItems, 0, kMaxItems);
    if (len * n.max > kMaxArrayChars) n.max = int(std::max<long long>(1, kMaxArrayChars / len));
    n.min = std::min(IntField(schema, "minItems", 0, 0, kMaxItems), n.max);
    return Add(std::move(n));
  }
  n.kind = Kind::kString;  // "string", none or one this acceptor does not know
  n.text = "\"";
  n.max = IntField(schema, "maxLength", kMaxStringChars, 0, kMaxStringChars);
  n.min = std::min(IntField(schema, "minLength", 0, 0, kMaxStringChars), n.max);
  return Add(std::move(n));
}

long long ToolCallConstraint::MaxLength(int node) const {
  const Node& g = nodes_[size_t(node)];
  const long long cap = INT_MAX;
  long long n = 0;
  switch (g.kind) {
    case Kind::kLiteral: return (long long)g.text.size();
    case Kind::kString: return 6LL * g.max + 2;  // "\u001f" is the longest character
    case Kind::kNumber: return 1 + kMaxDigits + (g.integer ? 0 : 1 + kMaxFracDigits);
    case Kind::kChoice:
      for (size_t i = 0; i < g.choices.size(); ++i)
        n = std::max(n, (long long)g.choices[i].size() + (i < g.kids.size() && g.kids[i] >= 0 ? MaxLength(g.kids[i]) : 0));
      return std::min(n, cap);
    case Kind::kSeq:
      for (int k : g.kids) n = std::min(cap, n + MaxLength(k));
      return n;
    case Kind::kUnion:
      for (int k : g.kids) n = std::max(n, MaxLength(k));
      return n;
    case Kind::kObject:
      n = 2;
      for (size_t i = 0; i < g.kids.size(); ++i)
        n = std::min(cap, n + (long long)g.choices[i].size() + MaxLength(g.kids[i]) + (spaced_ ? 2 : 1));
      return n;
    case Kind::kArray:
      return std::min(cap, 2 + g.max * (MaxLength(g.kids[0]) + (spaced_ ? 2 : 1)));
  }
  return cap;
}

ToolCallConstraint::ToolCallConstraint(ToolSyntax syntax, const ojson& tools, const std::string& name) {
  const bool hermes = syntax == ToolSyntax::kHermes;
  // Hermes: compact, as the call comes back in the next request (arguments as the reply reader
  // serializes them, rendered verbatim by Qwen's template): the conversation continues past it.
  spaced_ = !hermes;
  Node names;
  names.kind = Kind::kChoice;
  static const ojson kNone = ojson::object();
  if (tools.is_array())
    for (const ojson& tool : tools) {
      if (!tool.is_object() || !tool.contains("function") || !tool["function"].is_object()) continue;
      const ojson& f = tool["function"];
      if (!f.contains("name") || !f["name"].is_string()) continue;
      const std::string n = f["name"].get<std::string>();
      if (!name.empty() && n != name) continue;
      if (std::find(names.choices.begin(), names.choices.end(), n + "\"") != names.choices.end()) continue;
      names.choices.push_back(n + "\"");  // the closing quote: no name is a prefix of another's choice
      ojson params = f.contains("parameters") && f["parameters"].is_object() ? f["parameters"] : kNone;
      params["type"] = "object";  // the arguments are an object whatever the schema says
      params.erase("anyOf"), params.erase("oneOf"), params.erase("enum"), params.erase("const");
      Node branch;
      branch.kind = Kind::kSeq;
      branch.kids = {Literal(hermes ? ", \"arguments\": " : ", \"parameters\": "), Compile(params, 0),
                     Literal(hermes ? "}\n</tool_call>" : "}")};
      names.kids.push_back(Add(std::move(branch)));
    }
  Node root;
  root.kind = Kind::kSeq;
  root.kids = {Literal(hermes ? "<tool_call>\n{\"name\": \"" : "{\"name\": \"")};
  if (!names.choices.empty()) root.kids.push_back(Add(std::move(names)));  // else: never completes, as before
  const int r = Add(std::move(root));
  max_chars_ = int(MaxLength(r));
  Push(&state_, r);
}

void ToolCallConstraint::Push(State* s, int node) const {
  s->f[size_t(s->depth++)] = Frame::At(node);
}

void ToolCallConstraint::Pop(State* s) const {
  --s->depth;
  while (s->depth > 0) {
    const Frame& t = s->f[size_t(s->depth - 1)];
    const Node& g = nodes_[size_t(t.node)];
    if (g.kind != Kind::kSeq || t.n < int(g.kids.size())) break;
    --s->depth;
  }
}

// Matches c against choices[first..last] given the f->taken bytes already matched (f->cand: the
// first choice consistent with them).
ToolCallConstraint::Pick ToolCallConstraint::ChoiceStep(const std::vector<std::string>& choices, int first,
                                                        int last, Frame* f, unsigned char c) const {
  const size_t t = size_t(f->taken);
  int hit = -1;
  bool longer = false;
  for (int i = std::max(first, f->cand); i <= last; ++i) {
    const std::string& ch = choices[size_t(i)];
    if (ch.size() > t && static_cast<unsigned char>(ch[t]) == c && ch.compare(0, t, choices[size_t(f->cand)], 0, t) == 0) {
      if (hit < 0) hit = i;
      if (ch.size() > t + 1) longer = true;
    }
  }
  if (hit >= 0) {
    // Prefer an exact match for the index reported when nothing longer shares the prefix.
    f->cand = hit;
    f->taken = int(t + 1);
    if (!longer) {
      for (int i = hit; i <= last; ++i)
        if (choices[size_t(i)].size() == t + 1 && choices[size_t(i)].compare(0, t + 1, choices[size_t(hit)], 0, t + 1) == 0)
          f->cand = i;
      return Pick::kDone;
    }
    return Pick::kTaken;
  }
  // A choice that is a prefix of a longer one (enum 1 and 10) ends at the first other character.
  for (int i = std::max(first, f->cand); i <= last; ++i)
    if (choices[size_t(i)].size() == t && t > 0 && choices[size_t(i)].compare(0, t, choices[size_t(f->cand)], 0, t) == 0) {
      f->cand = i;
      return Pick::kEndedBefore;
    }
  return Pick::kRefused;
}

bool ToolCallConstraint::Step(State* s, unsigned char c) const {
  for (;;) {
    if (s->depth == 0) return false;  // complete: nothing more
    Frame* f = &s->f[size_t(s->depth - 1)];
    const Node& g = nodes_[size_t(f->node)];
    switch (g.kind) {
      case Kind::kLiteral:
        if (static_cast<unsigned char>(g.text[size_t(f->n)]) != c) return false;
        if (size_t(++f->n) == g.text.size()) Pop(s);
        return true;
      case Kind::kSeq:
        if (s->depth >= kMaxFrames) return false;  // not reached: Compile bounds the nesting
        Push(s, g.kids[size_t(f->n++)]);
        continue;
      case Kind::kUnion: {
        int pick = -1;
        for (int k : g.kids)
          if (FirstBytes(nodes_[size_t(k)]).find(char(c)) != std::string::npos) { pick = k; break; }
        if (pick < 0) return false;
        *f = Frame::At(pick);
        continue;
      }
      case Kind::kChoice: {
        const Pick p = ChoiceStep(g.choices, 0, int(g.choices.size()) - 1, f, c);
        if (p == Pick::kRefused) return false;
        if (p == Pick::kTaken) return true;
        const int after = size_t(f->cand) < g.kids.size() ? g.kids[size_t(f->cand)] : -1;
        if (after >= 0) {
          *f = Frame::At(after);
        } else {
          Pop(s);
        }
        if (p == Pick::kDone) return true;
        continue;  // kEndedBefore: c goes to what follows
      }
      case Kind::kObject: {
        const int keys = int(g.kids.size());
        switch (f->phase) {
          case 0:
            if (c != '{') return false;
            f->phase = 1;
            return true;
          case 1:  // after '{': a key or '}'
            if (c == '}' && g.req_from[size_t(f->next)] == keys) {
              Pop(s);
              return true;
            }
            f->phase = 2, f->taken = 0, f->cand = f->next;
            continue;
          case 2: {  // a key: any optional one up to the next required one
            const int last = std::min(g.req_from[size_t(f->next)], keys - 1);
            // Keys end with ':' after their closing quote: none is a prefix of another.
            const Pick p = ChoiceStep(g.choices, f->next, last, f, c);
            if (p != Pick::kDone) return p == Pick::kTaken;
            f->next = f->cand + 1;
            f->phase = 3;
            if (s->depth >= kMaxFrames) return false;
            Push(s, g.kids[size_t(f->cand)]);
            return true;
          }
          case 3:  // after a value
            if (c == ',' && f->next < keys) {
              f->phase = spaced_ ? 4 : 2, f->taken = 0, f->cand = f->next;
              return true;
            }
            if (c == '}' && g.req_from[size_t(f->next)] == keys) {
              Pop(s);
              return true;
            }
            return false;
          default:  // 4: the blank after ','
            if (c != ' ') return false;
            f->phase = 2;
            return true;
        }
      }
      case Kind::kArray:
        switch (f->phase) {
          case 0:
            if (c != '[') return false;
            f->phase = 1;
            return true;
          case 1:  // after '[': an item or ']'
            if (c == ']' && g.min == 0) {
              Pop(s);
              return true;
            }
            if (g.max == 0) return false;
            f->phase = 5;
            continue;
          case 3:  // after an item
            if (c == ',' && f->next < g.max) {
              f->phase = spaced_ ? 4 : 5;
              return true;
            }
            if (c == ']' && f->next >= g.min) {
              Pop(s);
              return true;
            }
            return false;
          case 4:
            if (c != ' ') return false;
            f->phase = 5;
            return true;
          default:  // 5: an item starts with c
            if (s->depth >= kMaxFrames) return false;
            ++f->next;
            f->phase = 3;
            Push(s, g.kids[0]);
            continue;
        }
      case Kind::kString:
        return StringStep(s, f, g, c);
      case Kind::kNumber: {
        bool reuse = false;
        const bool ok = NumberStep(s, f, g, c, &reuse);
        if (reuse) continue;
        return ok;
      }
    }
    return false;
  }
}

// -?(0|[1-9][0-9]{0,kMaxDigits-1})(\.[0-9]{1,kMaxFracDigits})? (no fraction for "integer"). The
// number ends at the first other character once it is whole; *reuse: that character goes to
// what follows. Phases: 0 start, 1 after '-', 2 integer digits, 3 after a leading 0, 4 after
// '.', 5 fraction digits.
bool ToolCallConstraint::NumberStep(State* s, Frame* f, const Node& g, unsigned char c, bool* reuse) const {
  const bool digit = c >= '0' && c <= '9';
  switch (f->phase) {
    case 0:
      if (c == '-') {
        f->phase = 1;
        return true;
      }
      [[fallthrough]];
    case 1:
      if (!digit) return false;
      if (c == '0') {
        f->phase = 3;
        if (g.integer) Pop(s);  // nothing can follow "0"
        return true;
      }
      f->phase = 2, f->n = 1;
      if (g.integer && f->n == kMaxDigits) Pop(s);
      return true;
    case 2:
      if (digit && f->n < kMaxDigits) {
        if (++f->n == kMaxDigits && g.integer) Pop(s);
        return true;
      }
      [[fallthrough]];
    case 3:
      if (c == '.' && !g.integer) {
        f->phase = 4;
        return true;
      }
      Pop(s);
      *reuse = true;
      return false;
    case 4:
      if (!digit) return false;
      f->phase = 5, f->n = 1;
      if (f->n == kMaxFracDigits) Pop(s);
      return true;
    default:
      if (digit && f->n < kMaxFracDigits) {
        if (++f->n == kMaxFracDigits) Pop(s);
        return true;
      }
      Pop(s);
      *reuse = true;
      return false;
  }
}

// A JSON string (the rules in tool_constraint.h): '"', then characters, then '"' (not inside a
// character or an escape). Well-formed UTF-8 means no overlong forms, surrogates or code points
// above U+10FFFF: nlohmann's parser and OpenAI's clients accept it.
bool ToolCallConstraint::StringStep(State* s, Frame* f, const Node& g, unsigned char c) const {
  if (f->n == 0) {
    if (c != '"') return false;
    f->n = 1;
    return true;
  }
  if (f->cont > 0) {  // inside a multi-byte character
    if (c < f->lo || c > f->hi) return false;
    --f->cont;
    f->lo = 0x80, f->hi = 0xBF;
    return true;
  }
  if (f->esc == 1) {  // after '\\'
    if (c == 'u') {
      f->esc = 2, f->next = 0;
      return true;
    }
    if (std::string_view("\"\\/bfnrt").find(char(c)) == std::string_view::npos) return false;
    f->esc = 0;
    return true;
  }
  if (f->esc >= 2) {  // \u: four hex digits
    const int v = HexValue(c);
    if (v < 0) return false;
    const int code = f->next * 16 + v;
    if (f->esc == 3 && code >= 0xD8 && code <= 0xDF) return false;  // a surrogate, whatever follows
    if (f->esc == 5 && code == '<') return false;
    f->next = code;
    f->esc = f->esc == 5 ? 0 : int8_t(f->esc + 1);
    return true;
  }
  if (c == '"') {
    if (f->n - 1 < g.min) return false;
    Pop(s);
    return true;
  }
  if (f->n - 1 >= g.max) return false;
  if (c == '\\') {
    ++f->n;
    f->esc = 1;
    return true;
  }
  if (c >= 0x20 && c <= 0x7e && c != '<') {
    ++f->n;
    return true;
  }
  int cont = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) cont = 1;
  else if (c >= 0xE0 && c <= 0xEF) cont = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) cont = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return false;  // control characters, stray continuation bytes, 0xC0-0xC1, 0xF5-0xFF
  ++f->n;
  f->cont = int8_t(cont), f->lo = lo, f->hi = hi;
  return true;
}

bool ToolCallConstraint::Allows(const std::string& text) const {
  if (text.empty() || state_.depth == 0) return false;
  State s;  // frames left unset: only the open ones are copied
  s.depth = state_.depth;
  std::copy_n(state_.f.begin(), state_.depth, s.f.begin());
  for (char c : text)
    if (!Step(&s, static_cast<unsigned char>(c))) return false;
  return true;
}

void ToolCallConstraint::Advance(const std::string& text) {
  for (char c : text) Step(&state_, static_cast<unsigned char>(c));
}

}  // namespace mz::serve
