// Tests for the sampler's full-row draw (kernels/sample_row.h, runtime/sampler.h): the row kernels
// against std::exp and hand-counted running sums (lengths that are and are not multiples of the
// SIMD width, -inf and NaN logits), and the sampler's law (token i drawn with probability
// exp(l_i / T) / sum_j exp(l_j / T)) checked by counting draws, its seeding and its fallbacks.
#include "kernels/sample_row.h"
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace mz {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(SampleRow, RowMaxSkipsNaNAtEveryPosition) {
  for (int n : {1, 7, 8, 9, 37, 64}) {
    for (int at = 0; at < n; ++at) {
      std::vector<float> x(size_t(n), -3.0f);
      x[size_t((at + 1) % n)] = kNaN;
      if ((at + 1) % n != at) x[size_t(at)] = 2.5f;
      const float m = kern::RowMax(x.data(), n);
      if (n == 1) {
        EXPECT_EQ(m, -kInf) << "a lone NaN is skipped";
      } else {
        EXPECT_EQ(m, 2.5f) << "n " << n << " max at " << at;
      }
    }
  }
  std::vector<float> all_neg_inf(19, -kInf);
  EXPECT_EQ(kern::RowMax(all_neg_inf.data(), 19), -kInf);
}

TEST(SampleRow, ExpWeightsMatchStdExp) {
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (int n : {1, 5, 8, 13, 1001}) {
    for (float t : {1.0f, 0.7f, 2.0f}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(g);
      if (n > 3) {
        x[1] = -kInf;
        x[size_t(n - 2)] = kNaN;
      }
      const float m = kern::RowMax(x.data(), n);
      std::vector<float> w(size_t(n), -1.0f);
      const double sum = kern::ExpWeights(x.data(), n, m, 1.0f / t, w.data());
      double want_sum = 0;
      for (int i = 0; i < n; ++i) {
        if (std::isnan(x[size_t(i)]) || x[size_t(i)] == -kInf) {
          EXPECT_EQ(w[size_t(i)], 0.0f) << "i " << i;
          continue;
        }
        const double y = (double(x[size_t(i)]) - double(m)) / double(t), want = std::exp(y);
        want_sum += want;
        // The exponent is computed in float: its rounding (~6e-8 relative) scales the weight's
        // relative error by |y|, on top of the polynomial's ~2e-7.
        EXPECT_NEAR(w[size_t(i)], want, want * (1e-6 + 3e-7 * std::fabs(y)) + 1e-37)
            << "n " << n << " i " << i << " t " << t;
      }
      EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << "n " << n;
    }
  }
}

TEST(SampleRow, DrawIndexIsTheFirstIndexWhoseRunningSumReachesTheTarget) {
  // Ones at every index: target k + 0.5 is reached at index k, in and across every SIMD block.
  const int n = 100;
  std::vector<float> ones(n, 1.0f);
  for (int k = 0; k < n; ++k) EXPECT_EQ(kern::DrawIndex(ones.data(), n, k + 0.5), k);
  EXPECT_EQ(kern::DrawIndex(ones.data(), n, 3.0), 2) << "a running sum equal to the target reaches it";
  // Zero weights are never drawn: target 0 lands on the first positive weight, a target beyond the
  // sum (rounding) on the last one.
  std::vector<float> w(21, 0.0f);
  w[9] = 1.0f;
  w[17] = 2.0f;
  EXPECT_EQ(kern::DrawIndex(w.data(), 21, 0.0), 9);
  EXPECT_EQ(kern::DrawIndex(w.data(), 21, 1.0), 9);
  EXPECT_EQ(kern::DrawIndex(w.data(), 21, 1.0001), 17);
  EXPECT_EQ(kern::DrawIndex(w.data(), 21, 3.0), 17);
  EXPECT_EQ(kern::DrawIndex(w.data(), 21, 3.5), 17);
  std::vector<float> zeros(12, 0.0f);
  EXPECT_EQ(kern::DrawIndex(zeros.data(), 12, 0.0), -1);
}

// Draws `draws` tokens and checks each token's count against its probability (within 5 standard
// deviations, and zero counts for impossible tokens).
void ExpectLaw(const std::vector<float>& logits, float t, int draws, uint32_t seed) {
  Sampler s(SamplerParams{t, 0, 1.0f, seed});
  const int n = int(logits.size());
  std::vector<int> count(size_t(n), 0);
  for (int d = 0; d < draws; ++d) {
    const int32_t tok = s.Sample(logits.data(), n);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, n);
    count[size_t(tok)]++;
  }
  double mx = -1e300, z = 0;
  for (float l : logits)
    if (!std::isnan(l)) mx = std::max(mx, double(l));
  std::vector<double> p(size_t(n), 0.0);
  for (int i = 0; i < n; ++i) {
    if (std::isnan(logits[size_t(i)])) continue;
    p[size_t(i)] = std::exp((double(logits[size_t(i)]) - mx) / t);
    z += p[size_t(i)];
  }
  for (int i = 0; i < n; ++i) {
    const double pi = p[size_t(i)] / z, mean = pi * draws, sd = std::sqrt(draws * pi * (1 - pi));
    if (pi == 0) {
      EXPECT_EQ(count[size_t(i)], 0) << "token " << i << " cannot be drawn";
    } else if (mean >= 20) {
      EXPECT_NEAR(count[size_t(i)], mean, 5 * sd + 1) << "token " << i << " p " << pi << " t " << t;
    }
  }
}

// n logits drawn uniformly from [-spread, spread] with generator seed `seed`.
std::vector<float> UniformLogits(int n, float spread, uint32_t seed) {
  std::vector<float> logits(static_cast<size_t>(n));
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-spread, spread);
  for (float& l : logits) l = u(g);
  return logits;
}

TEST(SamplerRow, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -kInf, 0.5f, kNaN, 3.0f, -1.0f, 2.5f, 1.5f, 0.25f};
  ExpectLaw(logits, 1.0f, 100000, 11);
  ExpectLaw(logits, 0.5f, 100000, 12);
  ExpectLaw(logits, 2.0f, 100000, 13);
}

TEST(SamplerRow, DrawsFollowTheSoftmaxOverAFullVocabulary) {
  // Qwen3's vocabulary size; three tokens hold most of the mass, the rest a spread of small logits.
  std::vector<float> logits = UniformLogits(151936, 2.0f, 5);
  logits[777] = 14.0f;
  logits[151935] = 13.0f;
  logits[64000] = 12.5f;
  ExpectLaw(logits, 1.0f, 3000, 21);
}

TEST(SamplerRow, ASeedGivesTheSameTokensAndAnotherSeedOthers) {
  const std::vector<float> logits = UniformLogits(5000, 1.0f, 9);
  Sampler a(SamplerParams{1.0f, 0, 1.0f, 7}), b(SamplerParams{1.0f, 0, 1.0f, 7}), c(SamplerParams{1.0f, 0, 1.0f, 8});
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    const int32_t ta = a.Sample(logits.data(), 5000), tb = b.Sample(logits.data(), 5000);
    EXPECT_EQ(ta, tb) << "draw " << i;
    differ += c.Sample(logits.data(), 5000) != ta;
  }
  EXPECT_GT(differ, 150) << "seed 8 drew the same tokens as seed 7";
}

TEST(SamplerRow, ARowWithoutAFiniteMaximumGivesArgMax) {
  Sampler s(SamplerParams{1.0f, 0, 1.0f, 1});
  std::vector<float> x(40, -kInf);
  EXPECT_EQ(s.Sample(x.data(), 40), 0);
  x[23] = kInf;
  x[31] = kInf;
  EXPECT_EQ(s.Sample(x.data(), 40), 23);
  std::vector<float> nan(10, kNaN);
  EXPECT_EQ(s.Sample(nan.data(), 10), 0);
}

TEST(SamplerRow, TopKStillCutsThroughLibllamasChain) {
  // With a top-k cut the chain samples: only the k largest logits are ever drawn.
  std::vector<float> logits(300);
  for (int i = 0; i < 300; ++i) logits[size_t(i)] = float(i % 17) * 0.1f;
  logits[5] = 9.0f;
  logits[250] = 8.9f;
  Sampler s(SamplerParams{1.0f, 2, 1.0f, 3});
  for (int d = 0; d < 300; ++d) {
    const int32_t t = s.Sample(logits.data(), 300);
    EXPECT_TRUE(t == 5 || t == 250) << t;
  }
}

}  // namespace
}  // namespace mz
