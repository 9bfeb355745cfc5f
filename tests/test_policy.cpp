// The hybrid swap policy as pure planning (no I/O): stage order in both cases of §4.3, balance
// preservation, backward-out keeps the longest resident prefix, and repeated calls continue from
// the state the previous plan left.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "model/synth.h"
#include "policy/hybrid_swap.h"
#include "policy/remote_fetch.h"
#include "policy/tier_failure.h"
#include "test_util.h"

namespace mz {
namespace {

struct World {
  int L, C;
  std::map<std::tuple<int, int, int>, UnitState> st;  // (kind, layer, chunk)
  UnitState get(const UnitRef& u) const {
    auto it = st.find({int(u.kind), u.layer, u.chunk});
    return it == st.end() ? UnitState::kResident : it->second;
  }
  void apply(const Plan& p) {
    for (auto& x : p) st[{int(x.unit.kind), x.unit.layer, x.unit.chunk}] = x.target;
  }
};

PolicyInput Input(World& w, uint64_t bytes, UnitTimes t, EvictOrder order = EvictOrder::kBackwardOut) {
  PolicyInput in;
  in.n_layer = w.L;
  in.n_chunks = w.C;
  in.layer_bytes.assign(size_t(w.L), 40 << 20);
  in.base_bytes = 100 << 20;
  in.chunk_bytes = 1 << 20;
  in.ratio = 0.5;
  in.t = t;
  in.state = [&w](const UnitRef& u) { return w.get(u); };
  in.bytes = bytes;
  in.order = order;
  return in;
}

// t_r^W / t_d^KV = 10 -> k = 10, T = 28 * 10 = 280.
UnitTimes Times() {
  UnitTimes t;
  t.t_d_kv = 0.001;
  t.t_r_kv = 0.0015;
  t.t_r_kvc = 0.0012;
  t.t_r_w = 0.0105;
  return t;
}

std::vector<Stage> StagesOf(const PolicyOutput& o) {
  std::vector<Stage> s;
  for (auto& x : o.steps)
    if (s.empty() || s.back() != x.stage) s.push_back(x.stage);
  return s;
}

TEST(Policy, CaseKvExceedsThreshold_KvOnlyThenKvAndWThenWonlyThenCompKv) {
  World w{28, 32};  // 896 chunks > T = 280
  PolicyOutput o = PlanHybridSwap(Input(w, UINT64_MAX, Times()));
  EXPECT_EQ(StagesOf(o), (std::vector<Stage>{Stage::kKvOnly, Stage::kKvAndW, Stage::kWOnly, Stage::kCompKv}));
  // KVonly stops exactly at T resident chunks.
  int kvonly = 0;
  for (auto& s : o.steps) kvonly += s.stage == Stage::kKvOnly;
  EXPECT_EQ(kvonly, 28 * 32 - 280);
  // In case 1 KV chunks and weight layers run out (almost) together: Wonly has at most one layer left.
  int wonly_layers = 0;
  for (auto& s : o.steps) wonly_layers += s.stage == Stage::kWOnly && s.placement.unit.layer >= 0;
  EXPECT_LE(wonly_layers, 1);
  // Everything ends out of RAM: all KV on storage (compressed or raw), all weights dropped.
  World after = w;
  after.apply(o.plan);
  for (int l = 0; l < 28; ++l) {
    EXPECT_EQ(after.get(UnitRef::Weights(l)), UnitState::kWeightsDropped);
    for (int c = 0; c < 32; ++c) {
      UnitState s = after.get(UnitRef::Kv(l, c));
      EXPECT_TRUE(s == UnitState::kKvStorageRaw || s == UnitState::kKvStorageCompressed) << l << "," << c;
    }
  }
}

TEST(Policy, CaseKvWithinThreshold_StartsAtKvAndWThenWonly) {
  World w{28, 4};  // 112 chunks <= T = 280
  PolicyOutput o = PlanHybridSwap(Input(w, UINT64_MAX, Times()));
  EXPECT_EQ(StagesOf(o), (std::vector<Stage>{Stage::kKvAndW, Stage::kWOnly, Stage::kCompKv}));
  int wonly_layers = 0;
  for (auto& s : o.steps) wonly_layers += s.stage == Stage::kWOnly && s.placement.unit.layer >= 0;
  EXPECT_GT(wonly_layers, 10) << "with few KV chunks the weights outlast them";
}

TEST(Policy, BalancePreservedThroughKvOnlyAndKvAndW) {
  for (int C : {4, 32, 64}) {
    World w{28, C};
    const UnitTimes t = Times();
    PolicyOutput o = PlanHybridSwap(Input(w, UINT64_MAX, t));
    // KVonly: every step moves one KV chunk; the paths stay within one chunk's time.
    // KVandW: a step is one weight layer (t_r^W on the storage path) or one KV chunk; the paths stay
    // within one weight layer's time plus one chunk's rounding.
    for (auto& s : o.steps) {
      const double bound = s.stage == Stage::kKvOnly ? std::max(t.t_d_kv, t.t_r_kv) : t.t_r_w + t.t_d_kv;
      if (s.stage != Stage::kKvOnly && s.stage != Stage::kKvAndW) continue;
      EXPECT_LE(std::fabs(s.mem_path_s - s.sto_path_s), bound + 1e-12)
          << "C=" << C << " after " << UnitName(s.placement.unit) << " in " << StageName(s.stage);
    }
    // After each complete KVandW increment (a weight layer and the KV chunks that balance it), the
    // paths are within one KV chunk's time (the in-memory path has caught up).
    for (size_t i = 0; i + 1 < o.steps.size(); ++i)
      if (o.steps[i].stage == Stage::kKvAndW && o.steps[i + 1].stage == Stage::kKvAndW &&
          o.steps[i + 1].placement.unit.kind == UnitRef::kWeights && o.steps[i].placement.unit.kind == UnitRef::kKv)
        EXPECT_LE(std::fabs(o.steps[i].mem_path_s - o.steps[i].sto_path_s), t.t_d_kv + 1e-12) << "C=" << C << " step " << i;
  }
}

// Fully-resident layers 0..p-1: the prefix compute can run on without waiting.
int ResidentPrefix(const World& w) {
  for (int l = 0; l < w.L; ++l) {
    if (w.get(UnitRef::Weights(l)) != UnitState::kResident) return l;
    for (int c = 0; c < w.C; ++c)
      if (w.get(UnitRef::Kv(l, c)) != UnitState::kResident) return l;
  }
  return w.L;
}

TEST(Policy, BackwardOutLeavesTheLongestResidentPrefix) {
  for (uint64_t mib : {8, 64, 256, 600, 1200}) {
    int prefix[3];
    int i = 0;
    for (EvictOrder ord : {EvictOrder::kBackwardOut, EvictOrder::kForwardOut, EvictOrder::kRandomOut}) {
      World w{28, 32};
      w.apply(PlanHybridSwap(Input(w, mib << 20, Times(), ord)).plan);
      prefix[i++] = ResidentPrefix(w);
    }
    EXPECT_GE(prefix[0], prefix[1]) << mib << " MiB";
    EXPECT_GE(prefix[0], prefix[2]) << mib << " MiB";
    EXPECT_EQ(prefix[1], 0) << "forward-out evicts layer 0 first";
  }
  // Backward-out: the prefix is as long as the bytes allow (only the rearmost layers are touched).
  World w{28, 32};
  w.apply(PlanHybridSwap(Input(w, 10 << 20, Times())).plan);
  EXPECT_GE(ResidentPrefix(w), 27);
}

TEST(Policy, RepeatedRequestsContinueFromTheCurrentState) {
  World big{28, 32}, inc{28, 32};
  PolicyOutput all = PlanHybridSwap(Input(big, 900ull << 20, Times()));
  big.apply(all.plan);
  uint64_t freed = 0;
  std::vector<Stage> seen;
  while (freed < (900ull << 20)) {
    PolicyOutput o = PlanHybridSwap(Input(inc, 50ull << 20, Times()));
    ASSERT_FALSE(o.plan.empty());
    inc.apply(o.plan);
    freed += o.est_freed;
    for (auto& s : o.steps)
      if (seen.empty() || seen.back() != s.stage) seen.push_back(s.stage);
  }
  // Same stage progression as one big request; stages never go backwards.
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(int(seen[i]), int(seen[i - 1]));
  EXPECT_EQ(ResidentPrefix(big), ResidentPrefix(inc));
}

TEST(Policy, NothingLeftGivesAnEmptyPlan) {
  World w{4, 2};
  w.apply(PlanHybridSwap(Input(w, UINT64_MAX, Times())).plan);
  EXPECT_TRUE(PlanHybridSwap(Input(w, 1, Times())).plan.empty());
}

// Unit times follow the restore paths the engine will take: mapped KV reads have no allocation
// term and use the page cache's rate, q8 chunks read in place cost only the extra attention time.
TEST(DeviceProfile, UnitTimesFollowRestorePaths) {
  DeviceProfile p;
  p.decode_Bps = {{"q8", 10e9}, {"zstd", 1e9}};
  p.ratio = {{"q8", 0.5}, {"zstd", 0.9}};
  p.read_Bps = {{1 << 20, 1e9}, {4 << 20, 1e9}};
  p.mapped_read_Bps = 2e9;
  p.alloc_s_per_MiB = 5e-4;
  p.attend_in_place_s_per_MiB = {{"q8", 2e-5}};
  const uint64_t chunk = 1 << 20, layer = 16 << 20;
  const UnitTimes paper = DeriveUnitTimes(p, "q8", chunk, layer);
  EXPECT_NEAR(paper.t_d_kv, 1048576.0 / 10e9 + 5e-4, 1e-12);
  EXPECT_NEAR(paper.t_r_kv, 1048576.0 / 1e9 + 5e-4, 1e-12);
  EXPECT_NEAR(paper.t_r_w, 16 * 1048576.0 / 1e9 + 16 * 5e-4, 1e-12);
  RestorePaths all;
  all.weights_file_backed = all.kv_mapped = all.kv_in_place = true;
  const UnitTimes ours = DeriveUnitTimes(p, "q8", chunk, layer, all);
  EXPECT_NEAR(ours.t_d_kv, 2e-5, 1e-12);
  EXPECT_NEAR(ours.t_r_kv, 1048576.0 / 2e9, 1e-12);
  EXPECT_NEAR(ours.t_r_w, 16 * 1048576.0 / 2e9, 1e-12);
  EXPECT_NEAR(ours.t_r_kvc, 524288.0 / 0.5e9 + 2e-5, 1e-9);  // half a chunk at the extrapolated rate, attended in place
  // Repacked layers (MZ_WEIGHTS_REPACKED): staged through the page cache, a fresh anonymous region,
  // and the repack on top.
  RestorePaths rp = all;
  rp.weights_file_backed = false;
  rp.weights_repacked = true;
  rp.repack_s_per_layer = 0.004;
  EXPECT_NEAR(DeriveUnitTimes(p, "q8", chunk, layer, rp).t_r_w, 16 * 1048576.0 / 2e9 + 16 * 5e-4 + 0.004, 1e-12);
  // A codec without an in-place figure (the profile measures only codecs the kernel reads in
  // place; the Context asks for in-place costs only for those) is costed as decoded.
  const UnitTimes z = DeriveUnitTimes(p, "zstd", chunk, layer, all);
  EXPECT_NEAR(z.t_d_kv, 1048576.0 / 1e9 + 5e-4, 1e-12);
  // A measured speed-up (reading half the bytes) is clamped above zero: k stays finite.
  p.attend_in_place_s_per_MiB["q8"] = -1e-5;
  const UnitTimes neg = DeriveUnitTimes(p, "q8", chunk, layer, all);
  EXPECT_GT(neg.t_d_kv, 0.0);
  EXPECT_LT(neg.t_d_kv, 1e-5);
  // A profile written before the figure existed: q8 chunks are costed as decoded.
  p.attend_in_place_s_per_MiB.clear();
  EXPECT_NEAR(DeriveUnitTimes(p, "q8", chunk, layer, all).t_d_kv, paper.t_d_kv, 1e-12);
}

// With q8 chunks read in place the in-memory path is nearly free: k = floor(t_r^W / t_d^KV) = 210
// makes T = 28 * 210 larger than the 896 chunks, so the plan starts at KVandW (case 2 of §4.3):
// one weight layer dropped per k chunks compressed in memory, no KV raw on storage.
TEST(Policy, InPlaceChunksStartAtKvAndW) {
  World w{28, 32};
  UnitTimes t = Times();
  t.t_d_kv = 0.00005;
  const int k = int(std::floor(t.t_r_w / t.t_d_kv));
  ASSERT_GT(28 * k, 28 * 32);
  PolicyOutput o = PlanHybridSwap(Input(w, 300 << 20, t));
  int mem = 0, sto = 0, weights = 0;
  for (auto& x : o.plan) {
    if (x.target == UnitState::kKvMemCompressed) ++mem;
    if (x.target == UnitState::kKvStorageRaw) ++sto;
    if (x.unit.kind == UnitRef::kWeights) ++weights;
  }
  EXPECT_EQ(StagesOf(o), std::vector<Stage>{Stage::kKvAndW});
  EXPECT_EQ(sto, 0);
  EXPECT_GT(mem, 0);
  EXPECT_EQ(weights, (mem + k - 1) / k) << "mem " << mem << " k " << k;  // k chunks per dropped layer
}

TEST(DeviceProfile, SavesAndLoadsTheInPlaceFigureAndRejectsBadOnes) {
  const std::string path = test::TempDir() + "/profile-inplace.json";
  DeviceProfile p = DeviceProfile::Default();
  p.attend_in_place_s_per_MiB = {{"q8", 6e-5}};
  ASSERT_TRUE(p.Save(path).ok());
  DeviceProfile q;
  ASSERT_TRUE(DeviceProfile::Load(path, &q).ok());
  EXPECT_EQ(q.attend_in_place_s_per_MiB, p.attend_in_place_s_per_MiB);
  p.repack_Bps = {{"q4_0", 3e9}};
  ASSERT_TRUE(p.Save(path).ok());
  ASSERT_TRUE(DeviceProfile::Load(path, &q).ok());
  EXPECT_EQ(q.repack_Bps, p.repack_Bps);
  p.repack_Bps = {{"q4_0", 0}};  // a repack that takes forever is not a figure
  ASSERT_TRUE(p.Save(path).ok());
  EXPECT_EQ(DeviceProfile::Load(path, &q).code(), Status::kCorruption);
  {
    std::ofstream f(path);
    f << R"({"decode_Bps": {"q8": 1e9}, "read_Bps": [{"request_bytes": 4096, "Bps": 1e9}],
             "attend_in_place_s_per_MiB": {"q8": "fast"}})";
  }
  Status st = DeviceProfile::Load(path, &q);
  EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
  std::remove(path.c_str());
}

// The remote tier's measured rate is saved and loaded; a profile written before it was measured
// (no such fields) loads with 0 (not measured); implausible figures are refused by name.
TEST(DeviceProfile, RemoteRateRoundTripsAndOlderProfilesLoadWithoutIt) {
  const std::string path = test::TempDir() + "/profile-remote.json";
  DeviceProfile p = DeviceProfile::Default();
  p.remote_read_Bps = 2.5e8;
  p.remote_first_byte_s = 3e-4;
  ASSERT_TRUE(p.Save(path).ok());
  DeviceProfile q;
  ASSERT_TRUE(DeviceProfile::Load(path, &q).ok());
  EXPECT_EQ(q.remote_read_Bps, p.remote_read_Bps);
  EXPECT_EQ(q.remote_first_byte_s, p.remote_first_byte_s);
  {
    std::ofstream f(path);  // an older profile: no remote fields
    f << R"({"decode_Bps": {"q8": 1e9}, "read_Bps": [{"request_bytes": 4096, "Bps": 1e9}]})";
  }
  q.remote_read_Bps = 7;
  ASSERT_TRUE(DeviceProfile::Load(path, &q).ok());
  EXPECT_EQ(q.remote_read_Bps, 0.0);
  EXPECT_EQ(q.remote_first_byte_s, 0.0);
  for (const char* bad : {R"("remote_read_Bps": 0.5)", R"("remote_read_Bps": -3)", R"("remote_first_byte_s": -1)",
                          R"("remote_first_byte_s": 1e9)", R"("remote_read_Bps": "fast")"}) {
    {
      std::ofstream f(path);
      f << R"({"decode_Bps": {"q8": 1e9}, "read_Bps": [{"request_bytes": 4096, "Bps": 1e9}], )" << bad << "}";
    }
    Status st = DeviceProfile::Load(path, &q);
    EXPECT_EQ(st.code(), Status::kCorruption) << bad;
  }
  std::remove(path.c_str());
}

// Fetch vs compute again: the two expected times decide; fetching wins ties; a rate unknown (0,
// negative, NaN) or nothing to compute falls back to fetching.
TEST(RemoteFetchPolicy, FetchesWhenFasterComputesWhenSlowerAndFetchesWhenUnknown) {
  RemoteFetchInput in;
  in.bytes = 1000;
  in.tokens = 10;
  in.remote_Bps = 100;            // 10 s to fetch
  in.compute_s_per_token = 2.0;   // 20 s to compute
  RemoteFetchPlan p = PlanRemoteFetch(in);
  EXPECT_TRUE(p.fetch);
  EXPECT_DOUBLE_EQ(p.fetch_s, 10.0);
  EXPECT_DOUBLE_EQ(p.compute_s, 20.0);
  in.first_byte_s = 15.0;         // the latency tips it: 25 s > 20 s
  p = PlanRemoteFetch(in);
  EXPECT_FALSE(p.fetch);
  EXPECT_DOUBLE_EQ(p.fetch_s, 25.0);
  in.first_byte_s = 10.0;         // equal: fetched
  EXPECT_TRUE(PlanRemoteFetch(in).fetch);
  in.first_byte_s = 0;
  in.remote_Bps = 10;             // a slow link: 100 s > 20 s
  EXPECT_FALSE(PlanRemoteFetch(in).fetch);
  for (double r : {0.0, -1.0, std::nan("")}) {
    RemoteFetchInput u = in;
    u.remote_Bps = r;
    EXPECT_TRUE(PlanRemoteFetch(u).fetch) << r;
    u = in;
    u.compute_s_per_token = r;
    EXPECT_TRUE(PlanRemoteFetch(u).fetch) << r;
  }
  RemoteFetchInput none = in;
  none.tokens = 0;
  EXPECT_TRUE(PlanRemoteFetch(none).fetch);
}

// planned with: a zero ratio, zero/negative mapped-read rates, a non-positive thread count.
TEST(DeviceProfile, LoadRejectsFiguresThatBreakTheUnitTimes) {
  const std::string path = test::TempDir() + "/profile-bad.json";
  const std::string base = R"("decode_Bps": {"q8": 1e9}, "read_Bps": [{"request_bytes": 4096, "Bps": 1e9}])";
  for (const char* extra : {R"("ratio": {"q8": 0})", R"("ratio": {"q8": -0.5})", R"("alloc_s_per_MiB": -1)",
                            // Regressions (fuzz/fuzz_profile.cpp): finite but absurd figures gave
                            // infinite/NaN unit times and out-of-range float-to-int conversions.
                            R"("ratio": {"q8": 1e300})", R"("ratio": {"q8": 1e-300})", R"("alloc_s_per_MiB": 1e300)",
                            R"("decode_Bps": {"q8": 1e-300})", R"("mapped_read_Bps": 1e-300)",
                            R"("encode_Bps": {"q8": 1e-300})", R"("attend_in_place_s_per_MiB": {"q8": 1e300})",
                            R"("read_Bps": [{"request_bytes": 4096, "Bps": 1e-300}])", R"("threads": 100000)",
                            R"("threads": 1e20)", R"("threads": 2.5)",
                            R"("read_Bps": [{"request_bytes": 131070000000000000002, "Bps": 1e9}])",
                            R"("read_Bps": [{"request_bytes": -1.5, "Bps": 1e9}])",
                            R"("mapped_read_by_request": [{"request_bytes": 1048576, "Bps": 0}])",
                            R"("mapped_read_by_request": [{"request_bytes": 0, "Bps": 1e9}])", R"("threads": 0)"}) {
    {
      std::ofstream f(path);
      f << "{" << base << ", " << extra << "}";
    }
    DeviceProfile q;
    const Status st = DeviceProfile::Load(path, &q);
    EXPECT_EQ(st.code(), Status::kCorruption) << extra << ": " << st.ToString();
  }
  {
    std::ofstream f(path);
    f << "{" << base << ", " << R"("ratio": {"q8": 0.53})" << "}";
  }
  DeviceProfile ok;
  EXPECT_TRUE(DeviceProfile::Load(path, &ok).ok());
  std::remove(path.c_str());
}

// Regression (fuzz/regressions/profile/, found by fuzz/fuzz_profile.cpp): a profile with a 1 B/s
// mapped-read rate made t_r^W / t_d^KV about 7e10, and k = floor(that) was converted to int
// (undefined; on x86 INT_MIN, so T = L * k was not above the chunk count and the plan started
// with KVonly). k is now capped at C + 1: every chunk is within the threshold, as with any k > C,
// and the plan starts at KV&W (case 2 of §4.3).
TEST(Policy, HugeWeightToKvTimeRatioIsCaseTwo) {
  World w{28, 4};
  UnitTimes huge = Times(), big = Times();
  huge.t_r_w = huge.t_d_kv * 7e10;
  big.t_r_w = big.t_d_kv * 100;  // k = 100 > C = 4
  const PolicyOutput a = PlanHybridSwap(Input(w, UINT64_MAX, huge));
  const PolicyOutput b = PlanHybridSwap(Input(w, UINT64_MAX, big));
  ASSERT_FALSE(a.plan.empty());
  EXPECT_EQ(StagesOf(a).front(), Stage::kKvAndW);
  EXPECT_EQ(StagesOf(b).front(), Stage::kKvAndW);
  // A ratio above 1 (compressed larger than raw) frees nothing by compressing, never a wrapped-around
  // estimate.
  PolicyInput in = Input(w, UINT64_MAX, big);
  in.ratio = 3.5;
  for (const PlanStep& s : PlanHybridSwap(in).steps) EXPECT_LE(s.est_freed, uint64_t(100) << 20) << StageName(s.stage);
}

// Regression (fuzz/regressions/profile/interpolation-cancels-to-zero.json, found by
// fuzz/fuzz_profile.cpp): interpolating between 8e80 and 1.6e9 B/s cancelled to 0 B/s at the
// second size, so a weight layer's read time was infinite. A rate at a measured size is that rate.
TEST(DeviceProfile, InterpolationIsExactAtMeasuredSizesWhateverTheNeighbours) {
  DeviceProfile p = DeviceProfile::Default();
  p.read_Bps = {{512 << 10, 8e80}, {4 << 20, 1.6e9}};
  EXPECT_EQ(p.ReadBps(4 << 20), 1.6e9);
  EXPECT_EQ(p.ReadBps(512 << 10), 8e80);
  const double mid = p.ReadBps(1 << 20);
  EXPECT_TRUE(mid >= 1.6e9 && mid <= 8e80) << mid;
  const UnitTimes t = DeriveUnitTimes(p, "q8", 1 << 20, 32 << 20);
  for (double v : {t.t_d_kv, t.t_r_kv, t.t_r_kvc, t.t_r_w}) EXPECT_TRUE(std::isfinite(v) && v >= 0) << v;
}

// Mapped reads are costed at the rate measured for the piece's size: a KV chunk populated alone
// is slower than a 64 MiB weight layer; the table survives Save/Load.
TEST(DeviceProfile, MappedReadsAreCostedAtTheirPieceSize) {
  DeviceProfile p = DeviceProfile::Default();
  p.mapped_read_Bps = 2e9;
  RestorePaths all;
  all.weights_file_backed = all.kv_mapped = all.kv_in_place = true;
  const uint64_t chunk = 1 << 20, layer = 64ull << 20;
  // Without the table every size reads at mapped_read_Bps (profiles written before it existed).
  EXPECT_NEAR(DeriveUnitTimes(p, "q8", chunk, layer, all).t_r_kv, 1048576.0 / 2e9, 1e-12);
  // 4 MiB pieces measured fastest; 64 MiB (a layer) slower than mapped_read_Bps says.
  p.mapped_read_by_request = {{256 << 10, 0.25e9}, {1 << 20, 0.5e9}, {4 << 20, 3e9}, {64ull << 20, 1.5e9}};
  const UnitTimes t = DeriveUnitTimes(p, "q8", chunk, layer, all);
  EXPECT_NEAR(t.t_r_kv, 1048576.0 / 0.5e9, 1e-12);
  EXPECT_NEAR(t.t_r_w, 64 * 1048576.0 / 1.5e9, 1e-12);
  EXPECT_NEAR(p.MappedReadBps(2 << 20), 0.5e9 + (3e9 - 0.5e9) / 3, 1);  // between entries: linear
  EXPECT_NEAR(p.MappedReadBps(128 << 10), 0.125e9, 1);  // below the smallest: its per-request time
  EXPECT_NEAR(p.MappedReadBps(1ull << 30), 1.5e9, 1);   // above the largest: its rate, not the table's peak
  const std::string path = test::TempDir() + "/profile-mapped.json";
  ASSERT_TRUE(p.Save(path).ok());
  DeviceProfile q;
  ASSERT_TRUE(DeviceProfile::Load(path, &q).ok());
  EXPECT_EQ(q.mapped_read_by_request, p.mapped_read_by_request);
  std::remove(path.c_str());
}

// ---- Which failure a configuration meets on a phone tier (issue 49, policy/tier_failure.h) ----

ModelFilePlan PlanOf(const char* shape, const char* type) {
  SynthOptions o;
  o.type = type;
  o.vocab_dir = std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab";
  ModelFilePlan p;
  EXPECT_TRUE(PlanModelFile(*FindModelSpec(shape), o, &p).ok());
  return p;
}

TierConfig NotesConfig(bool repack, bool q8_kv) {
  TierConfig c;
  c.repack = repack;
  c.kv_bytes = q8_kv ? 4096ull * 68 * 1024 : 4096ull * 128 * 1024;  // Llama-3.1-8B, 4096 tokens
  c.scratch_bytes = 200000000;
  return c;
}

// The notes' arithmetic: on the Snapdragon 695 table, 4.62 of the Q4_K_M file's 4.92 GB become
// anonymous (all but the 0.30 GB token embedding); on the 8 GB phone that is killed at load, and
// with --no-repack the same file stays evictable and thrashes instead.
TEST(TierFailure, NotesEightGbPhone) {
  const ModelFilePlan q4km = PlanOf("llama3.1-8b", "q4_k_m");
  const PhoneTier phone = PhoneTier::FromRam(8e9, 800e6);
  EXPECT_NEAR(phone.os + phone.background + phone.runtime, 4.30e9, 1e6);
  const TierVerdict rep = ClassifyOnTier(q4km, phone, NotesConfig(true, false));
  EXPECT_NEAR(rep.weights_anon / 1e9, 4.62, 0.02);
  EXPECT_NEAR(rep.weights_file / 1e9, 0.30, 0.01);
  EXPECT_EQ(rep.failure, TierFailure::kKilledAtLoad) << rep.why;
  EXPECT_GT(rep.quiet_demand, phone.ram);
  // The notes' 9.12 GB of unevictable demand before the cache: OS, background, runtime, repacked weights, scratch.
  EXPECT_NEAR((rep.busy_demand - double(NotesConfig(true, false).kv_bytes)) / 1e9, 9.12, 0.02);

  const TierVerdict raw = ClassifyOnTier(q4km, phone, NotesConfig(false, false));
  EXPECT_EQ(raw.weights_anon, 0.0);
  EXPECT_EQ(raw.failure, TierFailure::kThrash) << raw.why;
  EXPECT_NEAR(raw.reread_per_token, raw.streamed_file - raw.page_cache, 1.0);
  EXPECT_GT(raw.reread_per_token, 1e9);
  EXPECT_NE(raw.why.find("from flash"), std::string::npos);
}

// Between "killed at load" and "fits" lies the tier where it loads on a quiet phone and dies when
// the background apps come back; more RAM never makes the failure worse.
TEST(TierFailure, KilledOnReturnBetweenLoadAndFit) {
  const ModelFilePlan q4km = PlanOf("llama3.1-8b", "q4_k_m");
  const TierConfig cfg = NotesConfig(true, true);
  EXPECT_EQ(ClassifyOnTier(q4km, PhoneTier::FromRam(8e9, 800e6), cfg).failure, TierFailure::kKilledAtLoad);
  const TierVerdict nine = ClassifyOnTier(q4km, PhoneTier::FromRam(9e9, 800e6), cfg);
  EXPECT_EQ(nine.failure, TierFailure::kKilledOnReturn) << nine.why;
  EXPECT_LE(nine.quiet_demand, 9e9);
  EXPECT_GT(nine.busy_demand, 9e9);
  EXPECT_EQ(ClassifyOnTier(q4km, PhoneTier::FromRam(12e9, 800e6), cfg).failure, TierFailure::kFits);
  for (bool repack : {true, false}) {
    int worst = 3;
    for (double gb = 4; gb <= 16; gb += 0.5) {
      const int f = int(ClassifyOnTier(q4km, PhoneTier::FromRam(gb * 1e9, 800e6), NotesConfig(repack, false)).failure);
      EXPECT_LE(f, worst) << gb << " GB, repack " << repack;
      worst = f;
    }
  }
}

// The repack tables: Q3_K has no repacked kernel anywhere, Q6_K only on ARM (so a Q4_K_M file
// leaves more in the file mapping on AVX2), and a tied embedding is loaded twice, once for the head.
TEST(TierFailure, RepackTables) {
  EXPECT_FALSE(RepackedByLlamaCpp("q3_K", 4096, RepackIsa::kArmDotprod));
  EXPECT_FALSE(RepackedByLlamaCpp("q2_K", 4096, RepackIsa::kArmDotprod));
  EXPECT_TRUE(RepackedByLlamaCpp("q6_K", 4096, RepackIsa::kArmDotprod));
  EXPECT_FALSE(RepackedByLlamaCpp("q6_K", 4096, RepackIsa::kX86Avx2));
  EXPECT_TRUE(RepackedByLlamaCpp("q8_0", 4096, RepackIsa::kArmDotprod));
  EXPECT_FALSE(RepackedByLlamaCpp("q8_0", 4096, RepackIsa::kX86Avx2));
  EXPECT_FALSE(RepackedByLlamaCpp("q4_K", 4100, RepackIsa::kArmDotprod));  // rows not a multiple of 8
  const ModelFilePlan q4km = PlanOf("llama3.1-8b", "q4_k_m");
  const PhoneTier phone = PhoneTier::FromRam(8e9, 800e6);
  TierConfig x86 = NotesConfig(true, false);
  x86.isa = RepackIsa::kX86Avx2;
  const TierVerdict arm = ClassifyOnTier(q4km, phone, NotesConfig(true, false)), avx = ClassifyOnTier(q4km, phone, x86);
  EXPECT_NEAR(arm.weights_anon - avx.weights_anon, double(q4km.bytes_by_type.at("q6_K")), 1.0);
  const ModelFilePlan q3km = PlanOf("llama3.1-8b", "q3_k_m");
  EXPECT_NEAR(ClassifyOnTier(q3km, phone, NotesConfig(true, false)).weights_file,
              double(q3km.bytes_by_type.at("q3_K") + q3km.bytes_by_type.at("f32")), 1.0);
  // Tied (Qwen3-0.6B, q8_0): the embedding stays in the file and its head copy is repacked.
  const ModelFilePlan tied = PlanOf("qwen3-0.6b", "q8_0");
  TierConfig tc = NotesConfig(true, false);
  tc.tied = true;
  const TierVerdict t = ClassifyOnTier(tied, phone, tc);
  EXPECT_NEAR(t.weights_anon + t.weights_file, double(tied.tensor_bytes + tied.token_embd_bytes), 1.0);
}

// The third way (TierConfig::give_back, a plan of a design not built): never killed for its weights;
// where the repacked default is killed and --no-repack thrashes, it thrashes by the same bound with
// the front layers repacked; where everything fits, every layer stays repacked.
TEST(TierFailure, ThirdWayGivesBackLayersInsteadOfBeingKilled) {
  const ModelFilePlan q4km = PlanOf("llama3.1-8b", "q4_k_m");
  TierConfig gb = NotesConfig(true, false);
  gb.give_back = true;
  gb.repack_Bps = 1e9;
  const PhoneTier eight = PhoneTier::FromRam(8e9, 800e6);
  const TierVerdict raw = ClassifyOnTier(q4km, eight, NotesConfig(false, false));
  const TierVerdict third = ClassifyOnTier(q4km, eight, gb);
  ASSERT_EQ(ClassifyOnTier(q4km, eight, NotesConfig(true, false)).failure, TierFailure::kKilledAtLoad);
  EXPECT_EQ(third.failure, TierFailure::kThrash) << third.why;
  EXPECT_NEAR(third.reread_per_token, raw.reread_per_token, 1.0);
  EXPECT_EQ(third.n_layer, 32);
  EXPECT_GT(third.repacked_layers_busy, 0);
  EXPECT_LT(third.repacked_layers_busy, 32);
  EXPECT_GT(third.repacked_layers_quiet, third.repacked_layers_busy);  // the background apps' 1.2 GB
  EXPECT_LE(third.app_unevictable + eight.os + eight.background, eight.ram);  // not the kill
  // Re-making one layer: its repackable bytes read at flash speed and repacked.
  const double layer = (q4km.tensor_bytes - q4km.token_embd_bytes - q4km.bytes_by_type.at("f32") -
                        4096.0 * 128256 / 256 * 210) / 32.0;
  EXPECT_NEAR(third.remake_layer_s, layer / 800e6 + layer / 1e9, 1e-3);
  const TierVerdict twelve = ClassifyOnTier(q4km, PhoneTier::FromRam(12e9, 800e6), gb);
  EXPECT_EQ(twelve.failure, TierFailure::kFits) << twelve.why;
  EXPECT_EQ(twelve.repacked_layers_busy, 32);
  // Killed only when the app does not fit without any weights (1.5 GB: 0.49 OS + 1.24 app).
  EXPECT_EQ(ClassifyOnTier(q4km, PhoneTier::FromRam(1.5e9, 800e6), gb).failure, TierFailure::kKilledAtLoad);
  EXPECT_EQ(ClassifyOnTier(q4km, PhoneTier::FromRam(2e9, 800e6), gb).failure, TierFailure::kKilledOnReturn);
}

}  // namespace
}  // namespace mz
