#include "tools/serve/turn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "tools/cli/c_api_text.h"
#include "tools/serve/text_stream.h"

namespace mz::serve {
namespace {

TurnResult Failed(TurnResult r, int status) {
  r.status = status;
  r.error = mz_last_error();
  return r;
}

// The sampled token's log-probability under logits (n floats) and the k most likely, most likely
// first: a log-softmax, computed in double.
TokenLogprob Logprob(mz_model* model, const float* logits, int32_t n, mz_token t, int k) {
  TokenLogprob out;
  const float mx = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  out.piece = cli::TokenPiece(model, t);
  out.logprob = float(double(logits[t]) - lse);
  // The k best by one pass over the row, kept sorted (k <= 20): no per-token vocabulary-sized
  // allocation. Ties go to the lower id.
  k = std::min(k, int(n));
  std::vector<int32_t> best;
  best.reserve(size_t(k) + 1);
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  for (int32_t i = 0; i < n && k > 0; ++i) {
    if (int(best.size()) == k && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (int(best.size()) > k) best.pop_back();
  }
  for (int32_t id : best) out.top.emplace_back(cli::TokenPiece(model, id), float(double(logits[id]) - lse));
  return out;
}

}  // namespace

TurnResult RunTurn(mz_model* model, mz_conversation* conv, const std::vector<mz_token>& prompt, int keep,
                   const TurnParams& params, const EmitFn& emit) {
  TurnResult r;
  int32_t n_vocab = 0;
  if (params.top_logprobs >= 0) {
    mz_model_info info;
    if (int st = mz_model_get_info(model, &info); st != MZ_OK) return Failed(r, st);
    n_vocab = info.n_vocab;
  }
  std::vector<TokenLogprob> pending;  // logprobs not yet given to emit
  auto send = [&](const std::string& text) {
    const bool go_on = emit(text, pending);
    for (TokenLogprob& t : pending) r.logprobs.push_back(std::move(t));
    r.logprobs_emitted = r.logprobs.size();
    pending.clear();
    return go_on;
  };
  const int held = mz_conversation_n_tokens(conv);
  if (held < 0) return Failed(r, held);
  if (keep > held) keep = held;
  if (held > keep) {
    if (int st = mz_conversation_truncate(conv, keep); st != MZ_OK) return Failed(r, st);
  }
  r.history.assign(prompt.begin(), prompt.begin() + keep);  // what the conversation holds now
  std::unique_ptr<mz_sampler, void (*)(mz_sampler*)> sampler(mz_sampler_new(&params.sampler), mz_sampler_free);
  if (!sampler) return Failed(r, MZ_ERR_INVALID_ARG);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  if (int st = mz_conversation_restore_generate(conv, prompt.data() + keep, int32_t(prompt.size()) - keep, nullptr,
                                                &r.restore);
      st != MZ_OK)
    return Failed(r, st);
  const Clock::time_point t1 = Clock::now();
  r.prompt_s = std::chrono::duration<double>(t1 - t0).count();

  r.history = prompt;
  std::vector<mz_token> script;
  if (params.scripted) {
    if (int st = cli::TokenizeText(model, *params.scripted, false, true, &script); st != MZ_OK) {
      mz_conversation_commit(conv);
      return Failed(r, st);
    }
  }
  size_t script_at = 0;
  TextStream text(params.stop);
  int n = int(prompt.size());
  bool stopped = false;
  r.finish_reason = "length";
  while (r.completion_tokens < params.max_tokens) {
    if (params.scripted && script_at == script.size()) {  // the scripted reply ends as on EOG
      r.finish_reason = "stop";
      break;
    }
    const mz_token t = params.scripted ? script[script_at++] : mz_conversation_sample(conv, sampler.get(), 0);
    if (t < 0) {
      mz_conversation_commit(conv);
      return Failed(r, t);
    }
    if (mz_token_is_eog(model, t)) {
      r.finish_reason = "stop";
      break;
    }
    if (params.top_logprobs >= 0) {
      const float* logits = mz_conversation_logits(conv, 0);  // the row mz_conversation_sample used
      if (!logits) {
        mz_conversation_commit(conv);
        return Failed(r, MZ_ERR_INTERNAL);
      }
      pending.push_back(Logprob(model, logits, n_vocab, t, params.top_logprobs));
    }
    ++r.completion_tokens;
    // With logprobs, the token's piece was just built for them: not built a second time.
    const std::string out =
        text.Push(params.top_logprobs >= 0 ? pending.back().piece : cli::TokenPiece(model, t), &stopped);
    if (!out.empty() && !send(out)) {
      r.finish_reason = "cancelled";
      break;
    }
    if (stopped) {
      r.finish_reason = "stop";
      break;
    }
    // The sampled token is decoded only if another one follows it.
    if (r.completion_tokens >= params.max_tokens || n + 1 >= params.n_ctx) break;
    if (int st = mz_conversation_decode(conv, &t, 1, false); st != MZ_OK) {
      mz_conversation_commit(conv);
      return Failed(r, st);
    }
    r.history.push_back(t);
    ++n;
  }
  if (r.finish_reason != "cancelled") {
    const std::string rest = text.Finish();
    if (!rest.empty() && !send(rest)) r.finish_reason = "cancelled";
  }
  for (TokenLogprob& t : pending) r.logprobs.push_back(std::move(t));  // after logprobs_emitted
  r.text = text.released();
  r.predicted_s = std::chrono::duration<double>(Clock::now() - t1).count();
  if (int st = mz_conversation_commit(conv); st != MZ_OK) return Failed(r, st);
  return r;
}

}  // namespace mz::serve
