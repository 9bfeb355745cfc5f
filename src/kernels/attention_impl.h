// Internals shared by the attention kernel's per-ISA files (kernels/attention.cpp: dispatch, scalar
// path and reference; attention_avx2.cpp; attention_neon.cpp). Not an API: only those files include it.
//
// Algorithm (all paths: scalar, AVX2, NEON): the work is cut into items = (kv head, sub-group of the
// q heads sharing it, block of query tokens); an item owns R <= kMaxRows query rows. For one item,
// the keys [0, kend) are streamed once in tiles of <= kTile tokens that never straddle a chunk: the
// K tile is converted fp16->f32 into scratch, scores S[R][n] are computed for all rows, the online
// softmax state (m, l) and accumulators acc[R][head_dim] are updated (acc rescaled by
// exp(m_old - m_new)), then the V tile is converted into the same scratch and P*V is accumulated.
// Only keys < pos0 + n_tokens <= n_kv are ever read, so garbage past n_kv in the last chunk is never
// touched. The partition (Plan, Item, item_owner) is shared, so every path splits work identically.
//
// Every file of the kernel is compiled with the same flags (MZ_ARCH applies to all of src), so the
// ISA chosen below is the same in each of them.
#pragma once
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/fp16.h"
#include "kernels/q8_block.h"

// The SIMD path attention_chunked runs: AVX2+FMA+F16C (kernels/attention_avx2.cpp), NEON on AArch64
// (kernels/attention_neon.cpp; baseline ARMv8-A: fcvtl, fmla, fcvtns need no extension flag), or
// neither (the scalar path in kernels/attention.cpp).
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define MZ_ATTN_AVX2 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define MZ_ATTN_NEON 1
#endif

namespace mz::attn {

inline constexpr int kMaxRows = 32;  // query rows per work item (bounds scratch and keeps acc in L1/L2)
inline constexpr int kTile = 32;     // keys per tile; multiple of 8 (32 measured best for D=128, 8-token decode)
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

inline Plan make_plan(const AttnArgs& a, const KvLayerView& kv, int nth) {
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
inline Item make_item(const Plan& p, const AttnArgs& a, const KvLayerView& kv, int j) {
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

inline Scratch get_scratch(int D) {
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

inline void check_args(const AttnArgs& a, const KvLayerView& kv, int ith, int nth) {
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
    tl.ka = q8_row_amax(ks, t);
    tl.va = q8_row_amax(vs, t);
    tl.kq = q8_row_codes(ks, rows, D, t);
    tl.vq = q8_row_codes(vs, rows, D, t);
    return tl;
  }
  const size_t off = (static_cast<size_t>(kvh) * CT + (k0 - cbeg)) * D;
  return Tile{k0, n, kv.k_chunks[c] + off, kv.v_chunks[c] + off};
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
// Helpers of the SIMD paths (AVX2 and NEON).

#if defined(__GNUC__)
#define MZ_UNROLL _Pragma("GCC unroll 16")
#else
#define MZ_UNROLL
#endif

// Hint: bring the cache line at p into L2 (x86 PREFETCHT1, AArch64 PRFM PLDL2KEEP).
inline void prefetch_l2(const char* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 2);  // locality 2: PREFETCHT1 on x86 (what _mm_prefetch(p, _MM_HINT_T1) emits)
#else
  (void)p;
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

// Number of register blocks of at most `max` that cover `n` items (the Prefetcher's step count).
inline int blocks_of(int n, int max) { return (n + max - 1) / max; }

// Scores for all R rows against the n keys of the tile: s[r][j], r < R, j < n. tbl[nr-1][nk-1] is
// the register block for nr rows and nk keys (the ISA's qk_block<nr, nk>). pf advances once per block call.
template <int kRows, int kKeys, class BlockFn>
inline void qk_tile_blocks(const BlockFn (&tbl)[kRows][kKeys], const float* q, int R, const float* k, int n, int D,
                           float* s, Prefetcher& pf) {
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kRows);
    for (int j0 = 0; j0 < n; j0 += kKeys) {
      const int nk = std::min(kKeys, n - j0);
      tbl[nr - 1][nk - 1](q + static_cast<size_t>(r0) * D, k + static_cast<size_t>(j0) * D, D, s + r0 * kTile + j0);
      pf.step();
    }
  }
}

// acc[r][0..D) = acc*alpha[r] + sum_{t<n} p[r][t] * v[t][0..D) for r < R, in register blocks of
// tbl[nr-1][nv-1] (the ISA's pv_block<nr, nv>, nv vectors of kW floats). D % kW == 0. pf advances
// once per block call.
template <int kW, int kRows, int kVecs, class BlockFn>
inline void pv_tile_blocks(const BlockFn (&tbl)[kRows][kVecs], const float* p, const float* alpha, const float* v,
                           int n, int R, int D, float* acc, Prefetcher& pf) {
  const int nvec = D / kW;
  for (int r0 = 0, nr; r0 < R; r0 += nr) {
    nr = block_len(R - r0, kRows);
    for (int c0 = 0, nv; c0 < nvec; c0 += nv) {
      nv = block_len(nvec - c0, kVecs);
      tbl[nr - 1][nv - 1](p + r0 * kTile, alpha + r0, v + kW * c0, n, D,
                          acc + static_cast<size_t>(r0) * D + kW * c0);
      pf.step();
    }
  }
}

// How many of the tile's n keys (from k0) query row r of the item sees under the causal mask: n when
// the whole tile lies below kall (keys every row sees), else 0..n.
inline int visible_keys(const AttnArgs& a, const Item& it, int r, int k0, int n, int kall) {
  if (k0 + n <= kall) return n;
  return std::max(0, std::min(n, a.pos0 + it.t0 + r / it.gn - k0 + 1));  // causal
}

// Online-softmax step for row r after a tile whose scores were exponentiated against m_new (the new
// running max, finite) and summed to tile_sum: rescale factor alpha, running max and denominator.
inline void update_row_state(const Scratch& sc, int r, float m_new, float tile_sum) {
  const float al = std::exp2(sc.m[r] - m_new);  // 0 on the first tile (m = -inf)
  sc.alpha[r] = al;
  sc.m[r] = m_new;
  sc.l[r] = sc.l[r] * al + tile_sum;
}

// One work item of a SIMD path: pre-scaled queries, then per tile QK, causal mask, online softmax and
// PV, then the normalised output. The ISA supplies the vector steps as static members of Isa:
//   kW (floats per vector), kQkRows/kQkKeys and kPvRows/kPvVecs (register block limits);
//   load_row(src, qs, D, q, acc): q[0..D) = src * qs, acc[0..D) = 0;
//   to_f32(codes, amax, half, n, D, dst): n rows of a K or V tile to f32 (q8 when codes, else fp16 half);
//   qk_tile / pv_tile (the register-blocked tiles, same arguments as qk_tile_blocks / pv_tile_blocks);
//   zero(s, nw): s[0..nw) = 0;
//   exp_row(s, nw, m_old, *m_new): m_new = max(m_old, max s[0..nw)); s = 2^(s - m_new); returns sum s;
//   store_row(acc, inv, D, dst): dst[0..D) = acc * inv.
template <class Isa>
void simd_item(const AttnArgs& a, const KvLayerView& kv, const Item& it, const Scratch& sc) {
  constexpr int W = Isa::kW;
  const int D = kv.head_dim, R = it.rows();
  const float qs = a.scale * kLog2e;  // scores in log2 units -> exp2
  for (int r = 0; r < R; ++r) {
    Isa::load_row(a.q + q_offset(a, D, it, r), qs, D, sc.q + r * D, sc.acc + r * D);
    sc.m[r] = kNegInf;
    sc.l[r] = 0.0f;
  }
  const int kend = a.pos0 + it.t0 + it.tn;  // keys [0, kend) are visible to at least one row
  const int kall = a.pos0 + it.t0 + 1;      // keys [0, kall) are visible to every row
  for_each_tile(kv, it.kvh, kend, [&](const Tile& t, const Tile& next) {
    const int k0 = t.k0, n = t.n;
    // The next tile's K streams in during this tile's QK, its V during this tile's PV.
    const size_t next_bytes = next.bytes(D);
    Prefetcher pf_k(next.k_bytes(), next_bytes, blocks_of(R, Isa::kQkRows) * blocks_of(n, Isa::kQkKeys));
    Prefetcher pf_v(next.v_bytes(), next_bytes, blocks_of(R, Isa::kPvRows) * blocks_of(D / W, Isa::kPvVecs));
    Isa::to_f32(t.kq, t.ka, t.k, n, D, sc.kv);
    Isa::qk_tile(sc.q, R, sc.kv, n, D, sc.s, pf_k);
    const int nw = (n + W - 1) & ~(W - 1);
    for (int r = 0; r < R; ++r) {
      float* s = sc.s + r * kTile;
      const int lim = visible_keys(a, it, r, k0, n, kall);
      if (lim == 0) {  // nothing visible in this tile: P = 0, state unchanged
        sc.alpha[r] = 1.0f;
        Isa::zero(s, nw);
        continue;
      }
      for (int j = lim; j < nw; ++j) s[j] = kNegInf;
      float m_new;
      const float sum = Isa::exp_row(s, nw, sc.m[r], &m_new);  // m_new finite: s[0] is visible
      update_row_state(sc, r, m_new, sum);
    }
    Isa::to_f32(t.vq, t.va, t.v, n, D, sc.kv);
    Isa::pv_tile(sc.s, sc.alpha, sc.kv, n, R, D, sc.acc, pf_v);
  });
  for (int r = 0; r < R; ++r) Isa::store_row(sc.acc + r * D, 1.0f / sc.l[r], D, a.out + q_offset(a, D, it, r));
}

// ---------------------------------------------------------------------------------------------
// Driver (shared by all paths).

// Runs item_fn(a, kv, item, scratch) for every work item thread ith of nth owns (see attention.h).
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

// The per-ISA entry points, same contract as attention_chunked (attention.h). Each is defined only
// in builds where its macro above is set (kernels/attention_avx2.cpp, kernels/attention_neon.cpp).
void attention_chunked_avx2(const AttnArgs& a, const KvLayerView& kv, int ith, int nth);
void attention_chunked_neon(const AttnArgs& a, const KvLayerView& kv, int ith, int nth);

}  // namespace mz::attn
