// The pool's recent events and turns (tools/serve/activity_log.h).
#include "tools/serve/activity_log.h"

#include <chrono>
#include <utility>

namespace mz::serve {

int64_t ActivityLog::NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void ActivityLog::BeginAction() {
  std::lock_guard<std::mutex> lk(mu_);
  ++in_flight_;
}

void ActivityLog::AddEvent(const std::string& kind, uint64_t bytes, const std::string& detail, bool ends_action) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ends_action && in_flight_ > 0) --in_flight_;
  if (kind == "trim" || kind == "evict" || kind == "pressure") explained_ += bytes;
  PoolEvent e;
  e.seq = ++event_seq_;
  e.t_ms = NowMs();
  e.kind = kind;
  e.bytes = bytes;
  e.detail = detail;
  events_.push_back(std::move(e));
  while (events_.size() > max_events_) events_.pop_front();
}

void ActivityLog::AddTurn(TurnRecord r) {
  std::lock_guard<std::mutex> lk(mu_);
  r.seq = ++turn_seq_;
  r.t_ms = NowMs();
  turns_.push_back(std::move(r));
  while (turns_.size() > max_turns_) turns_.pop_front();
}

void ActivityLog::NoteEvicted(uint64_t total) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!have_baseline_ || total < seen_evicted_) {
    have_baseline_ = true;
    seen_evicted_ = total;
    explained_ = 0;
    return;
  }
  if (in_flight_ > 0) return;  // an explicit action is giving memory back: its event explains it
  const uint64_t grown = total - seen_evicted_;
  seen_evicted_ = total;
  // Bytes an action reported but the pool did not count (the load arena's, given back first) do
  // not carry over to hide a later budget eviction.
  const uint64_t budget = grown > explained_ ? grown - explained_ : 0;
  explained_ = 0;
  if (budget == 0) return;
  PoolEvent e;
  e.seq = ++event_seq_;
  e.t_ms = NowMs();
  e.kind = "budget";
  e.bytes = budget;
  e.detail = "memory budget";
  events_.push_back(std::move(e));
  while (events_.size() > max_events_) events_.pop_front();
}

nlohmann::json ActivityLog::EventsJson() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json a = nlohmann::json::array();
  for (const PoolEvent& e : events_)
    a.push_back({{"seq", e.seq}, {"t", e.t_ms}, {"kind", e.kind}, {"bytes", e.bytes}, {"detail", e.detail}});
  return a;
}

nlohmann::json ActivityLog::TurnsJson() const {
  std::lock_guard<std::mutex> lk(mu_);
  nlohmann::json a = nlohmann::json::array();
  for (const TurnRecord& r : turns_)
    a.push_back({{"seq", r.seq}, {"t", r.t_ms}, {"conversation", r.conversation}, {"new_conversation", r.new_conversation},
                 {"prompt_tokens", r.prompt_tokens}, {"cached_tokens", r.cached_tokens},
                 {"completion_tokens", r.completion_tokens}, {"ttft_s", r.ttft_s}, {"reload_s", r.reload_s},
                 {"bytes_from_storage", r.bytes_from_storage}, {"units_restored", r.units_restored}});
  return a;
}

}  // namespace mz::serve
