// Sustained runs (issue 24 section 4): thermal zones read from fake sysfs trees, the controller's
// stepping rules (down on heat, hysteresis, up after a hold, tokens/s drift, at most one change per
// interval), the duty-cycle arithmetic, and SustainedMode on a real context with a fake clock and
// fake sensors: the thread count really changes between decodes, the logits equal a context that
// never changed threads and the KV is kept. Also the C API's enable / stats / disable. No timed
// assertion: every time is a fake clock's.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>

#include "env/env.h"
#include "env/fault_env.h"
#include "env/thermal_zones.h"
#include "mzcache.h"
#include "policy/sustained_controller.h"
#include "runtime/context.h"
#include "runtime/sustained.h"
#include "test_util.h"

namespace mz {
namespace {

const std::string kRoot = "/fakesys/thermal";
constexpr uint64_t kS = 1'000'000'000ull;

void Zone(FaultEnv* env, int i, const std::string& type, const std::string& temp,
          const std::vector<std::pair<std::string, std::string>>& trips = {}) {
  const std::string d = kRoot + "/thermal_zone" + std::to_string(i);
  env->SetFakeFile(d + "/type", type + "\n");
  env->SetFakeFile(d + "/temp", temp + "\n");
  env->SetFakeFile(d + "/mode", "enabled\n");
  for (size_t k = 0; k < trips.size(); ++k) {
    env->SetFakeFile(d + "/trip_point_" + std::to_string(k) + "_type", trips[k].first + "\n");
    env->SetFakeFile(d + "/trip_point_" + std::to_string(k) + "_temp", trips[k].second + "\n");
  }
}

// ---- thermal zones ----

TEST(ThermalZones, NoThermalClassIsNoSensorsNotAnError) {
  FaultEnv env(Env::Default());
  env.HideRealFilesUnder("/fakesys/");
  ThermalReading r;
  ASSERT_TRUE(ReadThermalZones(&env, &r, kRoot).ok());
  EXPECT_TRUE(r.zones.empty());
  // A thermal class with only cooling devices: no zone either.
  env.SetFakeFile(kRoot + "/cooling_device0/type", "cpufreq-cpu0\n");
  ASSERT_TRUE(ReadThermalZones(&env, &r, kRoot).ok());
  EXPECT_TRUE(r.zones.empty());
}

TEST(ThermalZones, ZonesTripsAndOrder) {
  FaultEnv env(Env::Default());
  env.HideRealFilesUnder("/fakesys/");
  Zone(&env, 10, "skin-therm", "38500", {{"passive", "44000"}});
  Zone(&env, 2, "cpu-1-0-usr", "61250", {{"active", "50000"}, {"passive", "95000"}, {"passive", "85000"},
                                          {"critical", "115000"}});
  Zone(&env, 3, "battery", "-2500");  // no trip point, below zero
  Zone(&env, 4, "gpu", "70000", {{"hot", "100000"}, {"critical", "110000"}});
  env.SetFakeFile(kRoot + "/cooling_device0/type", "thermal-cpufreq-0\n");
  ThermalReading r;
  ASSERT_TRUE(ReadThermalZones(&env, &r, kRoot).ok());
  ASSERT_EQ(r.zones.size(), 4u);
  EXPECT_EQ(r.zones[0].name, "thermal_zone2");  // numeric order, not text order
  EXPECT_EQ(r.zones[3].name, "thermal_zone10");
  EXPECT_EQ(r.zones[0].type, "cpu-1-0-usr");
  EXPECT_DOUBLE_EQ(r.zones[0].temp_c, 61.25);
  ASSERT_EQ(r.zones[0].trips.size(), 4u);
  EXPECT_EQ(r.zones[0].trips[1].type, "passive");
  double trip = 0;
  ASSERT_TRUE(r.zones[0].ThrottleTrip(&trip));
  EXPECT_DOUBLE_EQ(trip, 85.0);  // the lowest passive, not the active (fan) one
  EXPECT_DOUBLE_EQ(r.zones[1].temp_c, -2.5);
  EXPECT_FALSE(r.zones[1].ThrottleTrip(&trip));
  ASSERT_TRUE(r.zones[2].ThrottleTrip(&trip));
  EXPECT_DOUBLE_EQ(trip, 100.0);  // no passive: the lowest hot/critical
  EXPECT_TRUE(r.notes.empty());
  // The type filter.
  ASSERT_TRUE(ReadThermalZones(&env, &r, kRoot, "cpu").ok());
  ASSERT_EQ(r.zones.size(), 1u);
  EXPECT_EQ(r.zones[0].type, "cpu-1-0-usr");
}

TEST(ThermalZones, MalformedTempSkipsTheZoneWithANote) {
  FaultEnv env(Env::Default());
  env.HideRealFilesUnder("/fakesys/");
  Zone(&env, 0, "cpu0", "abc", {{"passive", "90000"}});
  Zone(&env, 1, "cpu1", "", {{"passive", "90000"}});
  Zone(&env, 2, "cpu2", "50000", {{"passive", "9x"}, {"passive", "80000"}});
  env.SetFakeFile(kRoot + "/thermal_zone3/type", "sensor-off\n");  // no temp file at all (EAGAIN-like)
  ThermalReading r;
  ASSERT_TRUE(ReadThermalZones(&env, &r, kRoot).ok());
  ASSERT_EQ(r.zones.size(), 1u);
  EXPECT_EQ(r.zones[0].name, "thermal_zone2");
  ASSERT_EQ(r.zones[0].trips.size(), 1u);  // the malformed trip point ignored
  EXPECT_DOUBLE_EQ(r.zones[0].trips[0].temp_c, 80.0);
  ASSERT_EQ(r.notes.size(), 4u);
  EXPECT_NE(r.notes[0].find("thermal_zone0"), std::string::npos);
  EXPECT_NE(r.notes[0].find("\"abc\" is not a temperature"), std::string::npos) << r.notes[0];
  EXPECT_NE(r.notes[1].find("thermal_zone1"), std::string::npos);
  EXPECT_NE(r.notes[2].find("trip point 0"), std::string::npos) << r.notes[2];
  EXPECT_NE(r.notes[3].find("thermal_zone3"), std::string::npos) << r.notes[3];
}

TEST(ThermalZones, ParseMilliCelsius) {
  double t = 0;
  ASSERT_TRUE(ParseMilliCelsius("45000\n", &t).ok());
  EXPECT_DOUBLE_EQ(t, 45.0);
  ASSERT_TRUE(ParseMilliCelsius("-1500", &t).ok());
  EXPECT_DOUBLE_EQ(t, -1.5);
  EXPECT_EQ(ParseMilliCelsius("4.5", &t).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseMilliCelsius("-", &t).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseMilliCelsius("99999999999999", &t).code(), Status::kInvalidArgument);
}

TEST(ThermalZones, UnreadableClassIsAnError) {
  FaultEnv env(Env::Default());
  env.HideRealFilesUnder("/fakesys/");
  Zone(&env, 0, "cpu0", "50000");
  env.fail_small_reads_after = 0;  // the listing fails with EIO
  ThermalReading r;
  EXPECT_EQ(ReadThermalZones(&env, &r, kRoot).code(), Status::kIOError);
  EXPECT_TRUE(r.zones.empty());
}

// ---- controller ----

SustainedOptions Opts(int lo, int hi) {
  SustainedOptions o;
  o.min_threads = lo;
  o.max_threads = hi;
  o.band_c = 5;
  o.hold_up_ns = 30 * kS;
  o.min_interval_ns = 10 * kS;
  o.drift = 0.25;
  o.drift_windows = 2;
  o.drift_horizon_ns = 60 * kS;
  o.probe_up_ns = 120 * kS;
  return o;
}

SustainedSample Temp(uint64_t t_s, double temp, double high = 80) {
  SustainedSample s;
  s.now_ns = t_s * kS;
  s.has_temp = true;
  s.temp_c = temp;
  s.high_c = high;
  return s;
}

TEST(SustainedController, Validation) {
  EXPECT_TRUE(ValidateSustainedOptions(Opts(1, 4)).ok());
  EXPECT_FALSE(ValidateSustainedOptions(Opts(0, 4)).ok());
  EXPECT_FALSE(ValidateSustainedOptions(Opts(3, 2)).ok());
  SustainedOptions o = Opts(1, 4);
  o.drift = 1;
  EXPECT_FALSE(ValidateSustainedOptions(o).ok());
  o = Opts(1, 4);
  o.band_c = -1;
  EXPECT_FALSE(ValidateSustainedOptions(o).ok());
}

TEST(SustainedController, StepsDownOnHeatOncePerIntervalToTheMinimum) {
  SustainedController c(Opts(1, 4), 4, 0);
  // Hot from the start: no change before min_interval after the start.
  EXPECT_EQ(c.Step(Temp(5, 85)).delta, 0);
  SustainedDecision d = c.Step(Temp(10, 85));
  EXPECT_EQ(d.delta, -1);
  EXPECT_EQ(d.threads, 3);
  EXPECT_EQ(d.reason, SustainedReason::kHot);
  EXPECT_NE(d.why.find("85.0 C >= high mark 80.0 C"), std::string::npos) << d.why;
  EXPECT_EQ(c.Step(Temp(15, 85)).delta, 0);  // within the interval of the last change
  EXPECT_EQ(c.Step(Temp(20, 85)).threads, 2);
  EXPECT_EQ(c.Step(Temp(30, 85)).threads, 1);
  EXPECT_EQ(c.Step(Temp(40, 95)).delta, 0);  // at the minimum: nothing more to give
  EXPECT_EQ(c.threads(), 1);
  EXPECT_EQ(c.steps_down(), 3);
  EXPECT_EQ(c.steps_up(), 0);
}

TEST(SustainedController, NoOscillationInsideTheHysteresisBand) {
  SustainedController c(Opts(1, 4), 4, 0);
  ASSERT_EQ(c.Step(Temp(10, 80)).delta, -1);  // at the mark: hot
  // Wandering inside [75, 80) for ten minutes: nothing changes.
  for (uint64_t t = 11; t < 600; ++t) {
    const double temp = 75.0 + 4.9 * (0.5 + 0.5 * std::sin(double(t)));
    ASSERT_EQ(c.Step(Temp(t, temp)).delta, 0) << "t " << t << " temp " << temp;
  }
  EXPECT_EQ(c.threads(), 3);
  EXPECT_EQ(c.steps_down() + c.steps_up(), 1);
}

TEST(SustainedController, StepsUpOnlyAfterTheHold) {
  SustainedController c(Opts(1, 4), 4, 0);
  ASSERT_EQ(c.Step(Temp(10, 85)).threads, 3);
  ASSERT_EQ(c.Step(Temp(20, 85)).threads, 2);
  // Cool (below 75) from t=21; a blip into the band at t=40 restarts the hold.
  for (uint64_t t = 21; t < 40; ++t) ASSERT_EQ(c.Step(Temp(t, 60)).delta, 0) << t;
  ASSERT_EQ(c.Step(Temp(40, 77)).delta, 0);
  for (uint64_t t = 41; t < 71; ++t) ASSERT_EQ(c.Step(Temp(t, 60)).delta, 0) << t;  // 41 + 30 = 71
  SustainedDecision d = c.Step(Temp(71, 60));
  EXPECT_EQ(d.delta, +1);
  EXPECT_EQ(d.reason, SustainedReason::kCool);
  EXPECT_EQ(d.threads, 3);
  // The next step up needs another full hold.
  for (uint64_t t = 72; t < 101; ++t) ASSERT_EQ(c.Step(Temp(t, 60)).delta, 0) << t;
  EXPECT_EQ(c.Step(Temp(101, 60)).threads, 4);
  // At the maximum: cool changes nothing.
  for (uint64_t t = 102; t < 300; t += 10) ASSERT_EQ(c.Step(Temp(t, 30)).delta, 0);
  EXPECT_EQ(c.steps_up(), 2);
}

SustainedSample Rate(uint64_t t_s, double tps) {
  SustainedSample s;
  s.now_ns = t_s * kS;
  s.has_rate = true;
  s.tokens_per_s = tps;
  return s;
}

TEST(SustainedController, TokensPerSecondDriftStepsDownWithoutASensor) {
  SustainedController c(Opts(1, 2), 2, 0);
  for (uint64_t t = 1; t <= 20; ++t) ASSERT_EQ(c.Step(Rate(t, 10.0 + 0.1 * double(t % 3))).delta, 0);
  // A 20% dip is within the allowed 25%; one drifted window alone is not enough.
  EXPECT_EQ(c.Step(Rate(21, 8.1)).delta, 0);
  EXPECT_EQ(c.Step(Rate(22, 7.0)).delta, 0);
  EXPECT_EQ(c.Step(Rate(23, 10.0)).delta, 0);  // recovered: the count restarts
  EXPECT_EQ(c.Step(Rate(24, 7.0)).delta, 0);
  SustainedDecision d = c.Step(Rate(25, 6.9));
  EXPECT_EQ(d.delta, -1);
  EXPECT_EQ(d.reason, SustainedReason::kDrift);
  EXPECT_NE(d.why.find("75%"), std::string::npos) << d.why;
  // At the new count the lower rate is the baseline: no further drift step.
  for (uint64_t t = 26; t < 145; ++t) ASSERT_EQ(c.Step(Rate(t, 6.0)).delta, 0) << t;
  // No temperature: a probe step up probe_up (120 s) after the drift step.
  d = c.Step(Rate(145, 6.0));
  EXPECT_EQ(d.delta, +1);
  EXPECT_EQ(d.reason, SustainedReason::kProbe);
  // No further probe (the last change was the probe, not a drift).
  for (uint64_t t = 146; t < 400; t += 5) ASSERT_EQ(c.Step(Rate(t, 6.0)).delta, 0) << t;
}

TEST(SustainedController, DriftIgnoredWhileTheSensorSaysCool) {
  SustainedController c(Opts(1, 2), 2, 0);
  for (uint64_t t = 1; t <= 20; ++t) {
    SustainedSample s = Temp(t, 50);
    s.has_rate = true;
    s.tokens_per_s = t < 15 ? 10 : 5;  // halved while cool: not thermal
    ASSERT_EQ(c.Step(s).delta, 0) << t;
  }
  // In the band (not cool) the same drift is acted on.
  SustainedSample s = Temp(21, 77);
  s.has_rate = true;
  s.tokens_per_s = 5;
  EXPECT_EQ(c.Step(s).reason, SustainedReason::kDrift);
}

TEST(SustainedController, DriftOff) {
  SustainedOptions o = Opts(1, 2);
  o.drift = 0;
  SustainedController c(o, 2, 0);
  for (uint64_t t = 1; t <= 100; ++t) ASSERT_EQ(c.Step(Rate(t, t < 20 ? 10 : 1)).delta, 0);
}

TEST(SustainedController, ResyncFollowsTheRealCount) {
  SustainedController c(Opts(1, 4), 4, 0);
  ASSERT_EQ(c.Step(Temp(10, 90)).threads, 3);
  c.Resync(4, 11 * kS);  // the context refused: it still has 4
  EXPECT_EQ(c.threads(), 4);
  EXPECT_EQ(c.Step(Temp(15, 90)).delta, 0);  // an interval from the resync
  EXPECT_EQ(c.Step(Temp(21, 90)).threads, 3);
  c.Resync(9, 22 * kS);
  EXPECT_EQ(c.threads(), 4);  // clamped
}

TEST(DutyCycle, SleepArithmetic) {
  EXPECT_EQ(DutySleepNs(100, 100, 1.0), 0u);
  EXPECT_EQ(DutySleepNs(100, 100, 0.0), 0u);  // invalid: no pacing
  EXPECT_EQ(DutySleepNs(70, 70, 0.7), 30u);    // 70 / 0.7 = 100 of wall
  EXPECT_EQ(DutySleepNs(70, 90, 0.7), 10u);    // 20 of idle happened already
  EXPECT_EQ(DutySleepNs(70, 200, 0.7), 0u);    // idle enough
  EXPECT_EQ(DutySleepNs(50, 0, 0.5), 50u);     // wall < busy counts as busy
  EXPECT_EQ(DutySleepNs(300'000'000, 300'000'000, 0.25), 900'000'000u);
  // Over a run of steps the ratio holds: busy / (busy + idle + sleep) <= duty.
  uint64_t busy = 0, wall = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t b = 1'000'000 + uint64_t(i % 7) * 100'000, idle = uint64_t(i % 5) * 50'000;
    const uint64_t sl = DutySleepNs(b, b + idle, 0.6);
    busy += b;
    wall += b + idle + sl;
  }
  EXPECT_LE(double(busy) / double(wall), 0.6 + 1e-9);
  EXPECT_GE(double(busy) / double(wall), 0.59);
}

// ---- SustainedMode on a real context, fake clock and sensors ----

// A FaultEnv whose monotonic clock and sleeps are fake: SleepNs advances the clock.
class FakeClockEnv : public FaultEnv {
 public:
  FakeClockEnv() : FaultEnv(Env::Default()) {}
  std::atomic<uint64_t> now{1000 * kS};
  std::atomic<uint64_t> slept{0};
  uint64_t NowNs() override { return now.load(); }
  void SleepNs(uint64_t ns) override {
    now += ns;
    slept += ns;
  }
};

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Rig MakeRig(const char* tag, int n_threads) {
  Rig r;
  const std::string path = test::ModelPath("tiny-qwen3");
  EXPECT_TRUE(Model::Load(Env::Default(), path, ModelOptions(), &r.model).ok());
  ContextOptions co;
  co.n_ctx = 512;
  co.kv_chunk_tokens = 16;
  co.kv_codec = "none";
  co.hybrid = false;
  co.n_threads = n_threads;
  co.swap_path = test::TempDir() + "/sustained-" + tag + ".swap";
  r.ctx = std::make_unique<Context>(r.model.get(), co);
  EXPECT_TRUE(r.ctx->Init().ok());
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

TEST(SustainedMode, ThreadsStepBetweenDecodesAndTheConversationIsKept) {
  const int kSteps = 30;
  // Reference: a context that never changes threads.
  Rig ref = MakeRig("ref", 2);
  std::vector<std::vector<float>> want;
  const auto p = Prompt();
  ASSERT_TRUE(ref.ctx->Decode(p.data(), int(p.size()), false).ok());
  want.push_back(Logits(*ref.ctx));
  for (int i = 0; i < kSteps; ++i) {
    const int32_t t = Greedy(want.back());
    ASSERT_TRUE(ref.ctx->Decode(&t, 1, false).ok());
    want.push_back(Logits(*ref.ctx));
  }

  FakeClockEnv env;
  env.HideRealFilesUnder("/fakesys/");
  Zone(&env, 0, "cpu-0-0", "60000", {{"passive", "90000"}});  // high mark 90 - 5 = 85
  Zone(&env, 1, "battery", "30000");                            // no trip: not used
  Rig r = MakeRig("chg", 2);
  SustainedModeOptions o;
  o.control = Opts(1, 0);  // max 0: the context's 2
  o.control.max_threads = 0;
  o.control.min_interval_ns = 2 * kS;
  o.control.hold_up_ns = 5 * kS;
  o.control.drift = 0;
  o.window_ns = kS;
  o.thermal_root = kRoot;
  SustainedMode sm(&env, r.ctx.get(), o);
  ASSERT_TRUE(sm.Init().ok());
  EXPECT_EQ(sm.stats().max_threads, 2);
  EXPECT_EQ(sm.stats().threads, 2);
  EXPECT_NE(sm.stats().sensors.find("1 of 2 thermal zones watched"), std::string::npos) << sm.stats().sensors;

  std::vector<std::vector<float>> got;
  ASSERT_TRUE(r.ctx->Decode(p.data(), int(p.size()), false).ok());
  got.push_back(Logits(*r.ctx));
  std::vector<int> threads_seen;
  int changes = 0;
  for (int i = 0; i < kSteps; ++i) {
    // Heat up from step 3, cool down from step 12 (one fake second per step).
    if (i == 3) env.SetFakeFile(kRoot + "/thermal_zone0/temp", "86000\n");
    if (i == 12) env.SetFakeFile(kRoot + "/thermal_zone0/temp", "70000\n");
    const int32_t t = Greedy(got.back());
    const uint64_t t0 = env.NowNs();
    ASSERT_TRUE(r.ctx->Decode(&t, 1, false).ok());
    env.now += kS;
    SustainedEvent ev;
    sm.AfterStep(1, t0, env.NowNs(), &ev);
    EXPECT_FALSE(ev.refused) << ev.status.ToString();
    if (ev.changed) {
      ++changes;
      EXPECT_EQ(ev.to, r.ctx->n_threads());
      EXPECT_EQ(ev.reason, i < 12 ? SustainedReason::kHot : SustainedReason::kCool) << i;
    }
    threads_seen.push_back(r.ctx->n_threads());
    got.push_back(Logits(*r.ctx));
  }
  EXPECT_EQ(changes, 2);
  EXPECT_EQ(*std::min_element(threads_seen.begin(), threads_seen.end()), 1);
  EXPECT_EQ(threads_seen.back(), 2);
  EXPECT_EQ(threads_seen[2], 2);
  EXPECT_EQ(threads_seen[3], 1);  // stepped down right after the decode that saw the heat
  const SustainedStats st = sm.stats();
  EXPECT_EQ(st.steps_down, 1);
  EXPECT_EQ(st.steps_up, 1);
  EXPECT_TRUE(st.has_temp);
  EXPECT_DOUBLE_EQ(st.temp_c, 70.0);
  EXPECT_DOUBLE_EQ(st.high_c, 85.0);
  EXPECT_EQ(st.zone, "thermal_zone0 (cpu-0-0)");
  EXPECT_EQ(st.decode_tokens, uint64_t(kSteps));
  EXPECT_EQ(env.slept.load(), 0u);  // duty 1: no pacing
  // The conversation: same logits bit for bit, same history.
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float))) << "step " << i;
  EXPECT_EQ(r.ctx->history(), ref.ctx->history());
  EXPECT_EQ(int(r.ctx->history().size()), int(p.size()) + kSteps);
}

TEST(SustainedMode, DutyCycleSleepsThroughTheEnvAndCapsThreads) {
  FakeClockEnv env;
  env.HideRealFilesUnder("/fakesys/");  // no thermal class: no sensors
  Rig r = MakeRig("duty", 2);
  SustainedModeOptions o;
  o.control.max_threads = 1;
  o.duty = 0.7;
  o.thermal_root = kRoot;
  SustainedMode sm(&env, r.ctx.get(), o);
  ASSERT_TRUE(sm.Init().ok());
  EXPECT_EQ(r.ctx->n_threads(), 1);  // capped at once
  EXPECT_NE(sm.stats().sensors.find("no thermal sensors"), std::string::npos) << sm.stats().sensors;
  const uint64_t start = env.NowNs();
  uint64_t busy = 0;
  for (int i = 0; i < 50; ++i) {
    const uint64_t t0 = env.NowNs(), b = 70'000'000 + uint64_t(i % 3) * 10'000'000;
    env.now += b;
    busy += b;
    sm.AfterStep(1, t0, env.NowNs());
    env.now += 5'000'000;  // the caller's sampling between steps counts as idle
  }
  const double wall = double(env.NowNs() - start);
  EXPECT_LE(double(busy) / wall, 0.7 + 1e-9);
  EXPECT_GE(double(busy) / wall, 0.69);
  EXPECT_EQ(sm.stats().slept_ns, env.slept.load());
  EXPECT_GT(env.slept.load(), 0u);
  EXPECT_FALSE(sm.stats().has_temp);
  EXPECT_EQ(sm.stats().n_zones, 0);
}

TEST(SustainedMode, BadOptionsAreRefusedAndChangeNothing) {
  FakeClockEnv env;
  Rig r = MakeRig("bad", 2);
  SustainedModeOptions o;
  o.duty = 0;
  EXPECT_EQ(SustainedMode(&env, r.ctx.get(), o).Init().code(), Status::kInvalidArgument);
  o = SustainedModeOptions();
  o.control.min_threads = 3;
  o.control.max_threads = 0;  // the context's 2 < 3
  EXPECT_EQ(SustainedMode(&env, r.ctx.get(), o).Init().code(), Status::kInvalidArgument);
  EXPECT_EQ(r.ctx->n_threads(), 2);
}

// ---- C API ----

TEST(SustainedApi, EnableStatsDisable) {
  const std::string path = test::ModelPath("tiny-qwen3");
  mz_model* m = nullptr;
  ASSERT_EQ(mz_model_load(path.c_str(), nullptr, &m), MZ_OK);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = 256;
  cp.n_threads = 2;
  const std::string swap = test::TempDir() + "/sustained-api.swap";
  cp.swap_path = swap.c_str();
  mz_context* c = nullptr;
  ASSERT_EQ(mz_context_new(m, &cp, &c), MZ_OK);
  mz_sustained_stats st;
  ASSERT_EQ(mz_context_get_sustained_stats(c, &st), MZ_OK);
  EXPECT_EQ(st.enabled, 0);

  mz_sustained_params sp = mz_sustained_default_params();
  EXPECT_EQ(sp.max_threads, 0);
  EXPECT_EQ(sp.min_threads, 1);
  EXPECT_FLOAT_EQ(sp.duty_cycle, 1.0f);
  EXPECT_FLOAT_EQ(sp.window_s, 1.0f);
  sp.duty_cycle = 1.5f;
  EXPECT_EQ(mz_context_set_sustained(c, &sp), MZ_ERR_INVALID_ARG);
  EXPECT_NE(std::string(mz_last_error()).find("duty"), std::string::npos) << mz_last_error();
  sp = mz_sustained_default_params();
  sp.struct_size = 3;
  EXPECT_EQ(mz_context_set_sustained(c, &sp), MZ_ERR_INVALID_ARG);
  sp = mz_sustained_default_params();
  sp.max_threads = 1;
  sp.thermal_root = "/nonexistent/thermal";
  ASSERT_EQ(mz_context_set_sustained(c, &sp), MZ_OK) << mz_last_error();
  ASSERT_EQ(mz_context_get_sustained_stats(c, &st), MZ_OK);
  EXPECT_EQ(st.enabled, 1);
  EXPECT_EQ(st.threads, 1);
  EXPECT_EQ(st.n_zones, 0);
  const auto p = Prompt();
  ASSERT_EQ(mz_decode(c, p.data(), int32_t(p.size()), false), MZ_OK);
  int32_t tok = 1;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(mz_decode(c, &tok, 1, false), MZ_OK);
  ASSERT_EQ(mz_context_get_sustained_stats(c, &st), MZ_OK);
  EXPECT_GT(st.busy_s, 0.0);
  EXPECT_EQ(st.slept_s, 0.0);
  EXPECT_EQ(mz_context_n_tokens(c), int32_t(p.size()) + 3);
  // Replacing the setting starts from the threads the context had before sustained mode (2), not
  // from what the old setting capped them to (1).
  sp = mz_sustained_default_params();
  sp.thermal_root = "/nonexistent/thermal";
  ASSERT_EQ(mz_context_set_sustained(c, &sp), MZ_OK) << mz_last_error();
  ASSERT_EQ(mz_context_get_sustained_stats(c, &st), MZ_OK);
  EXPECT_EQ(st.threads, 2);
  ASSERT_EQ(mz_context_set_sustained(c, nullptr), MZ_OK);
  ASSERT_EQ(mz_context_get_sustained_stats(c, &st), MZ_OK);
  EXPECT_EQ(st.enabled, 0);
  EXPECT_EQ(mz_context_set_sustained(nullptr, nullptr), MZ_ERR_INVALID_ARG);
  EXPECT_EQ(mz_context_get_sustained_stats(c, nullptr), MZ_ERR_INVALID_ARG);
  mz_context_free(c);
  mz_model_free(m);
}

}  // namespace
}  // namespace mz
