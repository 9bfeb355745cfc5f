#include "tools/serve/turn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>

#include "tools/cli/c_api_text.h"
#include "tools/serve/text_stream.h"
#include "tools/serve/tool_constraint.h"

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

// A token among those constraint allows (pieces[i]: token i's text; EOG tokens and empty pieces
// never), by the turn's sampler settings applied to the allowed tokens only: greedy at
// temperature <= 0, else top-k, top-p and temperature over them with rng. -1 when none is allowed.
mz_token ConstrainedPick(const float* logits, const std::vector<std::string>& pieces, const std::vector<char>& eog,
                         const ToolCallConstraint& constraint, const mz_sampler_params& sp, std::mt19937* rng) {
  // A piece whose first byte is refused is refused: 256 one-byte checks spare the full check of
  // most of the vocabulary (151,936 pieces for Qwen3) before each token.
  bool first[256];
  for (int b = 0; b < 256; ++b) first[b] = constraint.Allows(std::string(1, char(b)));
  std::vector<int32_t> ok;
  for (int32_t i = 0; i < int32_t(pieces.size()); ++i) {
    const std::string& piece = pieces[size_t(i)];
    if (eog[size_t(i)] || piece.empty() || !first[static_cast<unsigned char>(piece[0])]) continue;
    if (constraint.Allows(piece)) ok.push_back(i);
  }
  if (ok.empty()) return -1;
  auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (sp.temperature <= 0) return *std::min_element(ok.begin(), ok.end(), better);
  std::sort(ok.begin(), ok.end(), better);
  if (sp.top_k > 0 && size_t(sp.top_k) < ok.size()) ok.resize(size_t(sp.top_k));
  std::vector<double> p(ok.size());
  double sum = 0;
  for (size_t i = 0; i < ok.size(); ++i) sum += p[i] = std::exp(double(logits[ok[i]] - logits[ok[0]]) / sp.temperature);
  if (sp.top_p < 1.0f) {  // the smallest head whose mass reaches top_p
    double acc = 0;
    size_t keep = 0;
    while (keep < ok.size() && acc < double(sp.top_p) * sum) acc += p[keep++];
    ok.resize(std::max<size_t>(keep, 1));
    p.resize(ok.size());
  }
  std::discrete_distribution<size_t> pick(p.begin(), p.end());
  return ok[pick(*rng)];
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
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto send = [&](const std::string& text) {
    const Clock::time_point e0 = Clock::now();
    const bool go_on = emit(text, pending);
    r.emit_s += since(e0);
    for (TokenLogprob& t : pending) r.logprobs.push_back(std::move(t));
    r.logprobs_emitted = r.logprobs.size();
    pending.clear();
    return go_on;
  };
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const Clock::time_point tt = Clock::now();
  const int held = mz_conversation_n_tokens(conv);
  if (held < 0) return Failed(r, held);
  if (keep > held) keep = held;
  if (held > keep) {
    if (int st = mz_conversation_truncate(conv, keep); st != MZ_OK) return Failed(r, st);
  }
  r.history.assign(prompt.begin(), prompt.begin() + keep);  // what the conversation holds now
  std::unique_ptr<mz_sampler, void (*)(mz_sampler*)> sampler(mz_sampler_new(&params.sampler), mz_sampler_free);
  if (!sampler) return Failed(r, MZ_ERR_INVALID_ARG);
  const Clock::time_point t0 = Clock::now();
  r.truncate_s = secs(tt, t0);
  if (int st = mz_conversation_restore_generate(conv, prompt.data() + keep, int32_t(prompt.size()) - keep, nullptr,
                                                &r.restore);
      st != MZ_OK)
    return Failed(r, st);
  const Clock::time_point t1 = Clock::now();
  r.prompt_s = secs(t0, t1);
  // The turn mark (where this turn's prompt ends) is the pool's, persisted with this turn's commit:
  // after a restart, or on another server of a fleet, a resent history is matched against it.
  if (int st = mz_conversation_set_turn_mark(conv, int32_t(prompt.size())); st != MZ_OK) {
    mz_conversation_commit(conv);
    return Failed(r, st);
  }
  const Clock::time_point tm = Clock::now();
  r.mark_s = secs(t1, tm);

  r.history = prompt;
  std::vector<mz_token> script;
  if (params.scripted) {
    if (int st = cli::TokenizeText(model, *params.scripted, false, true, &script); st != MZ_OK) {
      mz_conversation_commit(conv);
      return Failed(r, st);
    }
  }
  size_t script_at = 0;
  // Constrained decoding (tool_choice "required" or a named function; not with a scripted reply):
  // every token's piece once, to test against the constraint at each step.
  ToolCallConstraint* const constraint = params.scripted ? nullptr : params.constraint;
  std::vector<std::string> pieces;
  std::vector<char> eog;
  std::mt19937 rng(params.sampler.seed);
  if (constraint) {
    mz_model_info info;
    if (int st = mz_model_get_info(model, &info); st != MZ_OK) {
      mz_conversation_commit(conv);
      return Failed(r, st);
    }
    pieces.resize(size_t(info.n_vocab));
    eog.resize(size_t(info.n_vocab));
    for (int32_t i = 0; i < info.n_vocab; ++i) {
      eog[size_t(i)] = mz_token_is_eog(model, i);
      if (!eog[size_t(i)]) pieces[size_t(i)] = cli::TokenPiece(model, i);
    }
  }
  TextStream text(params.stop);
  Clock::time_point t_first = tm;  // the first token sampled
  bool any_text = false;           // some text went to emit
  int n = int(prompt.size());
  bool stopped = false;
  r.finish_reason = "length";
  while (r.completion_tokens < params.max_tokens) {
    if (params.scripted && script_at == script.size()) {  // the scripted reply ends as on EOG
      r.finish_reason = "stop";
      break;
    }
    if (constraint && constraint->Complete()) {  // the call is whole: the turn ends as on EOG
      r.finish_reason = "stop";
      break;
    }
    mz_token t = -1;
    const Clock::time_point s0 = Clock::now();
    if (params.scripted) {
      t = script[script_at++];
    } else if (constraint) {
      const float* logits = mz_conversation_logits(conv, 0);
      t = logits ? ConstrainedPick(logits, pieces, eog, *constraint, params.sampler, &rng) : MZ_ERR_INTERNAL;
      if (t == -1) {
        mz_conversation_commit(conv);
        r.status = MZ_ERR_INTERNAL;
        r.error = "no token of the vocabulary continues the constrained tool call";
        return r;
      }
      constraint->Advance(pieces[size_t(t)]);
    } else {
      t = mz_conversation_sample(conv, sampler.get(), 0);
    }
    r.sample_s += since(s0);
    if (t < 0) {
      mz_conversation_commit(conv);
      return Failed(r, t);
    }
    if (r.completion_tokens == 0) {
      t_first = Clock::now();
      r.first_sample_s = secs(tm, t_first);
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
    if (params.decoded) params.decoded->store(r.completion_tokens);
    // With logprobs, the token's piece was just built for them: not built a second time.
    const std::string out =
        text.Push(params.top_logprobs >= 0 ? pending.back().piece : cli::TokenPiece(model, t), &stopped);
    const bool first_text = !any_text && !out.empty();
    if (!out.empty() && !send(out)) {
      r.finish_reason = "cancelled";
      break;
    }
    if (first_text) {
      any_text = true;
      r.first_text_s = secs(t_first, Clock::now());
    }
    if (stopped) {
      r.finish_reason = "stop";
      break;
    }
    // The sampled token is decoded only if another one follows it.
    if (r.completion_tokens >= params.max_tokens || n + 1 >= params.n_ctx) break;
    const Clock::time_point d0 = Clock::now();
    const int dst = mz_conversation_decode(conv, &t, 1, false);
    r.decode_s += since(d0);
    if (dst != MZ_OK) {
      mz_conversation_commit(conv);
      return Failed(r, dst);
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
