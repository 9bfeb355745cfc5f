// Sampling from a full row of logits without sorting it: the two passes a temperature-only sampler
// needs (softmax weights and their sum, then the draw), vectorized where the build targets AVX2+FMA
// (the exp of kernels/exp2_avx2.h), scalar std::exp elsewhere. Used by runtime/sampler.cpp when no
// top-k or top-p cut is asked (OpenAI's defaults, what `mzcache serve` gets from most clients):
// 151,936 logits per token for Qwen3, where libllama's chain (a copy into token-data records, one
// scalar expf and a double add per logit, then a normalizing division pass) took ~1.1 ms a token on
// the 2-core AMD EPYC VM, on the thread of each generating conversation.
//
// Thread-safety: pure functions over the caller's buffers.
#pragma once
#include <cstdint>

namespace mz::kern {

// The largest of x[0..n) (n >= 1); NaN entries are skipped unless every entry is NaN (then NaN).
float RowMax(const float* x, int32_t n);

// w[i] = exp((x[i] - max) * inv_t) for i in [0, n), where max = RowMax(x, n) is passed in and must
// be finite; returns the sum of w[0..n) (float partial sums, added in double at the end). x[i] =
// -inf gives w[i] = 0 exactly; NaN x[i] gives w[i] = 0 (a NaN logit is never drawn). inv_t > 0.
// Relative error of each weight ~2e-7 on the AVX2 path (Cephes exp2 polynomial), std::exp's
// elsewhere.
double ExpWeights(const float* x, int32_t n, float max, float inv_t, float* w);

// The first index i whose running sum w[0] + ... + w[i] reaches target (0 <= target <= the sum of
// w); when rounding leaves the whole sum short of target, the last i with w[i] > 0; -1 if every
// w[i] is 0 (or n == 0).
int32_t DrawIndex(const float* w, int32_t n, double target);

}  // namespace mz::kern
