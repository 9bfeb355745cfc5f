#include "tools/serve/turn.h"

#include <memory>

#include "tools/serve/text_stream.h"

namespace mz::serve {
namespace {

TurnResult Failed(TurnResult r, int status) {
  r.status = status;
  r.error = mz_last_error();
  return r;
}

std::string Piece(mz_model* model, mz_token t) {
  char buf[256];
  const int32_t n = mz_token_to_piece(model, t, buf, int32_t(sizeof buf));
  if (n <= 0) return {};
  if (n < int32_t(sizeof buf)) return std::string(buf, size_t(n));
  std::string big(size_t(n) + 1, '\0');
  mz_token_to_piece(model, t, big.data(), n + 1);
  big.resize(size_t(n));
  return big;
}

}  // namespace

TurnResult RunTurn(mz_model* model, mz_conversation* conv, const std::vector<mz_token>& prompt, int keep,
                   const TurnParams& params, const std::function<bool(const std::string&)>& emit) {
  TurnResult r;
  const int held = mz_conversation_n_tokens(conv);
  if (held < 0) return Failed(r, held);
  if (keep > held) keep = held;
  if (held > keep) {
    if (int st = mz_conversation_truncate(conv, keep); st != MZ_OK) return Failed(r, st);
  }
  r.history.assign(prompt.begin(), prompt.begin() + keep);  // what the conversation holds now
  std::unique_ptr<mz_sampler, void (*)(mz_sampler*)> sampler(mz_sampler_new(&params.sampler), mz_sampler_free);
  if (!sampler) return Failed(r, MZ_ERR_INVALID_ARG);
  if (int st = mz_conversation_restore_generate(conv, prompt.data() + keep, int32_t(prompt.size()) - keep, nullptr,
                                                &r.restore);
      st != MZ_OK)
    return Failed(r, st);
  r.history = prompt;
  TextStream text(params.stop);
  int n = int(prompt.size());
  bool stopped = false;
  r.finish_reason = "length";
  while (r.completion_tokens < params.max_tokens) {
    const mz_token t = mz_conversation_sample(conv, sampler.get(), 0);
    if (t < 0) {
      mz_conversation_commit(conv);
      return Failed(r, t);
    }
    if (mz_token_is_eog(model, t)) {
      r.finish_reason = "stop";
      break;
    }
    ++r.completion_tokens;
    const std::string out = text.Push(Piece(model, t), &stopped);
    if (!out.empty() && !emit(out)) {
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
    if (!rest.empty() && !emit(rest)) r.finish_reason = "cancelled";
  }
  r.text = text.released();
  if (int st = mz_conversation_commit(conv); st != MZ_OK) return Failed(r, st);
  return r;
}

}  // namespace mz::serve
