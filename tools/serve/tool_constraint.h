// Constrained decoding for tool_choice "required" and a named function (docs/server.md "Tool
// calling"): the reply IS one tool call, in the model's tool syntax, whose arguments are a JSON
// object holding the schema's required keys.
//
// ToolCallConstraint is a character-level acceptor of exactly the texts
//   kHermes: <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>   (ARGS compact: {"k":v,...})
//   kLlama3: {"name": "NAME", "parameters": ARGS}                          (ARGS {"k": v, ...})
// (the shapes ToolCallStream parses), NAME one of the tools' names, ARGS the object of that tool's
// `parameters.required` keys in the schema's order, each value by its property's schema:
//   enum            one of the values (JSON-serialized);
//   "string" (or no/unknown type)  a string of at most kMaxStringChars characters: printable
//                   ASCII other than '"', '\\' and '<' (no call marker or special token inside), or
//                   well-formed UTF-8 (no escapes, no control characters: always valid JSON);
//   "integer"/"number"  an integer of 1 to kMaxDigits digits, '-' allowed (no leading zero);
//   "boolean"       true or false;   "null" null;   "object" {};   "array" [].
// Optional keys are left out (the object is valid for the schema's `required`; the model cannot
// be trusted with free JSON on random or weak weights: every text the acceptor takes parses).
// The caller (tools/serve/turn.cpp) masks, before each sample, every token whose piece the acceptor
// would not take (Allows), samples among the rest, and feeds the sampled piece (Advance); once
// Complete(), the turn ends as on an end-of-generation token. Every path to Complete is at most
// MaxChars() bytes, so a max_tokens of that many tokens always fits the call (a shorter one may cut
// it: the reply is then content, finish_reason "length").
// Thread-safety: none (one per turn). Allows is const and may be called from several threads.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tools/serve/tool_calls.h"

namespace mz::serve {

class ToolCallConstraint {
 public:
  static constexpr int kMaxStringChars = 128;
  static constexpr int kMaxDigits = 6;

  // tools: the request's OpenAI tools (an array of {type:"function", function:{name, parameters}}),
  // already validated (openai_api.cpp); name: the one tool to call ("" = any of them).
  ToolCallConstraint(ToolSyntax syntax, const nlohmann::json& tools, const std::string& name);

  // Whether text (a token's piece) can be taken from the current state. An empty text is refused
  // (it would not advance the call).
  bool Allows(const std::string& text) const;
  // Takes text; REQUIRES Allows(text).
  void Advance(const std::string& text);
  bool Complete() const { return state_.seg >= 0 && Done(state_); }
  int MaxChars() const { return max_chars_; }

 private:
  enum class Kind { kLiteral, kChoice, kString, kInteger };
  struct Segment {
    Kind kind = Kind::kLiteral;
    std::string text;                  // kLiteral
    std::vector<std::string> choices;  // kChoice
  };
  struct State {
    int seg = 0;        // the segment being matched
    int tool = -1;      // the chosen tool (its branch follows the head), -1 before the name
    int n = 0;          // kLiteral: bytes taken; kString: 1 + characters taken (after the opening quote)
    int cont = 0;       // kString: continuation bytes still due in a UTF-8 character
    unsigned char lo = 0x80, hi = 0xBF;  // kString: the next continuation byte's range
    std::string taken;  // kChoice: the characters taken; kInteger: the sign and digits
  };
  const Segment* Seg(const State& s) const;
  bool Done(const State& s) const { return Seg(s) == nullptr; }
  bool Step(State* s, char c) const;     // one byte; false: refused
  bool StringStep(State* s, unsigned char c) const;
  void Next(State* s) const;             // the segment is done: to the next one
  static void AddLiteral(std::vector<Segment>* out, const std::string& text);  // merged with a literal before it
  static void AddValue(std::vector<Segment>* out, const nlohmann::json& schema);  // one argument's value
  static int MaxLength(const std::vector<Segment>& segs);

  std::vector<Segment> head_;                   // up to and including the name choice
  std::vector<std::vector<Segment>> branches_;  // per tool: its arguments and the closing text
  std::vector<std::string> names_;
  State state_;
  int max_chars_ = 0;
};

}  // namespace mz::serve
