// Sustained mode (issue 24 section 4): a long generation that caps its compute threads and duty
// cycle and steps the thread count down and up with hysteresis as the device heats (thermal zones,
// env/thermal_zones.h) or its tokens/s drifts (the throttling signature when there is no sensor).
// SustainedController (policy/sustained_controller.h) plans; this class reads the sensors through
// the Env, feeds the controller once per window and applies its thread count through
// Context::SetThreads (the one path that changes threads: KV, history and logits are kept, and the
// logits are those of a context that never changed threads). It also paces the generation: after
// each step it sleeps (Env::SleepNs) so that compute time over wall time stays <= duty.
//
// Use: Init once, then call AfterStep on the generating thread after every Decode /
// RestoreGenerate returned (the context released), with the step's start and end times from the
// same Env's NowNs. The C API does this inside mz_decode / mz_restore_generate once
// mz_context_set_sustained enabled it; the CLI's run and chat call it from their loop.
//
// Thread-safety: Init and AfterStep from the context's generating thread; stats() from any thread.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "env/thermal_zones.h"
#include "policy/sustained_controller.h"

namespace mz {

class Context;

struct SustainedModeOptions {
  // The thread range and hysteresis. control.max_threads 0: the context's thread count at Init. With
  // pinned compute CPUs (a big.LITTLE default, or SetThreads with CPUs) the threads use the first n
  // of those CPUs, and max_threads is capped to their number.
  SustainedOptions control;
  double duty = 1.0;               // (0, 1]: compute time / wall time cap; 1 = no pacing
  uint64_t window_ns = 1'000'000'000ull;  // sensors read and controller stepped at most this often
  // The high mark: > 0 applies to every zone (degrees C); 0: per zone, its throttle trip
  // (ThermalZone::ThrottleTrip) minus trip_margin_c; a zone with no trip point is then not used.
  double high_c = 0;
  double trip_margin_c = 5;
  std::string thermal_root = kSysThermalRoot;
  std::string zone_filter;         // only zones whose type contains this ("" = all)
};
Status ValidateSustainedModeOptions(const SustainedModeOptions& o);

// What one AfterStep did to the threads (for a chat line).
struct SustainedEvent {
  bool changed = false;     // the thread count changed
  bool refused = false;     // the controller asked for a change that SetThreads refused (status)
  int from = 0, to = 0;
  int wanted = 0;           // the thread count the controller asked for (refused: not applied)
  SustainedReason reason = SustainedReason::kNone;
  std::string why;
  Status status;
};

struct SustainedStats {
  int threads = 0;            // compute threads now
  int min_threads = 0, max_threads = 0;
  int steps_down = 0, steps_up = 0;
  SustainedReason last_reason = SustainedReason::kNone;
  int n_zones = 0;            // zones read at the last window
  bool has_temp = false;      // a zone with a high mark was read at the last window
  double temp_c = 0, high_c = 0;  // of the zone nearest its mark
  std::string zone;           // its name and type, "thermal_zone3 (cpu-1-0)"
  double window_tokens_per_s = 0;  // decode tokens per second of compute, last window (0: none)
  uint64_t decode_tokens = 0;      // single-token steps seen
  uint64_t busy_ns = 0, slept_ns = 0;  // compute time of all steps; duty-cycle sleeps
  std::string sensors;        // "no thermal sensors ..." or "2 zones with trip points ..."
};

class SustainedMode {
 public:
  SustainedMode(Env* env, Context* ctx, const SustainedModeOptions& o);
  // Validates the options, reads the thermal zones once (an unreadable thermal class is reported in
  // stats().sensors and treated as no sensors), caps the context's threads to max_threads
  // (Context::SetThreads: its error, e.g. kBusy, is returned and nothing is enabled).
  Status Init();
  // After a generation step of n_tokens that ran over [start_ns, end_ns) (NowNs of this Env): sleeps
  // for the duty cycle, and when a window has passed reads the sensors, steps the controller and
  // applies its thread count. *ev (optional) receives what happened to the threads. Never fails:
  // a refused SetThreads (kBusy: another thread held the context) is reported in *ev and the
  // controller follows the threads the context really has.
  void AfterStep(int n_tokens, uint64_t start_ns, uint64_t end_ns, SustainedEvent* ev = nullptr);
  SustainedStats stats() const;
  const SustainedModeOptions& options() const { return o_; }

 private:
  void ReadSensors(SustainedSample* s);
  Env* env_;
  Context* ctx_;
  SustainedModeOptions o_;
  std::vector<int> cpus_;  // pinned CPUs to take the first n of; empty: not pinned
  std::unique_ptr<SustainedController> ctl_;
  uint64_t window_start_ns_ = 0;
  uint64_t prev_end_ns_ = 0;
  bool have_prev_ = false;
  uint64_t win_tokens_ = 0, win_busy_ns_ = 0;
  mutable std::mutex mu_;  // guards st_
  SustainedStats st_;
};

}  // namespace mz
