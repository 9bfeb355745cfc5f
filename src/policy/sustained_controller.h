// The sustained-mode controller: decides the compute thread count of a long generation from the
// temperature and the tokens/s it observes, so the run settles below the platform's throttling
// instead of oscillating with it (issue 24 section 4; field notes: "dropping from four threads to
// two before the trip is reached holds a steady rate where letting the governor decide oscillates
// and averages below it"). Pure logic: no OS call, no clock of its own (the caller passes the time),
// so every path is unit-tested with made-up inputs. It plans; runtime/sustained.h applies the plan
// through Context::SetThreads (one place applies).
//
// Rules, one Step per sampling window:
// - Down (-1 thread, not below min_threads): the temperature is at or above the high mark (hot), or
//   tokens/s has drifted below (1 - drift) of the best window at the same thread count within
//   drift_horizon for drift_windows consecutive windows (the throttling signature: the same work
//   got slower while nothing of ours changed). Drift is not acted on while a temperature is known
//   and below the low mark (the slowdown is not thermal: another process, a longer context).
// - Up (+1, not above max_threads): only after the temperature stayed below the low mark
//   (high - band: the hysteresis band) for hold_up; with no temperature at all, after a drift step
//   down, a probe step up after probe_up (0: never), which drifts back down if the cause remains.
// - Never two changes closer than min_interval (nor a change before min_interval from the start).
//   Inside the band (low <= temp < high) nothing changes: no oscillation.
//
// DutySleepNs is the duty-cycle cap's arithmetic (the caller sleeps through its Env).
// Thread-safety: none (one owner calls Step).
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "core/status.h"

namespace mz {

struct SustainedOptions {
  int max_threads = 2;              // >= min_threads
  int min_threads = 1;              // >= 1
  double band_c = 5;                // hysteresis: up only below high - band_c (degrees C, >= 0)
  uint64_t hold_up_ns = 30'000'000'000ull;        // cool this long before a step up
  uint64_t min_interval_ns = 10'000'000'000ull;   // at most one change per interval
  double drift = 0.25;              // 0: drift detection off; else in (0, 1)
  int drift_windows = 2;            // consecutive drifted windows before a step down (>= 1)
  uint64_t drift_horizon_ns = 60'000'000'000ull;  // "best recent window": within this long
  uint64_t probe_up_ns = 120'000'000'000ull;      // no sensor: step up again this long after a drift step (0: never)
};

// kInvalidArgument naming the field when an option is out of range.
Status ValidateSustainedOptions(const SustainedOptions& o);

// One window's observations. Temperature and rate are optional (no sensor; a window with no
// decode step).
struct SustainedSample {
  uint64_t now_ns = 0;          // the caller's monotonic clock, non-decreasing across calls
  bool has_temp = false;
  double temp_c = 0;            // the zone nearest its mark
  double high_c = 0;            // that zone's high mark (throttle trip minus margin, or configured)
  bool has_rate = false;
  double tokens_per_s = 0;      // decode tokens per second of compute in this window
};

enum class SustainedReason { kNone = 0, kHot = 1, kDrift = 2, kCool = 3, kProbe = 4 };
const char* SustainedReasonName(SustainedReason r);

struct SustainedDecision {
  int threads = 1;        // the thread count to compute with from now on
  int delta = 0;          // -1, 0 or +1 versus before this Step
  SustainedReason reason = SustainedReason::kNone;
  std::string why;        // for people: "62.0 C >= high mark 60.0 C", "8.1 tok/s < 75% of 11.0"
};

class SustainedController {
 public:
  // start_threads is clamped to [min_threads, max_threads]. REQUIRES: ValidateSustainedOptions ok.
  SustainedController(const SustainedOptions& o, int start_threads, uint64_t start_ns);

  SustainedDecision Step(const SustainedSample& s);
  // The thread count the caller really computes with (after a refused change): the controller
  // follows it (clamped) and treats it as a change at now_ns.
  void Resync(int threads, uint64_t now_ns);

  int threads() const { return threads_; }
  int steps_down() const { return steps_down_; }
  int steps_up() const { return steps_up_; }
  const SustainedOptions& options() const { return o_; }

 private:
  struct Window {
    uint64_t t;
    int threads;
    double rate;
  };
  void Change(int delta, uint64_t now, SustainedReason r);
  SustainedOptions o_;
  int threads_;
  uint64_t last_change_ns_;
  SustainedReason last_reason_ = SustainedReason::kNone;
  bool cool_ = false;
  uint64_t cool_since_ns_ = 0;
  int drifted_ = 0;  // consecutive drifted windows
  std::deque<Window> windows_;
  int steps_down_ = 0, steps_up_ = 0;
};

// The sleep after a step that used busy_ns of compute, wall_ns having passed since the end of the
// previous step's sleep (busy_ns included; 0 or < busy_ns counts as busy_ns), so that compute over
// wall time stays at most duty: max(0, busy/duty - wall). duty >= 1 (or <= 0): 0.
uint64_t DutySleepNs(uint64_t busy_ns, uint64_t wall_ns, double duty);

}  // namespace mz
