// Constrained decoding for tool_choice "required" and a named function (docs/server.md "Tool
// calling"): the reply IS one tool call, in the model's tool syntax, whose arguments are a JSON
// object valid for the tool's `parameters` schema (the subset below), in bounded length.
//
// ToolCallConstraint is a character-level acceptor of exactly the texts
//   kHermes: <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>   (ARGS compact: {"k":v,"k2":[1,2]})
//   kLlama3: {"name": "NAME", "parameters": ARGS}                          (ARGS {"k": v, "k2": [1, 2]})
// (the shapes ToolCallStream parses), NAME one of the tools' names, ARGS the tool's `parameters`
// compiled as a value schema (Compile, in tool_constraint.cpp) by these rules:
//   enum (non-empty)  one of its values (JSON-serialized, duplicates once); `const` its value;
//   anyOf / oneOf     one of the alternatives whose first characters differ from the ones before it
//                     (an alternative that could start like an earlier one is dropped);
//   type [T1, T2...]  the same, one alternative per type ("null" included);
//   "object" (or properties without a type)  the keys of `properties` in the schema's order (the
//                     request's JSON order), then `required` keys absent from `properties`; each key
//                     at most once, in that order; `required` keys always, the others as the model
//                     chooses (it may emit or skip each); values by their schemas. No properties and
//                     no required keys: {} (free-form objects are not generated);
//   "array" (or items without a type)  up to max(minItems', min(maxItems, kMaxItems)) items of the
//                     `items` schema, at least min(minItems, that) (fewer when the item schema is so
//                     large that kMaxArrayChars bytes hold fewer, never fewer than one); no `items`: [];
//   "string" (and no or an unknown type)  a string of minLength..maxLength characters (capped at
//                     kMaxStringChars): printable ASCII other than '"', '\\' and '<', well-formed
//                     UTF-8, or escapes \" \\ \/ \b \f \n \r \t \uXXXX (any hex case; no surrogates,
//                     which need pairs: raw UTF-8 is there for those; not \u003c). '<' is refused in
//                     every form: "</tool_call>" would end a Hermes call early, and "<|...|>" would
//                     re-tokenize as a special token when the call is rendered back;
//   "integer"         -?(0|[1-9][0-9]*) with at most kMaxDigits digits;
//   "number"          the same, optionally with a fraction of 1 to kMaxFracDigits digits (no exponent);
//   "boolean"         true or false;   "null" null.
// Values nested deeper than kMaxDepth objects/arrays below the arguments get {} / [] (scalars keep
// their rules). Every text the acceptor takes parses as JSON; it does not enforce pattern, format,
// minimum/maximum, uniqueItems, additionalProperties, $ref or allOf (such schemas still get a call
// that parses, typed by the rules above).
// The caller (tools/serve/turn.cpp) masks, before each sample, every token whose piece the acceptor
// would not take (Allows), samples among the rest, and feeds the sampled piece (Advance); once
// Complete(), the turn ends as on an end-of-generation token. From every state some byte is
// allowed until Complete, and every path to Complete is at most MaxChars() bytes (saturated at
// INT_MAX for absurd schemas), so a max_tokens of that many tokens always fits the call (a shorter
// one may cut it: the reply is then content, finish_reason "length").
// Thread-safety: none (one per turn). Allows is const and may be called from several threads.
#pragma once
#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tools/serve/tool_calls.h"

namespace mz::serve {

class ToolCallConstraint {
 public:
  static constexpr int kMaxStringChars = 128;
  static constexpr int kMaxDigits = 6;       // of an integer part
  static constexpr int kMaxFracDigits = 4;   // of a number's fraction
  static constexpr int kMaxItems = 8;        // of an array
  static constexpr int kMaxArrayChars = 4096;
  static constexpr int kMaxDepth = 6;        // objects/arrays nested below the arguments object

  // tools: the request's OpenAI tools (an array of {type:"function", function:{name, parameters}}),
  // already validated (openai_api.cpp; anything malformed in a schema is read as the rules above
  // allow, never refused here); ordered so that keys keep the request's order. name: the one tool
  // to call ("" = any of them).
  ToolCallConstraint(ToolSyntax syntax, const nlohmann::ordered_json& tools, const std::string& name);

  // Whether text (a token's piece) can be taken from the current state. An empty text is refused
  // (it would not advance the call).
  bool Allows(const std::string& text) const;
  // Takes text; REQUIRES Allows(text).
  void Advance(const std::string& text);
  bool Complete() const { return state_.depth == 0; }
  int MaxChars() const { return max_chars_; }

 private:
  enum class Kind : uint8_t { kLiteral, kChoice, kSeq, kObject, kArray, kString, kNumber, kUnion };
  struct Node {
    Kind kind = Kind::kLiteral;
    std::string text;                  // kLiteral: the bytes; else the bytes a value may start with (FirstBytes)
    std::vector<std::string> choices;  // kChoice: the texts; kObject: each key as written ("\"k\":")
    std::vector<int> kids;             // kChoice: the node after each choice (-1: none); kSeq: parts;
                                       // kObject: each key's value; kArray: {item}; kUnion: alternatives
    std::vector<int> req_from;         // kObject: [i] = the first required key at or after i (size() if none)
    int min = 0, max = 0;              // kString: characters; kArray: items
    bool integer = false;              // kNumber
  };
  // One open node; trivial (no member initializers) so that Allows, called for every piece of the
  // vocabulary before each token, neither initializes nor copies more than the open frames. Made by At.
  struct Frame {
    int node;
    int8_t phase;
    int8_t esc;            // kString: 0, 1 after '\\', 2..5 hex digits of \u taken + 2
    int8_t cont;           // kString: UTF-8 continuation bytes still due
    uint8_t lo, hi;        // kString: the next continuation byte's range
    int32_t n;             // kLiteral: bytes; kSeq: parts started; kString: 1 + characters; kNumber: digits
    int32_t next;          // kObject: the first key still possible; kArray: items started; kString: \u code
    int32_t taken;         // kChoice / kObject key: bytes of the choice taken
    int32_t cand;          // kChoice / kObject key: the first choice consistent with them
    static Frame At(int node) { return Frame{node, 0, 0, 0, 0x80, 0xBF, 0, 0, 0, 0}; }
  };
  static constexpr int kMaxFrames = kMaxDepth + 8;
  struct State {
    int depth;
    std::array<Frame, kMaxFrames> f;  // [0, depth) open, the innermost last; the rest unset
  };
  enum class Pick { kRefused, kTaken, kDone, kEndedBefore };

  static constexpr size_t kMaxNodes = 1 << 16;  // beyond it a value compiles to null (absurd schemas)
  static std::string FirstBytes(const Node& n);  // the bytes a value of n may start with
  int Compile(const nlohmann::ordered_json& schema, int depth);
  int Add(Node n);
  int Literal(const std::string& text);
  bool Step(State* s, unsigned char c) const;  // one byte; false: refused
  bool StringStep(State* s, Frame* f, const Node& g, unsigned char c) const;
  bool NumberStep(State* s, Frame* f, const Node& g, unsigned char c, bool* reuse) const;
  Pick ChoiceStep(const std::vector<std::string>& choices, int first, int last, Frame* f, unsigned char c) const;
  void Push(State* s, int node) const;
  void Pop(State* s) const;  // the top node is done: pops it and every sequence it ended
  long long MaxLength(int node) const;

  std::vector<Node> nodes_;
  bool spaced_ = false;  // ", " and ": " (Llama 3) rather than "," and ":" (Hermes)
  State state_{};
  int max_chars_ = 0;
};

}  // namespace mz::serve
