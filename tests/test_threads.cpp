// Threads that change while the conversation stays (issue 24, section 3): the CPU topology read
// from (fake) sysfs trees, the fastest-cluster default, Context::SetThreads between calls (the
// continued conversation's logits equal a context that never changed threads), its refusal during
// a generation (kBusy at once, nothing changed) and the caller's affinity kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <cstring>
#include <thread>

#include "core/sync_point.h"
#include "env/cpu_topology.h"
#include "env/env.h"
#include "env/fault_env.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "test_util.h"

namespace mz {
namespace {

const std::string kRoot = "/fakesys/cpu";

// A fake sysfs CPU tree: per CPU its capacity and max frequency (0: no such file).
struct FakeCpu {
  int id;
  uint32_t capacity;
  uint64_t max_freq_khz;
};
void FakeTree(FaultEnv* env, const std::vector<FakeCpu>& cpus, const std::string& online) {
  env->HideRealFilesUnder("/fakesys/");
  if (!online.empty()) env->SetFakeFile(kRoot + "/online", online);
  // Entries that are not CPUs must be skipped.
  env->SetFakeFile(kRoot + "/cpufreq/boost", "0\n");
  env->SetFakeFile(kRoot + "/possible", "0-7\n");
  for (const FakeCpu& c : cpus) {
    const std::string d = kRoot + "/cpu" + std::to_string(c.id);
    env->SetFakeFile(d + "/topology/core_id", std::to_string(c.id) + "\n");
    if (c.capacity) env->SetFakeFile(d + "/cpu_capacity", std::to_string(c.capacity) + "\n");
    if (c.max_freq_khz) env->SetFakeFile(d + "/cpufreq/cpuinfo_max_freq", std::to_string(c.max_freq_khz) + "\n");
  }
}

// A 1+3+4 phone: cpu0-3 little, cpu4-6 mid, cpu7 prime (as the kernel numbers them on Snapdragon).
std::vector<FakeCpu> Phone(bool capacities, bool freqs) {
  std::vector<FakeCpu> v;
  for (int i = 0; i < 8; ++i) {
    const uint32_t cap = i < 4 ? 410 : i < 7 ? 801 : 1024;
    const uint64_t f = i < 4 ? 1800000 : i < 7 ? 2400000 : 3000000;
    v.push_back({i, capacities ? cap : 0u, freqs ? f : 0u});
  }
  return v;
}

TEST(CpuTopology, ParseCpuList) {
  std::vector<int> v;
  ASSERT_TRUE(ParseCpuList("0-3,5,7-8\n", &v).ok());
  EXPECT_EQ(v, (std::vector<int>{0, 1, 2, 3, 5, 7, 8}));
  ASSERT_TRUE(ParseCpuList("\n", &v).ok());
  EXPECT_TRUE(v.empty());
  EXPECT_EQ(ParseCpuList("0-", &v).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseCpuList("3-1", &v).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseCpuList("a", &v).code(), Status::kInvalidArgument);
  EXPECT_TRUE(v.empty());
}

TEST(CpuTopology, FakeListDirShowsTheFakeTreeOnly) {
  FaultEnv env(Env::Default());
  FakeTree(&env, Phone(true, true), "0-7\n");
  std::vector<std::string> names;
  ASSERT_TRUE(env.ListDir(kRoot, &names).ok());
  EXPECT_EQ(names, (std::vector<std::string>{"cpu0", "cpu1", "cpu2", "cpu3", "cpu4", "cpu5", "cpu6", "cpu7",
                                             "cpufreq", "online", "possible"}));
  ASSERT_TRUE(env.ListDir(kRoot + "/cpu7/", &names).ok());
  EXPECT_EQ(names, (std::vector<std::string>{"cpu_capacity", "cpufreq", "topology"}));
  EXPECT_FALSE(env.ListDir("/fakesys/nothing", &names).ok());
  EXPECT_TRUE(names.empty());
  env.fail_small_reads_after = 0;
  EXPECT_EQ(env.ListDir(kRoot, &names).code(), Status::kIOError);
}

void ExpectPhoneClusters(const CpuTopology& t) {
  ASSERT_EQ(t.cpus.size(), 8u);
  ASSERT_EQ(t.clusters.size(), 3u);
  EXPECT_TRUE(t.heterogeneous());
  EXPECT_EQ(t.clusters[0].cpus, (std::vector<int>{7}));
  EXPECT_EQ(t.clusters[1].cpus, (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(t.clusters[2].cpus, (std::vector<int>{0, 1, 2, 3}));
  // Only the prime core, whatever was asked for.
  for (int n : {1, 2, 8}) {
    const ComputeCpus cc = ChooseComputeCpus(t, n);
    EXPECT_EQ(cc.n_threads, 1);
    EXPECT_EQ(cc.cpus, (std::vector<int>{7}));
  }
}

TEST(CpuTopology, Phone1Plus3Plus4ByCapacity) {
  FaultEnv env(Env::Default());
  FakeTree(&env, Phone(true, false), "0-7\n");
  CpuTopology t;
  ASSERT_TRUE(ReadCpuTopology(&env, &t, kRoot).ok());
  ExpectPhoneClusters(t);
  EXPECT_EQ(t.clusters[0].capacity, 1024u);
}

TEST(CpuTopology, Phone1Plus3Plus4ByMaxFrequency) {
  FaultEnv env(Env::Default());
  FakeTree(&env, Phone(false, true), "0-7\n");
  CpuTopology t;
  ASSERT_TRUE(ReadCpuTopology(&env, &t, kRoot).ok());
  ExpectPhoneClusters(t);
  EXPECT_EQ(t.clusters[0].max_freq_khz, 3000000u);
}

TEST(CpuTopology, OfflinePrimeCoreLeavesTheMidCluster) {
  FaultEnv env(Env::Default());
  FakeTree(&env, Phone(true, true), "0-6\n");
  CpuTopology t;
  ASSERT_TRUE(ReadCpuTopology(&env, &t, kRoot).ok());
  ASSERT_EQ(t.clusters.size(), 2u);
  const ComputeCpus cc = ChooseComputeCpus(t, 2);
  EXPECT_EQ(cc.n_threads, 2);
  EXPECT_EQ(cc.cpus, (std::vector<int>{4, 5}));
  // Without the root online file, per-CPU online files decide (cpu0 has none: online).
  FaultEnv env2(Env::Default());
  FakeTree(&env2, Phone(true, true), "");
  env2.SetFakeFile(kRoot + "/cpu7/online", "0\n");
  env2.SetFakeFile(kRoot + "/cpu6/online", "1\n");
  ASSERT_TRUE(ReadCpuTopology(&env2, &t, kRoot).ok());
  ASSERT_EQ(t.cpus.size(), 7u);
  EXPECT_EQ(ChooseComputeCpus(t, 8).cpus, (std::vector<int>{4, 5, 6}));
}

TEST(CpuTopology, Laptop2Plus6TurboBinsStayOneCluster) {
  FaultEnv env(Env::Default());
  // Two performance cores whose turbo bins differ by 2% (4.8 / 4.7 GHz), six efficiency cores.
  std::vector<FakeCpu> v = {{0, 0, 4800000}, {1, 0, 4700000}};
  for (int i = 2; i < 8; ++i) v.push_back({i, 0, 3400000});
  FakeTree(&env, v, "0-7\n");
  CpuTopology t;
  ASSERT_TRUE(ReadCpuTopology(&env, &t, kRoot).ok());
  ASSERT_EQ(t.clusters.size(), 2u);
  EXPECT_EQ(t.clusters[0].cpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.clusters[1].cpus.size(), 6u);
  ComputeCpus cc = ChooseComputeCpus(t, 4);
  EXPECT_EQ(cc.n_threads, 2);
  EXPECT_EQ(cc.cpus, (std::vector<int>{0, 1}));
  cc = ChooseComputeCpus(t, 1);
  EXPECT_EQ(cc.n_threads, 1);
  EXPECT_EQ(cc.cpus, (std::vector<int>{0}));
}

TEST(CpuTopology, HomogeneousIsNotPinned) {
  // This machine (a 2-CPU VM: cpu_capacity 1024 on both, no cpufreq): one cluster of every online CPU.
  CpuTopology t;
  ASSERT_TRUE(ReadCpuTopology(Env::Default(), &t).ok());
  EXPECT_FALSE(t.heterogeneous());
  ASSERT_EQ(t.clusters.size(), 1u);
  EXPECT_EQ(t.clusters[0].cpus.size(), t.cpus.size());
  EXPECT_GE(t.cpus.size(), 1u);
  ComputeCpus cc = ChooseComputeCpus(t, 2);
  EXPECT_EQ(cc.n_threads, 2);
  EXPECT_TRUE(cc.cpus.empty());
  // A fake one with equal capacities (an arm64 server) and equal frequencies.
  FaultEnv env(Env::Default());
  FakeTree(&env, {{0, 1024, 2000000}, {1, 1024, 2000000}, {2, 1024, 2000000}, {3, 1024, 2000000}}, "0-3\n");
  ASSERT_TRUE(ReadCpuTopology(&env, &t, kRoot).ok());
  EXPECT_FALSE(t.heterogeneous());
  EXPECT_TRUE(ChooseComputeCpus(t, 3).cpus.empty());
  EXPECT_EQ(ChooseComputeCpus(t, 3).n_threads, 3);
}

TEST(CpuTopology, UnreadableTreesFail) {
  FaultEnv env(Env::Default());
  FakeTree(&env, Phone(true, true), "0-x\n");
  CpuTopology t;
  EXPECT_EQ(ReadCpuTopology(&env, &t, kRoot).code(), Status::kInvalidArgument);
  EXPECT_TRUE(t.cpus.empty());
  EXPECT_FALSE(ReadCpuTopology(&env, &t, "/fakesys/none").ok());
  FaultEnv env2(Env::Default());
  FakeTree(&env2, Phone(true, true), "\n");  // nothing online
  EXPECT_EQ(ReadCpuTopology(&env2, &t, kRoot).code(), Status::kIOError);
}

// ---- Context::SetThreads ----

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Rig MakeRig(Env* env, const char* tag, int n_threads, const std::string& cpu_root = kSysCpuRoot) {
  Rig r;
  const std::string path = test::ModelPath("tiny-qwen3");
  EXPECT_TRUE(Model::Load(env, path, ModelOptions(), &r.model).ok());
  ContextOptions co;
  co.n_ctx = 512;
  co.kv_chunk_tokens = 16;
  co.kv_codec = "none";
  co.hybrid = false;
  co.n_threads = n_threads;
  co.cpu_root = cpu_root;
  co.swap_path = test::TempDir() + "/threads-" + tag + ".swap";
  r.ctx = std::make_unique<Context>(r.model.get(), co);
  EXPECT_TRUE(r.ctx->Init().ok());
  r.ctx->set_profile(DeviceProfile::Default());
  return r;
}

std::vector<int32_t> Prompt() {
  static const std::vector<int32_t> toks = test::PromptTokens(test::ModelPath("tiny-qwen3"), 40);
  return toks;
}

std::vector<float> Logits(const Context& c) {
  const int nv = int(c.model()->hparams().n_vocab);
  return std::vector<float>(c.logits(0), c.logits(0) + nv);
}

int32_t Greedy(const std::vector<float>& l) { return int32_t(std::max_element(l.begin(), l.end()) - l.begin()); }

// Prompt, then `steps` greedy tokens; before step i, change(i) may change the threads. Returns the
// logits of the prompt's last token and of every step.
std::vector<std::vector<float>> Converse(Context& c, int steps, const std::function<void(int)>& change) {
  std::vector<std::vector<float>> out;
  const auto p = Prompt();
  EXPECT_TRUE(c.Decode(p.data(), int(p.size()), false).ok());
  out.push_back(Logits(c));
  for (int i = 0; i < steps; ++i) {
    change(i);
    const int32_t t = Greedy(out.back());
    EXPECT_TRUE(c.Decode(&t, 1, false).ok());
    out.push_back(Logits(c));
  }
  return out;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// The claim the header makes: the continued conversation is the same bit for bit, whatever the
// thread count and pinning (ggml's CPU backend computes each output element on one thread, our
// attention kernel deals whole query rows to threads).
TEST(SetThreads, ContinuedConversationEqualsNeverChanged) {
  Rig ref = MakeRig(Env::Default(), "ref", 2);
  const auto want = Converse(*ref.ctx, 6, [](int) {});
  Rig r = MakeRig(Env::Default(), "chg", 2);
  std::vector<int> allowed;
  ASSERT_TRUE(Env::Default()->GetThreadAffinity(&allowed).ok());
  const auto got = Converse(*r.ctx, 6, [&](int i) {
    if (i == 0) ASSERT_TRUE(r.ctx->SetThreads(1, {}).ok());
    if (i == 2) ASSERT_TRUE(r.ctx->SetThreads(2, {}).ok());
    if (i == 3) ASSERT_TRUE(r.ctx->SetThreads(1, {allowed.back()}).ok());  // pinned
    if (i == 4 && allowed.size() >= 2) ASSERT_TRUE(r.ctx->SetThreads(2, {allowed[1], allowed[0]}).ok());
    if (i == 5) ASSERT_TRUE(r.ctx->SetThreads(2, {}).ok());  // unpinned again
  });
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)))
        << "step " << i << ": max |diff| " << MaxAbsDiff(got[i], want[i]);
  }
  EXPECT_EQ(r.ctx->history(), ref.ctx->history());
  EXPECT_EQ(r.ctx->n_threads(), 2);
  EXPECT_TRUE(r.ctx->compute_cpus().empty());
  // A whole prefill with every row's logits on 1 thread equals it on 2 (batched matmuls too).
  Rig a = MakeRig(Env::Default(), "a", 1), b = MakeRig(Env::Default(), "b", 2);
  const auto p = Prompt();
  ASSERT_TRUE(a.ctx->Decode(p.data(), int(p.size()), true).ok());
  ASSERT_TRUE(b.ctx->Decode(p.data(), int(p.size()), true).ok());
  const size_t nv = a.model->hparams().n_vocab;
  EXPECT_EQ(0, std::memcmp(a.ctx->logits(0), b.ctx->logits(0), p.size() * nv * sizeof(float)));
}

TEST(SetThreads, BadRequestsChangeNothing) {
  Rig r = MakeRig(Env::Default(), "bad", 2);
  std::vector<int> allowed;
  ASSERT_TRUE(Env::Default()->GetThreadAffinity(&allowed).ok());
  ASSERT_TRUE(r.ctx->SetThreads(1, {allowed[0]}).ok());
  const auto expect_unchanged = [&] {
    EXPECT_EQ(r.ctx->n_threads(), 1);
    EXPECT_EQ(r.ctx->forward().n_threads(), 1);
    EXPECT_EQ(r.ctx->compute_cpus(), (std::vector<int>{allowed[0]}));
  };
  EXPECT_EQ(r.ctx->SetThreads(0, {}).code(), Status::kInvalidArgument);
  expect_unchanged();
  EXPECT_EQ(r.ctx->SetThreads(513, {}).code(), Status::kInvalidArgument);
  expect_unchanged();
  EXPECT_EQ(r.ctx->SetThreads(2, {allowed[0]}).code(), Status::kInvalidArgument);  // fewer CPUs than threads
  expect_unchanged();
  EXPECT_EQ(r.ctx->SetThreads(2, {allowed[0], allowed[0]}).code(), Status::kInvalidArgument);
  expect_unchanged();
  EXPECT_EQ(r.ctx->SetThreads(1, {4000}).code(), Status::kInvalidArgument);  // not a CPU of this process
  expect_unchanged();
  EXPECT_EQ(r.ctx->SetThreads(1, {-1}).code(), Status::kInvalidArgument);
  expect_unchanged();
  const auto p = Prompt();
  EXPECT_TRUE(r.ctx->Decode(p.data(), 8, false).ok());
}

// ggml (OpenMP) pins the calling thread as compute thread 0 and leaves it pinned; Decode puts the
// caller's affinity back. One pinned thread is the caller itself, pinned through the Env.
TEST(SetThreads, CallerAffinityIsPutBackAndOneThreadIsPinnedThroughTheEnv) {
  FaultEnv env(Env::Default());
  Rig r = MakeRig(&env, "aff", 2);
  std::vector<int> before;
  ASSERT_TRUE(env.GetThreadAffinity(&before).ok());
  const auto p = Prompt();
  ASSERT_TRUE(r.ctx->SetThreads(std::min<int>(2, int(before.size())), before).ok());
  env.clear_affinity_log();
  ASSERT_TRUE(r.ctx->Decode(p.data(), 8, false).ok());
  std::vector<int> after;
  ASSERT_TRUE(env.GetThreadAffinity(&after).ok());
  EXPECT_EQ(after, before);
  ASSERT_FALSE(env.affinity_log().empty());
  EXPECT_EQ(env.affinity_log().back(), before);

  ASSERT_TRUE(r.ctx->SetThreads(1, {before.back()}).ok());
  env.clear_affinity_log();
  ASSERT_TRUE(r.ctx->Decode(p.data() + 8, 1, false).ok());
  const auto log = env.affinity_log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0], (std::vector<int>{before.back()}));  // the compute thread (the caller) pinned
  EXPECT_EQ(log[1], before);                             // and given back
  ASSERT_TRUE(env.GetThreadAffinity(&after).ok());
  EXPECT_EQ(after, before);

  // A refused pin costs placement, not the token.
  env.refuse_affinity = true;
  EXPECT_TRUE(r.ctx->Decode(p.data() + 9, 1, false).ok());
  env.refuse_affinity = false;
  EXPECT_EQ(int(r.ctx->history().size()), 10);
}

// On a (fake) big.LITTLE machine Init computes on the fastest cluster only, pinned.
TEST(SetThreads, HeterogeneousDefaultIsTheFastestCluster) {
  std::vector<int> allowed;
  ASSERT_TRUE(Env::Default()->GetThreadAffinity(&allowed).ok());
  FaultEnv env(Env::Default());
  // This process's CPUs as a fake big.LITTLE tree: the last one big, the others little.
  std::vector<FakeCpu> v;
  for (int c : allowed) v.push_back({c, c == allowed.back() ? 1024u : 400u, 0});
  FakeTree(&env, v, "");
  Rig r = MakeRig(&env, "het", 2, kRoot);
  if (allowed.size() >= 2) {
    EXPECT_EQ(r.ctx->n_threads(), 1);
    EXPECT_EQ(r.ctx->compute_cpus(), (std::vector<int>{allowed.back()}));
  }
  env.clear_affinity_log();
  const auto p = Prompt();
  ASSERT_TRUE(r.ctx->Decode(p.data(), 4, false).ok());
  if (allowed.size() >= 2) {
    ASSERT_FALSE(env.affinity_log().empty());
    EXPECT_EQ(env.affinity_log().front(), (std::vector<int>{allowed.back()}));
  }
  // Turned off: as asked, not pinned.
  FaultEnv env2(Env::Default());
  FakeTree(&env2, v, "");
  Rig o;
  {
    const std::string path = test::ModelPath("tiny-qwen3");
    ASSERT_TRUE(Model::Load(&env2, path, ModelOptions(), &o.model).ok());
    ContextOptions co;
    co.n_ctx = 64;
    co.n_threads = 2;
    co.cpu_root = kRoot;
    co.fastest_cluster_only = false;
    co.swap_path = test::TempDir() + "/threads-off.swap";
    o.ctx = std::make_unique<Context>(o.model.get(), co);
    ASSERT_TRUE(o.ctx->Init().ok());
  }
  EXPECT_EQ(o.ctx->n_threads(), 2);
  EXPECT_TRUE(o.ctx->compute_cpus().empty());
}

// During a generation on another thread SetThreads returns kBusy at once and changes nothing; the
// generation's logits are those of a context nobody disturbed.
TEST(SetThreadsConcurrency, BusyDuringDecodeAndRestoreGenerate) {
  Rig ref = MakeRig(Env::Default(), "cref", 2);
  const auto p = Prompt();
  ASSERT_TRUE(ref.ctx->Decode(p.data(), 32, false).ok());
  ASSERT_TRUE(ref.ctx->Decode(p.data() + 32, 4, false).ok());
  const auto want_decode = Logits(*ref.ctx);
  ASSERT_TRUE(ref.ctx->RestoreGenerate(p.data() + 36, 4, PipelineOptions(), nullptr).ok());
  const auto want_rg = Logits(*ref.ctx);

  Rig r = MakeRig(Env::Default(), "conc", 2);
  ASSERT_TRUE(r.ctx->Decode(p.data(), 32, false).ok());
  std::atomic<int> busy{0}, other{0};
  std::atomic<int> set_locked{0};
  SyncPoints::SetCallback("context:set_threads_locked", [&](int) { ++set_locked; });
  SyncPoints::SetCallback("context:decode_locked", [&](int) {
    // This thread holds the context: from another thread, SetThreads must not wait or change.
    std::thread([&] {
      Status st = r.ctx->SetThreads(1, {});
      (st.code() == Status::kBusy ? busy : other)++;
    }).join();
  });
  ASSERT_TRUE(r.ctx->Decode(p.data() + 32, 4, false).ok());
  EXPECT_EQ(busy.load(), 1);
  EXPECT_EQ(0, std::memcmp(Logits(*r.ctx).data(), want_decode.data(), want_decode.size() * sizeof(float)));
  // Evict some KV so restore_generate has work, then the same during it.
  uint64_t freed = 0;
  ASSERT_TRUE(r.ctx->EvictBytes(64 << 10, &freed).ok());
  EXPECT_GT(freed, 0u);
  ASSERT_TRUE(r.ctx->RestoreGenerate(p.data() + 36, 4, PipelineOptions(), nullptr).ok());
  SyncPoints::ClearAll();
  EXPECT_EQ(busy.load(), 2);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(set_locked.load(), 0);  // never got the context
  EXPECT_EQ(r.ctx->n_threads(), 2);
  EXPECT_EQ(0, std::memcmp(Logits(*r.ctx).data(), want_rg.data(), want_rg.size() * sizeof(float)));
  // Between calls it applies.
  ASSERT_TRUE(r.ctx->SetThreads(1, {}).ok());
  EXPECT_EQ(r.ctx->n_threads(), 1);
  EXPECT_EQ(r.ctx->forward().n_threads(), 1);
}

// SetThreads racing real generations (no sync points): every call is either applied between two
// generations or refused with kBusy; the conversation equals the undisturbed one. Under TSan this
// checks the lock discipline of SetThreads against Decode.
TEST(SetThreadsConcurrency, RacingSetThreadsNeverTearsTheConversation) {
  Rig ref = MakeRig(Env::Default(), "rref", 2);
  const auto want = Converse(*ref.ctx, 8, [](int) {});
  Rig r = MakeRig(Env::Default(), "race", 2);
  std::atomic<bool> stop{false};
  std::atomic<int> applied{0}, busy{0}, other{0};
  std::thread setter([&] {
    int n = 1;
    while (!stop.load()) {
      Status st = r.ctx->SetThreads(n, {});
      if (st.ok()) ++applied, n = 3 - n;
      else (st.code() == Status::kBusy ? busy : other)++;
      std::this_thread::yield();
    }
  });
  const auto got = Converse(*r.ctx, 8, [](int) {});
  stop = true;
  setter.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(applied.load() + busy.load(), 0);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float))) << "step " << i;
}

}  // namespace
}  // namespace mz
