// WatermarkSource: the fallback that works everywhere: polls how much memory is left and maps the
// headroom to a level.
//
// Headroom = available / limit, where
//   - with a cgroup v1 directory that has a limit (memory.limit_in_bytes below MemTotal):
//     available = limit - (memory.usage_in_bytes - total_inactive_file), i.e. the limit minus the
//     working set (inactive page cache is reclaimed cheaply, so it does not count as used);
//     a cgroup v2 directory likewise with memory.max, memory.current and inactive_file;
//   - otherwise (no cgroup, or an unlimited one): MemAvailable / MemTotal from /proc/meminfo.
// Levels (WatermarkLevels): the level rises as soon as headroom falls below its mark
// (low_headroom, medium_headroom, critical_headroom) and drops back only after headroom recovers to
// mark + headroom_hysteresis (no flapping around a mark). An event is reported on every change of
// level (kNone when pressure is gone) and, while the level stays at kLow or above, again every
// repeat_ms (so a monitor can give back more if the first step did not help).
//
// Time: polls every poll_ms; deadlines are computed on the Env clock (a fake clock in tests drives
// the hysteresis and repeat logic), sleeps are real and end early on Stop(); a wait also ends once
// the real time it slept reaches timeout_ms (a frozen fake clock cannot make it hang).
// The counters are read through the Env (ReadSmallFile), so a FaultEnv can serve fake ones.
// Thread-safety: Stop() from any thread; the rest from the monitor's thread.
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>

#include "pressure/pressure_source.h"

namespace mz {

// The level logic alone (pure, deterministic).
class WatermarkLevels {
 public:
  explicit WatermarkLevels(const PressureSourceOptions& o) : o_(o) {}
  // Feeds one sample; returns true and sets *level when an event is due.
  bool Update(double headroom, uint64_t now_ns, PressureLevel* level);
  PressureLevel level() const { return cur_; }

 private:
  double Mark(PressureLevel l) const;
  PressureSourceOptions o_;
  PressureLevel cur_ = PressureLevel::kNone;
  uint64_t last_emit_ns_ = 0;
  bool any_ = false;
};

class WatermarkSource : public PressureSource {
 public:
  // One sample: bytes available and the limit they are measured against.
  using Sampler = std::function<Status(uint64_t* available, uint64_t* limit)>;
  // Samples opts.cgroup_dir (v1 or v2, if it has a limit) or /proc/meminfo.
  WatermarkSource(Env* env, const PressureSourceOptions& opts);
  // Samples through `sampler` (tests; other counters).
  WatermarkSource(Env* env, const PressureSourceOptions& opts, Sampler sampler, std::string what);
  std::string name() const override { return "watermark:" + what_; }
  // Takes one sample to check the counters can be read.
  Status Start() override;
  // Polls until an event, timeout_ms (< 0: no limit; 0: one sample, no sleep) or Stop().
  Status Wait(int timeout_ms, PressureEvent* ev) override;
  void Stop() override;
  // A fresh sample through the sampler.
  Status Headroom(uint64_t* available, uint64_t* limit) override { return sampler_(available, limit); }
  // The default sampler without the inactive-page-cache credit (a custom sampler: Headroom).
  Status FreeBeforeReclaim(uint64_t* available, uint64_t* limit) override {
    return strict_ ? strict_(available, limit) : sampler_(available, limit);
  }
  // Headroom (available / limit) of the last sample.
  double last_headroom() const;
  // The default sampler for a cgroup dir ("" or unlimited: /proc/meminfo); *what describes it.
  // Reads through env (nullptr: Env::Default()), which must outlive the sampler.
  // credit_inactive = false: the cgroup's inactive page cache is not counted as available
  // (FreeBeforeReclaim).
  static Sampler DefaultSampler(Env* env, const std::string& cgroup_dir, std::string* what,
                                bool credit_inactive = true);

 private:
  Env* env_;
  PressureSourceOptions o_;
  Sampler strict_;  // FreeBeforeReclaim (the default sampler's strict twin; empty for a custom sampler)
  Sampler sampler_;
  std::string what_;
  WatermarkLevels levels_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  double last_headroom_ = 1.0;
};

}  // namespace mz
