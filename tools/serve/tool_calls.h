// Tool calls in a model's reply, as OpenAI `tool_calls` (docs/server.md "Tool calling").
//
// ToolCallStream reads the reply's text as it is generated, in pieces split anywhere, and tells
// apart text that is content (streamed at once) from tool calls:
//   kHermes  (Qwen2.5/Qwen3 and other Hermes-style templates): any number of
//            <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> blocks, text between them
//            content;
//   kLlama3  (Llama 3.x): the whole reply one JSON object {"name": NAME, "parameters": {...}}
//            ("arguments" accepted too; blanks around it), or <|python_tag|> followed by such an
//            object (or several separated by ';'); text before <|python_tag|> is content.
// A call whose text is not that shape (bad JSON, no name, an unclosed <tool_call>) is returned as
// content, verbatim: nothing the model wrote is dropped, except blanks that end the content (the
// newlines before and between calls) in a reply that made calls. A call is reported once complete, its arguments in one
// fragment: the object re-serialized compactly, keys in the model's order.
// Text that might begin a call's marker is held back until it is known not to (at most the
// marker's length); for kLlama3, a reply that begins with '{' is held back until its end.
// Thread-safety: none (one per reply).
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace mz::serve {

enum class ToolSyntax { kHermes, kLlama3 };

struct ToolCall {
  std::string id, name, arguments;  // arguments: JSON text of an object
};

// What one Push/Finish produced, in order: content text and completed calls (index = its place
// among the reply's calls).
struct ToolEvent {
  bool is_call = false;
  std::string content;  // !is_call
  int index = 0;        // is_call
  ToolCall call;        // is_call
};

class ToolCallStream {
 public:
  // new_id: the id given to each call (e.g. "call_" + random hex).
  ToolCallStream(ToolSyntax syntax, std::function<std::string()> new_id);
  void Push(const std::string& text, std::vector<ToolEvent>* out);
  void Finish(std::vector<ToolEvent>* out);  // the end of the reply: whatever is held is decided
  const std::vector<ToolCall>& calls() const { return calls_; }
  const std::string& content() const { return content_; }  // all content released so far

 private:
  void Content(std::string s, std::vector<ToolEvent>* out);
  void Call(ToolCall c, std::vector<ToolEvent>* out);
  bool TryCall(const std::string& json_text, ToolCall* out) const;  // one {"name", "arguments"|"parameters"}
  void Hermes(bool end, std::vector<ToolEvent>* out);
  void Llama3(bool end, std::vector<ToolEvent>* out);

  ToolSyntax syntax_;
  std::function<std::string()> new_id_;
  std::string buf_;         // text not decided yet
  bool in_call_ = false;    // kHermes: after <tool_call>
  int llama_mode_ = 0;      // kLlama3: 0 undecided (only blanks so far), 1 content, 2 whole-reply JSON, 3 after <|python_tag|>
  std::string blank_;       // blank-only content held back (see Content)
  std::vector<ToolCall> calls_;
  std::string content_;
};

// The syntax for a model architecture (mz_model_info.arch): "llama" is kLlama3, the rest kHermes.
ToolSyntax ToolSyntaxFor(const std::string& arch);

// OpenAI shapes. A message's tool_calls: [{id, type:"function", function:{name, arguments}}];
// a stream delta's: [{index, id, type, function:{name, arguments}}].
nlohmann::json ToolCallsJson(const std::vector<ToolCall>& calls);
nlohmann::json ToolCallDeltaJson(int index, const ToolCall& call);

}  // namespace mz::serve
