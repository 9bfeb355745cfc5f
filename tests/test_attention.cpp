// Tests for kernels/attention: the chunked kernels (SIMD dispatch and scalar) against the naive
// double-precision reference, across chunk boundaries, GQA ratios, head dims, decode and prefill,
// thread splits, garbage in the unused cache tail, and large scores; and the q8 layout
// (kernels/q8_block.h) read in place, which must be the q8 codec's.
#include "kernels/attention.h"
#include "kernels/q8_block.h"

#include <gtest/gtest.h>

#ifndef MZ_ATTENTION_ONLY  // the AArch64 cross build (scripts/test-arm64.sh) links the kernel alone
#include "store/codecs_internal.h"
#include "store/kv_codec.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace mz {
namespace {

constexpr uint16_t kGarbage[] = {0x7e00, 0x7c00, 0xfc00, 0x7fff};  // NaN, +inf, -inf, NaN

// A layer's KV cache in separately allocated chunks (so ASan sees reads past a chunk). Tokens past
// n_kv in the last chunk, for every head, hold NaN/inf bit patterns.
struct TestKv {
  std::vector<std::vector<uint16_t>> k, v;
  std::vector<const uint16_t*> kp, vp;
  KvLayerView view{};
};

// Values are uniform in [-amp, amp], or integers in [-amp, amp] when integral (exact in fp16).
float draw(std::mt19937& rng, float amp, bool integral) {
  if (integral) {
    std::uniform_int_distribution<int> d(-static_cast<int>(amp), static_cast<int>(amp));
    return static_cast<float>(d(rng));
  }
  std::uniform_real_distribution<float> d(-amp, amp);
  return d(rng);
}

void make_kv(TestKv& kv, int n_kv, int chunk_tokens, int n_kv_head, int head_dim, uint32_t seed, float amp,
             bool integral) {
  std::mt19937 rng(seed);
  const int n_chunks = (n_kv + chunk_tokens - 1) / chunk_tokens;
  const size_t chunk_elems = static_cast<size_t>(n_kv_head) * chunk_tokens * head_dim;
  kv.k.assign(n_chunks, std::vector<uint16_t>(chunk_elems));
  kv.v.assign(n_chunks, std::vector<uint16_t>(chunk_elems));
  for (int c = 0; c < n_chunks; ++c) {
    for (int h = 0; h < n_kv_head; ++h) {
      for (int t = 0; t < chunk_tokens; ++t) {
        const bool valid = c * chunk_tokens + t < n_kv;
        for (int d = 0; d < head_dim; ++d) {
          const size_t i = (static_cast<size_t>(h) * chunk_tokens + t) * head_dim + d;
          kv.k[c][i] = valid ? fp32_to_fp16(draw(rng, amp, integral)) : kGarbage[d % 4];
          kv.v[c][i] = valid ? fp32_to_fp16(draw(rng, amp, integral)) : kGarbage[(d + 1) % 4];
        }
      }
    }
  }
  kv.kp.clear();
  kv.vp.clear();
  for (int c = 0; c < n_chunks; ++c) {
    kv.kp.push_back(kv.k[c].data());
    kv.vp.push_back(kv.v[c].data());
  }
  kv.view = KvLayerView{kv.kp.data(), kv.vp.data(), n_chunks, chunk_tokens, n_kv_head, head_dim, n_kv};
}

struct Case {
  int n_kv;
  int chunk_tokens;
  int n_kv_head;
  int group;  // n_head / n_kv_head
  int head_dim;
  int n_tokens;
  int pos0;
  float amp = 1.0f;        // q, k, v magnitude
  float scale = 0.0f;      // 0: 1/sqrt(head_dim)
  bool integral = false;   // integer-valued q, k, v
};

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "n_kv=%d ct=%d kvh=%d group=%d D=%d n_tokens=%d pos0=%d amp=%g scale=%g", c.n_kv,
                c.chunk_tokens, c.n_kv_head, c.group, c.head_dim, c.n_tokens, c.pos0, c.amp, c.scale);
  return buf;
}

using Kernel = void (*)(const AttnArgs&, const KvLayerView&, int, int);

// Max abs difference; NaN/inf anywhere (including rows never written) counts as infinite.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return std::numeric_limits<double>::infinity();
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return m;
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

struct Fixture {
  Case c;
  TestKv kv;
  std::vector<float> q, ref;
  AttnArgs args{};
};

void setup(Fixture& f, const Case& c, uint32_t seed) {
  f.c = c;
  make_kv(f.kv, c.n_kv, c.chunk_tokens, c.n_kv_head, c.head_dim, seed, c.amp, c.integral);
  const int n_head = c.n_kv_head * c.group;
  f.q.resize(static_cast<size_t>(c.n_tokens) * n_head * c.head_dim);
  std::mt19937 rng(seed ^ 0x9e3779b9u);
  for (float& x : f.q) x = draw(rng, c.amp, c.integral);
  f.ref.assign(f.q.size(), 0.0f);
  f.args.q = f.q.data();
  f.args.out = f.ref.data();
  f.args.n_tokens = c.n_tokens;
  f.args.n_head = n_head;
  f.args.pos0 = c.pos0;
  f.args.scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  attention_reference(f.args, f.kv.view);
}

// Runs kernel for every ith of nth sequentially into a NaN-filled output and returns the max diff.
double run_sequential(const Fixture& f, Kernel kernel, int nth) {
  std::vector<float> out(f.q.size(), std::numeric_limits<float>::quiet_NaN());
  AttnArgs a = f.args;
  a.out = out.data();
  for (int ith = 0; ith < nth; ++ith) kernel(a, f.kv.view, ith, nth);
  return max_diff(out, f.ref);
}

// Errors come from f32 dot products/accumulation over <= ~1000 keys (~1e-6 relative) and the
// polynomial exp2 (~2e-7 relative); observed max is ~1.5e-7, so 1e-5 leaves a wide margin while still catching a missing
// rescale, a wrong mask position or a wrong kv head, which all give errors >= 1e-2.
constexpr double kRelTol = 1e-5;

void check_case(const Case& c, uint32_t seed, double rel_tol = kRelTol) {
  SCOPED_TRACE(describe(c));
  Fixture f;
  setup(f, c, seed);
  const double tol = rel_tol * (1.0 + max_abs(f.ref));
  double worst = 0.0;
  for (int nth = 1; nth <= 3; ++nth) {
    const double d_simd = run_sequential(f, attention_chunked, nth);
    const double d_scalar = run_sequential(f, attention_chunked_scalar, nth);
    EXPECT_LE(d_simd, tol) << "attention_chunked nth=" << nth;
    EXPECT_LE(d_scalar, tol) << "attention_chunked_scalar nth=" << nth;
    worst = std::max({worst, d_simd, d_scalar});
  }
  std::printf("  %-90s maxdiff=%.3g (tol %.3g)\n", describe(c).c_str(), worst, tol);
}

TEST(AttentionFp16, RoundTripAndKnownValues) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = fp16_to_fp32(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f)))) << h;
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), bits) << h;
  }
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(1e-8f), 0x0000);              // below half of the smallest subnormal
  EXPECT_EQ(fp32_to_fp16(5.9604644775390625e-8f), 0x0001);
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048.0f), 0x3c00);  // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048.0f), 0x3c02);  // tie -> even
  EXPECT_FLOAT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
#if defined(__F16C__)
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << bits;
  }
#endif
}

TEST(Attention, DecodeAcrossChunkBoundaries) {
  std::printf("simd path compiled in: %s\n", attention_chunked_has_simd() ? "yes" : "no");
  for (int n_kv : {1, 255, 256, 257, 600, 1000}) {
    check_case({n_kv, 256, 2, 2, 128, 1, n_kv - 1}, 100 + n_kv);
  }
  for (int n_kv : {1, 15, 16, 17, 37, 300}) {
    check_case({n_kv, 16, 2, 4, 64, 1, n_kv - 1}, 200 + n_kv);
  }
  check_case({200, 64, 4, 1, 64, 1, 199}, 301);
}

TEST(Attention, MultiTokenQueries) {
  for (int n_tokens : {3, 8, 64}) {
    for (int group : {1, 2, 4}) {
      for (int head_dim : {64, 128}) {
        check_case({1000, 256, 2, group, head_dim, n_tokens, 1000 - n_tokens}, 400 + n_tokens * 10 + group + head_dim);
      }
    }
  }
  check_case({37, 16, 2, 2, 128, 8, 29}, 501);
  check_case({200, 64, 3, 2, 64, 5, 195}, 502);
  check_case({600, 256, 2, 2, 64, 8, 100}, 503);   // cache holds more tokens than the queries may see
  check_case({300, 64, 1, 8, 64, 64, 236}, 504);   // 8 heads x 4 tokens = 32 rows per item
  check_case({100, 16, 1, 48, 64, 3, 97}, 505);    // group > rows per item: heads split across items
  check_case({300, 256, 2, 2, 80, 8, 292}, 506);   // head_dim not a multiple of 32
  check_case({300, 64, 2, 2, 256, 8, 292}, 507);
}

TEST(Attention, CausalPrefill) {
  check_case({1, 256, 2, 2, 128, 1, 0}, 601);
  check_case({77, 16, 2, 4, 64, 77, 0}, 602);
  check_case({300, 64, 2, 2, 128, 300, 0}, 603);
  check_case({300, 256, 1, 1, 64, 300, 0}, 604);
  check_case({520, 256, 2, 4, 128, 520, 0}, 605);
  check_case({1000, 256, 1, 2, 64, 1000, 0}, 606);
  check_case({450, 64, 2, 2, 64, 150, 300}, 607);  // chunked prefill continuing a cached prefix
}

TEST(Attention, LargeScoresStayFinite) {
  // Integer q/k in [-8, 8] with scale 1: scores are exact integers of magnitude up to hundreds, so the
  // softmax is nearly one-hot and every tile shifts the running max by large amounts.
  check_case({1000, 256, 2, 2, 128, 8, 992, 8.0f, 1.0f, true}, 701, 1e-3);
  check_case({300, 64, 2, 2, 64, 300, 0, 8.0f, 1.0f, true}, 702, 1e-3);
  check_case({257, 16, 1, 4, 128, 3, 254, 8.0f, 1.0f, false}, 703, 1e-3);
}

TEST(Attention, RealThreads) {
  const Case cases[] = {
      {1000, 256, 8, 2, 128, 8, 992},
      {300, 64, 2, 2, 64, 300, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Fixture f;
    setup(f, c, 800);
    const double tol = kRelTol * (1.0 + max_abs(f.ref));
    for (Kernel kernel : {static_cast<Kernel>(attention_chunked), static_cast<Kernel>(attention_chunked_scalar)}) {
      for (int nth : {2, 3}) {
        std::vector<float> out(f.q.size(), std::numeric_limits<float>::quiet_NaN());
        AttnArgs a = f.args;
        a.out = out.data();
        std::vector<std::thread> threads;
        for (int ith = 0; ith < nth; ++ith) threads.emplace_back([&, ith] { kernel(a, f.kv.view, ith, nth); });
        for (auto& t : threads) t.join();
        const double d = max_diff(out, f.ref);
        EXPECT_LE(d, tol) << "nth=" << nth;
      }
    }
  }
}

// The dispatching kernel must take the SIMD path whenever the build targets one (AVX2+FMA+F16C on x86,
// NEON on AArch64), and that path must agree with the scalar one (same partition, so the same rows,
// and values within the reference tolerance).
TEST(Attention, SimdPathMatchesScalar) {
#if (defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)) || (defined(__aarch64__) && defined(__ARM_NEON))
  EXPECT_TRUE(attention_chunked_has_simd());
#endif
  struct TolCase {
    Case c;
    double rel_tol;
  };
  const TolCase cases[] = {
      {{1000, 256, 8, 2, 128, 8, 992}, kRelTol},
      {{37, 16, 2, 4, 64, 1, 36}, kRelTol},
      {{300, 64, 2, 2, 80, 300, 0}, kRelTol},
      {{100, 16, 1, 48, 64, 3, 97}, kRelTol},
      {{1000, 256, 2, 2, 128, 8, 992, 8.0f, 1.0f, true}, 1e-3},  // same tolerance as LargeScoresStayFinite
  };
  for (const auto& [c, rel_tol] : cases) {
    SCOPED_TRACE(describe(c));
    Fixture f;
    setup(f, c, 1000);
    const double tol = rel_tol * (1.0 + max_abs(f.ref));
    for (int nth : {1, 2, 3}) {
      std::vector<float> simd(f.q.size(), std::numeric_limits<float>::quiet_NaN()), scalar(simd);
      AttnArgs a = f.args;
      for (int ith = 0; ith < nth; ++ith) {
        a.out = simd.data();
        attention_chunked(a, f.kv.view, ith, nth);
        a.out = scalar.data();
        attention_chunked_scalar(a, f.kv.view, ith, nth);
        // After each thread's share, both outputs have the same rows written (NaN elsewhere).
        for (size_t i = 0; i < simd.size(); ++i) {
          ASSERT_EQ(std::isnan(simd[i]), std::isnan(scalar[i])) << "element " << i << " ith=" << ith << " nth=" << nth;
        }
      }
      EXPECT_LE(max_diff(simd, scalar), tol) << "nth=" << nth;
    }
  }
}

#ifndef MZ_ATTENTION_ONLY
// Chunks held compressed by the q8 codec and read in place (KvLayerView::q8_chunks) give the same
// output, bit for bit, as decoding them into fp16 chunks first, on every path and thread split;
// the reference reading the q8 view agrees with the reference over the decoded chunks.
TEST(Attention, Q8ChunksReadInPlaceEqualDecodedChunks) {
  const auto codec = MakeKvCodec("q8");
  ASSERT_TRUE(codec);
  const Case cases[] = {
      {1000, 256, 8, 2, 128, 8, 992},   // Qwen3-0.6B-like decode over 4 chunks, last one partial
      {300, 64, 2, 2, 64, 300, 0},      // causal prefill across chunks
      {37, 16, 2, 4, 64, 1, 36},        // small chunks, last partial
      {1000, 256, 2, 2, 128, 8, 992, 8.0f, 0.0f, false},  // larger magnitudes
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Fixture f;
    setup(f, c, 77);
    const int n_chunks = f.kv.view.n_chunks;
    // Encode every other chunk (and the last one) with q8; keep the decoded copy for the fp16 view.
    std::vector<std::vector<uint8_t>> blobs(static_cast<size_t>(n_chunks));
    std::vector<std::vector<uint16_t>> dec_k(f.kv.k), dec_v(f.kv.v);
    std::vector<const uint8_t*> qp(static_cast<size_t>(n_chunks), nullptr);
    std::vector<int> qrows(static_cast<size_t>(n_chunks), 0);
    std::vector<const uint16_t*> kp(f.kv.kp), vp(f.kv.vp);
    const size_t block = size_t(c.n_kv_head) * c.chunk_tokens * c.head_dim;
    int n_q8 = 0;
    for (int ch = 0; ch < n_chunks; ++ch) {
      if (ch % 2 == 1 && ch != n_chunks - 1) continue;
      ChunkShape sh;
      sh.n_kv_head = c.n_kv_head;
      sh.chunk_tokens = c.chunk_tokens;
      sh.head_dim = c.head_dim;
      sh.n_tokens = std::min(c.chunk_tokens, c.n_kv - ch * c.chunk_tokens);
      std::vector<uint16_t> raw(2 * block);
      std::copy(f.kv.k[size_t(ch)].begin(), f.kv.k[size_t(ch)].end(), raw.begin());
      std::copy(f.kv.v[size_t(ch)].begin(), f.kv.v[size_t(ch)].end(), raw.begin() + long(block));
      auto& b = blobs[size_t(ch)];
      b.resize(codec->MaxEncodedSize(sh));
      size_t n = 0;
      ASSERT_TRUE(codec->Encode(sh, raw.data(), b.data(), b.size(), &n).ok());
      std::vector<uint16_t> back(2 * block);
      ASSERT_TRUE(codec->Decode(sh, b.data(), n, back.data()).ok());
      dec_k[size_t(ch)].assign(back.begin(), back.begin() + long(block));
      dec_v[size_t(ch)].assign(back.begin() + long(block), back.end());
      kp[size_t(ch)] = dec_k[size_t(ch)].data();
      vp[size_t(ch)] = dec_v[size_t(ch)].data();
      qp[size_t(ch)] = b.data() + kKvCodecHeaderBytes;
      qrows[size_t(ch)] = sh.n_tokens;
      ++n_q8;
    }
    ASSERT_GE(n_q8, 1);
    KvLayerView decoded = f.kv.view;
    decoded.k_chunks = kp.data();
    decoded.v_chunks = vp.data();
    KvLayerView inplace = f.kv.view;  // fp16 chunks where not compressed, q8 where compressed
    inplace.q8_chunks = qp.data();
    inplace.q8_rows = qrows.data();
    // Poison the fp16 pointers of compressed chunks: the kernel must not read them.
    std::vector<const uint16_t*> kp_bad(f.kv.kp), vp_bad(f.kv.vp);
    for (int ch = 0; ch < n_chunks; ++ch)
      if (qp[size_t(ch)]) kp_bad[size_t(ch)] = vp_bad[size_t(ch)] = nullptr;
    inplace.k_chunks = kp_bad.data();
    inplace.v_chunks = vp_bad.data();
    for (Kernel kernel : {attention_chunked, attention_chunked_scalar}) {
      for (int nth : {1, 2, 3}) {
        std::vector<float> a_out(f.q.size(), std::numeric_limits<float>::quiet_NaN()), b_out(a_out);
        AttnArgs a = f.args;
        for (int ith = 0; ith < nth; ++ith) {
          a.out = a_out.data();
          kernel(a, decoded, ith, nth);
          a.out = b_out.data();
          kernel(a, inplace, ith, nth);
        }
        ASSERT_EQ(0, std::memcmp(a_out.data(), b_out.data(), a_out.size() * sizeof(float)))
            << (kernel == attention_chunked ? "attention_chunked" : "attention_chunked_scalar") << " nth=" << nth;
        for (float x : b_out) ASSERT_TRUE(std::isfinite(x));
      }
    }
    // The reference over the q8 view equals the reference over the decoded chunks (same inputs).
    std::vector<float> r1(f.q.size()), r2(f.q.size());
    AttnArgs a = f.args;
    a.out = r1.data();
    attention_reference(a, decoded);
    a.out = r2.data();
    attention_reference(a, inplace);
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)));
    // And q8 changed something (the test would be vacuous if the codec were exact here).
    EXPECT_GT(max_diff(r1, f.ref), 0.0);
  }
}

#endif  // MZ_ATTENTION_ONLY

// The q8 payload (kernels/q8_block.h) of the first `rows` tokens of chunk ch, built with the scalar
// definitions alone (no codec), and the fp16 chunk it decodes to: valid rows decoded, rows >= `rows`
// copied from the original (never read).
struct Q8Chunk {
  std::vector<uint8_t> payload;
  std::vector<uint16_t> k, v;
};

Q8Chunk q8_encode_chunk(const TestKv& kv, int ch, int rows) {
  const int H = kv.view.n_kv_head, CT = kv.view.chunk_tokens, D = kv.view.head_dim;
  Q8Chunk out;
  out.payload.assign(q8_payload_bytes(H, rows, D), 0xee);
  out.k = kv.k[size_t(ch)];
  out.v = kv.v[size_t(ch)];
  std::vector<float> x(static_cast<size_t>(D));
  for (int seg = 0; seg < 2 * H; ++seg) {
    const std::vector<uint16_t>& src = seg < H ? kv.k[size_t(ch)] : kv.v[size_t(ch)];
    std::vector<uint16_t>& dec = seg < H ? out.k : out.v;
    uint8_t* sp = q8_segment(out.payload.data(), rows, D, seg);
    for (int t = 0; t < rows; ++t) {
      const size_t off = (static_cast<size_t>(seg % H) * CT + t) * D;
      for (int d = 0; d < D; ++d) x[size_t(d)] = fp16_to_fp32(src[off + size_t(d)]) + 0.0f;  // -0 -> +0
      int8_t* codes = q8_row_codes(sp, rows, D, t);
      const uint16_t amax = q8_quantize_row(x.data(), D, codes);
      q8_store_amax(q8_row_amax(sp, t), amax);
      q8_dequantize_row(codes, D, amax, dec.data() + off);
    }
  }
  return out;
}

// The q8 layout read in place (KvLayerView::q8_chunks) gives the same output, bit for bit, as the
// fp16 chunks it decodes to, on every path (the NEON one too: no codec needed) and thread split;
// q8_element reads the decoded value; and q8 is not exact here (the test is not vacuous).
TEST(AttentionQ8, BlockReadInPlaceEqualsDecodedChunks) {
  const Case cases[] = {
      {1000, 256, 8, 2, 128, 8, 992},   // Qwen3-0.6B-like decode over 4 chunks, last one partial
      {300, 64, 2, 2, 64, 300, 0},      // causal prefill across chunks
      {37, 16, 2, 4, 64, 1, 36},        // small chunks, last partial
      {200, 32, 1, 3, 32, 5, 195, 4.0f, 0.0f, true},  // integer values, exact fp16
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Fixture f;
    setup(f, c, 123);
    const int n_chunks = f.kv.view.n_chunks, D = c.head_dim;
    std::vector<Q8Chunk> q8(static_cast<size_t>(n_chunks));
    std::vector<const uint8_t*> qp(static_cast<size_t>(n_chunks), nullptr);
    std::vector<int> qrows(static_cast<size_t>(n_chunks), 0);
    std::vector<const uint16_t*> kp(f.kv.kp), vp(f.kv.vp), kp_bad(f.kv.kp), vp_bad(f.kv.vp);
    for (int ch = 0; ch < n_chunks; ++ch) {
      if (ch % 2 == 1 && ch != n_chunks - 1) continue;  // every other chunk and the last one
      const int rows = std::min(c.chunk_tokens, c.n_kv - ch * c.chunk_tokens);
      q8[size_t(ch)] = q8_encode_chunk(f.kv, ch, rows);
      qp[size_t(ch)] = q8[size_t(ch)].payload.data();
      qrows[size_t(ch)] = rows;
      kp[size_t(ch)] = q8[size_t(ch)].k.data();
      vp[size_t(ch)] = q8[size_t(ch)].v.data();
      kp_bad[size_t(ch)] = vp_bad[size_t(ch)] = nullptr;  // the kernel must not read them
      // q8_element is the decoded value, K and V, first and last row.
      for (int seg : {0, 2 * c.n_kv_head - 1}) {
        const std::vector<uint16_t>& dec = seg < c.n_kv_head ? q8[size_t(ch)].k : q8[size_t(ch)].v;
        for (int t : {0, rows - 1}) {
          for (int d = 0; d < D; ++d) {
            const size_t off = (static_cast<size_t>(seg % c.n_kv_head) * c.chunk_tokens + t) * D + d;
            ASSERT_EQ(q8_element(q8_segment(qp[size_t(ch)], rows, D, seg), rows, D, t, d), fp16_to_fp32(dec[off]))
                << "chunk " << ch << " seg " << seg << " row " << t << " dim " << d;
          }
        }
      }
    }
    KvLayerView decoded = f.kv.view;
    decoded.k_chunks = kp.data();
    decoded.v_chunks = vp.data();
    KvLayerView inplace = f.kv.view;
    inplace.k_chunks = kp_bad.data();
    inplace.v_chunks = vp_bad.data();
    inplace.q8_chunks = qp.data();
    inplace.q8_rows = qrows.data();
    for (Kernel kernel : {attention_chunked, attention_chunked_scalar}) {
      for (int nth : {1, 2, 3}) {
        std::vector<float> a_out(f.q.size(), std::numeric_limits<float>::quiet_NaN()), b_out(a_out);
        AttnArgs a = f.args;
        for (int ith = 0; ith < nth; ++ith) {
          a.out = a_out.data();
          kernel(a, decoded, ith, nth);
          a.out = b_out.data();
          kernel(a, inplace, ith, nth);
        }
        ASSERT_EQ(0, std::memcmp(a_out.data(), b_out.data(), a_out.size() * sizeof(float)))
            << (kernel == attention_chunked ? "attention_chunked" : "attention_chunked_scalar") << " nth=" << nth;
        for (float x : b_out) ASSERT_TRUE(std::isfinite(x));
      }
    }
    std::vector<float> r(f.q.size());
    AttnArgs a = f.args;
    a.out = r.data();
    attention_reference(a, inplace);
    if (!c.integral) {
      EXPECT_GT(max_diff(r, f.ref), 0.0);  // q8 is not exact on these values: the test is not vacuous
    }
    EXPECT_LE(max_diff(r, f.ref), 0.05 * (1.0 + max_abs(f.ref)));  // q8: ~1% relative per element
  }
}

// q8 arithmetic at its edges: codes +-127 decode to exactly +-amax, -128 reads as -127, an all-zero
// row has amax 0 and zero codes, and decoding then re-encoding a row gives the same codes and amax.
TEST(AttentionQ8, BlockArithmetic) {
  const int D = 16;
  std::vector<float> x(D);
  std::vector<int8_t> codes(D), codes2(D);
  std::vector<uint16_t> dec(D);
  EXPECT_EQ(q8_quantize_row(x.data(), D, codes.data()), 0);
  for (int8_t q : codes) EXPECT_EQ(q, 0);
  std::mt19937 rng(5);
  for (int iter = 0; iter < 2000; ++iter) {
    const float amp = std::ldexp(1.0f, int(rng() % 30) - 14);
    for (float& v : x) v = fp16_to_fp32(fp32_to_fp16(draw(rng, amp, false))) + 0.0f;
    const uint16_t amax = q8_quantize_row(x.data(), D, codes.data());
    const float step = q8_step_of_bits(amax);
    ASSERT_EQ(q8_dequantize(kQ8MaxCode, step), amax) << iter;
    ASSERT_EQ(q8_dequantize(-kQ8MaxCode, step), amax | 0x8000u) << iter;
    ASSERT_EQ(q8_dequantize(-128, step), q8_dequantize(-kQ8MaxCode, step)) << iter;
    q8_dequantize_row(codes.data(), D, amax, dec.data());
    for (int d = 0; d < D; ++d) x[size_t(d)] = fp16_to_fp32(dec[size_t(d)]) + 0.0f;
    ASSERT_EQ(q8_quantize_row(x.data(), D, codes2.data()), amax) << iter;
    ASSERT_EQ(codes, codes2) << iter;
  }
}

#ifndef MZ_ATTENTION_ONLY
// The q8 codec writes exactly the layout kernels/q8_block.h defines: its payload (past the 16-byte
// header) equals the one built with the scalar definitions, byte for byte, and it decodes to the
// same fp16 values; the codec's row kernels (SIMD or not) agree with q8_quantize_row /
// q8_dequantize_row.
TEST(AttentionQ8, BlockLayoutIsTheCodecs) {
  const auto codec = MakeKvCodec("q8");
  ASSERT_TRUE(codec);
  const Case cases[] = {
      {300, 256, 8, 1, 128, 1, 299},
      {37, 16, 2, 1, 64, 1, 36, 8.0f},
      {20, 32, 1, 1, 8, 1, 19, 1000.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    TestKv kv;
    make_kv(kv, c.n_kv, c.chunk_tokens, c.n_kv_head, c.head_dim, 31, c.amp, c.integral);
    const size_t block = size_t(c.n_kv_head) * c.chunk_tokens * c.head_dim;
    for (int ch = 0; ch < kv.view.n_chunks; ++ch) {
      ChunkShape sh;
      sh.n_kv_head = c.n_kv_head;
      sh.chunk_tokens = c.chunk_tokens;
      sh.head_dim = c.head_dim;
      sh.n_tokens = std::min(c.chunk_tokens, c.n_kv - ch * c.chunk_tokens);
      std::vector<uint16_t> raw(2 * block);
      std::copy(kv.k[size_t(ch)].begin(), kv.k[size_t(ch)].end(), raw.begin());
      std::copy(kv.v[size_t(ch)].begin(), kv.v[size_t(ch)].end(), raw.begin() + long(block));
      std::vector<uint8_t> blob(codec->MaxEncodedSize(sh));
      size_t n = 0;
      ASSERT_TRUE(codec->Encode(sh, raw.data(), blob.data(), blob.size(), &n).ok());
      const Q8Chunk mine = q8_encode_chunk(kv, ch, sh.n_tokens);
      ASSERT_EQ(n, kKvCodecHeaderBytes + mine.payload.size());
      ASSERT_EQ(0, std::memcmp(blob.data() + kKvCodecHeaderBytes, mine.payload.data(), mine.payload.size()))
          << "chunk " << ch;
      std::vector<uint16_t> back(2 * block);
      ASSERT_TRUE(codec->Decode(sh, blob.data(), n, back.data()).ok());
      for (int h = 0; h < c.n_kv_head; ++h) {
        for (int t = 0; t < sh.n_tokens; ++t) {
          const size_t off = (static_cast<size_t>(h) * c.chunk_tokens + t) * c.head_dim;
          for (int d = 0; d < c.head_dim; ++d) {
            ASSERT_EQ(back[off + size_t(d)], mine.k[off + size_t(d)]) << "K chunk " << ch << " h " << h << " t " << t;
            ASSERT_EQ(back[block + off + size_t(d)], mine.v[off + size_t(d)]) << "V chunk " << ch << " h " << h;
          }
        }
      }
    }
  }
  // Row kernels on every int8 code and a spread of amax values (odd lengths: SIMD body and tail).
  std::vector<int8_t> codes(259);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(int(i) - 128);
  std::vector<uint16_t> a(codes.size()), b(codes.size()), r(codes.size());
  for (uint32_t amax = 0; amax <= 0x7bffu; amax += 97) {
    q8_dequantize_row(codes.data(), int(codes.size()), uint16_t(amax), a.data());
    kvc::Q8DecodeRowScalar(codes.data(), int(codes.size()), uint16_t(amax), b.data());
    kvc::Q8DecodeRowSimd(codes.data(), int(codes.size()), uint16_t(amax), r.data());
    ASSERT_EQ(a, b) << amax;
    ASSERT_EQ(a, r) << amax;
  }
  std::mt19937 rng(9);
  std::vector<float> x(77);
  std::vector<int8_t> c1(x.size()), c2(x.size());
  for (int iter = 0; iter < 500; ++iter) {
    const float amp = std::ldexp(1.0f, int(rng() % 30) - 14);
    for (float& v : x) v = fp16_to_fp32(fp32_to_fp16(draw(rng, amp, false))) + 0.0f;
    ASSERT_EQ(q8_quantize_row(x.data(), int(x.size()), c1.data()), kvc::Q8EncodeRow(x.data(), int(x.size()), c2.data()));
    ASSERT_EQ(c1, c2) << iter;
  }
}
#endif  // MZ_ATTENTION_ONLY

// Each thread writes a disjoint set of rows, all rows get written, and the Qwen3-0.6B decode shape
// (8 kv heads, group 2, 8 tokens) splits evenly over 2 threads.
TEST(Attention, PartitionIsDisjointAndBalanced) {
  const Case cases[] = {
      {1000, 256, 8, 2, 128, 8, 992},
      {1000, 256, 8, 2, 128, 1, 999},
      {300, 64, 2, 4, 64, 300, 0},
      {100, 16, 1, 48, 64, 3, 97},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(describe(c));
    Fixture f;
    setup(f, c, 900);
    const int D = c.head_dim;
    const size_t n_rows = f.q.size() / D;
    for (int nth : {1, 2, 3, 4}) {
      std::vector<int> owner(n_rows, -1);
      std::vector<size_t> rows_of(nth, 0);
      for (int ith = 0; ith < nth; ++ith) {
        std::vector<float> out(f.q.size(), std::numeric_limits<float>::quiet_NaN());
        AttnArgs a = f.args;
        a.out = out.data();
        attention_chunked(a, f.kv.view, ith, nth);
        for (size_t r = 0; r < n_rows; ++r) {
          if (std::isnan(out[r * D])) continue;
          EXPECT_EQ(owner[r], -1) << "row " << r << " written by threads " << owner[r] << " and " << ith;
          owner[r] = ith;
          ++rows_of[ith];
        }
      }
      for (size_t r = 0; r < n_rows; ++r) EXPECT_NE(owner[r], -1) << "row " << r << " never written";
      if (c.n_kv_head == 8 && nth == 2) {
        EXPECT_EQ(rows_of[0], rows_of[1]);
      }
    }
  }
}

}  // namespace
}  // namespace mz
