// Accuracy of a perturbed next-token distribution against a reference, for `bench accuracy`:
// KL divergence of the softmax distributions and top-1 agreement, computed in double precision.
#pragma once
#include <cstdint>
#include <vector>

namespace mz::cli {

// Natural-log softmax of logits[0, n) into out[0, n) (max-subtracted, double accumulation).
// REQUIRES n >= 1; logits finite.
void LogSoftmax(const float* logits, int n, float* out);
// KL(p || q) = sum_i p_i (log p_i - log q_i) in nats, from log-probabilities (LogSoftmax output).
// >= 0 up to rounding (clamped at 0); 0 when the two are equal.
double KlFromLogProbs(const float* log_p, const float* log_q, int n);
// KL(softmax(p) || softmax(q)) straight from logits (invariant to adding a constant to either).
double KlFromLogits(const float* logits_p, const float* logits_q, int n);
// Index of the largest value (first one on ties); -1 if n < 1.
int ArgMaxIndex(const float* x, int n);

// Summary of per-position values.
struct KlSummary {
  double mean = 0, max = 0, p50 = 0, p90 = 0, p99 = 0;
  int n = 0;
};
KlSummary SummarizeKl(std::vector<double> kl);
// Histogram of log10(kl) over [lo, hi) in `bins` equal bins; values below lo (including 0) go to
// the first bin, values at or above hi to the last. Returns the counts.
std::vector<int> Log10Histogram(const std::vector<double>& kl, double lo, double hi, int bins);

}  // namespace mz::cli
