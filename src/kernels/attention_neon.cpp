// Chunked-KV attention, NEON path (AArch64). Compiled in every build (GLOB_RECURSE); empty unless
// the compiler targets AArch64 with NEON (MZ_ATTN_NEON, kernels/attention_impl.h). Same algorithm,
// tiles, scratch layout and prefetching as the AVX2 path, with 4-wide f32 vectors. Register blocks
// are sized for the 32 NEON registers (not tuned on hardware). q8 tiles are dequantized by the
// portable q8_dequantize_rows_f32 (kernels/q8_block.h), as in the scalar path.
#include "kernels/attention_impl.h"

#if MZ_ATTN_NEON
#include <arm_neon.h>

namespace mz::attn {
namespace {

// 2^x, same contract and Cephes polynomial as the AVX2 exp2_ps: x < -126 (including -inf) gives
// exactly 0, relative error ~2e-7 for x <= 0 (also fine up to ~127). NaN gives NaN.
inline float32x4_t exp2_f32x4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(-126.0f);
  const uint32x4_t under = vcltq_f32(x, lo);
  x = vminq_f32(vmaxq_f32(x, lo), vdupq_n_f32(127.0f));
  const int32x4_t n = vcvtnq_s32_f32(x);  // round to nearest, ties to even
  const float32x4_t f = vsubq_f32(x, vcvtq_f32_s32(n));
  float32x4_t p = vdupq_n_f32(1.535336188319500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.339887440266574e-3f), p, f);  // vfmaq_f32(c, a, b) = c + a * b
  p = vfmaq_f32(vdupq_n_f32(9.618437357674640e-3f), p, f);
  p = vfmaq_f32(vdupq_n_f32(5.550332471162809e-2f), p, f);
  p = vfmaq_f32(vdupq_n_f32(2.402264791363012e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(6.931472028550421e-1f), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  const int32x4_t e = vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23);
  const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), under));
}

// {sum(a0), sum(a1), sum(a2), sum(a3)}
inline float32x4_t hsum4_neon(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
  return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
}

// fp16 -> f32 for count elements (count % 8 == 0). fcvtl/fcvtl2 are exact (subnormals, inf, NaN).
inline void cvt_tile_neon(const uint16_t* src, size_t count, float* dst) {
  for (size_t i = 0; i < count; i += 8) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
    vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
  }
}

// s[r*kTile + j] = dot(q[r*D..], k[j*D..]) for r < NR, j < NK. 16 accumulators + 4 q + 4 k = 24 regs.
template <int NR, int NK>
void qk_block_neon(const float* q, const float* k, int D, float* s) {
  float32x4_t acc[NR][NK];
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    MZ_UNROLL for (int j = 0; j < NK; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  }
  for (int d = 0; d < D; d += 4) {
    float32x4_t qv[NR];
    MZ_UNROLL for (int r = 0; r < NR; ++r) qv[r] = vld1q_f32(q + r * D + d);
    MZ_UNROLL for (int j = 0; j < NK; ++j) {
      const float32x4_t kj = vld1q_f32(k + j * D + d);
      MZ_UNROLL for (int r = 0; r < NR; ++r) acc[r][j] = vfmaq_f32(acc[r][j], qv[r], kj);
    }
  }
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    if constexpr (NK == 4) {
      vst1q_f32(s + r * kTile, hsum4_neon(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
    } else {
      MZ_UNROLL for (int j = 0; j < NK; ++j) s[r * kTile + j] = vaddvq_f32(acc[r][j]);
    }
  }
}

constexpr int kQkRowsNeon = 4, kQkKeysNeon = 4;

// Scores for all R rows against the n keys of the tile: s[r][j], r < R, j < n.
// pf advances once per block call.
void qk_tile_neon(const float* q, int R, const float* k, int n, int D, float* s, Prefetcher& pf) {
  using Fn = void (*)(const float*, const float*, int, float*);
  static const Fn tbl[kQkRowsNeon][kQkKeysNeon] = {
      {qk_block_neon<1, 1>, qk_block_neon<1, 2>, qk_block_neon<1, 3>, qk_block_neon<1, 4>},
      {qk_block_neon<2, 1>, qk_block_neon<2, 2>, qk_block_neon<2, 3>, qk_block_neon<2, 4>},
      {qk_block_neon<3, 1>, qk_block_neon<3, 2>, qk_block_neon<3, 3>, qk_block_neon<3, 4>},
      {qk_block_neon<4, 1>, qk_block_neon<4, 2>, qk_block_neon<4, 3>, qk_block_neon<4, 4>},
  };
  qk_tile_blocks(tbl, q, R, k, n, D, s, pf);
}

// acc[r][0..4*NV) = acc*alpha[r] + sum_{t<n} p[r][t] * v[t][0..4*NV), r < NR. 16 acc + 4 v + 4 p = 24 regs.
// acc and v point at the same column block; their row strides are D.
template <int NR, int NV>
void pv_block_neon(const float* p, const float* alpha, const float* v, int n, int D, float* acc) {
  float32x4_t a[NR][NV];
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    MZ_UNROLL for (int c = 0; c < NV; ++c) a[r][c] = vmulq_n_f32(vld1q_f32(acc + r * D + 4 * c), alpha[r]);
  }
  for (int t = 0; t < n; ++t) {
    float32x4_t vv[NV];
    MZ_UNROLL for (int c = 0; c < NV; ++c) vv[c] = vld1q_f32(v + static_cast<size_t>(t) * D + 4 * c);
    MZ_UNROLL for (int r = 0; r < NR; ++r) {
      const float pr = p[r * kTile + t];
      MZ_UNROLL for (int c = 0; c < NV; ++c) a[r][c] = vfmaq_n_f32(a[r][c], vv[c], pr);
    }
  }
  MZ_UNROLL for (int r = 0; r < NR; ++r) {
    MZ_UNROLL for (int c = 0; c < NV; ++c) vst1q_f32(acc + r * D + 4 * c, a[r][c]);
  }
}

constexpr int kPvRowsNeon = 4, kPvVecsNeon = 4;

// pf advances once per block call.
void pv_tile_neon(const float* p, const float* alpha, const float* v, int n, int R, int D, float* acc,
                  Prefetcher& pf) {
  using Fn = void (*)(const float*, const float*, const float*, int, int, float*);
  static const Fn tbl[kPvRowsNeon][kPvVecsNeon] = {
      {pv_block_neon<1, 1>, pv_block_neon<1, 2>, pv_block_neon<1, 3>, pv_block_neon<1, 4>},
      {pv_block_neon<2, 1>, pv_block_neon<2, 2>, pv_block_neon<2, 3>, pv_block_neon<2, 4>},
      {pv_block_neon<3, 1>, pv_block_neon<3, 2>, pv_block_neon<3, 3>, pv_block_neon<3, 4>},
      {pv_block_neon<4, 1>, pv_block_neon<4, 2>, pv_block_neon<4, 3>, pv_block_neon<4, 4>},
  };
  pv_tile_blocks<4>(tbl, p, alpha, v, n, R, D, acc, pf);
}

// The NEON steps of simd_item (attention_impl.h).
struct Neon {
  static constexpr int kW = 4;
  static constexpr int kQkRows = kQkRowsNeon, kQkKeys = kQkKeysNeon;
  static constexpr int kPvRows = kPvRowsNeon, kPvVecs = kPvVecsNeon;
  static void load_row(const float* src, float qs, int D, float* q, float* acc) {
    for (int d = 0; d < D; d += 4) {
      vst1q_f32(q + d, vmulq_n_f32(vld1q_f32(src + d), qs));
      vst1q_f32(acc + d, vdupq_n_f32(0.0f));
    }
  }
  static void to_f32(const int8_t* codes, const uint8_t* amax, const uint16_t* half, int n, int D, float* dst) {
    if (codes) q8_dequantize_rows_f32(codes, amax, n, D, dst);
    else cvt_tile_neon(half, static_cast<size_t>(n) * D, dst);
  }
  static void qk_tile(const float* q, int R, const float* k, int n, int D, float* s, Prefetcher& pf) {
    qk_tile_neon(q, R, k, n, D, s, pf);
  }
  static void pv_tile(const float* p, const float* alpha, const float* v, int n, int R, int D, float* acc,
                      Prefetcher& pf) {
    pv_tile_neon(p, alpha, v, n, R, D, acc, pf);
  }
  static void zero(float* s, int nw) {
    for (int j = 0; j < nw; j += 4) vst1q_f32(s + j, vdupq_n_f32(0.0f));
  }
  static float exp_row(float* s, int nw, float m_old, float* m_new) {
    float32x4_t vmx = vld1q_f32(s);
    for (int j = 4; j < nw; j += 4) vmx = vmaxq_f32(vmx, vld1q_f32(s + j));
    *m_new = std::max(m_old, vmaxvq_f32(vmx));
    const float32x4_t mv = vdupq_n_f32(*m_new);
    float32x4_t vsum = vdupq_n_f32(0.0f);
    for (int j = 0; j < nw; j += 4) {
      const float32x4_t pj = exp2_f32x4(vsubq_f32(vld1q_f32(s + j), mv));
      vst1q_f32(s + j, pj);
      vsum = vaddq_f32(vsum, pj);
    }
    return vaddvq_f32(vsum);
  }
  static void store_row(const float* acc, float inv, int D, float* dst) {
    for (int d = 0; d < D; d += 4) vst1q_f32(dst + d, vmulq_n_f32(vld1q_f32(acc + d), inv));
  }
};

}  // namespace

void attention_chunked_neon(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  run_items(a, kv, ith, nth, simd_item<Neon>);
}

}  // namespace mz::attn

#endif  // MZ_ATTN_NEON
