// What happened recently in the pool of `mzcache serve`, for GET /v1/mzcache/pool's "events" and
// "turns" (the web page at / shows them as they happen; docs/server.md): two bounded rings, the
// oldest entry dropped when full. Each entry has a sequence number (1, 2, ... per ring, never
// reused while the server runs), so a client polling the pool shows only the entries newer than
// the last one it saw. Thread-safe (one mutex, held for copies only); no I/O.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace mz::serve {

// One memory event. kind: "trim" (POST /v1/mzcache/trim; bytes given back), "evict" (POST
// /v1/mzcache/evict; bytes given back), "pressure" (the pressure watcher's event; bytes given
// back), "restore" (the watcher's restore-ahead slice; bytes brought back), "budget" (the memory
// budget's evictions, inferred from the pool's counters: see ActivityLog::NoteEvicted), "error"
// (a watcher action that failed; detail says why).
struct PoolEvent {
  uint64_t seq = 0;
  int64_t t_ms = 0;  // Unix time, milliseconds
  std::string kind;
  uint64_t bytes = 0;
  std::string detail;  // e.g. "level 80 (COMPLETE)", "psi: critical"
};

// One finished turn (a response that was answered), with its restore figures.
struct TurnRecord {
  uint64_t seq = 0;
  int64_t t_ms = 0;
  std::string conversation;
  bool new_conversation = false;
  int prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double ttft_s = 0, reload_s = 0;
  uint64_t bytes_from_storage = 0;
  int units_restored = 0;
};

class ActivityLog {
 public:
  explicit ActivityLog(size_t max_events = 64, size_t max_turns = 32) : max_events_(max_events), max_turns_(max_turns) {}

  // An explicit action (trim, evict) is about to give memory back: until its AddEvent, NoteEvicted
  // does not attribute the pool's evictions to the budget. Every BeginAction must be followed by
  // exactly one AddEvent(..., /*ends_action=*/true).
  void BeginAction();
  // Appends an event stamped now. Its bytes (of kinds that give memory back) are not reported
  // again as "budget" by the next NoteEvicted. ends_action: it ends a BeginAction.
  void AddEvent(const std::string& kind, uint64_t bytes, const std::string& detail, bool ends_action = false);
  // Appends a turn (seq and t_ms are set here).
  void AddTurn(TurnRecord r);
  // The pool's total of bytes evicted (mz_pool_report.bytes_evicted) as a report saw it: its growth
  // since the last call, less the bytes of the events added meanwhile, becomes one "budget" event.
  // The first call only sets the baseline. Not exact: a pressure action whose eviction a report
  // sees before its event is added is reported as budget too (the watcher adds its event right
  // after the action), and no action is attributed while an explicit one is in flight.
  void NoteEvicted(uint64_t bytes_evicted_total);
  // The rings, oldest first: [{seq, t, kind, bytes, detail}] and [{seq, t, conversation, ...}].
  nlohmann::json EventsJson() const;
  nlohmann::json TurnsJson() const;

 private:
  static int64_t NowMs();
  mutable std::mutex mu_;
  const size_t max_events_, max_turns_;
  std::deque<PoolEvent> events_;
  std::deque<TurnRecord> turns_;
  uint64_t event_seq_ = 0, turn_seq_ = 0;
  int in_flight_ = 0;
  bool have_baseline_ = false;
  uint64_t seen_evicted_ = 0, explained_ = 0;
};

}  // namespace mz::serve
