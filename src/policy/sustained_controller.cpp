#include "policy/sustained_controller.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mz {

Status ValidateSustainedOptions(const SustainedOptions& o) {
  if (o.min_threads < 1 || o.min_threads > 512) return Status::InvalidArgument("min_threads must be in [1, 512]");
  if (o.max_threads < o.min_threads || o.max_threads > 512)
    return Status::InvalidArgument("max_threads must be in [min_threads, 512]");
  if (!(o.band_c >= 0) || o.band_c > 100) return Status::InvalidArgument("band_c must be in [0, 100] degrees");
  if (!(o.drift >= 0 && o.drift < 1)) return Status::InvalidArgument("drift must be in [0, 1)");
  if (o.drift_windows < 1) return Status::InvalidArgument("drift_windows must be >= 1");
  return Status::Ok();
}

const char* SustainedReasonName(SustainedReason r) {
  switch (r) {
    case SustainedReason::kNone: return "none";
    case SustainedReason::kHot: return "hot";
    case SustainedReason::kDrift: return "drift";
    case SustainedReason::kCool: return "cool";
    case SustainedReason::kProbe: return "probe";
  }
  return "?";
}

SustainedController::SustainedController(const SustainedOptions& o, int start_threads, uint64_t start_ns)
    : o_(o), threads_(std::clamp(start_threads, o.min_threads, o.max_threads)), last_change_ns_(start_ns) {}

void SustainedController::Change(int delta, uint64_t now, SustainedReason r) {
  threads_ += delta;
  last_change_ns_ = now;
  last_reason_ = r;
  drifted_ = 0;
  if (delta < 0) ++steps_down_;
  else ++steps_up_;
}

void SustainedController::Resync(int threads, uint64_t now_ns) {
  threads_ = std::clamp(threads, o_.min_threads, o_.max_threads);
  last_change_ns_ = now_ns;
  drifted_ = 0;
}

SustainedDecision SustainedController::Step(const SustainedSample& s) {
  SustainedDecision d;
  char buf[160];
  const bool hot = s.has_temp && s.temp_c >= s.high_c;
  const bool cool = s.has_temp && s.temp_c < s.high_c - o_.band_c;
  if (cool) {
    if (!cool_) cool_since_ns_ = s.now_ns;
  }
  cool_ = cool;

  double best = 0;
  if (s.has_rate && o_.drift > 0) {
    while (!windows_.empty() && s.now_ns - windows_.front().t > o_.drift_horizon_ns) windows_.pop_front();
    for (const Window& w : windows_)
      if (w.threads == threads_) best = std::max(best, w.rate);
    const bool drifted = best > 0 && s.tokens_per_s < (1.0 - o_.drift) * best;
    drifted_ = drifted ? drifted_ + 1 : 0;
    windows_.push_back({s.now_ns, threads_, s.tokens_per_s});
  }

  const bool may_change = s.now_ns - last_change_ns_ >= o_.min_interval_ns;
  if (may_change) {
    if (hot && threads_ > o_.min_threads) {
      std::snprintf(buf, sizeof buf, "%.1f C >= high mark %.1f C", s.temp_c, s.high_c);
      Change(-1, s.now_ns, SustainedReason::kHot);
      d.delta = -1, d.reason = SustainedReason::kHot, d.why = buf;
    } else if (drifted_ >= o_.drift_windows && threads_ > o_.min_threads && !cool) {
      std::snprintf(buf, sizeof buf, "%.2f tok/s < %.0f%% of the best recent %.2f tok/s at %d threads",
                    s.tokens_per_s, 100.0 * (1.0 - o_.drift), best, threads_);
      Change(-1, s.now_ns, SustainedReason::kDrift);
      d.delta = -1, d.reason = SustainedReason::kDrift, d.why = buf;
    } else if (threads_ < o_.max_threads) {
      if (cool && s.now_ns - cool_since_ns_ >= o_.hold_up_ns) {
        std::snprintf(buf, sizeof buf, "%.1f C below %.1f C (high mark %.1f - band %.1f) for %.0f s", s.temp_c,
                      s.high_c - o_.band_c, s.high_c, o_.band_c, double(s.now_ns - cool_since_ns_) * 1e-9);
        Change(+1, s.now_ns, SustainedReason::kCool);
        cool_since_ns_ = s.now_ns;  // the next step up needs another full hold
        d.delta = +1, d.reason = SustainedReason::kCool, d.why = buf;
      } else if (!s.has_temp && last_reason_ == SustainedReason::kDrift && o_.probe_up_ns > 0 &&
                 s.now_ns - last_change_ns_ >= o_.probe_up_ns) {
        std::snprintf(buf, sizeof buf, "no temperature: probing %d threads again %.0f s after a drift step",
                      threads_ + 1, double(s.now_ns - last_change_ns_) * 1e-9);
        Change(+1, s.now_ns, SustainedReason::kProbe);
        d.delta = +1, d.reason = SustainedReason::kProbe, d.why = buf;
      }
    }
  }
  d.threads = threads_;
  return d;
}

uint64_t DutySleepNs(uint64_t busy_ns, uint64_t wall_ns, double duty) {
  if (!(duty > 0) || duty >= 1) return 0;
  const double wall = double(std::max(wall_ns, busy_ns));
  // Whole nanoseconds, rounded up (less a hair so that 70 / 0.7 is 100, not 101: 0.7 is inexact).
  const double target = std::ceil(double(busy_ns) / duty - 1e-6);
  return target > wall ? uint64_t(target - wall) : 0;
}

}  // namespace mz
