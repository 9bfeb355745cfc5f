// The restore mode (policy/restore_mode.h): the choice between restoring overlapped with the
// prefill and restoring first, and the workers, as a pure function of the cores, the restore's
// CPU and storage-wait costs and the compute cost; and, applied by Context::RestoreGenerate
// (Overlap::kAuto), every mode giving the same logits bit for bit after the weights and the KV
// were given back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "policy/restore_mode.h"
#include "policy/restore_rates.h"
#include "runtime/context.h"
#include "test_util.h"

namespace mz {
namespace {

RestoreCosts Costs(int cores, int threads, double cpu, double wait, double compute) {
  RestoreCosts c;
  c.cores = cores;
  c.compute_threads = threads;
  c.io_workers = 2;
  c.decode_workers = 1;
  c.restore_cpu_s = cpu;
  c.restore_wait_s = wait;
  c.compute_s = compute;
  return c;
}

// Session 32's switch on the 2-core VM: compute 0.374 s, page-cache restore about 0.78 s of one
// core: serial (0.39 + 0.374) beats overlapped (max(2 x 0.374, 0.78)), as measured.
TEST(RestoreMode, TwoCoresPageCacheRestoreGoesSerial) {
  const RestoreModePlan p = PlanRestoreMode(Costs(2, 2, 0.78, 0.0, 0.374));
  EXPECT_FALSE(p.overlap) << p.why;
  EXPECT_NEAR(p.predicted_serial_s, 0.78 / 2 + 0.374, 1e-9);
  EXPECT_NEAR(p.predicted_overlap_s, 0.78, 1e-9);
  EXPECT_EQ(p.io_workers + p.decode_workers, 2) << "one worker per core, nothing computes meanwhile";
  EXPECT_EQ(p.compute_threads_during, 2);
  // Compute not measured yet: CPU-bound restoration on no spare core is serial too.
  EXPECT_FALSE(PlanRestoreMode(Costs(2, 2, 0.78, 0.0, 0.0)).overlap);
}

TEST(RestoreMode, SpareCoresOverlapAndComputeKeepsItsThreads) {
  const RestoreModePlan p = PlanRestoreMode(Costs(8, 4, 0.78, 0.0, 0.374));
  EXPECT_TRUE(p.overlap) << p.why;
  EXPECT_EQ(p.compute_threads_during, 4) << "restoration has cores of its own";
  EXPECT_EQ(p.io_workers, 2);
  EXPECT_NEAR(p.predicted_overlap_s, std::max(0.374, 0.78 / 3), 1e-9);
  // One spare core: one storage worker for CPU-bound reads, if the restore fits behind compute...
  const RestoreModePlan q = PlanRestoreMode(Costs(3, 2, 0.3, 0.0, 0.374));
  EXPECT_TRUE(q.overlap) << q.why;
  EXPECT_EQ(q.io_workers, 1);
  // ...but a restore far longer than compute on one core is faster on all three, then compute.
  const RestoreModePlan r = PlanRestoreMode(Costs(3, 2, 0.78, 0.0, 0.374));
  EXPECT_FALSE(r.overlap) << r.why;
  EXPECT_EQ(r.io_workers + r.decode_workers, 3);
  EXPECT_TRUE(PlanRestoreMode(Costs(8, 4, 0.78, 0.0, 0.0)).overlap) << "compute unknown, spare cores";
}

TEST(RestoreMode, StorageWaitHidesBehindThePrefillOnFewCores) {
  // Direct reads that mostly wait for the disk: overlapping hides them behind compute.
  const RestoreModePlan p = PlanRestoreMode(Costs(2, 2, 0.05, 0.6, 0.5));
  EXPECT_TRUE(p.overlap) << p.why;
  // Compute on one thread of two while the 0.6 s restore runs (0.3 s of its work), then on both.
  EXPECT_NEAR(p.predicted_overlap_s, 0.5 + 0.6 / 2, 1e-9);
  EXPECT_NEAR(p.predicted_serial_s, 0.6 + 0.5, 1e-9);
  EXPECT_EQ(p.compute_threads_during, 1);
  EXPECT_EQ(p.io_workers, 2) << "waiting reads keep the workers asked for in flight";
  EXPECT_TRUE(PlanRestoreMode(Costs(2, 2, 0.05, 0.6, 0.0)).overlap) << "compute unknown, mostly waiting";
  // The same reads against a short prefill: serial waits 0.6 s then computes 0.1 s; overlapped,
  // the 0.2 s of compute on one thread hides behind the 0.6 s wait.
  const RestoreModePlan q = PlanRestoreMode(Costs(2, 2, 0.05, 0.6, 0.1));
  EXPECT_EQ(q.overlap, q.predicted_overlap_s < q.predicted_serial_s);
  EXPECT_TRUE(q.overlap) << "0.6 overlapped against 0.7 serial";
}

TEST(RestoreMode, OneCoreOneThread) {
  // One core: compute and a CPU-bound restore add up either way; a tie goes to serial.
  RestoreModePlan p = PlanRestoreMode(Costs(1, 1, 0.4, 0.0, 0.3));
  EXPECT_FALSE(p.overlap) << p.why;
  EXPECT_EQ(p.compute_threads_during, 1);
  EXPECT_GE(p.io_workers, 1);
  // Waiting reads on one core: overlap (the core computes while the disk reads).
  p = PlanRestoreMode(Costs(1, 1, 0.0, 0.5, 0.3));
  EXPECT_TRUE(p.overlap);
  // Nothing to restore: no worse either way, serial by the tie rule.
  p = PlanRestoreMode(Costs(2, 2, 0.0, 0.0, 0.3));
  EXPECT_FALSE(p.overlap);
  // Nonsense inputs are clamped, never divide by zero.
  p = PlanRestoreMode(Costs(0, 0, -1, -1, -1));
  EXPECT_GE(p.io_workers, 1);
  EXPECT_GE(p.decode_workers, 1);
  EXPECT_GE(p.compute_threads_during, 1);
}

// Compute gets its threads back once restoration is done (the pipeline's wait hook): a prefill
// that outlasts the restore is charged one thread's share of the restore, not n / (n - 1) of
// itself; one that is shorter ends with the restore.
TEST(RestoreMode, ComputeGetsItsThreadsBackAfterTheRestore) {
  RestoreModePlan p = PlanRestoreMode(Costs(2, 2, 0.1, 0.2, 1.0));
  EXPECT_NEAR(p.predicted_overlap_s, 1.0 + 0.2 / 2, 1e-9);
  EXPECT_NEAR(p.predicted_serial_s, 0.2 + 1.0, 1e-9);
  EXPECT_TRUE(p.overlap) << p.why;
  p = PlanRestoreMode(Costs(4, 4, 0.9, 0.0, 0.2));
  EXPECT_NEAR(p.predicted_overlap_s, 0.9, 1e-9) << "the prefill cannot end before the last unit is back";
  EXPECT_NEAR(p.predicted_serial_s, 0.9 / 3 + 0.2, 1e-9) << "min(cores, workers asked) = 3";
  EXPECT_FALSE(p.overlap) << p.why;
}

// The model switch of issue 45 on 2 cores, 2 compute threads: Llama-3.2-1B's 1.2 GiB of dropped
// weights priced by the default profile's mapped-read rate (1.6 GB/s on two threads: all CPU) go
// serial; priced by a learned rate saying the reload is mostly not CPU (session 36: 0.33 s of wall
// time for ~0.1 s of CPU, two workers) they go overlapped, as forcing overlap measured.
TEST(RestoreMode, LearnedPageCacheRateFlipsTheSwitchToOverlap) {
  const double bytes = 1.2 * 1073741824.0, compute = 0.37;
  const RestoreModePlan prior = PlanRestoreMode(Costs(2, 2, bytes / (1.6e9 / 2), 0.0, compute));
  EXPECT_FALSE(prior.overlap) << prior.why;
  RestoreRates rates;
  RestoreSample s;  // two workers for 0.33 s: 0.66 s of their wall time, 0.1 s of it on a core
  s.bytes = uint64_t(bytes);
  s.wall_s = 0.66;
  s.cpu_s = 0.1;
  s.cpu_known = true;
  ASSERT_TRUE(rates.Note(RestoreKind::kMappedWeights, s));
  const RestoreRate r = rates.Get(RestoreKind::kMappedWeights);
  const double cpu = bytes * r.cpu_s_per_byte, wait = bytes * r.wait_s_per_byte() / 2;  // 2 storage workers
  EXPECT_NEAR(cpu, 0.1, 1e-9);
  EXPECT_NEAR(wait, 0.28, 1e-9);
  const RestoreModePlan learned = PlanRestoreMode(Costs(2, 2, cpu, wait, compute));
  EXPECT_TRUE(learned.overlap) << learned.why;
  EXPECT_NEAR(learned.predicted_serial_s, 0.28 + compute, 1e-9);
  EXPECT_NEAR(learned.predicted_overlap_s, compute + 0.28 / 2, 1e-9);
  // The same reload learned as all CPU (an Env that cannot tell thread CPU time) stays serial.
  RestoreRates blind;
  s.cpu_known = false;
  ASSERT_TRUE(blind.Note(RestoreKind::kMappedWeights, s));
  const RestoreRate b = blind.Get(RestoreKind::kMappedWeights);
  EXPECT_DOUBLE_EQ(b.cpu_s_per_byte, b.wall_s_per_byte);
  EXPECT_FALSE(PlanRestoreMode(Costs(2, 2, bytes * b.cpu_s_per_byte, 0.0, compute)).overlap);
}

TEST(RestoreRates, LearnsPerKindAsAMovingAverage) {
  RestoreRates rates(1000);
  for (int k = 0; k < kRestoreKinds; ++k) EXPECT_EQ(rates.Get(RestoreKind(k)).samples, 0) << "nothing observed";
  RestoreSample s;
  s.bytes = 999;  // below min_bytes: fixed costs would dominate
  s.wall_s = 1;
  s.cpu_known = true;
  EXPECT_FALSE(rates.Note(RestoreKind::kMappedKv, s));
  s.bytes = 1000;
  s.wall_s = 0;  // no time: nothing to learn
  EXPECT_FALSE(rates.Note(RestoreKind::kMappedKv, s));
  EXPECT_EQ(rates.Get(RestoreKind::kMappedKv).samples, 0);
  s.wall_s = 4e-6;
  s.cpu_s = 1e-6;
  EXPECT_TRUE(rates.Note(RestoreKind::kMappedKv, s));
  RestoreRate r = rates.Get(RestoreKind::kMappedKv);
  EXPECT_EQ(r.samples, 1);
  EXPECT_DOUBLE_EQ(r.wall_s_per_byte, 4e-9);
  EXPECT_DOUBLE_EQ(r.cpu_s_per_byte, 1e-9);
  EXPECT_DOUBLE_EQ(r.wait_s_per_byte(), 3e-9);
  EXPECT_EQ(rates.Get(RestoreKind::kMappedWeights).samples, 0) << "kinds are learned apart";
  EXPECT_EQ(rates.Get(RestoreKind::kDirectRead).samples, 0);
  // The newest sample weighs a half.
  s.wall_s = 2e-6;
  s.cpu_s = 3e-6;  // more CPU than wall (clocks of different threads): clamped to the wall time
  EXPECT_TRUE(rates.Note(RestoreKind::kMappedKv, s));
  r = rates.Get(RestoreKind::kMappedKv);
  EXPECT_EQ(r.samples, 2);
  EXPECT_DOUBLE_EQ(r.wall_s_per_byte, 3e-9);
  EXPECT_DOUBLE_EQ(r.cpu_s_per_byte, 1.5e-9);
  // CPU time unknown: page-cache kinds count as all CPU (as the profile prices them), direct reads
  // as all waiting.
  s.cpu_known = false;
  EXPECT_TRUE(rates.Note(RestoreKind::kMappedWeights, s));
  EXPECT_TRUE(rates.Note(RestoreKind::kDirectRead, s));
  EXPECT_DOUBLE_EQ(rates.Get(RestoreKind::kMappedWeights).cpu_s_per_byte, 2e-9);
  EXPECT_DOUBLE_EQ(rates.Get(RestoreKind::kDirectRead).cpu_s_per_byte, 0.0);
  EXPECT_DOUBLE_EQ(rates.Get(RestoreKind::kDirectRead).wall_s_per_byte, 2e-9);
}

// An Env whose threads never use CPU time (every restore is all waiting), or which cannot tell.
class ThreadCpuEnv : public EnvWrapper {
 public:
  explicit ThreadCpuEnv(bool known) : EnvWrapper(Env::Default()), known_(known) {}
  bool ThreadCpuNs(uint64_t* ns) override {
    ++calls;
    if (!known_) return false;
    *ns = 12345;
    return true;
  }
  std::atomic<int> calls{0};

 private:
  const bool known_;
};

// Learning through the Env: a restore before compute (kNone) teaches the context's rates what its
// units cost, per kind, with the CPU share the Env's thread clock gave; the next plan prices the
// dropped bytes with them instead of the profile (restore_rates shared: a pool's contexts).
TEST(RestoreRates, ContextLearnsFromItsRestoresThroughTheEnv) {
  const std::string path = test::ModelPath("tiny-qwen3", "q8_0");
  std::vector<int32_t> toks;
  for (int i = 0; i < 200; ++i) toks.push_back(int32_t(100 + (i * 37) % 1900));
  // env_kind: 0 the real Env, 1 thread CPU never advances, 2 thread CPU unknown.
  for (int env_kind = 0; env_kind < 3; ++env_kind) {
    SCOPED_TRACE(env_kind);
    ThreadCpuEnv fake(env_kind == 1);
    Env* env = env_kind == 0 ? Env::Default() : static_cast<Env*>(&fake);
    std::unique_ptr<Model> m;
    Status st = Model::Load(env, path, ModelOptions(), &m);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(m->file_backed()) << "the default: weights mapped from the model file";
    ContextOptions co;
    co.n_ctx = 512;
    co.kv_chunk_tokens = 64;
    co.kv_codec = "none";
    co.swap_path = test::TempDir() + "/restore-rates-" + std::to_string(getpid()) + ".swap";
    co.restore_rates = std::make_shared<RestoreRates>(0);  // learn from a tiny model's few bytes
    co.hybrid = false;  // every KV chunk to storage, raw (codec none): nothing decoded
    auto rates = co.restore_rates;
    uint64_t freed = 0;
    {
      Context c(m.get(), co);
      ASSERT_TRUE(c.Init().ok());
      EXPECT_EQ(c.restore_rates(), rates) << "the rates given are the ones used";
      ASSERT_TRUE(c.Decode(toks.data(), 150, false).ok());
      ASSERT_TRUE(c.EvictBytes(~uint64_t(0) >> 1, &freed).ok());
      const MemoryReport before = c.Report();
      ASSERT_GT(before.weights_dropped, 0u);
      PipelineOptions po;
      po.overlap = Overlap::kNone;  // restored before compute: nothing else on the cores
      RestoreGenerateStats rs;
      st = c.RestoreGenerate(toks.data() + 150, 50, po, &rs);
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(rs.rates_learned);
      const RestoreSample& sw = rs.pipeline.by_kind[int(RestoreKind::kMappedWeights)];
      EXPECT_EQ(sw.bytes, before.weights_dropped) << "every dropped weight unit, as the table counts it";
      EXPECT_GT(sw.wall_s, 0.0);
      EXPECT_EQ(sw.cpu_known, env_kind != 2);
      const RestoreRate w = rates->Get(RestoreKind::kMappedWeights);
      ASSERT_EQ(w.samples, 1);
      EXPECT_DOUBLE_EQ(w.wall_s_per_byte, sw.wall_s / double(sw.bytes));
      EXPECT_LE(w.cpu_s_per_byte, w.wall_s_per_byte);
      if (env_kind == 1) EXPECT_EQ(w.cpu_s_per_byte, 0.0) << "the thread clock never advanced: all waiting";
      if (env_kind == 2) EXPECT_EQ(w.cpu_s_per_byte, w.wall_s_per_byte) << "unknown: all CPU, as the prior";
      if (env_kind != 0) EXPECT_GT(fake.calls.load(), 0);
    }
    // The next plan prices dropped weights and mapped KV with what was learned (the same rates for
    // every kind here, so the KV's path does not matter), not the profile.
    RestoreSample seed;
    seed.bytes = 1 << 20;
    seed.wall_s = 1e-3;   // 1 ms per MiB per thread
    seed.cpu_s = 0.25e-3;  // a quarter of it on a core
    seed.cpu_known = true;
    auto fresh = std::make_shared<RestoreRates>(0);
    for (int k = 0; k < kRestoreKinds; ++k) ASSERT_TRUE(fresh->Note(RestoreKind(k), seed));
    co.restore_rates = fresh;
    Context d(m.get(), co);
    ASSERT_TRUE(d.Init().ok());
    ASSERT_TRUE(d.Decode(toks.data(), 150, false).ok());
    ASSERT_TRUE(d.EvictBytes(~uint64_t(0) >> 1, &freed).ok());
    const MemoryReport r = d.Report();
    ASSERT_EQ(r.kv_storage_compressed + r.kv_mem_compressed_raw, 0u) << "codec none: nothing decoded";
    PipelineOptions ask;
    const RestoreCosts got = d.RestoreModeCosts(50, ask);
    const double per_byte = 1e-3 / double(1 << 20), bytes = double(r.weights_dropped + r.kv_storage_raw);
    const double alloc = d.units().KvStorageMapped()
                             ? 0.0
                             : double(r.kv_storage_raw) / 1048576.0 * d.profile().alloc_s_per_MiB;
    EXPECT_NEAR(got.restore_cpu_s, bytes * per_byte * 0.25 + alloc, 1e-12);
    EXPECT_NEAR(got.restore_wait_s, bytes * per_byte * 0.75 / ask.io_threads, 1e-12);
    // A context with its own rates (none given) has learned nothing yet: the profile prices them.
    co.restore_rates = nullptr;
    Context e(m.get(), co);
    ASSERT_TRUE(e.Init().ok());
    ASSERT_NE(e.restore_rates(), nullptr);
    EXPECT_EQ(e.restore_rates()->Get(RestoreKind::kMappedWeights).samples, 0);
  }
}

// Every mode after the weights and the KV were given back gives the logits of a context that never
// gave anything back, bit for bit; kAuto reports what it chose and why.
TEST(RestoreMode, EveryModeSameLogits) {
  const std::string path = test::ModelPath("tiny-qwen3", "q8_0");
  std::vector<int32_t> toks;
  for (int i = 0; i < 200; ++i) toks.push_back(int32_t(100 + (i * 37) % 1900));
  auto run = [&](bool evict, Overlap o, RestoreGenerateStats* rs, double* rate) {
    std::unique_ptr<Model> m;
    Status st = Model::Load(Env::Default(), path, ModelOptions(), &m);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return std::vector<float>();
    ContextOptions co;
    co.n_ctx = 512;
    co.kv_chunk_tokens = 64;
    co.kv_codec = "none";
    co.swap_path = test::TempDir() + "/restore-mode-" + std::to_string(getpid()) + ".swap";
    Context c(m.get(), co);
    EXPECT_TRUE(c.Init().ok());
    EXPECT_TRUE(c.Decode(toks.data(), 150, false).ok());
    if (rate) *rate = c.compute_s_per_token();
    if (evict) {
      uint64_t freed = 0;
      st = c.EvictBytes(~uint64_t(0) >> 1, &freed);
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_GT(freed, 0u);
    }
    PipelineOptions po;
    po.overlap = o;
    RestoreGenerateStats local;
    st = c.RestoreGenerate(toks.data() + 150, 50, po, rs ? rs : &local);
    EXPECT_TRUE(st.ok()) << st.ToString();
    const int nv = int(m->hparams().n_vocab);
    const float* l = c.logits(0);
    return l ? std::vector<float>(l, l + nv) : std::vector<float>();
  };
  double rate = 0;
  const std::vector<float> want = run(false, Overlap::kFull, nullptr, &rate);
  ASSERT_FALSE(want.empty());
  EXPECT_GT(rate, 0.0) << "a 150-token prompt measures the prefill rate";
  for (Overlap o : {Overlap::kFull, Overlap::kNone, Overlap::kAuto}) {
    RestoreGenerateStats rs;
    const std::vector<float> got = run(true, o, &rs, nullptr);
    EXPECT_TRUE(got == want) << OverlapName(o) << ": logits differ from a context that kept everything";
    EXPECT_GT(rs.pipeline.units, 0) << OverlapName(o);
    if (o == Overlap::kAuto) {
      EXPECT_TRUE(rs.auto_mode);
      EXPECT_TRUE(rs.overlap == Overlap::kFull || rs.overlap == Overlap::kNone);
      EXPECT_EQ(rs.overlap == Overlap::kFull, rs.mode_plan.overlap) << "the plan is what ran";
      EXPECT_GT(rs.mode_costs.restore_cpu_s + rs.mode_costs.restore_wait_s, 0.0) << "something to restore";
      EXPECT_GT(rs.mode_costs.compute_s, 0.0) << "the measured prefill rate";
      EXPECT_GE(rs.mode_costs.cores, 1);
      EXPECT_NE(std::string(rs.mode_plan.why), "");
    } else {
      EXPECT_FALSE(rs.auto_mode);
      EXPECT_EQ(rs.overlap, o);
    }
  }
}

}  // namespace
}  // namespace mz
