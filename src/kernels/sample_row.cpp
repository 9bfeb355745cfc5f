// Sampling from a full row of logits: see sample_row.h for the contract.
#include "kernels/sample_row.h"

#include <cmath>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#define MZ_SAMPLE_AVX2 1
#include <immintrin.h>

#include "kernels/exp2_avx2.h"
#endif

namespace mz::kern {
namespace {

#if MZ_SAMPLE_AVX2
inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}
#endif

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace

float RowMax(const float* x, int32_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
#if MZ_SAMPLE_AVX2
  __m256 mv = _mm256_set1_ps(m);
  // _mm256_max_ps(a, b) returns b when either is NaN: a NaN entry leaves the running max as it was.
  for (; i + 8 <= n; i += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + i), mv);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mv);
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;  // false for NaN
  return m;
}

double ExpWeights(const float* x, int32_t n, float max, float inv_t, float* w) {
  double sum = 0;
  int32_t i = 0;
#if MZ_SAMPLE_AVX2
  // exp(y) = 2^(y log2 e): one multiply folds the temperature and the base change.
  const __m256 mv = _mm256_set1_ps(max), k = _mm256_set1_ps(inv_t * kLog2e);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    const __m256 num = _mm256_cmp_ps(xv, xv, _CMP_ORD_Q);  // all ones unless NaN
    const __m256 wv = _mm256_and_ps(num, mz::simd::exp2_ps(_mm256_mul_ps(_mm256_sub_ps(xv, mv), k)));
    _mm256_storeu_ps(w + i, wv);
    acc = _mm256_add_ps(acc, wv);
  }
  sum = double(hsum(acc));
#endif
  for (; i < n; ++i) {
    w[i] = std::isnan(x[i]) ? 0.0f : std::exp((x[i] - max) * inv_t);
    sum += double(w[i]);
  }
  return sum;
}

int32_t DrawIndex(const float* w, int32_t n, double target) {
  double run = 0;
  int32_t i = 0;
#if MZ_SAMPLE_AVX2
  // Whole blocks of 8 first; the block that reaches target is scanned one by one below (if its
  // elements, added one at a time, round short of it, the scan just goes on).
  for (; i + 8 <= n; i += 8) {
    const double b = double(hsum(_mm256_loadu_ps(w + i)));
    if (run + b >= target) break;
    run += b;
  }
#endif
  for (; i < n; ++i) {
    run += double(w[i]);
    if (run >= target && w[i] > 0) return i;
  }
  for (i = n - 1; i >= 0; --i)
    if (w[i] > 0) return i;
  return -1;
}

}  // namespace mz::kern
