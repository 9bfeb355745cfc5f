// restore_generate: for every eviction policy, every overlap variant and remaining-memory levels
// 0/25/50/75%, the logits equal the never-evicted run (bit-identical for lossless placements,
// bounded for q8). Deterministic sync points force compute to reach a layer before that layer is
// restored, so the readiness signalling is exercised, not just the easy interleavings.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <thread>

#include "core/sync_point.h"
#include "env/fault_env.h"
#include "restore/restore_pipeline.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "test_util.h"

namespace mz {
// The pipeline and the unit table's loads driven directly, below the context's operations.
struct ContextTestPeer {
  static UnitTable& units(Context& c) { return *c.units_; }
};
namespace {

constexpr int kPrompt = 160;

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

std::vector<int32_t> Prompt(const std::string& path) { return test::PromptTokens(path, kPrompt + 8); }

Rig MakeCtx(const std::string& path, const std::string& codec, EvictOrder order, bool partial, const char* tag,
            Env* env = Env::Default()) {
  Rig s;
  EXPECT_TRUE(Model::Load(env, path, ModelOptions(), &s.model).ok());
  ContextOptions co;
  co.n_ctx = 512;
  co.kv_chunk_tokens = 16;
  co.kv_codec = codec;
  co.evict_order = order;
  co.partial_offload = partial;
  co.swap_path = test::TempDir() + "/pipe-" + tag + ".swap";
  s.ctx = std::make_unique<Context>(s.model.get(), co);
  EXPECT_TRUE(s.ctx->Init().ok());
  s.ctx->set_profile(DeviceProfile::Default());  // the same plans on every machine
  return s;
}

std::vector<float> Logits(Context& c) {
  const int nv = int(c.model()->hparams().n_vocab);
  return std::vector<float>(c.logits(0), c.logits(0) + nv);
}

// The logits of the 8 query tokens after the prompt, never evicted: what every restore must give.
std::vector<float> NeverEvictedLogits(const std::string& path, const std::string& codec, const std::vector<int32_t>& toks,
                                      const char* tag) {
  Rig ref = MakeCtx(path, codec, EvictOrder::kBackwardOut, false, tag);
  EXPECT_TRUE(ref.ctx->Decode(toks.data(), kPrompt, false).ok());
  EXPECT_TRUE(ref.ctx->Decode(toks.data() + kPrompt, 8, false).ok());
  return Logits(*ref.ctx);
}

struct Case {
  std::string policy;  // backward, forward, random, partial
  Overlap overlap;
  double remaining;
  std::string codec;
  bool alloc_ahead = true;  // false: each unit mapped by its worker (PipelineOptions::alloc_ahead)
};

class RestoreGenerate : public ::testing::TestWithParam<Case> {};

TEST_P(RestoreGenerate, MatchesNeverEvicted) {
  const Case c = GetParam();
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const auto want = NeverEvictedLogits(path, c.codec, toks, "ref");

  EvictOrder order = c.policy == "forward" ? EvictOrder::kForwardOut
                     : c.policy == "random" ? EvictOrder::kRandomOut
                                            : EvictOrder::kBackwardOut;
  Rig s = MakeCtx(path, c.codec, order, c.policy == "partial", "run");
  ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
  MemoryReport r = s.ctx->Report();
  const uint64_t target = uint64_t(c.remaining * double(r.footprint()));
  uint64_t freed = 0;
  if (r.in_memory() > target) ASSERT_TRUE(s.ctx->EvictBytes(r.in_memory() - target, &freed).ok());
  r = s.ctx->Report();
  // Evicted at least down to the level (within one unit), or everything there was.
  EXPECT_LE(r.remaining(), c.remaining + 0.08) << "remaining " << r.remaining();

  PipelineOptions po;
  po.overlap = c.overlap;
  po.sequential = c.policy == "partial";
  po.alloc_ahead = c.alloc_ahead;
  RestoreGenerateStats st;
  Status status = s.ctx->RestoreGenerate(toks.data() + kPrompt, 8, po, &st);
  ASSERT_TRUE(status.ok()) << status.ToString();
  // Everything is back in memory: resident, or (q8) compressed in the in-memory swap, read in place.
  const MemoryReport after = s.ctx->Report();
  EXPECT_EQ(after.weights_dropped, 0u);
  EXPECT_EQ(after.n_kv_chunks[int(UnitState::kKvStorageRaw)] + after.n_kv_chunks[int(UnitState::kKvStorageCompressed)], 0);
  if (c.codec != "q8") EXPECT_TRUE(s.ctx->units().AllResident());
  for (int l = 0; l < int(s.model->hparams().n_layer); ++l)
    for (int ch = 0; s.ctx->units().has_chunk(l, ch); ++ch)
      if (s.ctx->units().state(UnitRef::Kv(l, ch)) != UnitState::kResident)
        EXPECT_TRUE(s.ctx->units().readable_compressed(l, ch)) << UnitName(UnitRef::Kv(l, ch));
  const auto got = Logits(*s.ctx);
  const bool lossless = s.ctx->units().codec().lossless();
  if (lossless) {
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "logits differ";
  } else {
    double md = 0;
    for (size_t i = 0; i < want.size(); ++i) md = std::max(md, double(std::fabs(got[i] - want[i])));
    EXPECT_LT(md, 0.5) << "q8 placement moved a logit by " << md;
    EXPECT_EQ(ArgMax(want.data(), int(want.size())), ArgMax(got.data(), int(got.size())));
  }
}

// The full matrix (72 cases) in the normal build: every policy x overlap x level, q8 with full
// overlap, each-unit-maps-itself for backward at 0% and 50%.
std::vector<Case> FullCases() {
  std::vector<Case> v;
  for (std::string pol : {"backward", "forward", "random", "partial"})
    for (Overlap o : {Overlap::kNone, Overlap::kAllocReload, Overlap::kReloadPrefill, Overlap::kFull})
      for (double rem : {0.0, 0.25, 0.5, 0.75}) {
        if (pol == "partial" && o != Overlap::kNone) continue;  // its restore has no overlap variants
        v.push_back({pol, o, rem, "none"});
        if (o == Overlap::kFull) v.push_back({pol, o, rem, "q8"});
        if (pol == "backward" && (rem == 0.0 || rem == 0.5)) v.push_back({pol, o, rem, "none", false});
      }
  return v;
}

// Under a sanitizer (ASan+UBSan, TSan) a representative slice of it, 18 cases: every
// (policy, overlap) pair once (13), at levels forming a Latin square with the extra cases, so that
// each ordered policy meets every remaining level and every overlap variant meets every level; q8
// (read in place) with full overlap for each ordered policy (3); the each-unit-maps-itself variant
// for backward (2). Every code path of the restore (each policy's plan, each overlap's threads and
// readiness signalling, the sequential partial-offload restore, both codecs, both mapping modes)
// runs under each sanitizer; left out are combinations that differ only in how many units are
// evicted, which the normal build checks bit for bit. (Issue 21: this matrix was most of the TSan
// stage's 13 minutes.) RestoreGenerateSlice below checks these claims.
std::vector<Case> SanitizerCases() {
  const Overlap n = Overlap::kNone, ar = Overlap::kAllocReload, rp = Overlap::kReloadPrefill, f = Overlap::kFull;
  return {
      {"backward", n, 0.0, "none"},        {"backward", ar, 0.5, "none"},  {"backward", rp, 0.25, "none"},
      {"backward", f, 0.75, "none"},       {"forward", n, 0.5, "none"},    {"forward", ar, 0.25, "none"},
      {"forward", rp, 0.75, "none"},       {"forward", f, 0.0, "none"},    {"random", n, 0.25, "none"},
      {"random", ar, 0.75, "none"},        {"random", rp, 0.0, "none"},    {"random", f, 0.5, "none"},
      {"partial", n, 0.75, "none"},
      {"backward", f, 0.25, "q8"},         {"forward", f, 0.5, "q8"},      {"random", f, 0.0, "q8"},
      {"backward", ar, 0.0, "none", false}, {"backward", rp, 0.5, "none", false},
  };
}

std::vector<Case> Cases() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return SanitizerCases();
#else
  return FullCases();
#endif
}

// The slice keeps what it claims (both lists are compiled in every build): each policy x overlap
// pair, each level with each ordered policy and with each overlap variant, q8 with every ordered
// policy, the per-unit mapping mode; and each of its cases is one of the full matrix, which the
// normal build runs (so no case runs only under a sanitizer).
TEST(RestoreGenerateSlice, SanitizerSliceCoversEveryPathOfTheFullMatrix) {
  const auto full = FullCases(), slice = SanitizerCases();
  auto key = [](const Case& c) {
    return c.policy + "/" + OverlapName(c.overlap) + "/" + std::to_string(int(c.remaining * 100)) + "/" + c.codec +
           (c.alloc_ahead ? "" : "/unitmaps");
  };
  std::set<std::string> in_full;
  for (const Case& c : full) in_full.insert(key(c));
  std::set<std::string> pol_ov, pol_lvl, ov_lvl, q8_pol, seen;
  int unitmaps = 0;
  for (const Case& c : slice) {
    EXPECT_TRUE(in_full.count(key(c))) << key(c) << " is not in the full matrix";
    EXPECT_TRUE(seen.insert(key(c)).second) << key(c) << " twice";
    const std::string lvl = std::to_string(int(c.remaining * 100));
    pol_ov.insert(c.policy + "/" + OverlapName(c.overlap));
    if (c.policy != "partial") pol_lvl.insert(c.policy + "/" + lvl);
    ov_lvl.insert(std::string(OverlapName(c.overlap)) + "/" + lvl);
    if (c.codec == "q8") q8_pol.insert(c.policy);
    unitmaps += !c.alloc_ahead;
  }
  EXPECT_EQ(pol_ov.size(), 13u);   // 3 ordered policies x 4 overlaps + partial (no overlap variants)
  EXPECT_EQ(pol_lvl.size(), 12u);  // 3 ordered policies x 4 levels
  EXPECT_EQ(ov_lvl.size(), 16u);   // 4 overlaps x 4 levels
  EXPECT_EQ(q8_pol.size(), 3u);
  EXPECT_EQ(unitmaps, 2);
  EXPECT_EQ(slice.size(), 18u);
  EXPECT_EQ(full.size(), 72u);
}

INSTANTIATE_TEST_SUITE_P(AllPoliciesOverlapsLevels, RestoreGenerate, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           std::string s = c.policy + "_" + OverlapName(c.overlap) + "_" +
                                           std::to_string(int(c.remaining * 100)) + "_" + c.codec +
                                           (c.alloc_ahead ? "" : "_unitmaps");
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// KV chunks held compressed in memory by q8 are read in place by restore_generate (not restored):
// the logits equal, bit for bit, those of the same call restoring every unit first
// (attend_compressed off); the chunks are still compressed afterwards, the next decode reads them
// in place too (same logits again), and mz_restore brings them back (same logits again).
TEST(RestoreGenerateCompressed, ReadsQ8ChunksInPlaceBitIdenticalToRestoringThem) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const int n_layer = 4, n_chunks = kPrompt / 16;
  // Three placements: rear layers' chunks compressed in memory; plus their weights dropped and
  // some chunks on storage; and every chunk compressed in memory except the first of each layer.
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Plan plan;
    for (int l = n_layer - 1; l >= 0; --l) {
      if (variant == 1 && l >= 2) plan.push_back({UnitRef::Weights(l), UnitState::kWeightsDropped});
      for (int c = n_chunks - 1; c >= 0; --c) {
        UnitState t = UnitState::kResident;
        if (variant == 0 && l >= 2) t = UnitState::kKvMemCompressed;
        if (variant == 1 && l >= 1) t = c % 3 == 0 ? UnitState::kKvStorageCompressed : UnitState::kKvMemCompressed;
        if (variant == 2 && c > 0) t = UnitState::kKvMemCompressed;
        if (t != UnitState::kResident) plan.push_back({UnitRef::Kv(l, c), t});
      }
    }
    Rig on = MakeCtx(path, "q8", EvictOrder::kBackwardOut, false, "cq-on");
    Rig off = MakeCtx(path, "q8", EvictOrder::kBackwardOut, false, "cq-off");
    int in_mem_compressed = 0, sto_compressed = 0;
    for (Rig* r : {&on, &off}) {
      ASSERT_EQ(int(r->model->hparams().n_layer), n_layer);
      ASSERT_TRUE(r->ctx->Decode(toks.data(), kPrompt, false).ok());
      ASSERT_TRUE(r->ctx->Evict(plan, 0, nullptr).ok());
      in_mem_compressed = r->ctx->Report().n_kv_chunks[int(UnitState::kKvMemCompressed)];
      sto_compressed = r->ctx->Report().n_kv_chunks[int(UnitState::kKvStorageCompressed)];
    }
    EXPECT_EQ(sto_compressed > 0, variant == 1);
    // Chunks compressed on storage are loaded into the in-memory swap as they are, then read in place.
    in_mem_compressed += sto_compressed;
    ASSERT_GT(in_mem_compressed, 0) << "the policy placed no chunk in compressed memory: nothing to test";
    PipelineOptions po_on, po_off;
    po_off.attend_compressed = false;
    RestoreGenerateStats st_on, st_off;
    ASSERT_TRUE(on.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_on, &st_on).ok());
    ASSERT_TRUE(off.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_off, &st_off).ok());
    EXPECT_EQ(0, std::memcmp(Logits(*on.ctx).data(), Logits(*off.ctx).data(), Logits(*off.ctx).size() * 4));
    EXPECT_TRUE(off.ctx->units().AllResident());
    EXPECT_EQ(st_off.pipeline.bytes_read_compressed, 0u);
    const MemoryReport r_on = on.ctx->Report();
    EXPECT_EQ(r_on.n_kv_chunks[int(UnitState::kKvMemCompressed)], in_mem_compressed);
    EXPECT_EQ(r_on.n_kv_chunks[int(UnitState::kKvStorageCompressed)], 0);
    EXPECT_EQ(st_on.pipeline.bytes_read_compressed, r_on.kv_mem_compressed_raw);
    EXPECT_LT(st_on.pipeline.bytes_decoded, st_off.pipeline.bytes_decoded);
    // The next decode reads them in place as well.
    ASSERT_TRUE(on.ctx->Decode(toks.data() + kPrompt + 4, 4, false).ok());
    ASSERT_TRUE(off.ctx->Decode(toks.data() + kPrompt + 4, 4, false).ok());
    EXPECT_EQ(0, std::memcmp(Logits(*on.ctx).data(), Logits(*off.ctx).data(), Logits(*off.ctx).size() * 4));
    EXPECT_EQ(on.ctx->Report().n_kv_chunks[int(UnitState::kKvMemCompressed)], in_mem_compressed);
    // Restored, they give the same logits again (one more token on both).
    ASSERT_TRUE(on.ctx->Restore().ok());
    EXPECT_TRUE(on.ctx->units().AllResident());
    on.ctx->Truncate(kPrompt + 4);
    off.ctx->Truncate(kPrompt + 4);
    ASSERT_TRUE(on.ctx->Decode(toks.data() + kPrompt + 4, 4, false).ok());
    ASSERT_TRUE(off.ctx->Decode(toks.data() + kPrompt + 4, 4, false).ok());
    EXPECT_EQ(0, std::memcmp(Logits(*on.ctx).data(), Logits(*off.ctx).data(), Logits(*off.ctx).size() * 4));
  }
}

// Chunks compressed on storage whose extents lie back to back are loaded with one read per run
// (PipelineOptions::coalesce_bytes), with the same result as one read per chunk; an I/O error in a
// run leaves all of its chunks on storage, a flipped bit loses only the chunk it hit.
// After the prompt, layers 3, 2 and 1 of the tiny model evicted chunk by chunk from the last,
// compressed on storage: written one after another, so each layer's extents lie back to back.
// env counts the swap file's reads only.
constexpr int kRunChunks = kPrompt / 16;  // full chunks per layer
Rig CompressedOnStorage(const std::string& path, const std::vector<int32_t>& toks, FaultEnv* env, const char* tag) {
  Plan plan;
  for (int l = 3; l >= 1; --l)
    for (int c = kRunChunks - 1; c >= 0; --c) plan.push_back({UnitRef::Kv(l, c), UnitState::kKvStorageCompressed});
  env->path_filter = ".swap";
  Rig r = MakeCtx(path, "q8", EvictOrder::kBackwardOut, false, tag, env);
  EXPECT_TRUE(r.ctx->Decode(toks.data(), kPrompt, false).ok());
  EXPECT_TRUE(r.ctx->Evict(plan, 0, nullptr).ok());
  EXPECT_EQ(r.ctx->Report().n_kv_chunks[int(UnitState::kKvStorageCompressed)], 3 * kRunChunks);
  return r;
}

TEST(RestoreGenerateCompressed, CoalescedLoadsMatchOneReadPerChunkAndFailCleanly) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const int n_chunks = kRunChunks;
  auto make = [&](FaultEnv* env, const char* tag) { return CompressedOnStorage(path, toks, env, tag); };
  FaultEnv env_one(Env::Default()), env_run(Env::Default());
  Rig one = make(&env_one, "co-one"), run = make(&env_run, "co-run");
  PipelineOptions po_one, po_run;
  po_one.coalesce_bytes = 0;
  const int64_t reads_one0 = env_one.n_reads.load(), reads_run0 = env_run.n_reads.load();
  RestoreGenerateStats st_one, st_run;
  ASSERT_TRUE(one.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_one, &st_one).ok());
  ASSERT_TRUE(run.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_run, &st_run).ok());
  EXPECT_EQ(0, std::memcmp(Logits(*one.ctx).data(), Logits(*run.ctx).data(), Logits(*one.ctx).size() * 4));
  EXPECT_EQ(st_one.pipeline.storage_runs, 0);
  // Every layer's loads (its 10 full chunks; the query writes a new one) in one run each.
  EXPECT_EQ(st_run.pipeline.storage_runs, 3);
  EXPECT_EQ(st_run.pipeline.chunks_in_runs, 3 * n_chunks);
  const int64_t reads_one = env_one.n_reads.load() - reads_one0, reads_run = env_run.n_reads.load() - reads_run0;
  EXPECT_EQ(reads_one - reads_run, 3 * (n_chunks - 1)) << reads_one << " vs " << reads_run;
  for (Rig* r : {&one, &run}) {
    const MemoryReport m = r->ctx->Report();
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvStorageCompressed)], 0);
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvMemCompressed)], 3 * n_chunks);
  }

  // An I/O error: the failing run's chunks all stay on storage, the context is unchanged, and a
  // second attempt gives the same logits.
  {
    FaultEnv env(Env::Default());
    Rig f = make(&env, "co-eio");
    env.fail_reads_after = 0;  // the first read on the swap (whichever run a worker reads first)
    RestoreGenerateStats st;
    Status s = f.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_run, &st);
    EXPECT_EQ(s.code(), Status::kIOError) << s.ToString();
    EXPECT_EQ(f.ctx->history().size(), size_t(kPrompt));
    const MemoryReport m = f.ctx->Report();
    EXPECT_EQ(m.n_kv_lost, 0);
    EXPECT_GE(m.n_kv_chunks[int(UnitState::kKvStorageCompressed)], n_chunks);
    env.fail_reads_after = -1;
    ASSERT_TRUE(f.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po_run, &st).ok());
    EXPECT_EQ(0, std::memcmp(Logits(*one.ctx).data(), Logits(*f.ctx).data(), Logits(*one.ctx).size() * 4));
  }
  // A flipped bit inside a run: that chunk is lost (never read), its neighbours are loaded. One
  // storage worker and no help from compute, so the first read is layer 1's run.
  {
    FaultEnv env(Env::Default());
    Rig f = make(&env, "co-flip");
    env.flip_bit_read_after = 0;
    PipelineOptions po = po_run;
    po.io_threads = 1;
    po.decode_threads = 0;
    po.compute_helps = false;
    RestoreGenerateStats st;
    Status s = f.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po, &st);
    EXPECT_EQ(s.code(), Status::kCorruption) << s.ToString();
    EXPECT_EQ(f.ctx->history().size(), size_t(kPrompt));
    const MemoryReport m = f.ctx->Report();
    EXPECT_EQ(m.n_kv_lost, 1);
    // The lost chunk stays marked on storage; every other chunk, its run's neighbours included,
    // was loaded (layers other than the failed one finish restoring).
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvStorageCompressed)], 1);
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvMemCompressed)], 3 * n_chunks - 1);
    int lost_chunk = -1;
    for (int c = 0; c < n_chunks; ++c)
      if (f.ctx->units().lost(1, c)) lost_chunk = c;
    ASSERT_GE(lost_chunk, 0) << "the first run read was layer 1's";
    // Layer 1's other chunks go back to storage; loading the layer's chunks again as one run
    // that includes the lost chunk fails that one alone and loads every other.
    Plan back;
    for (int c = n_chunks - 1; c >= 0; --c)
      if (c != lost_chunk) back.push_back({UnitRef::Kv(1, c), UnitState::kKvStorageCompressed});
    ASSERT_TRUE(f.ctx->Evict(back, 0, nullptr).ok());
    // The others in file order (back to back: written one after another), the lost one in the
    // middle of them.
    std::vector<std::pair<uint64_t, int>> by_off;
    for (int c = 0; c < n_chunks; ++c) {
      uint64_t off = 0, len = 0;
      if (c != lost_chunk) {
        ASSERT_TRUE(f.ctx->units().StoredExtent(1, c, &off, &len));
        by_off.push_back({off, c});
      }
    }
    uint64_t off = 0, len = 0;
    EXPECT_FALSE(f.ctx->units().StoredExtent(1, lost_chunk, &off, &len)) << "a lost chunk is never coalesced";
    std::sort(by_off.begin(), by_off.end());
    std::vector<int> chunks;
    for (const auto& x : by_off) chunks.push_back(x.second);
    chunks.insert(chunks.begin() + long(chunks.size() / 2), lost_chunk);
    std::vector<UnitTable::LoadSlot> room(static_cast<size_t>(n_chunks));
    std::vector<UnitTable::LoadSlot*> rooms;
    for (int c = 0; c < n_chunks; ++c) rooms.push_back(&room[size_t(c)]);
    const int64_t reads0 = env.n_reads.load();
    s = ContextTestPeer::units(*f.ctx).LoadCompressedRun(1, chunks.data(), rooms.data(), n_chunks);
    EXPECT_EQ(s.code(), Status::kCorruption) << s.ToString();
    // Skipped, the lost chunk does not split the others, whose extents are back to back.
    EXPECT_EQ(env.n_reads.load() - reads0, 1) << "one read for the chunks on both sides of the lost one";
    for (int c = 0; c < n_chunks; ++c)
      EXPECT_EQ(f.ctx->units().state(UnitRef::Kv(1, c)),
                c == lost_chunk ? UnitState::kKvStorageCompressed : UnitState::kKvMemCompressed)
          << "chunk " << c;
    EXPECT_EQ(f.ctx->Report().n_kv_lost, 1);
    // Given in reverse file order (no two back to back), every chunk still loads, one read each.
    ASSERT_TRUE(f.ctx->Evict(back, 0, nullptr).ok());
    std::vector<std::pair<uint64_t, int>> rev;
    for (int c = 0; c < n_chunks; ++c)
      if (c != lost_chunk && f.ctx->units().StoredExtent(1, c, &off, &len)) rev.push_back({off, c});
    ASSERT_EQ(int(rev.size()), n_chunks - 1);
    std::sort(rev.rbegin(), rev.rend());
    std::vector<int> rchunks;
    for (const auto& x : rev) rchunks.push_back(x.second);
    std::vector<UnitTable::LoadSlot> rroom(rchunks.size());
    std::vector<UnitTable::LoadSlot*> rrooms;
    for (auto& r : rroom) rrooms.push_back(&r);
    const int64_t reads1 = env.n_reads.load();
    s = ContextTestPeer::units(*f.ctx).LoadCompressedRun(1, rchunks.data(), rrooms.data(), int(rchunks.size()));
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(env.n_reads.load() - reads1, int64_t(rchunks.size()));
    for (int c : rchunks) EXPECT_EQ(f.ctx->units().state(UnitRef::Kv(1, c)), UnitState::kKvMemCompressed) << c;
  }
}

// mz_decode after an eviction (no restore_generate): chunks compressed on storage come back into
// the in-memory swap as restore_generate brings them, one read per run of back-to-back extents,
// with the same logits; an I/O error leaves the conversation as it was and a retry succeeds; a
// flipped bit loses that chunk alone and fails the call.
TEST(DecodeAfterEviction, LoadsCompressedChunksOneReadPerRun) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const int n_chunks = kRunChunks;
  auto make = [&](FaultEnv* env, const char* tag) { return CompressedOnStorage(path, toks, env, tag); };
  // The reference: the same eviction, restored by restore_generate (one read per chunk).
  FaultEnv env_ref(Env::Default()), env(Env::Default());
  Rig ref = make(&env_ref, "dec-ref");
  PipelineOptions po;
  po.coalesce_bytes = 0;
  ASSERT_TRUE(ref.ctx->RestoreGenerate(toks.data() + kPrompt, 4, po, nullptr).ok());

  Rig d = make(&env, "dec-run");
  const int64_t reads0 = env.n_reads.load();
  ASSERT_TRUE(d.ctx->Decode(toks.data() + kPrompt, 4, false).ok());
  EXPECT_EQ(env.n_reads.load() - reads0, 3) << "one read per layer's run of " << n_chunks << " chunks";
  EXPECT_EQ(0, std::memcmp(Logits(*ref.ctx).data(), Logits(*d.ctx).data(), Logits(*ref.ctx).size() * 4));
  EXPECT_EQ(d.ctx->Report().n_kv_chunks[int(UnitState::kKvStorageCompressed)], 0);
  EXPECT_EQ(d.ctx->Report().n_kv_chunks[int(UnitState::kKvMemCompressed)], 3 * n_chunks);

  {  // An I/O error: nothing appended, no chunk lost; the retry gives the same logits.
    FaultEnv fe(Env::Default());
    Rig f = make(&fe, "dec-eio");
    fe.fail_reads_after = 0;
    Status st = f.ctx->Decode(toks.data() + kPrompt, 4, false);
    EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
    EXPECT_EQ(f.ctx->history().size(), size_t(kPrompt));
    EXPECT_EQ(f.ctx->Report().n_kv_lost, 0);
    EXPECT_GE(f.ctx->Report().n_kv_chunks[int(UnitState::kKvStorageCompressed)], n_chunks);
    fe.fail_reads_after = -1;
    ASSERT_TRUE(f.ctx->Decode(toks.data() + kPrompt, 4, false).ok());
    EXPECT_EQ(0, std::memcmp(Logits(*ref.ctx).data(), Logits(*f.ctx).data(), Logits(*ref.ctx).size() * 4));
  }
  {  // A flipped bit: the call fails with kCorruption, that chunk alone is lost, the others loaded.
    FaultEnv fe(Env::Default());
    Rig f = make(&fe, "dec-flip");
    fe.flip_bit_read_after = 0;
    Status st = f.ctx->Decode(toks.data() + kPrompt, 4, false);
    EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
    EXPECT_EQ(f.ctx->history().size(), size_t(kPrompt));
    const MemoryReport m = f.ctx->Report();
    EXPECT_EQ(m.n_kv_lost, 1);
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvStorageCompressed)], 1);
    EXPECT_EQ(m.n_kv_chunks[int(UnitState::kKvMemCompressed)], 3 * n_chunks - 1);
  }
}

// Compute must reach layer 2 and wait there before layer 2 starts restoring.
TEST(RestoreGenerateSync, ComputeWaitsForALayerStillBeingRestored) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const auto want = NeverEvictedLogits(path, "none", toks, "sref");

  Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, "sync");
  ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
  MemoryReport r = s.ctx->Report();
  ASSERT_TRUE(s.ctx->EvictBytes(r.in_memory() / 2, nullptr).ok());  // layers 2, 3 evicted (rear half)
  ASSERT_NE(s.ctx->units().state(UnitRef::Weights(3)), UnitState::kResident);

  std::mutex mu;
  std::condition_variable cv;
  bool compute_waiting_on_3 = false;
  std::atomic<int> restored_before_wait{0};
  SyncPoints::SetCallback("pipeline:wait", [&](int unit) {
    if (unit == 3) {
      std::lock_guard<std::mutex> lk(mu);
      compute_waiting_on_3 = true;
      cv.notify_all();
    }
  });
  SyncPoints::SetCallback("pipeline:before_unit", [&](int key) {
    if (key == 3) {
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return compute_waiting_on_3; });  // hold layer 3 until compute asks for it
    }
  });
  SyncPoints::SetCallback("pipeline:after_unit", [&](int key) {
    std::lock_guard<std::mutex> lk(mu);
    if (key == 3 && !compute_waiting_on_3) restored_before_wait++;
  });
  PipelineOptions po;
  po.overlap = Overlap::kFull;
  // The workers must restore layer 3 while compute waits: a helping compute thread could take
  // layer 3's task itself while waiting for an earlier layer, and block in the hold above.
  po.compute_helps = false;
  RestoreGenerateStats st;
  Status status = s.ctx->RestoreGenerate(toks.data() + kPrompt, 8, po, &st);
  SyncPoints::ClearAll();
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_TRUE(compute_waiting_on_3);
  EXPECT_EQ(restored_before_wait.load(), 0);
  EXPECT_GT(st.wait_s, 0.0);
  EXPECT_EQ(0, std::memcmp(Logits(*s.ctx).data(), want.data(), want.size() * 4));
}

// Reads through the page cache (KV chunks mapped from the swap) are CPU work: while one is pending
// compute must not take every core (cpu_work_done stays false); direct-I/O reads are not (once
// allocation ahead is over, cpu_work_done turns true while the read is still held).
TEST(RestoreGenerateSync, PageCacheReadsCountAsCpuWork) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  for (bool mapped : {true, false}) {
    SCOPED_TRACE(mapped ? "mapped" : "direct I/O");
    Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, mapped ? "cpuw-map" : "cpuw-dio");
    ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
    s.ctx->set_map_swap(mapped);
    Plan p;
    for (int c = kPrompt / 16 - 1; c >= 0; --c) p.push_back({UnitRef::Kv(3, c), UnitState::kKvStorageRaw});
    ASSERT_TRUE(s.ctx->Evict(p, 0, nullptr).ok());
    ASSERT_EQ(s.ctx->units().RestoresByMapping(UnitRef::Kv(3, 0)), mapped);
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    SyncPoints::SetCallback("pipeline:before_unit", [&](int key) {
      std::unique_lock<std::mutex> lk(mu);
      if (key == 3) cv.wait(lk, [&] { return release; });
    });
    PipelineOptions po;
    po.compute_helps = false;
    RestorePipeline pipe(&ContextTestPeer::units(*s.ctx), int(s.model->hparams().n_layer), po);
    ASSERT_TRUE(pipe.Start().ok());
    bool cpu_done = false;
    if (mapped) {
      cpu_done = pipe.cpu_work_done();  // every task is held before it starts
    } else {
      for (int i = 0; i < 200000 && !(cpu_done = pipe.cpu_work_done()); ++i) std::this_thread::yield();
    }
    EXPECT_EQ(cpu_done, !mapped);
    EXPECT_FALSE(pipe.done());
    {
      std::lock_guard<std::mutex> lk(mu);
      release = true;
    }
    cv.notify_all();
    ASSERT_TRUE(pipe.Finish().ok());
    SyncPoints::ClearAll();
    EXPECT_TRUE(pipe.cpu_work_done());
    EXPECT_TRUE(s.ctx->units().AllResident());
    EXPECT_EQ(s.ctx->Report().kv_resident_mapped > 0, mapped);
  }
}

// A pressure handler calling evict while restore_generate runs is refused (kBusy), never tears state.
TEST(RestoreGenerateSync, EvictionDuringGenerationIsRefused) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, "fail");
  ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
  ASSERT_TRUE(s.ctx->EvictBytes(s.ctx->Report().in_memory() / 2, nullptr).ok());
  std::atomic<bool> stop{false};
  Status evict_st;
  SyncPoints::SetCallback("pipeline:before_unit", [&](int key) {
    if (key == 3 && !stop.exchange(true)) evict_st = s.ctx->EvictBytes(1 << 20, nullptr);
  });
  Status status = s.ctx->RestoreGenerate(toks.data() + kPrompt, 8, PipelineOptions(), nullptr);
  SyncPoints::ClearAll();
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(evict_st.code(), Status::kBusy) << "eviction during a generation must be refused: " << evict_st.ToString();
  EXPECT_EQ(int(s.ctx->history().size()), kPrompt + 8);
}

// restore_nice: where the OS grants the raised priority, every restoration thread runs at the
// caller's nice + restore_nice and compute takes all n_threads from the start; where it refuses
// (FaultEnv refuse_nice, as without CAP_SYS_NICE), compute keeps n_threads - 1 as without the
// option. Either way the caller's own priority is left as it was and the output is bit-identical.
TEST(RestoreGenerateSync, RaisedRestorePriorityIsProbedAndFallsBack) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const auto want = NeverEvictedLogits(path, "none", toks, "prio-ref");
  // Can this process lower a thread's nice at all (root, or RLIMIT_NICE)? Probed on a thread of
  // its own so this one keeps its priority.
  bool grantable = false;
  std::thread([&] {
    const int n0 = Env::Default()->ThreadNice();
    grantable = Env::Default()->SetThreadNice(n0 - 5).ok();
  }).join();
  for (bool refuse : {true, false}) {
    SCOPED_TRACE(refuse ? "refused" : "granted");
    if (!refuse && !grantable) GTEST_SKIP() << "this process may not lower a thread's nice: the granted half is not run";
    FaultEnv env(Env::Default());
    env.refuse_nice = refuse;
    Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, "prio", &env);  // n_threads 2 (the default)
    ASSERT_EQ(s.ctx->options().n_threads, 2);
    ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
    ASSERT_TRUE(s.ctx->EvictBytes(s.ctx->Report().in_memory() / 2, nullptr).ok());
    const int base = env.ThreadNice();
    std::mutex mu;
    std::condition_variable cv;
    bool computing = false;  // compute has asked for a layer: the compute thread count is fixed
    std::vector<int> seen;   // the nice of each thread that restored a unit
    // Units are held until compute reaches its first wait, so restoration cannot be over (which
    // gives compute every thread anyway) when the thread count is chosen.
    SyncPoints::SetCallback("pipeline:wait", [&](int) {
      std::lock_guard<std::mutex> lk(mu);
      computing = true;
      cv.notify_all();
    });
    SyncPoints::SetCallback("pipeline:before_unit", [&](int) {
      const int v = env.ThreadNice();
      std::unique_lock<std::mutex> lk(mu);
      seen.push_back(v);
      cv.wait(lk, [&] { return computing; });
    });
    PipelineOptions po;
    po.restore_nice = -5;
    po.compute_helps = false;  // every unit restored by a worker
    RestoreGenerateStats st;
    Status status = s.ctx->RestoreGenerate(toks.data() + kPrompt, 8, po, &st);
    SyncPoints::ClearAll();
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_GT(env.nice_calls.load(), 0);
    EXPECT_EQ(st.pipeline.restore_priority_raised, !refuse);
    EXPECT_EQ(st.compute_threads_during_restore, refuse ? 1 : 2);
    EXPECT_EQ(env.ThreadNice(), base) << "the caller's priority is put back";
    ASSERT_FALSE(seen.empty());
    for (int v : seen) EXPECT_EQ(v, refuse ? base : base - 5);
    EXPECT_EQ(0, std::memcmp(Logits(*s.ctx).data(), want.data(), want.size() * 4));
  }
}

// Threads the OS refuses (Env::StartThread fails, as with EAGAIN under a thread or memory limit)
// cost overlap, never the context: with no restoration thread at all, or only the first one,
// restore_generate in every overlap variant and mz_restore still bring back every unit and give
// the never-evicted logits bit for bit; the refusals are counted.
TEST(RestoreGenerateSync, RefusedThreadsRestoreOnFewerThreads) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Prompt(path);
  const auto want = NeverEvictedLogits(path, "none", toks, "thr-ref");
  struct C {
    int64_t starts;  // threads the OS lets start
    Overlap o;
    bool parallel;
  };
  // Every variant with none; the paths in turn (one coordinating thread) and the allocation thread
  // taking the only thread there is with one.
  const C cases[] = {{0, Overlap::kNone, true},   {0, Overlap::kAllocReload, true}, {0, Overlap::kReloadPrefill, true},
                     {0, Overlap::kFull, true},   {0, Overlap::kFull, false},       {1, Overlap::kFull, true},
                     {1, Overlap::kNone, false},  {1, Overlap::kFull, false}};
  for (const C& c : cases) {
    SCOPED_TRACE(std::string(OverlapName(c.o)) + (c.parallel ? " parallel" : " paths in turn") + ", threads that start: " +
                 std::to_string(c.starts));
    FaultEnv env(Env::Default());
    Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, "thr", &env);
    ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
    ASSERT_TRUE(s.ctx->EvictBytes(s.ctx->Report().in_memory() * 3 / 4, nullptr).ok());
    ASSERT_FALSE(s.ctx->units().AllResident());
    const int before = env.threads_started.load();  // the model's load started its own
    env.fail_threads_after = c.starts;
    PipelineOptions po;
    po.overlap = c.o;
    po.parallel_paths = c.parallel;
    po.decode_threads = 2;
    RestoreGenerateStats st;
    Status status = s.ctx->RestoreGenerate(toks.data() + kPrompt, 8, po, &st);
    env.fail_threads_after = -1;
    ASSERT_TRUE(status.ok()) << status.ToString();
    EXPECT_TRUE(s.ctx->units().AllResident());
    EXPECT_GT(st.pipeline.threads_refused, 0);
    EXPECT_EQ(st.pipeline.threads_refused, env.threads_refused.load());
    EXPECT_LE(env.threads_started.load() - before, c.starts);
    EXPECT_EQ(0, std::memcmp(Logits(*s.ctx).data(), want.data(), want.size() * 4)) << "logits differ";
  }
  // mz_restore (the restore executor's kAll mode on several threads) with none of its helpers started.
  FaultEnv env(Env::Default());
  Rig s = MakeCtx(path, "none", EvictOrder::kBackwardOut, false, "thr-all", &env);
  ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
  ASSERT_TRUE(s.ctx->EvictBytes(UINT64_MAX, nullptr).ok());
  const int before = env.threads_started.load();
  env.fail_threads_after = 0;
  Status st = s.ctx->Restore();
  env.fail_threads_after = -1;
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(s.ctx->units().AllResident());
  EXPECT_EQ(env.threads_started.load(), before);
  EXPECT_GT(env.threads_refused.load(), 0) << "mz_restore's helpers were never asked for";
  ASSERT_TRUE(s.ctx->Decode(toks.data() + kPrompt, 8, false).ok());
  EXPECT_EQ(0, std::memcmp(Logits(*s.ctx).data(), want.data(), want.size() * 4)) << "logits differ after mz_restore";
}

// The policy's unit times follow the context's restore paths: q8 read in place (attend_compressed)
// costs the profile's in-place figure, switching either it or cost_restore_paths off gives the
// paper's decode + allocation; mapped KV is assumed from the options before the swap file exists
// and from the file once it does.
TEST(PolicyInputFromContext, UnitTimesFollowTheRestorePaths) {
  const std::string path = test::ModelPath("tiny-qwen3");
  Rig s = MakeCtx(path, "q8", EvictOrder::kBackwardOut, false, "costs");
  DeviceProfile p = DeviceProfile::Default();
  p.attend_in_place_s_per_MiB = {{"q8", 3e-5}};
  p.alloc_s_per_MiB = 1e-3;
  p.mapped_read_Bps = 2e9;
  s.ctx->set_profile(p);
  const double chunk_mib = double(s.ctx->kv().geometry().chunk_bytes()) / 1048576.0;
  const double decoded = chunk_mib / p.DecodeBps("q8") * 1048576.0 + p.alloc_s_per_MiB * chunk_mib;
  EXPECT_NEAR(s.ctx->MakePolicyInput(1).t.t_d_kv, std::max(1e-6, 3e-5 * chunk_mib), 1e-12);
  s.ctx->set_attend_compressed(false);
  EXPECT_NEAR(s.ctx->MakePolicyInput(1).t.t_d_kv, decoded, 1e-12);
  s.ctx->set_attend_compressed(true);
  s.ctx->set_cost_restore_paths(false);
  const PolicyInput paper = s.ctx->MakePolicyInput(1);
  EXPECT_NEAR(paper.t.t_d_kv, decoded, 1e-12);
  EXPECT_GT(paper.t.t_r_kv, p.alloc_s_per_MiB * chunk_mib) << "the paper's t_r^KV carries the allocation term";
  s.ctx->set_cost_restore_paths(true);

  // Mapped KV: from the options before any swap file exists, from the file afterwards (a file
  // system refusing direct I/O, such as tmpfs, turns it off).
  EXPECT_TRUE(s.ctx->units().KvStorageMapped());
  EXPECT_NEAR(s.ctx->MakePolicyInput(1).t.t_r_kv, chunk_mib * 1048576.0 / p.mapped_read_Bps, 1e-12);
  const auto toks = Prompt(path);
  ASSERT_TRUE(s.ctx->Decode(toks.data(), kPrompt, false).ok());
  Plan plan{{UnitRef::Kv(0, 0), UnitState::kKvStorageRaw}};
  ASSERT_TRUE(s.ctx->Evict(plan, 0, nullptr).ok());
  struct statfs fs;
  ASSERT_EQ(statfs(test::TempDir().c_str(), &fs), 0);
  const bool tmpfs = fs.f_type == 0x01021994;  // TMPFS_MAGIC: no O_DIRECT, so no mapping
  EXPECT_EQ(s.ctx->units().KvStorageMapped(), !tmpfs);
}

}  // namespace
}  // namespace mz
