#include "tools/bench/accuracy_metrics.h"

#include <algorithm>
#include <cmath>

namespace mz::cli {

void LogSoftmax(const float* logits, int n, float* out) {
  double m = logits[0];
  for (int i = 1; i < n; ++i) m = std::max(m, double(logits[i]));
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(logits[i]) - m);
  const double lse = m + std::log(s);
  for (int i = 0; i < n; ++i) out[i] = float(double(logits[i]) - lse);
}

double KlFromLogProbs(const float* log_p, const float* log_q, int n) {
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double lp = log_p[i];
    if (lp < -745) continue;  // exp underflows to 0: the term is 0
    kl += std::exp(lp) * (lp - double(log_q[i]));
  }
  return std::max(0.0, kl);
}

double KlFromLogits(const float* logits_p, const float* logits_q, int n) {
  std::vector<float> lp(static_cast<size_t>(n)), lq(static_cast<size_t>(n));
  LogSoftmax(logits_p, n, lp.data());
  LogSoftmax(logits_q, n, lq.data());
  return KlFromLogProbs(lp.data(), lq.data(), n);
}

int ArgMaxIndex(const float* x, int n) {
  if (n < 1) return -1;
  return int(std::max_element(x, x + n) - x);
}

KlSummary SummarizeKl(std::vector<double> kl) {
  KlSummary s;
  s.n = int(kl.size());
  if (kl.empty()) return s;
  std::sort(kl.begin(), kl.end());
  double sum = 0;
  for (double x : kl) sum += x;
  s.mean = sum / double(kl.size());
  s.max = kl.back();
  auto q = [&](double f) { return kl[std::min(kl.size() - 1, size_t(f * double(kl.size() - 1) + 0.5))]; };
  s.p50 = q(0.5);
  s.p90 = q(0.9);
  s.p99 = q(0.99);
  return s;
}

std::vector<int> Log10Histogram(const std::vector<double>& kl, double lo, double hi, int bins) {
  std::vector<int> h(size_t(std::max(bins, 1)), 0);
  for (double x : kl) {
    int b = 0;
    if (x > 0) {
      const double l = std::log10(x);
      b = int(std::floor((l - lo) / (hi - lo) * bins));
    }
    h[size_t(std::clamp(b, 0, int(h.size()) - 1))]++;
  }
  return h;
}

void NextTokenReference::Add(const float* logits, int n) {
  nv = n;
  log_probs.resize(log_probs.size() + size_t(n));
  float* lp = log_probs.data() + log_probs.size() - size_t(n);
  LogSoftmax(logits, n, lp);
  top1.push_back(ArgMaxIndex(logits, n));
  double p1 = 0, p2 = 0;
  for (int v = 0; v < n; ++v) {
    const double pv = std::exp(double(lp[v]));
    entropy_sum -= pv > 0 ? pv * double(lp[v]) : 0;
    if (pv > p1) p2 = p1, p1 = pv;
    else if (pv > p2) p2 = pv;
  }
  decided.push_back(p1 - p2 >= margin);
  n_decided += decided.back();
}

void NextTokenComparison::Add(const NextTokenReference& ref, int i, const float* logits) {
  lq_.resize(size_t(ref.nv));
  LogSoftmax(logits, ref.nv, lq_.data());
  kl.push_back(KlFromLogProbs(ref.log_probs_at(i), lq_.data(), ref.nv));
  const bool same = ArgMaxIndex(logits, ref.nv) == ref.top1[size_t(i)];
  agree += same;
  agree_decided += same && ref.decided[size_t(i)];
}

}  // namespace mz::cli
