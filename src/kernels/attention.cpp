// Chunked-KV attention kernels. See attention.h for the contract.
//
// Algorithm (all paths: scalar, AVX2, NEON): the work is cut into items = (kv head, sub-group of the
// q heads sharing it, block of query tokens); an item owns R <= kMaxRows query rows. For one item,
// the keys [0, kend) are streamed once in tiles of <= kTile tokens that never straddle a chunk: the
// K tile is converted fp16->f32 into scratch, scores S[R][n] are computed for all rows, the online
// softmax state (m, l) and accumulators acc[R][head_dim] are updated (acc rescaled by
// exp(m_old - m_new)), then the V tile is converted into the same scratch and P*V is accumulated.
// Only keys < pos0 + n_tokens <= n_kv are ever read, so garbage past n_kv in the last chunk is never
// touched.
#include "kernels/attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define MZ_ATTN_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define MZ_ATTN_NEON 1  // baseline ARMv8-A: fcvtl (fp16->f32), fmla, fcvtns need no extension flag
#include <arm_neon.h>
#endif

namespace mz {
namespace {

constexpr int kMaxRows = 32;  // query rows per work item (bounds scratch and keeps acc in L1/L2)
constexpr int kTile = 32;     // keys per tile; multiple of 8 (32 measured best for D=128, 8-token decode)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------------
// Work partition (shared by all paths, so scalar and SIMD split identically).

struct Plan {
  int group;   // q heads per kv head
  int gb;      // q heads per item (sub-group size)
  int n_gblk;  // sub-groups per kv head
  int tb;      // query tokens per item
  int n_tblk;  // token blocks
  int n_items;
};

Plan make_plan(const AttnArgs& a, const KvLayerView& kv, int nth) {
  Plan p;
  p.group = a.n_head / kv.n_kv_head;
  p.gb = std::min(p.group, kMaxRows);
  p.tb = std::min(a.n_tokens, std::max(1, kMaxRows / p.gb));
  auto count = [&] {
    p.n_gblk = (p.group + p.gb - 1) / p.gb;
    p.n_tblk = (a.n_tokens + p.tb - 1) / p.tb;
    p.n_items = kv.n_kv_head * p.n_gblk * p.n_tblk;
  };
  count();
  // Fewer items than threads: shrink items (each extra item re-reads its K/V) so no thread idles.
  while (p.n_items < nth && (p.tb > 1 || p.gb > 1)) {
    if (p.tb > 1) {
      p.tb = (p.tb + 1) / 2;
    } else {
      p.gb = (p.gb + 1) / 2;
    }
    count();
  }
  return p;
}

// Items are numbered token-block-major, so cost (number of visible keys) is non-decreasing in j.
// Dealing them in snake order (0,1,..,nth-1,nth-1,..,1,0,0,1,..) balances causal prefill.
inline int item_owner(int j, int nth) {
  const int round = j / nth, pos = j % nth;
  return (round & 1) ? nth - 1 - pos : pos;
}

struct Item {
  int kvh;     // kv head
  int h0;      // first q head (absolute)
  int gn;      // q heads in the item
  int t0;      // first query token
  int tn;      // query tokens in the item
  int rows() const { return gn * tn; }
};

// Row r of an item is query token t0 + r / gn, q head h0 + r % gn.
Item make_item(const Plan& p, const AttnArgs& a, const KvLayerView& kv, int j) {
  const int per_tblk = kv.n_kv_head * p.n_gblk;
  const int tblk = j / per_tblk, rem = j % per_tblk;
  Item it;
  it.kvh = rem / p.n_gblk;
  const int g0 = (rem % p.n_gblk) * p.gb;
  it.h0 = it.kvh * p.group + g0;
  it.gn = std::min(p.gb, p.group - g0);
  it.t0 = tblk * p.tb;
  it.tn = std::min(p.tb, a.n_tokens - it.t0);
  return it;
}

inline size_t q_offset(const AttnArgs& a, int D, const Item& it, int r) {
  return (static_cast<size_t>(it.t0 + r / it.gn) * a.n_head + it.h0 + r % it.gn) * D;
}

// Per-thread scratch, 64-byte aligned sub-buffers. Sized for kMaxRows rows and the given head_dim.
struct Scratch {
  float* q;      // [kMaxRows][D] pre-scaled queries
  float* acc;    // [kMaxRows][D] unnormalized outputs
  float* s;      // [kMaxRows][kTile] scores, then probabilities
  float* kv;     // [kTile][D] current K or V tile in f32
  float* m;      // [kMaxRows] running max
  float* l;      // [kMaxRows] running sum
  float* alpha;  // [kMaxRows] rescale factor of the current tile
};

Scratch get_scratch(int D) {
  thread_local std::vector<float> buf;
  const size_t rd = static_cast<size_t>(kMaxRows) * D, td = static_cast<size_t>(kTile) * D;
  const size_t need = 2 * rd + static_cast<size_t>(kMaxRows) * kTile + td + 3 * kMaxRows + 16;
  if (buf.size() < need) buf.resize(need);
  float* p = buf.data();
  p += (16 - (reinterpret_cast<uintptr_t>(p) / sizeof(float)) % 16) % 16;
  Scratch sc;
  sc.q = p;
  sc.acc = sc.q + rd;
  sc.s = sc.acc + rd;
  sc.kv = sc.s + static_cast<size_t>(kMaxRows) * kTile;
  sc.m = sc.kv + td;
  sc.l = sc.m + kMaxRows;
  sc.alpha = sc.l + kMaxRows;
  return sc;
}

void check_args(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  (void)a, (void)kv, (void)ith, (void)nth;
  assert(nth >= 1 && ith >= 0 && ith < nth);
  assert(a.n_tokens >= 1 && a.pos0 >= 0 && a.pos0 + a.n_tokens <= kv.n_kv);
  assert(kv.n_kv <= kv.n_chunks * kv.chunk_tokens);
  assert(kv.head_dim > 0 && kv.head_dim % 8 == 0);
  assert(kv.n_kv_head > 0 && a.n_head % kv.n_kv_head == 0);
  assert(a.q != a.out);
}

// Keys [k0, k0 + n) of one kv head, all inside one chunk; k / v point at token k0's K / V row. For
// a q8 chunk, k / v are null and kq / vq point at token k0's int8 codes, ka / va at its fp16 row max.
struct Tile {
  int k0;
  int n;
  const uint16_t* k;
  const uint16_t* v;
  const int8_t* kq = nullptr;
  const int8_t* vq = nullptr;
  const uint8_t* ka = nullptr;
  const uint8_t* va = nullptr;
  // Start and size of the K / V bytes this tile reads (for prefetching).
  const void* k_bytes() const { return kq ? static_cast<const void*>(kq) : static_cast<const void*>(k); }
  const void* v_bytes() const { return vq ? static_cast<const void*>(vq) : static_cast<const void*>(v); }
  size_t bytes(int D) const { return static_cast<size_t>(n) * D * (kq ? 1 : sizeof(uint16_t)); }
};

// One q8 segment (K or V of kv head h) of a chunk with `rows` encoded rows: amax[rows] fp16, then
// codes[rows][D] int8 (store/codec_q8.cpp).
inline const uint8_t* q8_segment(const uint8_t* payload, int rows, int D, int seg) {
  return payload + static_cast<size_t>(seg) * rows * (2 + D);
}

// The tile starting at key k0 < kend: at most kTile keys, never past kend or the end of k0's chunk.
inline Tile tile_at(const KvLayerView& kv, int kvh, int kend, int k0) {
  const int CT = kv.chunk_tokens, c = k0 / CT, cbeg = c * CT, D = kv.head_dim;
  const int n = std::min({kTile, cbeg + CT - k0, kend - k0});
  const uint8_t* q = kv.q8_chunks ? kv.q8_chunks[c] : nullptr;
  if (q) {
    const int rows = kv.q8_rows[c], t = k0 - cbeg;
    assert(t + n <= rows);
    const uint8_t* ks = q8_segment(q, rows, D, kvh);
    const uint8_t* vs = q8_segment(q, rows, D, kv.n_kv_head + kvh);
    Tile tl{k0, n, nullptr, nullptr};
    tl.ka = ks + 2 * static_cast<size_t>(t);
    tl.va = vs + 2 * static_cast<size_t>(t);
    tl.kq = reinterpret_cast<const int8_t*>(ks + 2 * static_cast<size_t>(rows)) + static_cast<size_t>(t) * D;
    tl.vq = reinterpret_cast<const int8_t*>(vs + 2 * static_cast<size_t>(rows)) + static_cast<size_t>(t) * D;
    return tl;
  }
  const size_t off = (static_cast<size_t>(kvh) * CT + (k0 - cbeg)) * D;
  return Tile{k0, n, kv.k_chunks[c] + off, kv.v_chunks[c] + off};
}

// The q8 codec's step for a row whose max is the fp16 `amax_le` (little-endian bytes): amax / 127
// computed as amax * fl(1/127), exactly as Q8Step in store/codecs_internal.h.
inline float q8_step(const uint8_t* amax_le) {
  const uint16_t h = static_cast<uint16_t>(amax_le[0] | (amax_le[1] << 8));
  return fp16_to_fp32(h) * (1.0f / 127.0f);
}

// q8 rows -> f32 as the codec decodes them (fp16(code * step), code clamped to [-127, 127]), then
// fp16 -> f32: n rows of D values. Portable; the same IEEE operations as the SIMD twin.
inline void cvt_tile_q8_portable(const int8_t* codes, const uint8_t* amax, int n, int D, float* dst) {
  for (int r = 0; r < n; ++r) {
    const float step = q8_step(amax + 2 * r);
    for (int d = 0; d < D; ++d) {
      const int c = std::max<int>(codes[static_cast<size_t>(r) * D + d], -127);
      dst[static_cast<size_t>(r) * D + d] = fp16_to_fp32(fp32_to_fp16(static_cast<float>(c) * step));
    }
  }
}

// Calls fn(tile, next) for the tiles covering keys [0, kend) of kv head kvh in ascending order;
// next is the following tile (n == 0 after the last), for prefetching.
template <class Fn>
inline void for_each_tile(const KvLayerView& kv, int kvh, int kend, Fn&& fn) {
  Tile t = tile_at(kv, kvh, kend, 0);
  while (t.n > 0) {
    const int k1 = t.k0 + t.n;
    const Tile next = k1 < kend ? tile_at(kv, kvh, kend, k1) : Tile{k1, 0, nullptr, nullptr};
    fn(t, next);
    t = next;
  }
}

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
    if (t.kq) cvt_tile_q8_portable(t.kq, t.ka, n, D, sc.kv);
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
    if (t.vq) cvt_tile_q8_portable(t.vq, t.va, n, D, sc.kv);
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

// ---------------------------------------------------------------------------------------------
// Helpers shared by the SIMD paths (AVX2 and NEON).

#if MZ_ATTN_AVX2 || MZ_ATTN_NEON

#if defined(__GNUC__)
#define MZ_UNROLL _Pragma("GCC unroll 16")
#else
#define MZ_UNROLL
#endif

// Hint: bring the cache line at p into L2 (x86 PREFETCHT1, AArch64 PRFM PLDL2KEEP).
inline void prefetch_l2(const char* p) {
#if MZ_ATTN_AVX2
  _mm_prefetch(p, _MM_HINT_T1);
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// Prefetches [base, base + bytes) into L2 a few cache lines per step() over `steps` calls, so the
// misses overlap with compute instead of queueing up behind the fill buffers in one burst (measured
// on x86: one burst per tile gains nothing; spreading them gains ~25%). L2 rather than L1 so the prefetched
// lines do not evict the f32 tile, queries and accumulators.
class Prefetcher {
 public:
  Prefetcher(const void* base, size_t bytes, int steps)
      : p_(static_cast<const char*>(base)), end_(p_ + (base ? bytes : 0)),
        lines_per_step_(steps > 0 ? (bytes / 64 + steps) / steps : 0) {}
  void step() {
    for (size_t i = 0; i < lines_per_step_ && p_ < end_; ++i, p_ += 64) prefetch_l2(p_);
  }

 private:
  const char* p_;
  const char* end_;
  size_t lines_per_step_;
};

// Length of the next register block when `left` items remain and blocks hold at most `max`: avoids
// ending on a block of 1 (4 independent FMA chains, half speed) by splitting max+1 as two blocks.
inline int block_len(int left, int max) {
  if (left == max + 1 && max > 2) return (left + 1) / 2;
  return std::min(left, max);
}

#endif  // MZ_ATTN_AVX2 || MZ_ATTN_NEON

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C path.

#if MZ_ATTN_AVX2

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

// q8 rows -> f32, bit-identical to cvt_tile_q8_portable (and to the codec's decoder followed by
// cvt_tile): code clamped to -127, one f32 multiply by the row's step, RNE to fp16, back to f32.
inline void cvt_tile_q8(const int8_t* codes, const uint8_t* amax, int n, int D, float* dst) {
  const __m128i m127 = _mm_set1_epi8(-127);
  for (int r = 0; r < n; ++r) {
    const __m256 vs = _mm256_set1_ps(q8_step(amax + 2 * r));
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
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kQkRows);
    for (int j0 = 0; j0 < n; j0 += kQkKeys) {
      const int nk = std::min(kQkKeys, n - j0);
      tbl[nr - 1][nk - 1](q + static_cast<size_t>(r0) * D, k + static_cast<size_t>(j0) * D, D,
                          s + r0 * kTile + j0);
      pf.step();
    }
  }
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
  const int nvec = D / 8;
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kPvRows);
    for (int c0 = 0, nv; c0 < nvec; c0 += nv) {
      nv = block_len(nvec - c0, kPvVecs);
      tbl[nr - 1][nv - 1](p + r0 * kTile, alpha + r0, v + 8 * c0, n, D, acc + static_cast<size_t>(r0) * D + 8 * c0);
      pf.step();
    }
  }
}

void item_avx2(const AttnArgs& a, const KvLayerView& kv, const Item& it, const Scratch& sc) {
  const int D = kv.head_dim, R = it.rows();
  const __m256 qs = _mm256_set1_ps(a.scale * kLog2e);  // scores in log2 units -> exp2
  for (int r = 0; r < R; ++r) {
    const float* src = a.q + q_offset(a, D, it, r);
    for (int d = 0; d < D; d += 8) {
      _mm256_store_ps(sc.q + r * D + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), qs));
      _mm256_store_ps(sc.acc + r * D + d, _mm256_setzero_ps());
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
    Prefetcher pf_k(next.k_bytes(), next_bytes, ((R + kQkRows - 1) / kQkRows) * ((n + kQkKeys - 1) / kQkKeys));
    Prefetcher pf_v(next.v_bytes(), next_bytes, ((R + kPvRows - 1) / kPvRows) * ((D / 8 + kPvVecs - 1) / kPvVecs));
    if (t.kq) cvt_tile_q8(t.kq, t.ka, n, D, sc.kv);
    else cvt_tile(t.k, static_cast<size_t>(n) * D, sc.kv);
    qk_tile(sc.q, R, sc.kv, n, D, sc.s, pf_k);
    const int n8 = (n + 7) & ~7;
    for (int r = 0; r < R; ++r) {
      float* s = sc.s + r * kTile;
      int lim = n;
      if (k0 + n > kall) lim = std::max(0, std::min(n, a.pos0 + it.t0 + r / it.gn - k0 + 1));  // causal
      if (lim == 0) {  // nothing visible in this tile: P = 0, state unchanged
        sc.alpha[r] = 1.0f;
        for (int j = 0; j < n8; j += 8) _mm256_store_ps(s + j, _mm256_setzero_ps());
        continue;
      }
      for (int j = lim; j < n8; ++j) s[j] = kNegInf;
      __m256 vmx = _mm256_load_ps(s);
      for (int j = 8; j < n8; j += 8) vmx = _mm256_max_ps(vmx, _mm256_load_ps(s + j));
      const float m_new = std::max(sc.m[r], hmax(vmx));  // finite: s[0] is visible
      const __m256 mv = _mm256_set1_ps(m_new);
      __m256 vsum = _mm256_setzero_ps();
      for (int j = 0; j < n8; j += 8) {
        const __m256 pj = exp2_ps(_mm256_sub_ps(_mm256_load_ps(s + j), mv));
        _mm256_store_ps(s + j, pj);
        vsum = _mm256_add_ps(vsum, pj);
      }
      const float al = std::exp2(sc.m[r] - m_new);  // 0 on the first tile (m = -inf)
      sc.alpha[r] = al;
      sc.m[r] = m_new;
      sc.l[r] = sc.l[r] * al + hsum(vsum);
    }
    if (t.vq) cvt_tile_q8(t.vq, t.va, n, D, sc.kv);
    else cvt_tile(t.v, static_cast<size_t>(n) * D, sc.kv);
    pv_tile(sc.s, sc.alpha, sc.kv, n, R, D, sc.acc, pf_v);
  });
  for (int r = 0; r < R; ++r) {
    float* dst = a.out + q_offset(a, D, it, r);
    const __m256 inv = _mm256_set1_ps(1.0f / sc.l[r]);
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(sc.acc + r * D + d), inv));
  }
}

#endif  // MZ_ATTN_AVX2

// ---------------------------------------------------------------------------------------------
// NEON path (AArch64). Same algorithm, tiles, scratch layout and prefetching as the AVX2 path, with
// 4-wide f32 vectors. Register blocks are sized for the 32 NEON registers (not tuned on hardware).

#if MZ_ATTN_NEON

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
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kQkRowsNeon);
    for (int j0 = 0; j0 < n; j0 += kQkKeysNeon) {
      const int nk = std::min(kQkKeysNeon, n - j0);
      tbl[nr - 1][nk - 1](q + static_cast<size_t>(r0) * D, k + static_cast<size_t>(j0) * D, D,
                          s + r0 * kTile + j0);
      pf.step();
    }
  }
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
  const int nvec = D / 4;
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kPvRowsNeon);
    for (int c0 = 0, nv; c0 < nvec; c0 += nv) {
      nv = block_len(nvec - c0, kPvVecsNeon);
      tbl[nr - 1][nv - 1](p + r0 * kTile, alpha + r0, v + 4 * c0, n, D, acc + static_cast<size_t>(r0) * D + 4 * c0);
      pf.step();
    }
  }
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
    Prefetcher pf_k(next.k_bytes(), next_bytes,
                    ((R + kQkRowsNeon - 1) / kQkRowsNeon) * ((n + kQkKeysNeon - 1) / kQkKeysNeon));
    Prefetcher pf_v(next.v_bytes(), next_bytes,
                    ((R + kPvRowsNeon - 1) / kPvRowsNeon) * ((D / 4 + kPvVecsNeon - 1) / kPvVecsNeon));
    if (t.kq) cvt_tile_q8_portable(t.kq, t.ka, n, D, sc.kv);
    else cvt_tile_neon(t.k, static_cast<size_t>(n) * D, sc.kv);
    qk_tile_neon(sc.q, R, sc.kv, n, D, sc.s, pf_k);
    const int n4 = (n + 3) & ~3;
    for (int r = 0; r < R; ++r) {
      float* s = sc.s + r * kTile;
      int lim = n;
      if (k0 + n > kall) lim = std::max(0, std::min(n, a.pos0 + it.t0 + r / it.gn - k0 + 1));  // causal
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
      const float al = std::exp2(sc.m[r] - m_new);  // 0 on the first tile (m = -inf)
      sc.alpha[r] = al;
      sc.m[r] = m_new;
      sc.l[r] = sc.l[r] * al + vaddvq_f32(vsum);
    }
    if (t.vq) cvt_tile_q8_portable(t.vq, t.va, n, D, sc.kv);
    else cvt_tile_neon(t.v, static_cast<size_t>(n) * D, sc.kv);
    pv_tile_neon(sc.s, sc.alpha, sc.kv, n, R, D, sc.acc, pf_v);
  });
  for (int r = 0; r < R; ++r) {
    float* dst = a.out + q_offset(a, D, it, r);
    const float inv = 1.0f / sc.l[r];
    for (int d = 0; d < D; d += 4) vst1q_f32(dst + d, vmulq_n_f32(vld1q_f32(sc.acc + r * D + d), inv));
  }
}

#endif  // MZ_ATTN_NEON

template <class ItemFn>
void run_items(const AttnArgs& a, const KvLayerView& kv, int ith, int nth, ItemFn&& item_fn) {
  check_args(a, kv, ith, nth);
  const Plan p = make_plan(a, kv, nth);
  Scratch sc{};
  bool have_scratch = false;
  for (int j = 0; j < p.n_items; ++j) {
    if (item_owner(j, nth) != ith) continue;
    if (!have_scratch) {
      sc = get_scratch(kv.head_dim);
      have_scratch = true;
    }
    item_fn(a, kv, make_item(p, a, kv, j), sc);
  }
}

}  // namespace

void attention_chunked_scalar(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
  run_items(a, kv, ith, nth, item_scalar);
}

void attention_chunked(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
#if MZ_ATTN_AVX2
  run_items(a, kv, ith, nth, item_avx2);
#elif MZ_ATTN_NEON
  run_items(a, kv, ith, nth, item_neon);
#else
  run_items(a, kv, ith, nth, item_scalar);
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
  cvt_tile_q8_portable(reinterpret_cast<const int8_t*>(segment + 2 * static_cast<size_t>(rows)) +
                           static_cast<size_t>(t) * head_dim + d,
                       segment + 2 * static_cast<size_t>(t), 1, 1, &out);
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
