// Differential test: mzcache's logits and greedy tokens against libllama (the pinned llama.cpp) on
// the same synthesized GGUF and the same prompt of 640 real-text tokens (crossing KV chunk and
// ubatch boundaries), for each architecture.
//
// Tolerance. Two correct implementations differ by rounding: llama.cpp's flash-attention and
// repacked-GEMM path and its plain path differ from each other, and mzcache (f32 Q, streamed fp16
// K/V, online softmax, unrepacked weights) differs from both. Random weights amplify rounding
// through the layers (there is no trained structure to damp it), so the natural scale is measured,
// not assumed: the test computes D_self = max over positions of max|logit diff| / std(logits)
// between llama.cpp's two configurations, and requires mzcache's distance to llama.cpp's plain
// configuration to be (a) under kTolRel = 0.15 and (b) under 2 x D_self + 0.01. A wrong RoPE, mask,
// norm or GQA mapping is far outside this (measured: swapping NEOX and NORM RoPE gives 4.4-4.8).
// Greedy tokens must agree wherever the reference's top-1 margin exceeds 2 x the worst logit
// difference measured over the prompt (a flip is then impossible unless something is wrong).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "llama.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace mz {
namespace {

struct Ref {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  ~Ref() {
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
};

double Std(const float* x, int n) {
  double m = 0, s = 0;
  for (int i = 0; i < n; ++i) m += x[i];
  m /= n;
  for (int i = 0; i < n; ++i) s += (x[i] - m) * (x[i] - m);
  return std::sqrt(s / n);
}

std::pair<int, double> TopMargin(const float* x, int n) {
  int a = ArgMax(x, n);
  float second = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (i != a) second = std::max(second, x[i]);
  return {a, double(x[a]) - second};
}

// llama.cpp's logits for `toks` (positions 0..n-1) in ubatches of `ubatch`, for the positions
// >= first_out (all positions when 0), into out[(pos - first_out) * n_vocab]. fa: flash attention;
// repack: llama.cpp's repacked weight buffers. The positions with logits go in their own batches.
void LlamaLogits(const std::string& path, const std::vector<int32_t>& toks, int n_ctx, int ubatch, int first_out,
                 bool fa, bool repack, std::vector<float>* out) {
  Ref r;
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = repack;
  r.model = llama_model_load_from_file(path.c_str(), mp);
  ASSERT_NE(r.model, nullptr);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(n_ctx);
  cp.n_batch = uint32_t(std::max(ubatch, int(toks.size()) - first_out));
  cp.n_ubatch = uint32_t(ubatch);
  cp.n_threads = cp.n_threads_batch = 2;
  cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  r.ctx = llama_init_from_model(r.model, cp);
  ASSERT_NE(r.ctx, nullptr);
  const int n = int(toks.size()), nv = llama_vocab_n_tokens(llama_model_get_vocab(r.model));
  llama_batch batch = llama_batch_init(int(cp.n_batch), 0, 1);
  for (int off = 0; off < n;) {
    const int end = off < first_out ? std::min(off + ubatch, first_out) : n;
    for (int i = off; i < end; ++i) {
      batch.token[i - off] = toks[size_t(i)];
      batch.pos[i - off] = i;
      batch.n_seq_id[i - off] = 1;
      batch.seq_id[i - off][0] = 0;
      batch.logits[i - off] = i >= first_out;
    }
    batch.n_tokens = end - off;
    ASSERT_EQ(llama_decode(r.ctx, batch), 0);
    off = end;
  }
  out->resize(size_t(n - first_out) * size_t(nv));
  for (int i = 0; i < n - first_out; ++i) std::copy_n(llama_get_logits_ith(r.ctx, i), nv, out->data() + size_t(i) * nv);
  llama_batch_free(batch);
}

// Max over n_pos positions of max|a - b| / std(b); *where (optional) receives the position.
double MaxRelDiff(const float* a_all, const float* b_all, int n_pos, int nv, int* where = nullptr) {
  double worst = 0;
  for (int i = 0; i < n_pos; ++i) {
    const float* a = a_all + size_t(i) * nv;
    const float* b = b_all + size_t(i) * nv;
    double md = 0;
    for (int v = 0; v < nv; ++v) md = std::max(md, double(std::fabs(a[v] - b[v])));
    md /= Std(b, nv);
    if (md > worst) {
      worst = md;
      if (where) *where = i;
    }
  }
  return worst;
}

constexpr double kTolRel = 0.15;

class Differential : public ::testing::TestWithParam<std::string> {};

TEST_P(Differential, LogitsAndGreedyMatchLlamaCpp) {
  const std::string path = test::ModelPath(GetParam(), "q8_0");
  const int kPrompt = 640, kGen = 32, kChunk = 256;

  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(path, &tok).ok());
  std::vector<int32_t> toks;
  ASSERT_TRUE(tok->Tokenize(test::LongText(), true, false, &toks).ok());
  ASSERT_GE(int(toks.size()), kPrompt);
  toks.resize(kPrompt);

  // mzcache
  std::unique_ptr<Model> model;
  Status st = Model::Load(Env::Default(), path, ModelOptions(), &model);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ContextOptions co;
  co.n_ctx = 2048;
  co.kv_chunk_tokens = kChunk;
  co.n_ubatch = 512;
  Context mz_ctx(model.get(), co);
  st = mz_ctx.Decode(toks.data(), kPrompt, true);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const int nv = int(model->hparams().n_vocab);

  // llama.cpp, twice: its default (flash attention auto, repacked weights) and plain (no flash
  // attention, no repacking: the same weight layout and matmul kernels as mzcache). Their difference
  // is the rounding noise between two valid implementations; mzcache is held to the same scale.
  std::vector<float> plain, dflt;
  LlamaLogits(path, toks, 2048, 512, 0, false, false, &plain);
  LlamaLogits(path, toks, 2048, 512, 0, true, true, &dflt);
  if (HasFatalFailure()) return;
  auto max_rel = [&](const float* a, const float* b, int* where) { return MaxRelDiff(a, b, kPrompt, nv, where); };
  std::vector<float> mine(size_t(kPrompt) * nv);
  for (int i = 0; i < kPrompt; ++i) {
    const float* a = mz_ctx.logits(i);
    ASSERT_NE(a, nullptr);
    for (int v = 0; v < nv; ++v) ASSERT_TRUE(std::isfinite(a[v])) << "position " << i;
    std::copy_n(a, nv, mine.data() + size_t(i) * nv);
  }
  int p_self = -1, p_mz = -1, p_mzd = -1;
  const double d_self = max_rel(dflt.data(), plain.data(), &p_self);
  const double d_mz = max_rel(mine.data(), plain.data(), &p_mz);
  const double d_mzd = max_rel(mine.data(), dflt.data(), &p_mzd);
  std::printf("[%s] max|diff|/std over %d positions: llama.cpp default vs plain %.4f (pos %d); mzcache vs plain %.4f "
              "(pos %d); mzcache vs default %.4f (pos %d)\n",
              GetParam().c_str(), kPrompt, d_self, p_self, d_mz, p_mz, d_mzd, p_mzd);
  EXPECT_LT(d_mz, kTolRel) << "logits differ from llama.cpp beyond tolerance";
  EXPECT_LT(d_mz, 2.0 * d_self + 0.01) << "mzcache is further from llama.cpp than llama.cpp's own configurations are";

  // Reference context for generation (plain configuration).
  Ref ref;
  {
    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    ref.model = llama_model_load_from_file(path.c_str(), mp);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 1024;
    cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    ref.ctx = llama_init_from_model(ref.model, cp);
    ASSERT_NE(ref.ctx, nullptr);
    llama_batch batch = llama_batch_init(kPrompt, 0, 1);
    for (int i = 0; i < kPrompt; ++i) {
      batch.token[i] = toks[i];
      batch.pos[i] = i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = i == kPrompt - 1;
    }
    batch.n_tokens = kPrompt;
    ASSERT_EQ(llama_decode(ref.ctx, batch), 0);
    llama_batch_free(batch);
  }

  // Greedy generation, teacher-forced on mzcache's choice so both engines see the same sequence.
  llama_batch one = llama_batch_init(1, 0, 1);
  int compared = 0, mismatched_flat = 0;
  int32_t next = ArgMax(mz_ctx.logits(kPrompt - 1), nv);
  for (int step = 0; step < kGen; ++step) {
    const float* a = mz_ctx.logits(step == 0 ? kPrompt - 1 : 0);
    const float* b = llama_get_logits_ith(ref.ctx, -1);
    auto [ra, margin] = TopMargin(b, nv);
    // A flip of the top-1 needs the two logits to move by margin/2 each: impossible while every
    // logit stays within the worst difference measured over the whole prompt (d_mz x std).
    const double tol = d_mz * Std(b, nv);
    int32_t mine = ArgMax(a, nv);
    if (margin > 2 * tol) {
      EXPECT_EQ(mine, ra) << "step " << step << ": greedy token differs with reference margin " << margin;
      ++compared;
    } else if (mine != ra) {
      ++mismatched_flat;
    }
    next = mine;
    ASSERT_TRUE(mz_ctx.Decode(&next, 1, false).ok());
    one.token[0] = next;
    one.pos[0] = kPrompt + step;
    one.n_seq_id[0] = 1;
    one.seq_id[0][0] = 0;
    one.logits[0] = 1;
    one.n_tokens = 1;
    ASSERT_EQ(llama_decode(ref.ctx, one), 0);
  }
  std::printf("[%s] greedy: %d/%d steps had a clear margin and matched; %d flat steps differed\n",
              GetParam().c_str(), compared, kGen, mismatched_flat);
  EXPECT_GE(compared, kGen / 4) << "too few steps with a clear top-1 margin: the test would be weak";
  llama_batch_free(one);
}

// Long context: the same comparison after a prompt of up to 8192 real-text tokens (32 KV chunks),
// on the last kTail positions (all-position logits would not fit: 8k x vocab floats). Catches what
// only shows at distance: RoPE at large positions, rope scaling (Llama 3), precision of the
// attention accumulation over thousands of keys. Prefilled in ubatches as a session would be.
TEST_P(Differential, LongContextLogitsMatchLlamaCpp) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Under a sanitizer, one architecture (issue 21: each of these took ~100 s there, most of it the
  // two uninstrumented llama.cpp prefills, which a sanitizer stage does not check). What the
  // sanitizer adds is mzcache's forward over 32 KV chunks and 16 ubatches, the same code for the
  // three architectures; tiny-llama is kept because it also takes the rope-frequency-factor path
  // (Llama 3 scaling). The numerical comparison at 8k for all three runs in the normal build, and
  // every architecture's forward runs under the sanitizers in LogitsAndGreedyMatchLlamaCpp.
  if (GetParam() != "tiny-llama") GTEST_SKIP() << "long context under a sanitizer: tiny-llama only";
#endif
  const std::string path = test::ModelPath(GetParam(), "q8_0");
  const int kTail = 16, kChunk = 256, kUbatch = 512;
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Tokenizer::Load(path, &tok).ok());
  std::vector<int32_t> toks;
  ASSERT_TRUE(tok->Tokenize(test::LongText(), true, false, &toks).ok());
  const int n = std::min(8192, int(toks.size())) / kChunk * kChunk;
  ASSERT_GE(n, 4096) << "the long text is too short for a long-context test";
  toks.resize(size_t(n));

  std::unique_ptr<Model> model;
  Status st = Model::Load(Env::Default(), path, ModelOptions(), &model);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const int nv = int(model->hparams().n_vocab);
  ContextOptions co;
  co.n_ctx = n;
  co.kv_chunk_tokens = kChunk;
  co.n_ubatch = kUbatch;
  Context mz_ctx(model.get(), co);
  ASSERT_TRUE(mz_ctx.Decode(toks.data(), n - kTail, false).ok());
  st = mz_ctx.Decode(toks.data() + n - kTail, kTail, true);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<float> mine(size_t(kTail) * nv);
  for (int i = 0; i < kTail; ++i) {
    ASSERT_NE(mz_ctx.logits(i), nullptr);
    std::copy_n(mz_ctx.logits(i), nv, mine.data() + size_t(i) * nv);
  }

  std::vector<float> plain, dflt;
  LlamaLogits(path, toks, n, kUbatch, n - kTail, false, false, &plain);
  LlamaLogits(path, toks, n, kUbatch, n - kTail, true, true, &dflt);
  if (HasFatalFailure()) return;
  auto max_rel = [&](const float* a, const float* b) { return MaxRelDiff(a, b, kTail, nv); };
  const double d_self = max_rel(dflt.data(), plain.data());
  const double d_mz = max_rel(mine.data(), plain.data());
  const double d_mzd = max_rel(mine.data(), dflt.data());
  std::printf("[%s] %d-token context, last %d positions, max|diff|/std: llama.cpp default vs plain %.4f; mzcache vs "
              "plain %.4f; mzcache vs default %.4f\n",
              GetParam().c_str(), n, kTail, d_self, d_mz, d_mzd);
  EXPECT_LT(d_mz, kTolRel) << "logits at long context differ from llama.cpp beyond tolerance";
  EXPECT_LT(d_mz, 2.0 * d_self + 0.01) << "mzcache is further from llama.cpp than llama.cpp's own configurations are";
}

INSTANTIATE_TEST_SUITE_P(Models, Differential, ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-qwen2"));

}  // namespace
}  // namespace mz
