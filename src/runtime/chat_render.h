// Chat rendering through the model's own Jinja chat template (its GGUF tokenizer.chat_template),
// with tools, assistant tool calls and role "tool" messages, by llama.cpp's Jinja engine
// (common/jinja of the pinned llama.cpp source, compiled into this library: CMakeLists.txt mz_jinja).
// The input is prepared as llama-server (--jinja) prepares it, so the text is the one llama-server
// renders for the same request (tests/test_chat_render.cpp compares with stored llama-server output).
// Thread-safety: a pure function; concurrent calls are safe.
#pragma once
#include <ctime>
#include <string>

#include "core/status.h"

namespace mz {

struct ChatRenderInput {
  std::string tmpl;           // the Jinja source (empty: Unsupported)
  std::string bos_token;      // the template's bos_token / eos_token variables (the tokens' text)
  std::string eos_token;
  std::string messages_json;  // a JSON array of OpenAI chat messages
  std::string tools_json;     // a JSON array of OpenAI tools, or empty / "null" / "[]": no tools
  bool add_generation_prompt = true;
  bool add_bos = false;       // the vocabulary adds BOS / EOS when tokenizing: a rendered leading
  bool add_eos = false;       // bos_token / trailing eos_token is removed (as llama.cpp does)
  std::time_t now = 0;        // the template's clock (strftime_now, date_string), Unix seconds; the caller
                              // sets it (mz_chat_render: the Env's wall clock): 0 is 1970-01-01
};

// Messages are put in llama-server's canonical shape first: content a string ("" for null; text
// parts joined by "\n"), "developer" mapped to "system", tool call arguments strings (objects are
// serialized; parsed back into objects for templates that index them), tool_call_id and name kept.
// Errors: kInvalidArgument for JSON that is not the shapes above (the message names the index and
// field) and for a template that fails to parse or raises while rendering (the engine's message,
// raise_exception's text); never an exception.
Status RenderChatTemplate(const ChatRenderInput& in, std::string* out);

}  // namespace mz
