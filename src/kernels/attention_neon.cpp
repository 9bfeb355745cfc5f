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

void item_neon(const AttnArgs& a, const KvLayerView& kv, const Item& it, const Scratch& sc) {
  const int D = kv.head_dim, R = it.rows();
  const float qs = a.scale * kLog2e;  // scores in log2 units -> exp2
  for (int r = 0; r < R; ++r) {
    const float* src = a.q + q_offset(a, D, it, r);
    for (int d = 0; d < D; d += 4) {
      vst1q_f32(sc.q + r * D + d, vmulq_n_f32(vld1q_f32(src + d), qs));
      vst1q_f32(sc.acc + r * D + d, vdupq_n_f32(0.0f));
    }
    sc.m[r] = kNegInf;
    sc.l[r] = 0.0f;
  }
  const int kend = a.pos0 + it.t0 + it.tn;  // keys [0, kend) are visible to at least one row
  const int kall = a.pos0 + it.t0 + 1;      // keys [0, kall) are visible to every row
  for_each_tile(kv, it.kvh, kend, [&](const Tile& t, const Tile& next) {
    const int k0 = t.k0, n = t.n;
    // The next tile's K streams in during this tile's QK, its V during this tile's PV.
    const size_t next_bytes = next.bytes(D);
    Prefetcher pf_k(next.k_bytes(), next_bytes, blocks_of(R, kQkRowsNeon) * blocks_of(n, kQkKeysNeon));
    Prefetcher pf_v(next.v_bytes(), next_bytes, blocks_of(R, kPvRowsNeon) * blocks_of(D / 4, kPvVecsNeon));
    if (t.kq) q8_dequantize_rows_f32(t.kq, t.ka, n, D, sc.kv);
    else cvt_tile_neon(t.k, static_cast<size_t>(n) * D, sc.kv);
    qk_tile_neon(sc.q, R, sc.kv, n, D, sc.s, pf_k);
    const int n4 = (n + 3) & ~3;
    for (int r = 0; r < R; ++r) {
      float* s = sc.s + r * kTile;
      const int lim = visible_keys(a, it, r, k0, n, kall);
      if (lim == 0) {  // nothing visible in this tile: P = 0, state unchanged
        sc.alpha[r] = 1.0f;
        for (int j = 0; j < n4; j += 4) vst1q_f32(s + j, vdupq_n_f32(0.0f));
        continue;
      }
      for (int j = lim; j < n4; ++j) s[j] = kNegInf;
      float32x4_t vmx = vld1q_f32(s);
      for (int j = 4; j < n4; j += 4) vmx = vmaxq_f32(vmx, vld1q_f32(s + j));
      const float m_new = std::max(sc.m[r], vmaxvq_f32(vmx));  // finite: s[0] is visible
      const float32x4_t mv = vdupq_n_f32(m_new);
      float32x4_t vsum = vdupq_n_f32(0.0f);
      for (int j = 0; j < n4; j += 4) {
        const float32x4_t pj = exp2_f32x4(vsubq_f32(vld1q_f32(s + j), mv));
        vst1q_f32(s + j, pj);
        vsum = vaddq_f32(vsum, pj);
      }
      update_row_state(sc, r, m_new, vaddvq_f32(vsum));
    }
    if (t.vq) q8_dequantize_rows_f32(t.vq, t.va, n, D, sc.kv);
    else cvt_tile_neon(t.v, static_cast<size_t>(n) * D, sc.kv);
    pv_tile_neon(sc.s, sc.alpha, sc.kv, n, R, D, sc.acc, pf_v);
  });
  for (int r = 0; r < R; ++r) {
    float* dst = a.out + q_offset(a, D, it, r);
    const float inv = 1.0f / sc.l[r];
    for (int d = 0; d < D; d += 4) vst1q_f32(dst + d, vmulq_n_f32(vld1q_f32(sc.acc + r * D + d), inv));
  }
}

}  // namespace

void attention_chunked_neon(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  run_items(a, kv, ith, nth, item_neon);
}

}  // namespace mz::attn

#endif  // MZ_ATTN_NEON
