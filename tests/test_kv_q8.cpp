// Live q8 KV (KV type q8_0, store/q8_kv.h): resident chunks are q8 blocks written as tokens are
// produced and read in place by attention.
//  - the codec adapter: q8 is the identity (blobs byte-identical to the q8 codec's), lossless codecs
//    round-trip q8 chunks exactly, corrupt blobs are refused;
//  - the rows a q8 context writes are the q8 codec's encoding of the rows an f16 context writes
//    (layer 0, whose K/V do not depend on attention), and the logits stay close to f16's;
//  - resident KV bytes follow the q8 formula (about half of f16);
//  - truncation inside a chunk, eviction to every tier and restore / restore_generate, sessions
//    (saved, loaded, adopted as storage) give bit for bit the logits of a never-evicted q8 context;
//  - the C API's kv_type.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>

#include "mzcache.h"
#include "kernels/q8_block.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "store/q8_kv.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr int kChunk = 64;
constexpr int kPrompt = 300;  // 4 full chunks + a partial one
constexpr int kNext = 4;

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Rig Make(KvType type, const std::string& codec = "q8", const std::string& tag = "a") {
  Rig r;
  EXPECT_TRUE(Model::Load(Env::Default(), test::ModelPath("tiny-qwen3"), ModelOptions(), &r.model).ok());
  ContextOptions co;
  co.n_ctx = 1024;
  co.kv_chunk_tokens = kChunk;
  co.kv_type = type;
  co.kv_codec = codec;
  co.n_threads = 2;
  co.swap_path = test::TempDir() + "/kvq8-" + tag + "-" + std::to_string(getpid()) + ".swap";
  r.ctx = std::make_unique<Context>(r.model.get(), co);
  Status st = r.ctx->Init();
  EXPECT_TRUE(st.ok()) << st.ToString();
  r.ctx->set_profile(DeviceProfile::Default());
  return r;
}

std::vector<int32_t> Toks() { return test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt + kNext); }

std::vector<float> AllLogits(Context& c, int rows) {
  const size_t nv = c.model()->hparams().n_vocab;
  std::vector<float> out;
  for (int i = 0; i < rows; ++i) out.insert(out.end(), c.logits(i), c.logits(i) + nv);
  return out;
}

// Logits of the kNext tokens after the prompt (all rows).
std::vector<float> Continue(Context& c, const std::vector<int32_t>& t) {
  Status st = c.Decode(t.data() + kPrompt, kNext, true);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return AllLogits(c, kNext);
}

bool Same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

ChunkShape Shape(int n_kv_head, int T, int D, int n) { return ChunkShape{n_kv_head, T, D, n, 0, 4}; }

// A random fp16 chunk (values of a few magnitudes, some zero rows).
std::vector<uint16_t> RandomF16(const ChunkShape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(s.raw_bytes() / 2);
  for (size_t i = 0; i < v.size(); ++i) v[i] = fp32_to_fp16(nd(rng) * float(1 + (i / 97) % 5));
  std::fill(v.begin(), v.begin() + s.head_dim, uint16_t(0));  // row 0 of K head 0 all zero
  return v;
}

TEST(Q8KvCodec, Q8IsTheIdentityAndLosslessCodecsAreExact) {
  for (int n : {1, 17, 64}) {
    const ChunkShape s = Shape(2, 64, 32, n);
    const auto f16 = RandomF16(s, 7 + n);
    std::vector<uint8_t> q8(KvChunkBytes(KvType::kQ8, 2, 64, 32), 0xAB);
    Q8KvFromF16(s, f16.data(), q8.data());
    // The identity: the adapter's blob is the q8 codec's blob of the fp16 chunk.
    auto plain = MakeKvCodec("q8");
    auto live = MakeKvCodecFor(KvType::kQ8, "q8");
    ASSERT_TRUE(live->lossless() && live->attention_reads_in_place());
    std::vector<uint8_t> b1(plain->MaxEncodedSize(s)), b2(live->MaxEncodedSize(s));
    size_t n1 = 0, n2 = 0;
    ASSERT_TRUE(plain->Encode(s, f16.data(), b1.data(), b1.size(), &n1).ok());
    ASSERT_TRUE(live->Encode(s, reinterpret_cast<const uint16_t*>(q8.data()), b2.data(), b2.size(), &n2).ok());
    ASSERT_EQ(n1, n2);
    EXPECT_EQ(0, std::memcmp(b1.data(), b2.data(), n1)) << "n=" << n;
    // Decoding gives the chunk back (valid rows; invalid rows zero, as a fresh chunk).
    std::vector<uint8_t> back(q8.size(), 0x5A);
    ASSERT_TRUE(live->Decode(s, b2.data(), n2, reinterpret_cast<uint16_t*>(back.data())).ok());
    EXPECT_EQ(0, std::memcmp(back.data(), q8.data(), q8.size())) << "n=" << n;
    // Lossless codecs over q8 chunks: exact.
    for (const char* name : {"none", "lz4", "zstd"}) {
      auto c = MakeKvCodecFor(KvType::kQ8, name);
      std::vector<uint8_t> b(c->MaxEncodedSize(s));
      size_t w = 0;
      ASSERT_TRUE(c->Encode(s, reinterpret_cast<const uint16_t*>(q8.data()), b.data(), b.size(), &w).ok());
      std::vector<uint8_t> r(q8.size(), 0x77);
      ASSERT_TRUE(c->Decode(s, b.data(), w, reinterpret_cast<uint16_t*>(r.data())).ok());
      EXPECT_EQ(0, std::memcmp(r.data(), q8.data(), q8.size())) << name << " n=" << n;
    }
    // Lossy codecs round-trip to valid q8 chunks.
    for (const char* name : {"q4", "cachegen"}) {
      auto c = MakeKvCodecFor(KvType::kQ8, name);
      std::vector<uint8_t> b(c->MaxEncodedSize(s));
      size_t w = 0;
      ASSERT_TRUE(c->Encode(s, reinterpret_cast<const uint16_t*>(q8.data()), b.data(), b.size(), &w).ok());
      std::vector<uint8_t> r(q8.size());
      ASSERT_TRUE(c->Decode(s, b.data(), w, reinterpret_cast<uint16_t*>(r.data())).ok()) << name;
    }
    // A corrupt row max is refused, as by the q8 codec.
    b2[kKvCodecHeaderBytes + 1] = 0xFC;  // amax of row 0 of segment 0 -> negative / not finite
    EXPECT_EQ(live->Decode(s, b2.data(), n2, reinterpret_cast<uint16_t*>(back.data())).code(), Status::kCorruption);
    EXPECT_EQ(live->Decode(s, b2.data(), n2 - 1, reinterpret_cast<uint16_t*>(back.data())).code(), Status::kCorruption);
  }
  KvType t;
  EXPECT_TRUE(ParseKvType("q8_0", &t) && t == KvType::kQ8);
  EXPECT_TRUE(ParseKvType("f16", &t) && t == KvType::kF16);
  EXPECT_FALSE(ParseKvType("q4_0", &t));
}

TEST(LiveQ8Kv, RowsAreTheQ8EncodingOfTheF16RowsAndMemoryIsHalved) {
  const auto t = Toks();
  Rig f = Make(KvType::kF16, "q8", "f"), q = Make(KvType::kQ8, "q8", "q");
  ASSERT_TRUE(f.ctx->Decode(t.data(), kPrompt, false).ok());
  ASSERT_TRUE(q.ctx->Decode(t.data(), kPrompt, false).ok());
  const KvGeometry& g = q.ctx->kv().geometry();
  ASSERT_TRUE(g.q8());
  // Layer 0's K/V come from the embeddings only: the q8 context's rows are exactly the q8 encoding
  // of the f16 context's rows.
  for (int c = 0; c < q.ctx->kv().n_chunks(); ++c) {
    const int n = std::min(kChunk, kPrompt - c * kChunk);
    const ChunkShape s = Shape(g.n_kv_head, kChunk, g.head_dim, n);
    std::vector<uint8_t> want(g.chunk_bytes());
    Q8KvFromF16(s, f.ctx->kv().chunk(0, c), want.data());
    const uint8_t* got = reinterpret_cast<const uint8_t*>(q.ctx->kv().chunk(0, c));
    for (int j = 0; j < 2 * g.n_kv_head; ++j) {
      const uint8_t* a = q8_segment(got, kChunk, g.head_dim, j);
      const uint8_t* b = q8_segment(want.data(), kChunk, g.head_dim, j);
      EXPECT_EQ(0, std::memcmp(a, b, 2 * size_t(n))) << "amax chunk " << c << " seg " << j;
      EXPECT_EQ(0, std::memcmp(q8_row_codes(a, kChunk, g.head_dim, 0), q8_row_codes(b, kChunk, g.head_dim, 0),
                               size_t(n) * g.head_dim))
          << "codes chunk " << c << " seg " << j;
    }
  }
  // Resident KV bytes: the q8 formula, per token 2 * n_kv_head * (head_dim + 2) per layer.
  const uint64_t q8_chunk = 2ull * g.n_kv_head * kChunk * (g.head_dim + 2);
  EXPECT_EQ(g.chunk_bytes(), q8_chunk);
  const MemoryReport rq = q.ctx->Report(), rf = f.ctx->Report();
  EXPECT_EQ(rq.kv_resident, uint64_t(g.n_layer) * q.ctx->kv().n_chunks() * q8_chunk);
  EXPECT_EQ(rf.kv_resident * (g.head_dim + 2), rq.kv_resident * 2 * g.head_dim);
  // Logits stay close to f16's.
  const auto lf = Continue(*f.ctx, t), lq = Continue(*q.ctx, t);
  const size_t nv = f.model->hparams().n_vocab;
  for (int i = 0; i < kNext; ++i) {
    const float* a = lf.data() + i * nv;
    const float* b = lq.data() + i * nv;
    double ma = -1e30, mb = -1e30;
    for (size_t k = 0; k < nv; ++k) ma = std::max(ma, double(a[k])), mb = std::max(mb, double(b[k]));
    double za = 0, zb = 0;
    for (size_t k = 0; k < nv; ++k) za += std::exp(a[k] - ma), zb += std::exp(b[k] - mb);
    double kl = 0;
    for (size_t k = 0; k < nv; ++k) {
      const double p = std::exp(a[k] - ma) / za, lp = a[k] - ma - std::log(za), lqk = b[k] - mb - std::log(zb);
      kl += p * (lp - lqk);
    }
    EXPECT_LT(kl, 0.02) << "row " << i;
    EXPECT_FALSE(Same(lf, lq));  // q8 is lossy: not the f16 result
  }
}

TEST(LiveQ8Kv, TruncateInsideAChunkThenDecode) {
  const auto t = Toks();
  const int cut = 3 * kChunk + 10;
  // b: the reference (the prompt up to the cut, then the rest).
  Rig b = Make(KvType::kQ8, "q8", "tb");
  ASSERT_TRUE(b.ctx->Decode(t.data(), cut, false).ok());
  ASSERT_TRUE(b.ctx->Decode(t.data() + cut, kPrompt - cut, false).ok());
  const auto want = Continue(*b.ctx, t);
  // a: other tokens written past the cut (rows of chunks 3 and 4), cut back, then the rest.
  for (bool evict : {false, true}) {
    Rig a = Make(KvType::kQ8, "q8", evict ? "tc" : "ta");
    ASSERT_TRUE(a.ctx->Decode(t.data(), cut, false).ok());
    ASSERT_TRUE(a.ctx->Decode(t.data() + 1, 80, false).ok());
    if (evict) {  // the chunk cut inside is on storage while truncated
      Plan p;
      for (int l = 0; l < int(a.model->hparams().n_layer); ++l) p.push_back({UnitRef::Kv(l, 3), UnitState::kKvStorageRaw});
      ASSERT_TRUE(a.ctx->Evict(p, 0, nullptr).ok());
    }
    a.ctx->Truncate(cut);
    if (evict) ASSERT_TRUE(a.ctx->Restore().ok());
    ASSERT_TRUE(a.ctx->Decode(t.data() + cut, kPrompt - cut, false).ok());
    EXPECT_TRUE(Same(Continue(*a.ctx, t), want)) << "evict " << evict;
  }
}

// The last-row logits of kNext tokens after the prompt (as restore_generate gives them).
std::vector<float> LastRow(Context& c) {
  const size_t nv = c.model()->hparams().n_vocab;
  return std::vector<float>(c.logits(0), c.logits(0) + nv);
}

Plan AllKv(Context& c, UnitState target) {
  Plan p;
  for (int l = 0; l < int(c.model()->hparams().n_layer); ++l)
    for (int ch = 0; ch < c.kv().n_chunks(); ++ch) p.push_back({UnitRef::Kv(l, ch), target});
  return p;
}

TEST(LiveQ8Kv, EvictRestoreAndRestoreGenerateAreExact) {
  const auto t = Toks();
  Rig ref = Make(KvType::kQ8, "q8", "ref");
  ASSERT_TRUE(ref.ctx->Decode(t.data(), kPrompt, false).ok());
  ASSERT_TRUE(ref.ctx->Decode(t.data() + kPrompt, kNext, false).ok());
  const auto want_last = LastRow(*ref.ctx);
  ref.ctx->Truncate(kPrompt);
  const auto want = Continue(*ref.ctx, t);
  // Under TSan, q8 (its rows kept as they are) and zstd (a general-purpose codec) only: the codec
  // changes the bytes the restore's workers and the compute read, not how they are handed over
  // (what TSan checks); Codecs.ConcurrentUse runs every codec from 4 threads at once under TSan, and
  // all four codecs run here in the normal and ASan+UBSan stages. 99 s of the TSan stage, 2026-12-07.
#if defined(__SANITIZE_THREAD__)
  for (const char* codec : {"q8", "zstd"})
#else
  for (const char* codec : {"q8", "none", "lz4", "zstd"})
#endif
    for (UnitState target : {UnitState::kKvMemCompressed, UnitState::kKvStorageCompressed, UnitState::kKvStorageRaw})
      for (bool generate : {false, true}) {
        SCOPED_TRACE(std::string(codec) + " " + UnitStateName(target) + (generate ? " restore_generate" : " restore"));
        Rig r = Make(KvType::kQ8, codec, std::string("ev-") + codec);
        ASSERT_TRUE(r.ctx->Decode(t.data(), kPrompt, false).ok());
        const uint64_t resident = r.ctx->Report().kv_resident;
        ASSERT_TRUE(r.ctx->Evict(AllKv(*r.ctx, target), 0, nullptr).ok());
        const MemoryReport er = r.ctx->Report();
        EXPECT_EQ(er.kv_resident, 0u);
        if (target == UnitState::kKvMemCompressed && std::string(codec) == "q8")  // the q8 rows as they are
          EXPECT_LE(er.kv_mem_compressed, resident + 16ull * r.ctx->kv().n_chunks() * r.model->hparams().n_layer);
        if (generate) {
          PipelineOptions po;
          RestoreGenerateStats st;
          Status s = r.ctx->RestoreGenerate(t.data() + kPrompt, kNext, po, &st);
          ASSERT_TRUE(s.ok()) << s.ToString();
          EXPECT_TRUE(Same(LastRow(*r.ctx), want_last));
        } else {
          ASSERT_TRUE(r.ctx->Restore().ok());
          EXPECT_TRUE(r.ctx->units().AllResident());
          EXPECT_EQ(r.ctx->Report().kv_resident, resident);
          EXPECT_TRUE(Same(Continue(*r.ctx, t), want));
        }
      }
}

TEST(LiveQ8Kv, SessionsSaveLoadAndServeAsStorage) {
  const auto t = Toks();
  Rig src = Make(KvType::kQ8, "q8", "src");
  ASSERT_TRUE(src.ctx->Decode(t.data(), kPrompt, false).ok());
  const std::string dir = test::TempDir();
  for (const char* codec : {"q8", "none", "zstd"}) {
    SCOPED_TRACE(codec);
    const std::string path = dir + "/kvq8-" + codec + "-" + std::to_string(getpid()) + ".mzs";
    SessionInfo info;
    ASSERT_TRUE(SaveSession(*src.ctx, path, codec, &info).ok());
    EXPECT_EQ(info.n_tokens, kPrompt);
    // Loaded into a q8_0 context: exact.
    Rig dst = Make(KvType::kQ8, "q8", "dst");
    Status st = LoadSession(*dst.ctx, path);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (int l = 0; l < int(dst.model->hparams().n_layer); ++l)
      for (int c = 0; c < dst.ctx->kv().n_chunks(); ++c) {
        const int n = std::min(kChunk, kPrompt - c * kChunk);
        const KvGeometry& g = dst.ctx->kv().geometry();
        const uint8_t* a = reinterpret_cast<const uint8_t*>(dst.ctx->kv().chunk(l, c));
        const uint8_t* b = reinterpret_cast<const uint8_t*>(src.ctx->kv().chunk(l, c));
        for (int j = 0; j < 2 * g.n_kv_head; ++j) {
          const uint8_t* sa = q8_segment(a, kChunk, g.head_dim, j);
          const uint8_t* sb = q8_segment(b, kChunk, g.head_dim, j);
          ASSERT_EQ(0, std::memcmp(sa, sb, 2 * size_t(n)));
          ASSERT_EQ(0, std::memcmp(q8_row_codes(sa, kChunk, g.head_dim, 0), q8_row_codes(sb, kChunk, g.head_dim, 0),
                                   size_t(n) * g.head_dim));
        }
      }
    // Adopted as the storage tier (its codec is the context's), restored by restore_generate.
    if (std::string(codec) == "q8") {
      Rig adopt = Make(KvType::kQ8, "q8", "adopt");
      st = OpenSessionAsStorage(*adopt.ctx, path);
      ASSERT_TRUE(st.ok()) << st.ToString();
      PipelineOptions po;
      RestoreGenerateStats rs;
      ASSERT_TRUE(adopt.ctx->RestoreGenerate(t.data() + kPrompt, kNext, po, &rs).ok());
      Rig ref = Make(KvType::kQ8, "q8", "ref2");
      ASSERT_TRUE(ref.ctx->Decode(t.data(), kPrompt, false).ok());
      ASSERT_TRUE(ref.ctx->Decode(t.data() + kPrompt, kNext, false).ok());
      EXPECT_TRUE(Same(LastRow(*adopt.ctx), LastRow(*ref.ctx)));
    }
    // Into an f16 context: converted (the q8 decode), and it continues.
    Rig f = Make(KvType::kF16, "q8", "f16");
    st = LoadSession(*f.ctx, path);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(f.ctx->Decode(t.data() + kPrompt, kNext, false).ok());
    std::remove(path.c_str());
  }
  // Continuing the loaded q8 context equals continuing the source.
  const std::string path = dir + "/kvq8-cont-" + std::to_string(getpid()) + ".mzs";
  ASSERT_TRUE(SaveSession(*src.ctx, path, "q8").ok());
  Rig dst = Make(KvType::kQ8, "q8", "dst2");
  ASSERT_TRUE(LoadSession(*dst.ctx, path).ok());
  EXPECT_TRUE(Same(Continue(*dst.ctx, t), Continue(*src.ctx, t)));
  std::remove(path.c_str());
}

TEST(LiveQ8Kv, CApiKvType) {
  mz_model* m = nullptr;
  ASSERT_EQ(mz_model_load(test::ModelPath("tiny-qwen3").c_str(), nullptr, &m), MZ_OK);
  mz_context_params cp = mz_context_default_params();
  EXPECT_EQ(cp.kv_type, MZ_KV_F16);
  cp.n_ctx = 512;
  cp.kv_chunk_tokens = 64;
  cp.kv_type = 7;
  mz_context* c = nullptr;
  EXPECT_EQ(mz_context_new(m, &cp, &c), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(c, nullptr);
  uint64_t kv[2] = {0, 0};
  for (int32_t type : {MZ_KV_F16, MZ_KV_Q8_0}) {
    cp.kv_type = type;
    ASSERT_EQ(mz_context_new(m, &cp, &c), MZ_OK);
    const auto t = Toks();
    ASSERT_EQ(mz_decode(c, t.data(), 100, false), MZ_OK);
    mz_memory_report r;
    ASSERT_EQ(mz_get_memory_report(c, &r), MZ_OK);
    kv[type] = r.kv_resident;
    mz_context_free(c);
  }
  mz_model_info info;
  ASSERT_EQ(mz_model_get_info(m, &info), MZ_OK);
  EXPECT_EQ(kv[1] * 2 * uint64_t(info.head_dim), kv[0] * uint64_t(info.head_dim + 2));
  mz_model_free(m);
}

}  // namespace
}  // namespace mz
