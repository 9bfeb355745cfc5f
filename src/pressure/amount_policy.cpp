#include "pressure/amount_policy.h"

#include <algorithm>
#include <cmath>

namespace mz {

AmountDecision AmountPolicy::OnEvent(const PressureEvent& ev, uint64_t llm_bytes, uint64_t resident_bytes) {
  AmountDecision d;
  if (ev.level == PressureLevel::kNone && ev.bytes_hint == 0) {
    cur_step_ = 0;  // pressure gone: the next event starts again from the base step
    return d;
  }
  if (resident_bytes >= llm_bytes) evicted_since_restore_ = false;
  any_event_ = true;
  last_event_ns_ = std::max(last_event_ns_, ev.time_ns);
  const double floor_bytes = std::clamp(o_.floor_points, 0.0, 1.0) * double(llm_bytes);
  const uint64_t room = double(resident_bytes) > floor_bytes ? resident_bytes - uint64_t(floor_bytes) : 0;
  const bool recent = any_applied_ && ev.time_ns >= last_applied_ns_;
  uint64_t want = 0;
  if (ev.bytes_hint > 0) {
    want = ev.bytes_hint;
    d.step_points = llm_bytes ? double(want) / double(llm_bytes) : 0;
  } else {
    if (recent && ev.time_ns - last_applied_ns_ < o_.hysteresis_ns && ev.level <= last_applied_level_)
      return d;  // merged into the last applied event
    const bool repeated = recent && ev.time_ns - last_applied_ns_ <= o_.escalation_window_ns && cur_step_ > 0;
    cur_step_ = repeated ? cur_step_ * o_.escalation : o_.step_points;
    cur_step_ = std::min(cur_step_, o_.max_step_points);
    double step = cur_step_;
    if (ev.level == PressureLevel::kMedium) step *= o_.escalation;
    if (ev.level == PressureLevel::kCritical) step = o_.critical_to_floor ? 1.0 : step * o_.escalation * o_.escalation;
    step = std::min(step, ev.level == PressureLevel::kCritical && o_.critical_to_floor ? 1.0 : o_.max_step_points);
    d.step_points = step;
    want = uint64_t(std::llround(step * double(llm_bytes)));
  }
  d.evict_bytes = std::min(want, room);
  if (d.evict_bytes > 0) {
    any_applied_ = true;
    last_applied_ns_ = ev.time_ns;
    last_applied_level_ = ev.level;
    evicted_since_restore_ = true;
  }
  return d;
}

AmountDecision AmountPolicy::Tick(uint64_t now_ns, uint64_t llm_bytes, uint64_t resident_bytes) {
  AmountDecision d;
  if (resident_bytes >= llm_bytes) evicted_since_restore_ = false;
  if (o_.restore_ahead != AmountOptions::RestoreAhead::kBackground || !evicted_since_restore_) return d;
  if (now_ns < last_event_ns_ || now_ns - last_event_ns_ < o_.calm_ns) return d;
  d.restore_now = true;  // again on every tick until resident (the monitor restores in slices)
  cur_step_ = 0;
  return d;
}

}  // namespace mz
