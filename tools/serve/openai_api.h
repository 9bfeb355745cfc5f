// The OpenAI-compatible wire format of `mzcache serve`: request parsing and validation, and the
// response / stream-chunk / error bodies. Pure functions of their inputs (no I/O, no globals), so
// every rule below is unit-tested (tests/test_serve.cpp) and fuzzable.
//
// What is accepted (POST /v1/chat/completions; POST /v1/completions takes `prompt` instead of
// `messages`):
//   messages      1..limits.max_messages of {role, content}; role system|developer (as system)|user|
//                 assistant|tool; content a string, or an array of {type:"text", text} parts (joined);
//                 anything else (images, audio) is a 400 naming the field. Tool calling
//                 (docs/server.md): an assistant message may carry tool_calls [{id, type:"function",
//                 function:{name, arguments (a string of JSON, or an object)}}] (content then may be
//                 null or absent); a "tool" message needs a non-empty string tool_call_id
//   tools         an array of {type:"function", function:{name ([A-Za-z0-9_.-]{1,64}, unique),
//                 description (string), parameters (object)}}
//   tool_choice   "none" | "auto" | "required" | {type:"function", function:{name}} (a name of tools);
//                 parallel_tool_calls a boolean (accepted, not enforced)
//   model         a string: which model (the server resolves it: tools/serve/models.h; with one
//                 model any name is accepted and answered with its own id)
//   stream, stream_options.include_usage
//   max_tokens | max_completion_tokens   >= 1 (the server caps it at its --max-tokens and n_ctx)
//   temperature [0, 2] (default 1; 0 = greedy), top_p (0, 1] (default 1), top_k >= 0 (extension,
//   default 0 = off), seed (integer), stop (a string or 1..4 non-empty strings, each <= 256 bytes)
//   logprobs: chat: `logprobs` true (and `top_logprobs` 0..20, which needs it); completions:
//   `logprobs` 0..5 (the legacy form). The log-probabilities are the model's own distribution
//   (log-softmax of the logits), whatever temperature, top_k and top_p do to the sampling
//   n = 1, presence_penalty = frequency_penalty = 0: other values are refused (400), never
//   silently ignored
//   conversation  (extension) a conversation id of the pool to continue, [A-Za-z0-9._-]{1,128}
// Unknown fields are ignored, as OpenAI-compatible servers do. The body is refused before it is
// parsed when it nests deeper than limits.max_depth (a deeply nested body costs no stack).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mz::serve {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool" (tool calling: see ChatRequest::jinja)
  std::string content;
};

struct Limits {
  int max_depth = 32;        // JSON nesting
  int max_messages = 4096;
  size_t max_stop = 4, max_stop_bytes = 256;
};

struct ChatRequest {
  bool chat = true;                   // false: /v1/completions (prompt, no template)
  std::vector<ChatMessage> messages;  // chat
  std::string prompt;                 // completions
  std::string model;
  bool stream = false, include_usage = false;
  int max_tokens = 0;                 // 0: not given
  float temperature = 1.0f, top_p = 1.0f;
  int top_k = 0;
  std::optional<uint32_t> seed;
  std::vector<std::string> stop;
  std::string conversation;           // extension; "" = found by the history it continues
  int top_logprobs = -1;              // -1: no logprobs; else the alternatives per token (0..20)
  // Tool calling (tools/serve/tool_calls.h). jinja: the request has tools, tool calls or "tool"
  // messages, so it is rendered by the model's own Jinja template (mz_chat_render) from
  // messages_json (the messages as sent, key order kept) and tools_json ("" = no tools rendered:
  // none given or tool_choice "none"; a named tool_choice renders that tool only).
  bool jinja = false;
  std::string messages_json, tools_json;
  std::string tool_choice = "auto";   // "none", "auto", "required" or "function" (tool_choice_name)
  std::string tool_choice_name;
  bool parse_tool_calls = false;      // the reply is read for tool calls (tools given, tool_choice not "none")
};

// One sampled token's log-probability under the model (log-softmax of its logits row), and the
// most likely alternatives, most likely first. Pieces are raw bytes: a piece may be part of a
// UTF-8 character (bodies give the text sanitized and the exact bytes, as OpenAI does).
struct TokenLogprob {
  std::string piece;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

// An error as OpenAI reports it: {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError {
  int http = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("" = none)
  std::string code;   // e.g. "invalid_api_key", "context_length_exceeded" ("" = none)
};
std::string ErrorBody(const ApiError& e);

// Depth of the deepest array/object nesting in text (strings and escapes skipped); stops counting
// at limit + 1. Linear, no recursion.
int JsonDepth(const std::string& text, int limit);

// Parses and validates a request body. false with *err (http 400) on any problem; *out is then
// unspecified.
bool ParseRequest(const std::string& body, bool chat, const Limits& limits, ChatRequest* out, ApiError* err);

// Whether id is a valid conversation id (the pool's rule: 1-128 of [A-Za-z0-9._-], not starting '.').
bool ValidConversationId(const std::string& id);

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens not computed: kept from the conversation or shared prefix chunks
};
// llama-server's "timings" object of one turn (prompt_n: prompt tokens computed, cache_n: those
// kept or reused, so prompt_n + cache_n = usage.prompt_tokens; predicted_*: the reply's tokens and
// the time from the first sampled token to the last), plus mzcache's restore figures (restore_ms:
// the restore's reload phase; restore_bytes_from_storage). Rates are 0 when their time is 0.
struct Timings {
  bool set = false;  // false: no "timings" in the body
  int prompt_n = 0, cache_n = 0, predicted_n = 0;
  double prompt_ms = 0, predicted_ms = 0, ttft_ms = 0, restore_ms = 0;
  uint64_t restore_bytes_from_storage = 0;
};
nlohmann::json TimingsJson(const Timings& t);

// POST /tokenize, as llama-server's: {"content": string or an array of strings and token ids,
// "add_special": bool (default false), "parse_special": bool (default true), "with_pieces": bool
// (default false)}. In an array, each string is tokenized (add_special applies to the first element
// only, if it is a string) and each id is taken as is (checked against the vocabulary by the
// caller: ids are integers >= 0 here).
struct TokenizePart {
  bool is_id = false;
  std::string text;  // !is_id
  int64_t id = 0;    // is_id
};
struct TokenizeRequest {
  std::vector<TokenizePart> content;
  bool add_special = false, parse_special = true, with_pieces = false;
};
bool ParseTokenize(const std::string& body, const Limits& limits, TokenizeRequest* out, ApiError* err);
// POST /detokenize: {"tokens": [ids]}, every id an integer in [0, n_vocab).
bool ParseDetokenize(const std::string& body, const Limits& limits, int32_t n_vocab, std::vector<int32_t>* out,
                     ApiError* err);
// POST /slots/{id}?action=A (llama-server's slot actions, mapped onto the pool: resources.cpp and
// docs/server.md "/slots actions"). action: the query's value ("save", "restore" or "erase"; else a
// 400 with param "action"); body: empty, or a JSON object whose only field llama-server defines,
// "filename", is refused (400, param "filename": no request names a file; the pool's own file of the
// slot's conversation is used). Other fields are ignored, as llama-server ignores them.
enum class SlotAction { kSave, kRestore, kErase };
bool ParseSlotAction(const std::string& action, const std::string& body, const Limits& limits, SlotAction* out,
                     ApiError* err);
// A piece as /tokenize's with_pieces gives it: a string if valid UTF-8, else its bytes.
nlohmann::json PieceJson(const std::string& piece);

// mzcache's own figures of one turn, added to responses as "mzcache" (clients ignore unknown fields).
struct TurnInfo {
  std::string conversation;
  bool new_conversation = false;
  double ttft_s = 0;
  double reload_s = 0, wait_s = 0;  // the restore's reload phase, and compute's wait for units
  uint64_t bytes_from_storage = 0;
  int units_restored = 0;
  uint64_t bytes_decoded = 0, bytes_read_compressed = 0;  // KV decoded from compressed memory; read in place
  double alloc_s = 0, restore_cpu_s = 0;  // the restore's allocation phase; process CPU seconds of restore_generate
  // Where the time to the first token went, in order (name, milliseconds): the request's parse,
  // template and tokenization, the claim, each step of the turn up to its first text written to the
  // client (docs/server.md "Where a return's time goes"). In JSON: "phases_ms": [[name, ms], ...].
  // Empty: not reported.
  std::vector<std::pair<std::string, double>> phases_ms;
  Timings timings;  // the body's "timings" (set: present)
};

// A choice's "logprobs" value for these tokens: null unless req.top_logprobs >= 0; chat:
// {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null};
// completions: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset} (offsets
// from text_offset0, in bytes of the pieces).
nlohmann::json LogprobsJson(const ChatRequest& req, const std::vector<TokenLogprob>& lps, size_t text_offset0 = 0);

// The non-streamed response (object "chat.completion" or "text_completion"); logprobs: every
// sampled token's (ignored unless req.top_logprobs >= 0).
nlohmann::json CompletionBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
                              const std::string& text, const std::string& finish_reason, const Usage& u,
                              const TurnInfo& info, const std::vector<TokenLogprob>& logprobs = {});
// One streamed chunk ("chat.completion.chunk" / "text_completion"): role only (first chat chunk:
// role_only), a text delta, or the end (finish_reason set, empty delta). Usage and mzcache figures
// go in a last chunk with empty choices (stream_options.include_usage, as OpenAI does). logprobs:
// the tokens sampled since the previous chunk (with req.top_logprobs >= 0; every token appears in
// exactly one chunk, in order: those whose text is still held back go with a later one).
// text_offset0 (completions): the byte offset of the first of these tokens in the whole
// completion, i.e. the summed piece sizes of every token sent in earlier chunks, so that a
// stream's text_offset values continue across chunks exactly as the non-streamed body's.
nlohmann::json ChunkBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
                         const std::string* delta, const std::string* finish_reason, bool role_only,
                         const std::vector<TokenLogprob>* logprobs = nullptr, size_t text_offset0 = 0);
nlohmann::json UsageChunkBody(const ChatRequest& req, const std::string& id, const std::string& model, int64_t created,
                              const Usage& u, const TurnInfo& info);
// "data: <json>\n\n": one server-sent event.
std::string SseEvent(const nlohmann::json& j);

}  // namespace mz::serve
