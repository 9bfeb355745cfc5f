// Eviction amount policy: how many bytes to give back per pressure event, and when to restore
// ahead (paper section 6.6: about 15 or 25 percentage points of LLM memory per event).
//
// Amount per event (all fractions are of the LLM memory: footprint above the base unit):
//   - kLow: step; kMedium: step * escalation (one notch up); kCritical: everything down to the
//     floor when critical_to_floor, else step * escalation^2. Capped by max_step_points.
//   - Escalation: an event within escalation_window_ns of the last applied one multiplies the step
//     by `escalation` (repeated events mean the last step did not help); kNone resets it.
//   - Hysteresis: an event within hysteresis_ns of the last applied one, at the same or a lower
//     level, is merged into it (nothing more); a higher level is applied at once.
//   - Floor: never evict below floor_points of the LLM memory remaining in RAM. (The policy's
//     amounts are exact; units move whole, so PressureMonitor caps requests to stay at or above
//     the floor, stopping within one unit above it.)
//   - bytes_hint > 0 (an explicit request): that many bytes, still respecting the floor.
// Restore-ahead: kOnRequest restores nothing until the next request (restore_generate overlaps it
// with the prefill); kBackground restores once calm_ns passed since the last pressure event (kNone
// events do not count as pressure), and keeps asking on every tick until everything is back: the
// monitor restores in slices (restore_slice_bytes, front layers first) only what fits the memory
// the source reports free while keeping restore_margin of the limit free (so restoring does not
// itself cause pressure, nor get the process killed while other apps still hold their memory). A
// context that is fully resident again (a generation restored it) needs no restore; RestoreGaveUp()
// (a restore failed) stops asking until the next eviction.
//
#pragma once
#include <cstdint>

#include "pressure/pressure_source.h"

namespace mz {

struct AmountOptions {
  double step_points = 0.25;          // fraction of LLM memory (footprint above the base unit) per event
  double escalation = 1.5;            // multiplier per repeated event within escalation_window
  uint64_t escalation_window_ns = 5'000'000'000ull;
  double max_step_points = 1.0;
  uint64_t hysteresis_ns = 1'000'000'000ull;  // events closer than this to the last applied one are merged
  double floor_points = 0.0;          // never evict below this fraction remaining
  enum class RestoreAhead { kOnRequest, kBackground } restore_ahead = RestoreAhead::kOnRequest;
  uint64_t calm_ns = 10'000'000'000ull;       // kBackground: restore once no event for this long
  bool critical_to_floor = true;              // kCritical gives back everything down to the floor
  double restore_margin = 0.20;               // kBackground: keep this fraction of the limit free
  uint64_t restore_slice_bytes = 256ull << 20;  // kBackground: at most this much per tick (0: no cap)
  bool restore_yields = true;  // kBackground: a slice stops early when a request waits for the context
};

struct AmountDecision {
  uint64_t evict_bytes = 0;   // 0: nothing to do now
  bool restore_now = false;   // kBackground and calm long enough
  double step_points = 0;     // the step this decision used (after escalation)
};

class AmountPolicy {
 public:
  explicit AmountPolicy(const AmountOptions& o) : o_(o) {}
  // llm_bytes: LLM footprint above the base unit; resident_bytes: how much of it is in RAM now.
  AmountDecision OnEvent(const PressureEvent& ev, uint64_t llm_bytes, uint64_t resident_bytes);
  AmountDecision Tick(uint64_t now_ns, uint64_t llm_bytes, uint64_t resident_bytes);
  // A background restore failed: stop asking for restores until the next eviction.
  void RestoreGaveUp() { evicted_since_restore_ = false; }
  const AmountOptions& options() const { return o_; }

 private:
  AmountOptions o_;
  uint64_t last_event_ns_ = 0, last_applied_ns_ = 0;
  PressureLevel last_applied_level_ = PressureLevel::kNone;
  bool any_applied_ = false;
  double cur_step_ = 0;
  bool any_event_ = false, evicted_since_restore_ = false;
};

}  // namespace mz
