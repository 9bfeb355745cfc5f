// Memory plan (issue 24 §2, runtime/memory_plan.h): the KV byte formulas, the limits read through
// the Env, the refusal at context creation (faked limits and the C API's memory_budget), and the
// estimate against the measured peak RSS (VmHWM) of real runs, each in a fresh child process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "env/fault_env.h"
#include "kernels/q8_block.h"
#include "model/model.h"
#include "mzcache.h"
#include "runtime/context.h"
#include "runtime/memory_plan.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace mz {
namespace {

HParams Qwen06() {  // Qwen3-0.6B: 28 layers, 8 KV heads of 128
  HParams hp;
  hp.n_layer = 28;
  hp.n_head = 16;
  hp.n_head_kv = 8;
  hp.head_dim = 128;
  hp.n_embd = 1024;
  hp.n_ff = 3072;
  hp.n_vocab = 151936;
  return hp;
}

TEST(MemoryPlan, KvBytesFollowTheLayouts) {
  const HParams hp = Qwen06();
  // f16: 2 (K, V) x 28 x 8 x 128 x 2 bytes = 112 KiB per token.
  EXPECT_EQ(KvBytesPerToken(hp, KvType::kF16), 2ull * 28 * 8 * 128 * 2);
  EXPECT_EQ(KvBytesPerToken(hp, KvType::kF16), 114688u);
  // q8_0: one fp16 amax + 128 int8 codes per row (kernels/q8_block.h).
  EXPECT_EQ(KvBytesPerToken(hp, KvType::kQ8), 2ull * 28 * 8 * (2 + 128));
  EXPECT_EQ(KvBytesPerToken(hp, KvType::kQ8), 2ull * 28 * q8_segment_bytes(8, 128));
  // Whole 256-token chunks, as the KvCache allocates them.
  EXPECT_EQ(KvBytes(hp, KvType::kF16, 4096, 256), 4096ull * 114688);
  EXPECT_EQ(KvBytes(hp, KvType::kF16, 4097, 256), 4352ull * 114688);
  EXPECT_EQ(KvBytes(hp, KvType::kQ8, 1, 256), 256ull * 2 * 28 * 8 * 130);
  // The field notes' 8B (32 layers, 8 KV heads of 128): 128 KiB per token f16, 68 KiB q8_0.
  HParams l8 = hp;
  l8.n_layer = 32;
  EXPECT_EQ(KvBytesPerToken(l8, KvType::kF16), 128u * 1024);
  EXPECT_NEAR(double(KvBytesPerToken(l8, KvType::kQ8)) / 1024.0, 65.0, 0.01);  // 8.125 bits: amax per 128, not per 32
}

TEST(MemoryPlan, PeakGrowsWithContextAndLargestContextFits) {
  PlanShape s;
  s.hp = Qwen06();
  s.weight_bytes = 600ull << 20;
  s.weight_params = 600000000;
  s.weight_type = 8;  // GGML_TYPE_Q8_0
  PlanRequest r;
  r.overhead = 50ull << 20;
  uint64_t last = 0;
  for (int n : {256, 512, 1024, 4096, 8192}) {
    r.n_ctx = n;
    const uint64_t p = EstimatePeak(s, r).peak();
    EXPECT_GT(p, last) << n;
    last = p;
  }
  const uint64_t limit = 1200ull << 20;
  const int c = LargestContext(s, r, limit, 0.1, 1 << 24);
  ASSERT_GT(c, 0);
  EXPECT_EQ(c % 256, 0);
  r.n_ctx = c;
  EXPECT_LE(double(EstimatePeak(s, r).peak()), 0.9 * double(limit));
  r.n_ctx = c + 256;
  EXPECT_GT(double(EstimatePeak(s, r).peak()), 0.9 * double(limit));
  // q8_0 KV holds more tokens in the same memory.
  r.kv_type = KvType::kQ8;
  EXPECT_GT(LargestContext(s, r, limit, 0.1, 1 << 24), c);
  // Nothing fits: 0.
  EXPECT_EQ(LargestContext(s, r, 100ull << 20, 0.1, 1 << 24), 0);
}

// A faked machine: MemAvailable, this process's status, its cgroup (v2) and the cgroup's limit.
void FakeMachine(FaultEnv* env, uint64_t avail_mib, uint64_t rss_mib, uint64_t anon_mib, const std::string& cg_max) {
  env->SetFakeFile("/proc/meminfo", "MemTotal:       25165824 kB\nMemFree:  1000 kB\nMemAvailable:   " +
                                        std::to_string(avail_mib * 1024) + " kB\n");
  env->SetFakeFile("/proc/self/status", "Name:\ttest\nVmHWM:\t  " + std::to_string(rss_mib * 1024) +
                                            " kB\nVmRSS:\t  " + std::to_string(rss_mib * 1024) + " kB\nRssAnon:\t  " +
                                            std::to_string(anon_mib * 1024) + " kB\nRssFile:\t 0 kB\n");
  env->SetFakeFile("/proc/self/cgroup", "0::/app.slice/test\n");
  env->SetFakeFile("/sys/fs/cgroup/app.slice/test/memory.max", cg_max + "\n");
}

// Another process's memory (bench models samples its workers' RSS this way), split into anonymous
// and file-backed pages, through the Env; a process that is gone (no status file) reads false.
TEST(MemoryPlan, ProcessMemoryIsReadThroughTheEnvWithItsSplit) {
  FaultEnv env(Env::Default());
  env.SetFakeFile("/proc/4242/status", "Name:\tw\nVmHWM:\t 3072 kB\nVmRSS:\t 2048 kB\nRssAnon:\t 512 kB\n"
                                       "RssFile:\t 1536 kB\nRssShmem:\t 0 kB\n");
  SelfMemory m;
  ASSERT_TRUE(ReadProcessMemory(&env, 4242, &m));
  EXPECT_EQ(m.rss, 2048ull << 10);
  EXPECT_EQ(m.rss_anon, 512ull << 10);
  EXPECT_EQ(m.rss_file, 1536ull << 10);
  EXPECT_EQ(m.hwm, 3072ull << 10);
  env.SetFakeFile("/proc/4243/status", "Name:\tkthread\n");  // no VmRSS: not a user process
  SelfMemory untouched;
  untouched.rss = 7;
  EXPECT_FALSE(ReadProcessMemory(&env, 4243, &untouched));
  EXPECT_EQ(untouched.rss, 7u);
  // This process's own, from the kernel: file-backed and anonymous add up to at most the RSS.
  SelfMemory self;
  ASSERT_TRUE(ReadProcessMemory(Env::Default(), 0, &self));
  EXPECT_GT(self.rss, 0u);
  EXPECT_GT(self.rss_anon, 0u);
  EXPECT_LE(self.rss_anon + self.rss_file, self.rss);
}

TEST(MemoryPlan, LimitsAreReadThroughTheEnv) {
  FaultEnv env(Env::Default());
  FakeMachine(&env, 1000, 300, 100, "max");
  MemoryLimits l = ReadMemoryLimits(&env, 0);
  EXPECT_EQ(l.mem_available, 1000ull << 20);
  EXPECT_EQ(l.self_anon, 100ull << 20);
  EXPECT_EQ(l.cgroup_limit, 0u);  // "max": none
  EXPECT_EQ(l.effective(), 1100ull << 20);
  EXPECT_STREQ(l.binding(), "MemAvailable");
  FakeMachine(&env, 1000, 300, 100, std::to_string(512ull << 20));
  l = ReadMemoryLimits(&env, 0);
  EXPECT_EQ(l.cgroup_limit, 512ull << 20);
  EXPECT_EQ(l.cgroup_path, "/sys/fs/cgroup/app.slice/test/memory.max");
  EXPECT_STREQ(l.binding(), "cgroup limit");
  l = ReadMemoryLimits(&env, 256ull << 20);
  EXPECT_EQ(l.effective(), 256ull << 20);
  EXPECT_STREQ(l.binding(), "memory budget");
  // v1: the memory controller's line.
  env.SetFakeFile("/proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/grp\n");
  env.SetFakeFile("/sys/fs/cgroup/memory/grp/memory.limit_in_bytes", std::to_string(700ull << 20) + "\n");
  l = ReadMemoryLimits(&env, 0);
  EXPECT_EQ(l.cgroup_limit, 700ull << 20);
  // Nothing readable: no limit, everything fits.
  FaultEnv none(Env::Default());
  none.HideRealFilesUnder("/proc/");
  none.HideRealFilesUnder("/sys/");
  l = ReadMemoryLimits(&none, 0);
  EXPECT_EQ(l.effective(), 0u);
}

// The refusal at context creation, with the limits faked: a context that cannot fit is refused
// naming the largest context that fits, which is then accepted; memory_check off accepts anything.
TEST(MemoryPlan, ContextRefusedAtStartWithWhatFits) {
  FaultEnv env(Env::Default());
  std::unique_ptr<Model> model;
  ASSERT_TRUE(Model::Load(&env, test::ModelPath("tiny-qwen3"), ModelOptions(), &model).ok());
  const PlanShape shape = ShapeOfModel(*model);
  const uint64_t weights_mib = shape.weight_bytes >> 20;
  // The process holds its weights + 30 MiB, 20 MiB of it anonymous (its weights are file pages,
  // counted in MemAvailable): limit = MemAvailable + 20 MiB = weights + 45 MiB, so 8192 tokens (16
  // MiB of f16 KV + about 7 MiB of compute buffers over the 30 MiB overhead) do not fit.
  FakeMachine(&env, weights_mib + 25, weights_mib + 30, 20, "max");
  ContextOptions o;
  o.n_ctx = 8192;
  o.memory_check = true;
  o.n_threads = 1;
  {
    Context c(model.get(), o);
    Status st = c.Init();
    ASSERT_EQ(st.code(), Status::kNoMemory) << st.ToString();
    PlanRequest r;
    r.n_ctx = 8192;
    SelfMemory self;
    ASSERT_TRUE(ReadSelfMemory(&env, &self));
    r.overhead = self.rss - shape.weight_bytes;
    const MemoryLimits lim = ReadMemoryLimits(&env, 0);
    const int fits = LargestContext(shape, r, lim.effective(), 0.0, 8192);
    ASSERT_GT(fits, 0);
    ASSERT_LT(fits, 8192);
    EXPECT_NE(st.message().find("n_ctx " + std::to_string(fits) + " (the largest context"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("q8_0 KV"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("MemAvailable"), std::string::npos) << st.message();
    // The context it names is accepted.
    ContextOptions ok = o;
    ok.n_ctx = fits;
    Context c2(model.get(), ok);
    EXPECT_TRUE(c2.Init().ok());
  }
  {
    ContextOptions off = o;
    off.memory_check = false;
    Context c(model.get(), off);
    EXPECT_TRUE(c.Init().ok());
  }
  // A cgroup limit binds the same way.
  FakeMachine(&env, 100000, weights_mib + 30, 20, std::to_string((weights_mib + 35) << 20));
  {
    Context c(model.get(), o);
    Status st = c.Init();
    ASSERT_EQ(st.code(), Status::kNoMemory);
    EXPECT_NE(st.message().find("cgroup limit"), std::string::npos) << st.message();
  }
}

// The real machine (24 GiB): normal test contexts are never refused.
TEST(MemoryPlan, NormalContextsAcceptedHere) {
  std::unique_ptr<Model> model;
  ASSERT_TRUE(Model::Load(Env::Default(), test::ModelPath("tiny-qwen3"), ModelOptions(), &model).ok());
  for (int n : {256, 8192, 32768}) {
    ContextOptions o;
    o.n_ctx = n;
    o.memory_check = true;
    o.n_threads = 1;
    Context c(model.get(), o);
    EXPECT_TRUE(c.Init().ok()) << n;
  }
}

// The C API: a memory_budget too small is refused with MZ_ERR_NO_MEMORY and a message naming a
// context that fits; memory_check = false creates it anyway; mz_plan_estimate agrees.
TEST(MemoryPlan, CApiRefusesOverBudget) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory is part of the RSS the plan counts as overhead: the plan is for normal builds";
#endif
  const std::string path = test::ModelPath("tiny-qwen3");
  mz_plan_params pp = mz_plan_default_params();
  mz_plan_result pr;
  ASSERT_EQ(mz_plan_estimate(path.c_str(), &pp, &pr), MZ_OK) << mz_last_error();
  EXPECT_EQ(pr.n_ctx, 8192u);
  EXPECT_EQ(pr.kv, 8192ull * pr.kv_bytes_per_token);
  EXPECT_EQ(pr.peak, pr.weights + pr.kv + pr.compute + pr.swap_stack + pr.overhead);
  EXPECT_TRUE(pr.fits);  // 24 GiB here
  pp.kv_type = MZ_KV_Q8_0;
  mz_plan_result pq;
  ASSERT_EQ(mz_plan_estimate(path.c_str(), &pp, &pq), MZ_OK);
  EXPECT_LT(pq.kv, pr.kv);
  pp.n_ctx = 0;  // auto
  pp.memory_budget = pr.weights + pr.overhead + (64ull << 20);
  ASSERT_EQ(mz_plan_estimate(path.c_str(), &pp, &pq), MZ_OK);
  EXPECT_GT(pq.n_ctx, 0u);
  EXPECT_TRUE(pq.fits);
  EXPECT_STREQ(pq.binding, "memory budget");

  mz_model* m = nullptr;
  ASSERT_EQ(mz_model_load(path.c_str(), nullptr, &m), MZ_OK);
  mz_context_params cp = mz_context_default_params();
  EXPECT_TRUE(cp.memory_check);
  cp.n_threads = 1;
  cp.memory_budget = pr.weights + (4ull << 20);  // less than weights + overhead + KV
  mz_context* c = nullptr;
  EXPECT_EQ(mz_context_new(m, &cp, &c), MZ_ERR_NO_MEMORY);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(mz_last_error()).find("memory budget"), std::string::npos) << mz_last_error();
  cp.memory_check = false;
  EXPECT_EQ(mz_context_new(m, &cp, &c), MZ_OK);
  mz_context_free(c);
  cp = mz_context_default_params();
  cp.n_threads = 1;
  EXPECT_EQ(mz_context_new(m, &cp, &c), MZ_OK) << mz_last_error();  // default: fits here
  mz_context_free(c);
  mz_model_free(m);
}

// ---- predicted vs measured peak RSS ----

struct RssCase {
  double predicted = 0, measured = 0;
  double weights = 0, kv = 0, compute = 0, overhead = 0;
  int ok = 0;
};

// One case, run in a fresh process (the test binary re-executed with MZ_PLAN_RSS_CASE="path n_ctx
// ubatch", see MeasureInChild): plan, load, fill n_ctx tokens of KV (the first n_ctx - ubatch
// imported, the last ubatch decoded through every layer: the weights touched as a run touches them,
// the compute buffers at their largest), then read VmHWM. Prints one "[rss-case] ..." line.
TEST(MemoryPlanChild, MeasureOneCase) {
  const char* spec = std::getenv("MZ_PLAN_RSS_CASE");
  if (!spec) GTEST_SKIP() << "run by PredictedPeakWithinFivePercentOfMeasured";
  char path_buf[4096] = {0};
  int n_ctx = 0, ubatch = 0;
  ASSERT_EQ(std::sscanf(spec, "%4095s %d %d", path_buf, &n_ctx, &ubatch), 3);
  const std::string path = path_buf;
  RssCase r;
  Env* env = Env::Default();
  // The peak from here on (Linux >= 4.0: reset to the current RSS).
  (void)env->WriteSmallFile("/proc/self/clear_refs", "5", false);
  PlanShape shape;
  {
    ModelOptions po;
    po.load_weights = false;
    std::unique_ptr<Model> parsed;
    ASSERT_TRUE(Model::Load(env, path, po, &parsed).ok());
    shape = ShapeOfModel(*parsed);
  }
  SelfMemory self;
  ASSERT_TRUE(ReadSelfMemory(env, &self));
  PlanRequest req;
  req.n_ctx = n_ctx;
  req.n_ubatch = ubatch;
  req.overhead = self.rss + EstimateModelOverhead(shape);
  const MemoryEstimate e = EstimatePeak(shape, req);
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(Model::Load(env, path, ModelOptions(), &model).ok());
  ASSERT_TRUE(Tokenizer::Load(path, &tok).ok());
  ContextOptions o;
  o.n_ctx = n_ctx;
  o.n_ubatch = ubatch;
  o.n_threads = 1;
  o.reconcile_min_missing = 0;
  Context c(model.get(), o);
  ASSERT_TRUE(c.Init().ok());
  const int imported = n_ctx - ubatch;
  const uint64_t elems = c.kv().geometry().chunk_bytes() / 2;
  if (imported > 0)
    ASSERT_TRUE(c.ImportKv(imported, [&](int l, int ch, uint16_t* dst) {
                   for (uint64_t i = 0; i < elems; ++i) dst[i] = uint16_t(0x3c00 ^ ((uint64_t(l) * 7 + uint64_t(ch) + i) & 0xff));
                 }).ok());
  std::vector<int32_t> toks(static_cast<size_t>(ubatch), 0);
  for (int i = 0; i < ubatch; ++i) toks[size_t(i)] = 100 + (i * 37) % 5000;
  ASSERT_TRUE(c.Decode(toks.data(), ubatch, false).ok());
  SelfMemory after;
  ASSERT_TRUE(ReadSelfMemory(env, &after));
  std::printf("[rss-case] %.0f %.0f %.0f %.0f %.0f %.0f\n", double(e.peak()), double(after.hwm), double(e.weights),
              double(e.kv), double(e.compute), double(e.overhead));
  std::fflush(stdout);
}

// Runs MeasureOneCase in a fresh process (this binary, re-executed): nothing earlier tests left in
// this process (freed heap, initialized libraries) is counted.
RssCase MeasureInChild(const std::string& path, int n_ctx, int ubatch) {
  RssCase r;
  char exe[4096] = {0};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return r;
  const std::string spec = path + " " + std::to_string(n_ctx) + " " + std::to_string(ubatch);
  int fd[2];
  if (pipe(fd) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    setenv("MZ_PLAN_RSS_CASE", spec.c_str(), 1);
    execl(exe, exe, "--gtest_filter=MemoryPlanChild.MeasureOneCase", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fd[1]);
  std::string out;
  char buf[4096];
  for (ssize_t k; (k = read(fd[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(k));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  const size_t p = out.find("[rss-case] ");
  if (p != std::string::npos &&
      std::sscanf(out.c_str() + p, "[rss-case] %lf %lf %lf %lf %lf %lf", &r.predicted, &r.measured, &r.weights, &r.kv,
                  &r.compute, &r.overhead) == 6 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
    r.ok = 1;
  else
    std::printf("%s\n", out.c_str());
  return r;
}

// Two shapes x three contexts: |predicted - measured| <= 5% of measured. The shapes: the tiny
// test model (4 layers, 151936-token vocabulary: overhead and embeddings dominate) and the
// Qwen3-0.6B shape (28 layers: weights and KV dominate), q8_0 weights, f16 KV.
TEST(MemoryPlan, PredictedPeakWithinFivePercentOfMeasured) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory and quarantine are part of the RSS: the plan is for normal builds";
#endif
  struct Shape {
    std::string id;
    int ubatch;
    std::vector<int> ctx;
  };
  const std::vector<Shape> shapes = {{"tiny-qwen3", 512, {1024, 4096, 16384}}, {"qwen3-0.6b", 128, {512, 2048, 4096}}};
  for (const Shape& s : shapes) {
    const std::string path = test::ModelPath(s.id);
    for (int n : s.ctx) {
      const RssCase r = MeasureInChild(path, n, s.ubatch);
      ASSERT_EQ(r.ok, 1) << s.id << " " << n;
      const double err = (r.predicted - r.measured) / r.measured;
      std::printf("[rss] %s n_ctx %d: predicted %.1f MiB (weights %.1f kv %.1f compute %.1f overhead %.1f), "
                  "measured %.1f MiB, error %+.2f%%\n",
                  s.id.c_str(), n, r.predicted / 1048576.0, r.weights / 1048576.0, r.kv / 1048576.0,
                  r.compute / 1048576.0, r.overhead / 1048576.0, r.measured / 1048576.0, 100.0 * err);
      EXPECT_LE(std::fabs(err), 0.05) << s.id << " n_ctx " << n;
    }
  }
}

}  // namespace
}  // namespace mz
