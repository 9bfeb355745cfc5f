// 2^x on eight floats, AVX2 + FMA (x86-64-v3): the one exp the SIMD kernels share (the attention
// tiles' softmax, kernels/attention_avx2.cpp, and the sampler's row, kernels/sample_row.cpp).
// Include only where __AVX2__ and __FMA__ are defined (the includer's own guard); header-only so
// that it inlines into each kernel loop.
#pragma once
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace mz::simd {

// 2^x for x <= 0 (also fine up to ~127). x < -126 (including -inf) gives exactly 0.
// Cephes exp2f polynomial on the fraction in [-0.5, 0.5]: relative error ~2e-7.
inline __m256 exp2_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace mz::simd
#endif
