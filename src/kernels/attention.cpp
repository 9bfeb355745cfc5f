// Chunked-KV attention: the dispatch, the portable scalar path and the reference. See attention.h for
// the contract and kernels/attention_impl.h for the algorithm shared by every path; the SIMD paths
// are in kernels/attention_avx2.cpp (x86) and kernels/attention_neon.cpp (AArch64).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_impl.h"

namespace mz {
namespace attn {
namespace {

// ---------------------------------------------------------------------------------------------
// Scalar path. Written so compilers can auto-vectorize it (GCC >= 12 does at -O2, NEON on aarch64):
// eight independent partial sums in the dot product, plain saxpy loops for P*V.

inline void cvt_tile_portable(const uint16_t* src, size_t count, float* dst) {
#if defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
  for (size_t i = 0; i < count; ++i) {  // native half type on AArch64: vectorizes to fcvtl
    __fp16 h;
    std::memcpy(&h, src + i, sizeof(h));
    dst[i] = static_cast<float>(h);
  }
#else
  for (size_t i = 0; i < count; ++i) dst[i] = fp16_to_fp32(src[i]);
#endif
}

#if defined(__GNUC__) || defined(__clang__)
#define MZ_RESTRICT __restrict__
#else
#define MZ_RESTRICT
#endif

// y[0..D) += a * x[0..D), D % 8 == 0. The fixed 8-wide body lets the SLP vectorizer work even when
// the loop vectorizer's cost model (GCC -O2) refuses a runtime trip count.
inline void axpy_portable(float a, const float* MZ_RESTRICT x, float* MZ_RESTRICT y, int D) {
  for (int d = 0; d < D; d += 8) {
    for (int i = 0; i < 8; ++i) y[d + i] += a * x[d + i];
  }
}

inline float dot_portable(const float* MZ_RESTRICT a, const float* MZ_RESTRICT b, int D) {  // D % 8 == 0
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int d = 0; d < D; d += 8) {
    for (int i = 0; i < 8; ++i) part[i] += a[d + i] * b[d + i];
  }
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

void item_scalar(const AttnArgs& a, const KvLayerView& kv, const Item& it, const Scratch& sc) {
  const int D = kv.head_dim, R = it.rows();
  for (int r = 0; r < R; ++r) {
    const float* src = a.q + q_offset(a, D, it, r);
    for (int d = 0; d < D; ++d) sc.q[r * D + d] = src[d] * a.scale;
    std::fill(sc.acc + r * D, sc.acc + (r + 1) * D, 0.0f);
    sc.m[r] = kNegInf;
    sc.l[r] = 0.0f;
  }
  const int kend = a.pos0 + it.t0 + it.tn;  // keys [0, kend) are visible to at least one row
  for_each_tile(kv, it.kvh, kend, [&](const Tile& t, const Tile&) {
    const int k0 = t.k0, n = t.n;
    if (t.kq) q8_dequantize_rows_f32(t.kq, t.ka, n, D, sc.kv);
    else cvt_tile_portable(t.k, static_cast<size_t>(n) * D, sc.kv);
    for (int r = 0; r < R; ++r) {
      float* s = sc.s + r * kTile;
      const int lim = std::max(0, std::min(n, a.pos0 + it.t0 + r / it.gn - k0 + 1));  // causal
      float mx = kNegInf;
      for (int j = 0; j < lim; ++j) {
        s[j] = dot_portable(sc.q + r * D, sc.kv + j * D, D);
        mx = std::max(mx, s[j]);
      }
      const float m_new = std::max(sc.m[r], mx);
      if (lim == 0 || m_new == kNegInf) {
        sc.alpha[r] = 1.0f;
        std::fill(s, s + n, 0.0f);
        continue;
      }
      sc.alpha[r] = std::exp(sc.m[r] - m_new);
      float sum = 0.0f;
      for (int j = 0; j < lim; ++j) {
        s[j] = std::exp(s[j] - m_new);
        sum += s[j];
      }
      for (int j = lim; j < n; ++j) s[j] = 0.0f;
      sc.m[r] = m_new;
      sc.l[r] = sc.l[r] * sc.alpha[r] + sum;
    }
    if (t.vq) q8_dequantize_rows_f32(t.vq, t.va, n, D, sc.kv);
    else cvt_tile_portable(t.v, static_cast<size_t>(n) * D, sc.kv);
    for (int r = 0; r < R; ++r) {
      float* MZ_RESTRICT acc = sc.acc + r * D;
      const float al = sc.alpha[r];
      if (al != 1.0f) {
        for (int d = 0; d < D; ++d) acc[d] *= al;
      }
      const float* p = sc.s + r * kTile;
      for (int j = 0; j < n; ++j) {
        const float pj = p[j];
        if (pj == 0.0f) continue;
        axpy_portable(pj, sc.kv + j * D, acc, D);
      }
    }
  });
  for (int r = 0; r < R; ++r) {
    float* dst = a.out + q_offset(a, D, it, r);
    const float inv = 1.0f / sc.l[r];
    for (int d = 0; d < D; ++d) dst[d] = sc.acc[r * D + d] * inv;
  }
}


}  // namespace
}  // namespace attn

void attention_chunked_scalar(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  attn::run_items(a, kv, ith, nth, attn::item_scalar);
}

void attention_chunked(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
#if MZ_ATTN_AVX2
  attn::attention_chunked_avx2(a, kv, ith, nth);
#elif MZ_ATTN_NEON
  attn::attention_chunked_neon(a, kv, ith, nth);
#else
  attention_chunked_scalar(a, kv, ith, nth);
#endif
}

bool attention_chunked_has_simd() {
#if MZ_ATTN_AVX2 || MZ_ATTN_NEON
  return true;
#else
  return false;
#endif
}

float q8_element(const uint8_t* segment, int rows, int head_dim, int t, int d) {
  float out;
  q8_dequantize_rows_f32(q8_row_codes(segment, rows, head_dim, t) + d, q8_row_amax(segment, t), 1, 1, &out);
  return out;
}

void attention_reference(const AttnArgs& a, const KvLayerView& kv) {
  const int D = kv.head_dim, group = a.n_head / kv.n_kv_head, CT = kv.chunk_tokens;
  const int n_keys = a.pos0 + a.n_tokens;
  std::vector<float> kf(static_cast<size_t>(n_keys) * D), vf(kf.size());
  std::vector<double> sc(n_keys), acc(D);
  for (int kvh = 0; kvh < kv.n_kv_head; ++kvh) {
    for (int t = 0; t < n_keys; ++t) {
      const size_t off = (static_cast<size_t>(kvh) * CT + t % CT) * D;
      const uint8_t* q = kv.q8_chunks ? kv.q8_chunks[t / CT] : nullptr;
      for (int d = 0; d < D; ++d) {
        if (q) {
          const int rows = kv.q8_rows[t / CT];
          kf[static_cast<size_t>(t) * D + d] = q8_element(q8_segment(q, rows, D, kvh), rows, D, t % CT, d);
          vf[static_cast<size_t>(t) * D + d] =
              q8_element(q8_segment(q, rows, D, kv.n_kv_head + kvh), rows, D, t % CT, d);
        } else {
          kf[static_cast<size_t>(t) * D + d] = fp16_to_fp32(kv.k_chunks[t / CT][off + d]);
          vf[static_cast<size_t>(t) * D + d] = fp16_to_fp32(kv.v_chunks[t / CT][off + d]);
        }
      }
    }
    for (int i = 0; i < a.n_tokens; ++i) {
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* q = a.q + (static_cast<size_t>(i) * a.n_head + h) * D;
        const int nk = a.pos0 + i + 1;
        double mx = -std::numeric_limits<double>::infinity();
        for (int t = 0; t < nk; ++t) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * kf[static_cast<size_t>(t) * D + d];
          sc[t] = dot * a.scale;
          mx = std::max(mx, sc[t]);
        }
        double sum = 0.0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int t = 0; t < nk; ++t) {
          const double p = std::exp(sc[t] - mx);
          sum += p;
          for (int d = 0; d < D; ++d) acc[d] += p * vf[static_cast<size_t>(t) * D + d];
        }
        float* out = a.out + (static_cast<size_t>(i) * a.n_head + h) * D;
        for (int d = 0; d < D; ++d) out[d] = static_cast<float>(acc[d] / sum);
      }
    }
  }
}

}  // namespace mz
