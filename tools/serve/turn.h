// One turn of `mzcache serve` on a conversation of the pool, over the public C API only.
//
// The conversation is cut back to the tokens it shares with the prompt (Router::Claim::keep), the
// rest of the prompt is computed with mz_conversation_restore_generate (whatever the pool or the
// OS took of this conversation, its weights or its KV in any tier, is restored front layers first
// while that prefill runs), then tokens are sampled and decoded one at a time until an
// end-of-generation token, a stop string, max_tokens or the context's end. The turn is committed
// (the pool persists it in the background) however it ended, so what was computed is kept.
// Thread-safety: one turn per conversation at a time (the router's claim); turns on distinct
// conversations may run at once.
#pragma once
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/serve/openai_api.h"
#include "tools/serve/tool_constraint.h"

namespace mz::serve {

struct TurnParams {
  mz_sampler_params sampler = mz_sampler_default_params();
  int max_tokens = 256;   // >= 1
  int n_ctx = 8192;       // the conversation's context size
  std::vector<std::string> stop;
  int top_logprobs = -1;  // >= 0: each sampled token's logprob and this many alternatives
  // TEST HOOK (tools/serve/scripted_replies.h): when set, the reply's tokens are these (the text
  // tokenized, special tokens parsed) instead of sampled ones, then the turn ends as on an
  // end-of-generation token; they are streamed, stopped and decoded as sampled tokens are.
  const std::string* scripted = nullptr;
  // tool_choice "required" or a named function (tools/serve/tool_constraint.h): each token is
  // sampled among those the constraint allows (the sampler's settings over them; the turn's seed),
  // and the turn ends once the call is complete. Not owned; null: free sampling. Ignored with
  // scripted.
  ToolCallConstraint* constraint = nullptr;
  // When set, holds the count of tokens sampled so far (GET /slots' n_decoded). Not owned.
  std::atomic<int>* decoded = nullptr;
};

struct TurnResult {
  int status = MZ_OK;          // MZ_OK, or the C API's error (error holds mz_last_error)
  std::string error;
  std::string text;            // what was released to emit (valid UTF-8, no stop string)
  std::string finish_reason;   // "stop", "length", or "cancelled" (emit returned false)
  int completion_tokens = 0;
  mz_restore_stats restore{};  // of the prompt's restore_generate
  // Wall seconds of the prompt's restore_generate (restore and prefill), and of the reply: from
  // the first sample to the end of the last decode (llama-server's prompt_ms / predicted_ms).
  double prompt_s = 0, predicted_s = 0;
  // Wall seconds of the steps around it up to the first text given to emit: cutting the
  // conversation back to keep (truncate_s), the turn mark (mark_s), the first token's sampling
  // (first_sample_s, from the mark to the token), and from that token to the return of the first
  // emit with text (first_text_s: the write to the client, and the decode of further tokens when
  // the first ones' text was held back, e.g. an incomplete UTF-8 character). 0 when the step did
  // not run.
  double truncate_s = 0, mark_s = 0, first_sample_s = 0, first_text_s = 0;
  // Of predicted_s, wall seconds in the reply's one-token decode calls (waiting for and computing
  // batcher steps), in sampling (mz_conversation_sample, or the constrained pick), and in handing
  // text to emit (the SSE write): the caller's part of a batched step's cycle (session 37).
  double decode_s = 0, sample_s = 0, emit_s = 0;
  // The conversation's history after the turn: the prompt (when its restore_generate succeeded)
  // and the sampled tokens that were decoded (the last sampled one is not).
  std::vector<mz_token> history;
  // With params.top_logprobs >= 0: every sampled token's, in order (an end-of-generation token is
  // not listed). The first logprobs_emitted went to emit with text; the rest after them did not.
  std::vector<TokenLogprob> logprobs;
  size_t logprobs_emitted = 0;
};

// emit(text, logprobs): text that may be shown now, and the logprobs of the tokens sampled since
// the previous call (empty unless params.top_logprobs >= 0).
using EmitFn = std::function<bool(const std::string& text, const std::vector<TokenLogprob>& logprobs)>;

// REQUIRES: 0 <= keep < prompt.size(); conv claimed by the caller. emit gets each piece of text as
// soon as it may be shown; returning false stops the generation (a client gone).
TurnResult RunTurn(mz_model* model, mz_conversation* conv, const std::vector<mz_token>& prompt, int keep,
                   const TurnParams& params, const EmitFn& emit);

}  // namespace mz::serve
