// The pool report's recent events and turns (tools/serve/activity_log.h): bounded rings with
// increasing sequence numbers, and the budget's evictions inferred from the pool's counter
// without counting an explicit action's bytes twice.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tools/serve/activity_log.h"

namespace mz::serve {
namespace {

TEST(ServeActivity, EventsAreKeptOldestFirstWithIncreasingSeqAndBounded) {
  ActivityLog log(3, 2);
  for (int i = 0; i < 5; ++i) log.AddEvent("trim", uint64_t(i), "level " + std::to_string(i));
  const auto e = log.EventsJson();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0]["seq"], 3);
  EXPECT_EQ(e[2]["seq"], 5);
  EXPECT_EQ(e[2]["bytes"], 4);
  EXPECT_EQ(e[2]["detail"], "level 4");
  EXPECT_GT(e[2]["t"].get<int64_t>(), 1700000000000LL);  // Unix milliseconds
  for (int i = 0; i < 3; ++i) {
    TurnRecord r;
    r.conversation = "c" + std::to_string(i);
    r.cached_tokens = i;
    r.ttft_s = 0.5;
    log.AddTurn(r);
  }
  const auto t = log.TurnsJson();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["conversation"], "c1");
  EXPECT_EQ(t[1]["seq"], 3);
  EXPECT_EQ(t[1]["cached_tokens"], 2);
  EXPECT_DOUBLE_EQ(t[1]["ttft_s"].get<double>(), 0.5);
}

TEST(ServeActivity, BudgetEvictionsAreTheCounterGrowthNoActionExplains) {
  ActivityLog log;
  log.NoteEvicted(1000);  // the baseline: nothing reported
  EXPECT_TRUE(log.EventsJson().empty());
  log.NoteEvicted(1000);
  EXPECT_TRUE(log.EventsJson().empty());
  log.NoteEvicted(1500);  // 500 nobody asked for: the budget
  auto e = log.EventsJson();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["kind"], "budget");
  EXPECT_EQ(e[0]["bytes"], 500);
  // A trim of 300: the counter grows by 300 + 200 of the budget.
  log.BeginAction();
  log.NoteEvicted(1800);  // while the trim runs: not attributed
  log.AddEvent("trim", 300, "level 80", /*ends_action=*/true);
  log.NoteEvicted(2000);
  e = log.EventsJson();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1]["kind"], "trim");
  EXPECT_EQ(e[2]["kind"], "budget");
  EXPECT_EQ(e[2]["bytes"], 200);
  // An action that gave back more than the pool counted (the load arena's bytes) hides no later
  // budget eviction.
  log.AddEvent("evict", 900, "asked 900");
  log.NoteEvicted(2100);
  EXPECT_EQ(log.EventsJson().size(), 4u);
  log.NoteEvicted(2150);
  e = log.EventsJson();
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[4]["kind"], "budget");
  EXPECT_EQ(e[4]["bytes"], 50);
  // A restore brings memory back: it explains no eviction.
  log.AddEvent("restore", 700, "restore-ahead");
  log.NoteEvicted(2250);
  e = log.EventsJson();
  ASSERT_EQ(e.size(), 7u);
  EXPECT_EQ(e[6]["bytes"], 100);
}

TEST(ServeActivity, ConcurrentWritersAndReaders) {
  ActivityLog log(64, 32);
  std::vector<std::thread> ts;
  for (int k = 0; k < 4; ++k)
    ts.emplace_back([&log, k] {
      for (int i = 0; i < 500; ++i) {
        log.AddEvent("pressure", 1, "t" + std::to_string(k));
        log.AddTurn(TurnRecord{});
        log.NoteEvicted(uint64_t(i));
        (void)log.EventsJson();
      }
    });
  for (auto& t : ts) t.join();
  const auto e = log.EventsJson();
  ASSERT_EQ(e.size(), 64u);
  for (size_t i = 1; i < e.size(); ++i) EXPECT_GT(e[i]["seq"].get<uint64_t>(), e[i - 1]["seq"].get<uint64_t>());
  EXPECT_EQ(log.TurnsJson().back()["seq"], 2000);
}

}  // namespace
}  // namespace mz::serve
