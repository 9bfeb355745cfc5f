// Chunked-KV attention, AVX2 + FMA + F16C path (x86-64-v3). Compiled in every build (GLOB_RECURSE);
// empty unless the compiler targets those extensions (MZ_ATTN_AVX2, kernels/attention_impl.h).
// The algorithm and the work partition are shared with the other paths (attention_impl.h); this
// file holds the register-blocked QK and PV tiles and fp16 / q8 -> f32 tile conversion (exp2 is
// kernels/exp2_avx2.h, shared with the sampler).
#include "kernels/attention_impl.h"

#if MZ_ATTN_AVX2
#include <immintrin.h>

#include "kernels/exp2_avx2.h"

namespace mz::attn {
namespace {

using mz::simd::exp2_ps;

inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// {sum(a0), sum(a1), sum(a2), sum(a3)}
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// fp16 -> f32 for count elements (count % 8 == 0).
inline void cvt_tile(const uint16_t* src, size_t count, float* dst) {
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m128i h0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i h1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 8));
    const __m128i h2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i h3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 24));
    _mm256_store_ps(dst + i, _mm256_cvtph_ps(h0));
    _mm256_store_ps(dst + i + 8, _mm256_cvtph_ps(h1));
    _mm256_store_ps(dst + i + 16, _mm256_cvtph_ps(h2));
    _mm256_store_ps(dst + i + 24, _mm256_cvtph_ps(h3));
  }
  for (; i < count; i += 8) {
    _mm256_store_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
}

// q8 rows -> f32, bit-identical to q8_dequantize_rows_f32 (kernels/q8_block.h; and to the codec's
// decoder followed by cvt_tile): code clamped to -127, one f32 multiply by the row's step, RNE to fp16, back to f32.
inline void cvt_tile_q8(const int8_t* codes, const uint8_t* amax, int n, int D, float* dst) {
  const __m128i m127 = _mm_set1_epi8(-kQ8MaxCode);
  for (int r = 0; r < n; ++r) {
    const __m256 vs = _mm256_set1_ps(q8_step_of_bits(q8_load_amax(amax + 2 * r)));
    const int8_t* c = codes + static_cast<size_t>(r) * D;
    float* o = dst + static_cast<size_t>(r) * D;
    for (int d = 0; d < D; d += 8) {
      const __m128i q = _mm_max_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + d)), m127);
      const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vs);
      _mm256_store_ps(o + d, _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
  }
}

// s[r*kTile + j] = dot(q[r*D..], k[j*D..]) for r < NR, j < NK. 12 accumulators + 3 q + 1 k = 16 ymm.
template <int NR, int NK>
void qk_block(const float* q, const float* k, int D, float* s) {
  __m256 acc[NR][NK];
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    MZ_UNROLL for (int j = 0; j < NK; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (int d = 0; d < D; d += 8) {
    __m256 qv[NR];
    MZ_UNROLL for (int r = 0; r < NR; ++r) qv[r] = _mm256_load_ps(q + r * D + d);
    MZ_UNROLL for (int j = 0; j < NK; ++j) {
      const __m256 kj = _mm256_load_ps(k + j * D + d);
      MZ_UNROLL for (int r = 0; r < NR; ++r) acc[r][j] = _mm256_fmadd_ps(qv[r], kj, acc[r][j]);
    }
  }
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    if constexpr (NK == 4) {
      _mm_storeu_ps(s + r * kTile, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
      MZ_UNROLL for (int j = 0; j < NK; ++j) s[r * kTile + j] = hsum(acc[r][j]);
    }
  }
}

using QkFn = void (*)(const float*, const float*, int, float*);
constexpr int kQkRows = 3, kQkKeys = 4;

// Scores for all R rows against the n keys of the tile: s[r][j], r < R, j < n.
// pf advances once per block call.
void qk_tile(const float* q, int R, const float* k, int n, int D, float* s, Prefetcher& pf) {
  static const QkFn tbl[kQkRows][kQkKeys] = {
      {qk_block<1, 1>, qk_block<1, 2>, qk_block<1, 3>, qk_block<1, 4>},
      {qk_block<2, 1>, qk_block<2, 2>, qk_block<2, 3>, qk_block<2, 4>},
      {qk_block<3, 1>, qk_block<3, 2>, qk_block<3, 3>, qk_block<3, 4>},
  };
  qk_tile_blocks(tbl, q, R, k, n, D, s, pf);
}

// acc[r][0..8*NV) = acc*alpha[r] + sum_{t<n} p[r][t] * v[t][0..8*NV), r < NR. 12 acc + 3 v + 1 p = 16 ymm.
// acc and v point at the same column block; their row strides are D.
template <int NR, int NV>
void pv_block(const float* p, const float* alpha, const float* v, int n, int D, float* acc) {
  __m256 a[NR][NV];
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    const __m256 al = _mm256_broadcast_ss(alpha + r);
    MZ_UNROLL for (int c = 0; c < NV; ++c) a[r][c] = _mm256_mul_ps(_mm256_load_ps(acc + r * D + 8 * c), al);
  }
  for (int t = 0; t < n; ++t) {
    __m256 vv[NV];
    MZ_UNROLL for (int c = 0; c < NV; ++c) vv[c] = _mm256_load_ps(v + static_cast<size_t>(t) * D + 8 * c);
    MZ_UNROLL for (int r = 0; r < NR; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * kTile + t);
      MZ_UNROLL for (int c = 0; c < NV; ++c) a[r][c] = _mm256_fmadd_ps(pr, vv[c], a[r][c]);
    }
  }
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    MZ_UNROLL for (int c = 0; c < NV; ++c) _mm256_store_ps(acc + r * D + 8 * c, a[r][c]);
  }
}

using PvFn = void (*)(const float*, const float*, const float*, int, int, float*);
constexpr int kPvRows = 4, kPvVecs = 3;

// pf advances once per block call.
void pv_tile(const float* p, const float* alpha, const float* v, int n, int R, int D, float* acc, Prefetcher& pf) {
  static const PvFn tbl[kPvRows][kPvVecs] = {
      {pv_block<1, 1>, pv_block<1, 2>, pv_block<1, 3>},
      {pv_block<2, 1>, pv_block<2, 2>, pv_block<2, 3>},
      {pv_block<3, 1>, pv_block<3, 2>, pv_block<3, 3>},
      {pv_block<4, 1>, pv_block<4, 2>, pv_block<4, 3>},
  };
  pv_tile_blocks<8>(tbl, p, alpha, v, n, R, D, acc, pf);
}

// The AVX2 steps of simd_item (attention_impl.h).
struct Avx2 {
  static constexpr int kW = 8;
  static constexpr int kQkRows = mz::attn::kQkRows, kQkKeys = mz::attn::kQkKeys;
  static constexpr int kPvRows = mz::attn::kPvRows, kPvVecs = mz::attn::kPvVecs;
  static void load_row(const float* src, float qs, int D, float* q, float* acc) {
    const __m256 vqs = _mm256_set1_ps(qs);
    for (int d = 0; d < D; d += 8) {
      _mm256_store_ps(q + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), vqs));
      _mm256_store_ps(acc + d, _mm256_setzero_ps());
    }
  }
  static void to_f32(const int8_t* codes, const uint8_t* amax, const uint16_t* half, int n, int D, float* dst) {
    if (codes) cvt_tile_q8(codes, amax, n, D, dst);
    else cvt_tile(half, static_cast<size_t>(n) * D, dst);
  }
  static void qk_tile(const float* q, int R, const float* k, int n, int D, float* s, Prefetcher& pf) {
    mz::attn::qk_tile(q, R, k, n, D, s, pf);
  }
  static void pv_tile(const float* p, const float* alpha, const float* v, int n, int R, int D, float* acc,
                      Prefetcher& pf) {
    mz::attn::pv_tile(p, alpha, v, n, R, D, acc, pf);
  }
  static void zero(float* s, int nw) {
    for (int j = 0; j < nw; j += 8) _mm256_store_ps(s + j, _mm256_setzero_ps());
  }
  static float exp_row(float* s, int nw, float m_old, float* m_new) {
    __m256 vmx = _mm256_load_ps(s);
    for (int j = 8; j < nw; j += 8) vmx = _mm256_max_ps(vmx, _mm256_load_ps(s + j));
    *m_new = std::max(m_old, hmax(vmx));
    const __m256 mv = _mm256_set1_ps(*m_new);
    __m256 vsum = _mm256_setzero_ps();
    for (int j = 0; j < nw; j += 8) {
      const __m256 pj = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s + j), mv));
      _mm256_store_ps(s + j, pj);
      vsum = _mm256_add_ps(vsum, pj);
    }
    return hsum(vsum);
  }
  static void store_row(const float* acc, float inv, int D, float* dst) {
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(acc + d), vinv));
  }
};

}  // namespace

void attention_chunked_avx2(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  run_items(a, kv, ith, nth, simd_item<Avx2>);
}

}  // namespace mz::attn

#endif  // MZ_ATTN_AVX2
