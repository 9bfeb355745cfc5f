// "Resident must mean resident" (issue 23): the unit table agrees with the kernel. Units whose
// pages the kernel took back (played by a FaultEnv, and for real with MADV_PAGEOUT) are counted
// evicted before a restore_generate, a restore-ahead slice or a policy eviction, restored front
// first by the pipeline, and the answer is bit for bit the never-evicted one.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <memory>
#include <set>
#include <vector>

#include "env/fault_env.h"
#include "memory/unit_table.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr int kPrompt = 200;
constexpr int kChunk = 32;

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Fixture Make(Env* env, const std::vector<int32_t>& toks, const std::string& swap_name, uint64_t min_missing = 4096,
             const std::string& model_path = test::ModelPath("tiny-qwen3")) {
  Fixture f;
  Status st = Model::Load(env, model_path, ModelOptions(), &f.model);
  EXPECT_TRUE(st.ok()) << st.ToString();
  ContextOptions co;
  co.n_ctx = 1024;
  co.kv_chunk_tokens = kChunk;
  co.swap_path = test::TempDir() + "/" + swap_name + ".swap";
  co.reconcile_min_missing = min_missing;
  f.ctx = std::make_unique<Context>(f.model.get(), co);
  EXPECT_TRUE(f.ctx->Init().ok());
  st = f.ctx->Decode(toks.data(), int(toks.size()), false);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return f;
}

std::vector<float> QueryLogits(Context& ctx, const std::vector<int32_t>& q, RestoreGenerateStats* rs) {
  Status st = ctx.RestoreGenerate(q.data(), int(q.size()), PipelineOptions(), rs);
  EXPECT_TRUE(st.ok()) << st.ToString();
  const int nv = int(ctx.model()->hparams().n_vocab);
  const float* l = ctx.logits(ctx.n_logit_rows() - 1);
  return l ? std::vector<float>(l, l + nv) : std::vector<float>();
}

// Every full KV chunk of `layers` to storage raw and back: they are then mappings of their swap
// extents (clean), the kind of KV page the kernel can reclaim.
void MapChunksFromSwap(Context& ctx, const std::vector<int>& layers) {
  Plan p;
  for (int l : layers)
    for (int c = 0; c < kPrompt / kChunk; ++c) p.push_back({UnitRef::Kv(l, c), UnitState::kKvStorageRaw});
  ASSERT_TRUE(ctx.Evict(p, 0, nullptr).ok());
  ASSERT_TRUE(ctx.Restore().ok());
  ASSERT_EQ(ctx.Report().kv_resident_mapped, uint64_t(layers.size()) * (kPrompt / kChunk) * ctx.kv().geometry().chunk_bytes());
}

// A FaultEnv hook that reports the given address ranges as taken by the kernel (half their pages
// missing), everything else as the real mincore says.
struct KernelTakes {
  std::vector<std::pair<const char*, size_t>> ranges;
  void Install(FaultEnv* env) {
    env->resident_bytes = [this, env](const void* p, size_t n, uint64_t* out) -> Status {
      const char* c = static_cast<const char*>(p);
      for (const auto& r : ranges)
        if (c >= r.first && c < r.first + r.second) {
          *out = (n / 2) & ~uint64_t(4095);
          return Status::Ok();
        }
      return env->EnvWrapper::ResidentBytes(p, n, out);
    };
  }
};

TEST(Residency, UnitsTheKernelTookAreRestoredByThePipelineNotFaulted) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt + 8);
  const std::vector<int32_t> ctx_toks(toks.begin(), toks.begin() + kPrompt), q(toks.begin() + kPrompt, toks.end());
  Fixture ref = Make(Env::Default(), ctx_toks, "res-ref");
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, ctx_toks, "res");
  MapChunksFromSwap(*f.ctx, {2, 3});
  const int L = int(f.model->hparams().n_layer);
  ASSERT_GE(L, 4);

  // The kernel takes weight units 2 and 3, the mapped chunks of layer 3 and anonymous chunks of layer 0.
  KernelTakes k;
  for (int u : {2, 3}) k.ranges.push_back({static_cast<const char*>(f.model->unit(u).region), f.model->unit(u).region_bytes});
  const size_t cb = f.ctx->kv().geometry().chunk_bytes();
  for (int c = 0; c < kPrompt / kChunk; ++c) {
    k.ranges.push_back({reinterpret_cast<const char*>(f.ctx->kv().chunk(3, c)), cb});
    k.ranges.push_back({reinterpret_cast<const char*>(f.ctx->kv().chunk(0, c)), cb});
  }
  k.Install(&env);
  KernelResidency kr;
  ASSERT_TRUE(f.ctx->MeasureInRam(&kr).ok());
  EXPECT_GT(kr.missing(), 0u);
  EXPECT_LT(kr.in_ram(), kr.counted());
  EXPECT_DOUBLE_EQ(f.ctx->Report().remaining(true), 1.0) << "the table alone still counts everything resident";

  RestoreGenerateStats rs;
  const std::vector<float> got = QueryLogits(*f.ctx, q, &rs);
  env.resident_bytes = nullptr;
  EXPECT_EQ(rs.reconciled.weight_units, 2);
  EXPECT_EQ(rs.reconciled.kv_chunks, kPrompt / kChunk) << "the clean mapped chunks of layer 3";
  EXPECT_GT(rs.reconciled.unreconciled_missing, 0u) << "anonymous chunks of layer 0 cannot move (no copy on storage)";
  EXPECT_EQ(rs.kernel_missing_at_start, rs.reconciled.missing + rs.reconciled.unreconciled_missing);
  EXPECT_EQ(rs.kernel_missing_at_start, kr.missing());
  EXPECT_LT(rs.remaining_at_start, 1.0) << "remaining is the kernel's count once reconciled";
  EXPECT_GT(rs.pipeline.units, 0) << "the pipeline restored what the kernel took";
  EXPECT_TRUE(f.ctx->units().AllResident());
  EXPECT_EQ(got, QueryLogits(*ref.ctx, q, nullptr)) << "reconciled and restored: bit for bit";
}

TEST(Residency, OffTrustsTheTable) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt + 8);
  const std::vector<int32_t> ctx_toks(toks.begin(), toks.begin() + kPrompt), q(toks.begin() + kPrompt, toks.end());
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, ctx_toks, "res-off", /*min_missing=*/0);
  int calls = 0;
  env.resident_bytes = [&calls](const void*, size_t, uint64_t* out) {
    ++calls;
    *out = 0;
    return Status::Ok();
  };
  RestoreGenerateStats rs;
  QueryLogits(*f.ctx, q, &rs);
  uint64_t freed = 0;
  ASSERT_TRUE(f.ctx->EvictBytes(1 << 20, &freed).ok());
  EXPECT_EQ(calls, 0) << "reconcile off: the kernel is not asked";
  EXPECT_EQ(rs.reconciled.weight_units + rs.reconciled.kv_chunks, 0);
  EXPECT_DOUBLE_EQ(rs.remaining_at_start, 1.0);
  env.resident_bytes = nullptr;
}

TEST(Residency, BelowTheThresholdAUnitStaysResident) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt + 8);
  const std::vector<int32_t> ctx_toks(toks.begin(), toks.begin() + kPrompt), q(toks.begin() + kPrompt, toks.end());
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, ctx_toks, "res-thr", /*min_missing=*/uint64_t(1) << 40);
  KernelTakes k;
  k.ranges.push_back({static_cast<const char*>(f.model->unit(1).region), f.model->unit(1).region_bytes});
  k.Install(&env);
  RestoreGenerateStats rs;
  QueryLogits(*f.ctx, q, &rs);
  env.resident_bytes = nullptr;
  EXPECT_EQ(rs.reconciled.weight_units, 0);
  EXPECT_GT(rs.reconciled.unreconciled_missing, 0u);
  EXPECT_GT(rs.kernel_missing_at_start, 0u);
}

TEST(Residency, EvictionFreesMemoryThatIsReallyThere) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt);
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, toks, "res-evict");
  const int L = int(f.model->hparams().n_layer);
  KernelTakes k;
  for (int u = 0; u < L; ++u)
    k.ranges.push_back({static_cast<const char*>(f.model->unit(u).region), f.model->unit(u).region_bytes});
  k.Install(&env);
  const MemoryReport before = f.ctx->Report();
  uint64_t freed = 0;
  ASSERT_TRUE(f.ctx->EvictBytes(1 << 20, &freed).ok());
  env.resident_bytes = nullptr;
  const MemoryReport after = f.ctx->Report();
  // Every layer's weights were taken by the kernel: the table now says so, and the megabyte freed
  // came from what was still there (KV, the base unit), not from units already gone.
  EXPECT_GE(after.n_weight_units[int(UnitState::kWeightsDropped)], L);
  EXPECT_GE(freed, uint64_t(1) << 20);
  EXPECT_LT(after.kv_resident + after.base_resident, before.kv_resident + before.base_resident);
  ASSERT_TRUE(f.ctx->Restore().ok());
  EXPECT_TRUE(f.ctx->units().AllResident());
}

TEST(Residency, RestoreAheadRestoresWhatTheKernelTook) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt);
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, toks, "res-ahead");
  KernelTakes k;
  k.ranges.push_back({static_cast<const char*>(f.model->unit(0).region), f.model->unit(0).region_bytes});
  k.Install(&env);
  uint64_t restored = 0;
  ASSERT_TRUE(f.ctx->TryRestoreUpTo(uint64_t(1) << 40, &restored).ok());
  env.resident_bytes = nullptr;
  EXPECT_EQ(restored, f.model->unit(0).region_bytes) << "unit 0 was taken by the kernel: restore-ahead brings it back";
  EXPECT_TRUE(f.ctx->units().AllResident());
}

// The real kernel: MADV_PAGEOUT reclaims the clean file pages of weight units, as a memory cgroup
// at its limit does. The next restore_generate finds them (mincore) and restores them.
TEST(Residency, RealKernelReclaimIsFoundAndRestored) {
  const auto toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), kPrompt + 8);
  const std::vector<int32_t> ctx_toks(toks.begin(), toks.begin() + kPrompt), q(toks.begin() + kPrompt, toks.end());
  // A private copy of the model: MADV_PAGEOUT leaves a page another mapping holds (another test
  // process running in parallel maps the shared test model).
  const std::string copy = test::TempDir() + "/residency-real-" + std::to_string(getpid()) + ".gguf";
  {
    std::ifstream in(test::ModelPath("tiny-qwen3"), std::ios::binary);
    std::ofstream out(copy, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    ASSERT_TRUE(out.good());
  }
  {  // written back: MADV_PAGEOUT reclaims clean pages only
    const int fd = open(copy.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
  }
  std::vector<float> want;
  {  // the reference first, then gone: a page another mapping holds is not reclaimed by MADV_PAGEOUT
    Fixture ref = Make(Env::Default(), ctx_toks, "res-real-ref", 4096, copy);
    want = QueryLogits(*ref.ctx, q, nullptr);
  }
  Fixture f = Make(Env::Default(), ctx_toks, "res-real", 4096, copy);
  if (f.model->weight_memory() != WeightMemory::kPageCache) GTEST_SKIP() << "weights are not in the page cache here";
  const int L = int(f.model->hparams().n_layer);
  for (int u = L / 2; u < L; ++u) {
    const WeightUnit& w = f.model->unit(u);
#ifdef MADV_PAGEOUT
    if (madvise(w.region, w.region_bytes, MADV_PAGEOUT) != 0) GTEST_SKIP() << "MADV_PAGEOUT refused";
#else
    GTEST_SKIP() << "no MADV_PAGEOUT";
#endif
  }
  KernelResidency kr;
  ASSERT_TRUE(f.ctx->MeasureInRam(&kr).ok());
  if (kr.weights_in_ram == kr.weights_counted) GTEST_SKIP() << "the kernel kept every page (shared with another mapping?)";
  RestoreGenerateStats rs;
  const std::vector<float> got = QueryLogits(*f.ctx, q, &rs);
  EXPECT_GT(rs.reconciled.weight_units, 0);
  EXPECT_GT(rs.kernel_missing_at_start, 0u);
  ASSERT_TRUE(f.ctx->MeasureInRam(&kr).ok());
  EXPECT_EQ(kr.missing(), 0u) << "after the call every unit counted resident is in RAM";
  EXPECT_EQ(got, want);
  f = Fixture();
  std::remove(copy.c_str());
}

}  // namespace
}  // namespace mz
