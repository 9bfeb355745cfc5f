// The third way (issue 49; docs/residency.md "Repacked weights"): layer units held in ggml's
// repacked layout (ModelOptions::repack), given back one layer at a time and re-made from the file
// (read + repack) on restore. Checks: repacked logits agree with the file layout's (different
// accumulation order: within a tolerance); a repacked unit is anonymous memory the kernel really
// holds, and dropping it returns it; a layer given back and re-made computes bit for bit what it
// computed before; a file truncated before a re-make gives a clear error and loses nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "env/fault_env.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "memory/unit_table.h"
#include "model/model.h"
#include "model/repack.h"
#include "policy/device_profile.h"
#include "runtime/context.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr int kPrompt = 96;
constexpr int kChunk = 32;

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Fixture Make(Env* env, const std::string& path, bool repack, const std::string& swap_name,
             WeightMemory weights = WeightMemory::kPageCache) {
  Fixture f;
  ModelOptions mo;
  mo.repack = repack;
  mo.weights = weights;
  Status st = Model::Load(env, path, mo, &f.model);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return f;
  ContextOptions co;
  co.n_ctx = 512;
  co.kv_chunk_tokens = kChunk;
  co.swap_path = test::TempDir() + "/" + swap_name + ".swap";
  f.ctx = std::make_unique<Context>(f.model.get(), co);
  EXPECT_TRUE(f.ctx->Init().ok());
  return f;
}

std::vector<float> LastLogits(Context& ctx) {
  const int nv = int(ctx.model()->hparams().n_vocab);
  const float* l = ctx.logits(ctx.n_logit_rows() - 1);
  return l ? std::vector<float>(l, l + nv) : std::vector<float>();
}

std::vector<float> DecodeLogits(Context& ctx, const std::vector<int32_t>& toks) {
  Status st = ctx.Decode(toks.data(), int(toks.size()), false);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return LastLogits(ctx);
}

std::string Q4Model() { return test::ModelPath("tiny-qwen3", "q4_0"); }

// This CPU has a repacked Q4_0 kernel for the model's matrices (AVX2, or ARM with dotprod/i8mm).
bool HasRepack(const Model& m) { return m.n_repack_units() == int(m.hparams().n_layer); }

TEST(Repack, LayerUnitsAreRepackedAnonymousAndTheKernelHoldsThem) {
  Fixture f = Make(Env::Default(), Q4Model(), true, "rp-units");
  ASSERT_TRUE(f.model);
  if (!HasRepack(*f.model)) GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
  const int L = int(f.model->hparams().n_layer);
  EXPECT_FALSE(f.model->file_backed());
  for (int u = 0; u < L; ++u) {
    const WeightUnit& w = f.model->unit(u);
    EXPECT_TRUE(w.repacked) << u;
    EXPECT_EQ(w.backing, WeightMemory::kAnonymous) << u;
    EXPECT_EQ(w.n_repack, 7) << u;  // q, k, v, o, gate, up, down
    for (const TensorExtent& e : w.tensors) {
      EXPECT_EQ(e.tensor->buffer == RepackTagBuffer(), e.repack) << e.tensor->name;
      EXPECT_EQ(e.tensor->extra != nullptr, e.repack) << e.tensor->name;
    }
  }
  EXPECT_FALSE(f.model->unit(f.model->base_unit()).repacked);  // embeddings: GET_ROWS, file form
  // "Resident means resident": every byte the table counts resident, the kernel holds.
  KernelResidency k;
  ASSERT_TRUE(f.ctx->MeasureInRam(&k).ok());
  EXPECT_GT(k.weights_counted, 0u);
  EXPECT_EQ(k.weights_in_ram, k.weights_counted);
  // Giving a layer back returns its anonymous memory: the table and the kernel agree it is gone.
  const MemoryReport before = f.ctx->Report();
  ASSERT_TRUE(f.ctx->Evict({{UnitRef::Weights(L - 1), UnitState::kWeightsDropped}}, 0, nullptr).ok());
  const MemoryReport after = f.ctx->Report();
  EXPECT_EQ(before.weights_resident - after.weights_resident, f.model->unit(L - 1).region_bytes);
  KernelResidency k2;
  ASSERT_TRUE(f.ctx->MeasureInRam(&k2).ok());
  EXPECT_EQ(k.weights_counted - k2.weights_counted, f.model->unit(L - 1).region_bytes);
  EXPECT_EQ(k2.weights_in_ram, k2.weights_counted);
  EXPECT_EQ(f.model->unit(L - 1).tensors[0].tensor->data, nullptr);
}

// One matmul, repacked vs ggml's generic kernel for the type, on random Q4_0 weights: the same
// q8_0 products summed in another order, so within float rounding of the result (GEMV for 1
// column, GEMM for more). This bounds what the model-level comparison below may show per matmul.
TEST(Repack, OneMatmulAgreesWithTheGenericKernel) {
  constexpr int64_t K = 512, N = 64;
  ggml_init_params ip{8 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
  for (int64_t cols : {1, 5, 16}) {
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* w_plain = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, K, N);
    ggml_tensor* w_rp = ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, K, N);
    ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, cols);
    if (!CanRepack(w_rp)) {
      ggml_free(ctx);
      GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
    }
    std::mt19937 rng(42 + int(cols));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> wf(size_t(K * N)), xf(size_t(K * cols));
    for (float& v : wf) v = u(rng);
    for (float& v : xf) v = u(rng);
    std::vector<uint8_t> wq(ggml_nbytes(w_plain));
    ggml_quantize_chunk(GGML_TYPE_Q4_0, wf.data(), wq.data(), 0, N, K, nullptr);
    void* rp_mem = Env::Default()->MapAnon(ggml_nbytes(w_rp));
    ASSERT_NE(rp_mem, nullptr);
    RepackInto(w_rp, rp_mem, wq.data());
    EXPECT_NE(std::memcmp(rp_mem, wq.data(), wq.size()), 0) << "the layout changed";
    ggml_tensor* y_plain = ggml_mul_mat(ctx, w_plain, x);
    ggml_tensor* y_rp = ggml_mul_mat(ctx, w_rp, x);
    ggml_cgraph* gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y_plain);
    ggml_build_forward_expand(gf, y_rp);
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);  // all but w_rp (has data)
    ASSERT_NE(buf, nullptr);
    ggml_backend_tensor_set(w_plain, wq.data(), 0, wq.size());
    ggml_backend_tensor_set(x, xf.data(), 0, xf.size() * sizeof(float));
    ASSERT_EQ(ggml_backend_graph_compute(be, gf), GGML_STATUS_SUCCESS);
    std::vector<float> a(size_t(N * cols)), b(a.size());
    ggml_backend_tensor_get(y_plain, a.data(), 0, a.size() * sizeof(float));
    ggml_backend_tensor_get(y_rp, b.data(), 0, b.size() * sizeof(float));
    float worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::fabs(a[i] - b[i]));
      scale = std::max(scale, std::fabs(a[i]));
    }
    EXPECT_GT(scale, 1.f);
    EXPECT_LE(worst, 1e-4f * scale) << cols << " columns: max |repacked - generic| " << worst << " of " << scale;
    const size_t rp_bytes = ggml_nbytes(w_rp);
    UnbindRepacked(w_rp);  // before ggml_free: the tensor lives in ctx
    ggml_backend_buffer_free(buf);
    ggml_backend_free(be);
    ggml_free(ctx);
    Env::Default()->Unmap(rp_mem, rp_bytes);
  }
}

TEST(Repack, LogitsAgreeWithTheFileLayout) {
  const auto toks = test::PromptTokens(Q4Model(), kPrompt);
  Fixture rp = Make(Env::Default(), Q4Model(), true, "rp-logits-a");
  Fixture fb = Make(Env::Default(), Q4Model(), false, "rp-logits-b");
  ASSERT_TRUE(rp.model && fb.model);
  if (!HasRepack(*rp.model)) GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
  EXPECT_EQ(fb.model->n_repack_units(), 0);
  const std::vector<float> a = DecodeLogits(*rp.ctx, toks), b = DecodeLogits(*fb.ctx, toks);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  // The repacked GEMM/GEMV sums the same q8_0-quantized products in another order: the logits
  // differ by rounding, not by meaning. Bound: 1% of the logits' range, and the same argmax.
  float lo = b[0], hi = b[0], worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    lo = std::min(lo, b[i]), hi = std::max(hi, b[i]);
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  }
  RecordProperty("max_abs_diff", std::to_string(worst));
  RecordProperty("logit_range", std::to_string(hi - lo));
  EXPECT_LE(worst, 0.01f * (hi - lo)) << "max |repacked - file layout| " << worst << " over range " << hi - lo;
  EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin());
}

// A layer given back and re-made from the file (read + repack, through the restore executor)
// computes bit for bit what it computed before; so does the pipeline's restore before a query.
// Q4_0 and Q4_K (both repacked 8x8 on AVX2; 4x4 / 8x4 on ARM with dotprod).
class RepackTypes : public ::testing::TestWithParam<std::string> {};

TEST_P(RepackTypes, GivenBackAndReMadeLayersGiveTheSameLogitsBitForBit) {
  const std::string path = test::ModelPath("tiny-qwen3", GetParam());
  const auto toks = test::PromptTokens(path, kPrompt);
  const std::vector<int32_t> q(toks.begin(), toks.begin() + 8);
  Fixture ref = Make(Env::Default(), path, true, "rp-bit-ref-" + GetParam());
  Fixture f = Make(Env::Default(), path, true, "rp-bit-" + GetParam());
  ASSERT_TRUE(ref.model && f.model);
  if (!HasRepack(*f.model)) GTEST_SKIP() << "no repacked " << GetParam() << " kernel on this CPU";
  const int L = int(f.model->hparams().n_layer);
  DecodeLogits(*ref.ctx, toks);
  DecodeLogits(*f.ctx, toks);
  Plan p;
  for (int l = 0; l < L; ++l) p.push_back({UnitRef::Weights(l), UnitState::kWeightsDropped});
  ASSERT_TRUE(f.ctx->Evict(p, 0, nullptr).ok());
  EXPECT_EQ(f.ctx->Report().n_weight_units[int(UnitState::kWeightsDropped)], L);
  RestoreGenerateStats rs;
  Status st = f.ctx->RestoreGenerate(q.data(), int(q.size()), PipelineOptions(), &rs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int l = 0; l < L; ++l) EXPECT_TRUE(f.model->unit(l).repacked) << "re-made repacked: layer " << l;
  const std::vector<float> got = LastLogits(*f.ctx);
  ASSERT_TRUE(ref.ctx->RestoreGenerate(q.data(), int(q.size()), PipelineOptions(), nullptr).ok());
  EXPECT_EQ(got, LastLogits(*ref.ctx)) << "re-made layers: bit for bit";
  // Again through Evict + Restore (the plain restore path), one layer.
  ASSERT_TRUE(f.ctx->Evict({{UnitRef::Weights(0), UnitState::kWeightsDropped}}, 0, nullptr).ok());
  ASSERT_TRUE(f.ctx->Restore().ok());
  const std::vector<int32_t> one{toks[9]};
  ASSERT_TRUE(f.ctx->Decode(one.data(), 1, false).ok());
  ASSERT_TRUE(ref.ctx->Decode(one.data(), 1, false).ok());
  EXPECT_EQ(LastLogits(*f.ctx), LastLogits(*ref.ctx));
}

INSTANTIATE_TEST_SUITE_P(Repack, RepackTypes, ::testing::Values("q4_0", "q4_k"));

// The model file truncated while a layer is given back: the re-make is refused with an error
// naming the file, the layer stays given back (nothing half-made), and the rest keeps working.
TEST(Repack, TruncatedFileDuringReMakeIsAClearError) {
  const std::string copy = test::TempDir() + "/rp-trunc.gguf";
  ASSERT_EQ(std::system(("cp '" + Q4Model() + "' '" + copy + "'").c_str()), 0);
  Fixture f = Make(Env::Default(), copy, true, "rp-trunc");
  ASSERT_TRUE(f.model);
  if (!HasRepack(*f.model)) GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
  const int L = int(f.model->hparams().n_layer);
  ASSERT_TRUE(f.ctx->Evict({{UnitRef::Weights(L - 1), UnitState::kWeightsDropped}}, 0, nullptr).ok());
  ASSERT_EQ(truncate(copy.c_str(), off_t(f.model->identity().size / 2)), 0);
  Status st = f.ctx->Restore();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::kModelChanged) << st.ToString();
  EXPECT_NE(st.message().find(copy), std::string::npos) << st.ToString();
  EXPECT_FALSE(f.model->unit(L - 1).resident());
  EXPECT_EQ(f.ctx->Report().n_weight_units[int(UnitState::kWeightsDropped)], 1);
  EXPECT_TRUE(f.model->unit(0).repacked);
  std::remove(copy.c_str());
}

// A read that comes back short while re-making (anonymous file form: direct reads): kCorruption
// "model file truncated", the unit stays dropped, and a later restore (reads whole again) re-makes
// it bit for bit.
TEST(Repack, ShortReadDuringReMakeIsAClearErrorAndLosesNothing) {
  const auto toks = test::PromptTokens(Q4Model(), kPrompt);
  FaultEnv env(Env::Default());
  env.path_filter = ".gguf";
  Fixture f = Make(&env, Q4Model(), true, "rp-short", WeightMemory::kAnonymous);
  Fixture ref = Make(Env::Default(), Q4Model(), true, "rp-short-ref");
  ASSERT_TRUE(f.model && ref.model);
  if (!HasRepack(*f.model)) GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
  DecodeLogits(*f.ctx, toks);
  DecodeLogits(*ref.ctx, toks);
  ASSERT_TRUE(f.ctx->Evict({{UnitRef::Weights(1), UnitState::kWeightsDropped}}, 0, nullptr).ok());
  env.short_reads_after = 0;
  Status st = f.ctx->Restore();
  env.short_reads_after = -1;
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.ToString();
  EXPECT_FALSE(f.model->unit(1).resident());
  ASSERT_TRUE(f.ctx->Restore().ok());
  EXPECT_TRUE(f.model->unit(1).repacked);
  const std::vector<int32_t> one{toks[3]};
  ASSERT_TRUE(f.ctx->Decode(one.data(), 1, false).ok());
  ASSERT_TRUE(ref.ctx->Decode(one.data(), 1, false).ok());
  EXPECT_EQ(LastLogits(*f.ctx), LastLogits(*ref.ctx));
}

// The policy costs re-making a repacked layer: the profile's repack throughput for the layer's
// repacked types on top of the read (DeriveUnitTimes, RestorePaths::weights_repacked).
TEST(Repack, PolicyCostsTheRepackOfAReMadeLayer) {
  Fixture f = Make(Env::Default(), Q4Model(), true, "rp-cost");
  ASSERT_TRUE(f.model);
  if (!HasRepack(*f.model)) GTEST_SKIP() << "no repacked Q4_0 kernel on this CPU";
  DeviceProfile p = DeviceProfile::Default();
  p.repack_Bps.clear();
  f.ctx->set_profile(p);
  const double without = f.ctx->MakePolicyInput(1).t.t_r_w;
  p.repack_Bps = {{"q4_0", 1e6}};
  f.ctx->set_profile(p);
  const double with = f.ctx->MakePolicyInput(1).t.t_r_w;
  uint64_t repacked = 0;
  for (const TensorExtent& e : f.model->unit(0).tensors)
    if (e.repack) repacked += e.bytes;
  ASSERT_GT(repacked, 0u);
  EXPECT_NEAR(with - without, double(repacked) / 1e6, 1e-9);
}

}  // namespace
}  // namespace mz
