// The restore mode (policy/restore_mode.h): the choice between restoring overlapped with the
// prefill and restoring first, and the workers, as a pure function of the cores, the restore's
// CPU and storage-wait costs and the compute cost; and, applied by Context::RestoreGenerate
// (Overlap::kAuto), every mode giving the same logits bit for bit after the weights and the KV
// were given back.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "policy/restore_mode.h"
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
  EXPECT_NEAR(p.predicted_overlap_s, 1.0, 1e-9);  // compute on one thread of two: 0.5 x 2
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
