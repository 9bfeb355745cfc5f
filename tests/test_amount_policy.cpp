// AmountPolicy: step per level, escalation on repeated events, hysteresis merge, floor, explicit
// byte requests, and restore-ahead after calm. Pure logic: times come in through the events and
// Tick(now), so every case is deterministic.
#include <gtest/gtest.h>

#include "pressure/amount_policy.h"

namespace mz {
namespace {

constexpr uint64_t kSec = 1'000'000'000ull;
constexpr uint64_t kLlm = 1000ull << 20;  // 1000 MiB of LLM memory

PressureEvent Ev(PressureLevel l, uint64_t t, uint64_t hint = 0) {
  PressureEvent e;
  e.level = l;
  e.time_ns = t;
  e.bytes_hint = hint;
  return e;
}

uint64_t Pts(double p) { return uint64_t(p * double(kLlm) + 0.5); }

AmountOptions Base() {
  AmountOptions o;
  o.step_points = 0.15;
  o.escalation = 2.0;
  o.escalation_window_ns = 5 * kSec;
  o.max_step_points = 0.6;
  o.hysteresis_ns = 1 * kSec;
  o.floor_points = 0.0;
  return o;
}

TEST(AmountPolicy, StepIsPointsOfLlmMemoryPerLevel) {
  AmountOptions o = Base();
  o.critical_to_floor = false;
  {
    AmountPolicy p(o);
    AmountDecision d = p.OnEvent(Ev(PressureLevel::kLow, 100 * kSec), kLlm, kLlm);
    EXPECT_EQ(d.evict_bytes, Pts(0.15));
    EXPECT_DOUBLE_EQ(d.step_points, 0.15);
  }
  {
    AmountPolicy p(o);
    EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kMedium, 100 * kSec), kLlm, kLlm).evict_bytes, Pts(0.30));
  }
  {
    AmountPolicy p(o);  // critical without critical_to_floor: two notches, capped at max_step
    EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, 100 * kSec), kLlm, kLlm).evict_bytes, Pts(0.6));
  }
  o.critical_to_floor = true;
  o.floor_points = 0.1;
  AmountPolicy p(o);
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, 100 * kSec), kLlm, kLlm).evict_bytes, Pts(0.9));
}

TEST(AmountPolicy, PaperSteps15And25Points) {
  for (double step : {0.15, 0.25}) {
    AmountOptions o = Base();
    o.step_points = step;
    AmountPolicy p(o);
    // Events far apart (beyond the escalation window): the same step each time.
    uint64_t resident = kLlm;
    for (int i = 0; i < 3; ++i) {
      AmountDecision d = p.OnEvent(Ev(PressureLevel::kLow, (10 + 10 * i) * kSec), kLlm, resident);
      EXPECT_EQ(d.evict_bytes, Pts(step)) << "event " << i;
      resident -= d.evict_bytes;
    }
  }
}

TEST(AmountPolicy, EscalatesOnRepeatedEventsAndResetsAfterTheWindowOrKNone) {
  AmountPolicy p(Base());
  uint64_t t = 100 * kSec;
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t), kLlm, kLlm).evict_bytes, Pts(0.15));
  // 2 s later (outside hysteresis, inside the escalation window): the step doubles.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 2 * kSec), kLlm, kLlm).evict_bytes, Pts(0.30));
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 4 * kSec), kLlm, kLlm).evict_bytes, Pts(0.60));
  // Capped at max_step_points.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 6 * kSec), kLlm, kLlm).evict_bytes, Pts(0.60));
  // Beyond the escalation window since the last applied event: back to the base step.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 20 * kSec), kLlm, kLlm).evict_bytes, Pts(0.15));
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 22 * kSec), kLlm, kLlm).evict_bytes, Pts(0.30));
  // Pressure gone resets escalation even inside the window.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kNone, t + 23 * kSec), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 24 * kSec), kLlm, kLlm).evict_bytes, Pts(0.15));
}

TEST(AmountPolicy, HysteresisMergesSameOrLowerLevelButNotHigher) {
  AmountPolicy p(Base());
  uint64_t t = 100 * kSec;
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kMedium, t), kLlm, kLlm).evict_bytes, Pts(0.30));
  // Within 1 s at the same or a lower level: merged.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kMedium, t + kSec / 2), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + kSec / 2), kLlm, kLlm).evict_bytes, 0u);
  // A higher level breaks through (critical: down to the floor of 0).
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, t + kSec / 2), kLlm, Pts(0.7)).evict_bytes, Pts(0.7));
  // Merge window measured from the last *applied* event (t + 0.5 s), not from merged ones.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, t + kSec), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_GT(p.OnEvent(Ev(PressureLevel::kLow, t + kSec + kSec / 2 + 1), kLlm, kLlm).evict_bytes, 0u);
}

TEST(AmountPolicy, FloorIsNeverCrossed) {
  AmountOptions o = Base();
  o.floor_points = 0.5;
  o.step_points = 0.25;
  o.escalation = 1.0;
  AmountPolicy p(o);
  uint64_t resident = kLlm, t = 100 * kSec;
  std::vector<uint64_t> got;
  for (int i = 0; i < 4; ++i, t += 10 * kSec) {
    AmountDecision d = p.OnEvent(Ev(PressureLevel::kLow, t), kLlm, resident);
    got.push_back(d.evict_bytes);
    resident -= d.evict_bytes;
  }
  EXPECT_EQ(got, (std::vector<uint64_t>{Pts(0.25), Pts(0.25), 0, 0}));
  EXPECT_EQ(resident, Pts(0.5));
  // Critical and explicit requests respect the floor too.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, t), kLlm, resident).evict_bytes, 0u);
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, t + 20 * kSec, 1ull << 30), kLlm, resident).evict_bytes, 0u);
  // A partly-evicted context above the floor gives back only down to it.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kCritical, t + 40 * kSec), kLlm, Pts(0.6)).evict_bytes, Pts(0.1));
}

TEST(AmountPolicy, ExplicitBytesHint) {
  AmountPolicy p(Base());
  AmountDecision d = p.OnEvent(Ev(PressureLevel::kNone, 5 * kSec, 123 << 20), kLlm, kLlm);
  EXPECT_EQ(d.evict_bytes, uint64_t(123) << 20);
  // Not merged by hysteresis: the host asked for exactly this.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kNone, 5 * kSec + 1, 7 << 20), kLlm, kLlm).evict_bytes, uint64_t(7) << 20);
  // Capped by what is resident.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, 6 * kSec, kLlm * 2), kLlm, 10).evict_bytes, 10u);
}

TEST(AmountPolicy, RestoreAheadOnRequestNeverRestores) {
  AmountPolicy p(Base());
  ASSERT_GT(p.OnEvent(Ev(PressureLevel::kLow, 10 * kSec), kLlm, kLlm).evict_bytes, 0u);
  for (uint64_t t = 10; t < 1000; t += 50) EXPECT_FALSE(p.Tick(t * kSec, kLlm, Pts(0.85)).restore_now);
}

TEST(AmountPolicy, RestoreAheadInBackgroundAfterCalm) {
  AmountOptions o = Base();
  o.restore_ahead = AmountOptions::RestoreAhead::kBackground;
  o.calm_ns = 10 * kSec;
  AmountPolicy p(o);
  // Nothing evicted yet: nothing to restore.
  EXPECT_FALSE(p.Tick(100 * kSec, kLlm, kLlm).restore_now);
  ASSERT_GT(p.OnEvent(Ev(PressureLevel::kLow, 100 * kSec), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_FALSE(p.Tick(105 * kSec, kLlm, Pts(0.85)).restore_now);
  // A merged event still counts as pressure: calm restarts from it.
  EXPECT_EQ(p.OnEvent(Ev(PressureLevel::kLow, 100 * kSec + kSec / 2), kLlm, Pts(0.85)).evict_bytes, 0u);
  EXPECT_FALSE(p.Tick(110 * kSec, kLlm, Pts(0.85)).restore_now);
  // kNone is not pressure.
  p.OnEvent(Ev(PressureLevel::kNone, 109 * kSec), kLlm, Pts(0.85));
  EXPECT_TRUE(p.Tick(110 * kSec + kSec / 2, kLlm, Pts(0.85)).restore_now);
  // The monitor restores in slices that fit the free memory: every tick asks again until all is back.
  EXPECT_TRUE(p.Tick(111 * kSec, kLlm, Pts(0.9)).restore_now);
  EXPECT_FALSE(p.Tick(112 * kSec, kLlm, kLlm).restore_now);
  EXPECT_FALSE(p.Tick(113 * kSec, kLlm, Pts(0.9)).restore_now);  // (nothing evicted since)
  // A failed restore stops the asking until the next eviction.
  ASSERT_GT(p.OnEvent(Ev(PressureLevel::kLow, 150 * kSec), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_TRUE(p.Tick(170 * kSec, kLlm, Pts(0.75)).restore_now);
  p.RestoreGaveUp();
  EXPECT_FALSE(p.Tick(171 * kSec, kLlm, Pts(0.75)).restore_now);
  // If a generation restored everything first, no restore is asked for.
  ASSERT_GT(p.OnEvent(Ev(PressureLevel::kLow, 200 * kSec), kLlm, kLlm).evict_bytes, 0u);
  EXPECT_FALSE(p.Tick(300 * kSec, kLlm, kLlm).restore_now);
  EXPECT_FALSE(p.Tick(301 * kSec, kLlm, Pts(0.5)).restore_now);
}

}  // namespace
}  // namespace mz
