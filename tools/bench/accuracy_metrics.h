// Accuracy of a perturbed next-token distribution against a reference, for `bench accuracy` (and
// its alias `bench kv-type`): KL divergence of the softmax distributions and top-1 agreement,
// computed in double precision; the reference distributions of teacher-forced positions and the
// per-position comparison of another context's logits with them.
#pragma once
#include <cstddef>
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

// The next-token distributions of teacher-forced positions on a reference context, one Add per
// position in order: log-probabilities, top-1, entropy, and whether the position is decided (top-1
// ahead of top-2 by >= margin probability: agreement there is not a coin flip between near-ties).
struct NextTokenReference {
  explicit NextTokenReference(double decided_margin = 0.05) : margin(decided_margin) {}
  double margin;
  int nv = 0;
  std::vector<float> log_probs;  // [positions][nv]
  std::vector<int> top1;
  std::vector<bool> decided;
  int n_decided = 0;
  double entropy_sum = 0;  // nats
  int positions() const { return int(top1.size()); }
  double mean_entropy() const { return top1.empty() ? 0 : entropy_sum / double(top1.size()); }
  const float* log_probs_at(int i) const { return log_probs.data() + size_t(i) * size_t(nv); }
  // Appends the next position. REQUIRES the same n >= 1 at every call; logits finite.
  void Add(const float* logits, int n);
};

// Another context's logits at the reference's positions: KL(p_ref || p) per position and top-1
// agreement (all positions, and the decided ones).
struct NextTokenComparison {
  std::vector<double> kl;  // per position, in Add order
  int agree = 0, agree_decided = 0;
  // Compares position i of ref with logits[0, ref.nv).
  void Add(const NextTokenReference& ref, int i, const float* logits);

 private:
  std::vector<float> lq_;  // scratch
};

}  // namespace mz::cli
