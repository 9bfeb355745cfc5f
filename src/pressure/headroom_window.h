// Restore-ahead's fit check, shared by the one-context monitor (pressure/monitor.h) and the pool's
// pressure watch (pool/pool.h): before memory is restored ahead of a request, the free memory the
// pressure source reports must have stopped shrinking for AmountOptions::calm_ns (someone, an app
// starting, may be taking memory without the kernel complaining yet), and a slice takes only what
// is free beyond AmountOptions::restore_margin of the limit.
//
// Not thread-safe: one owner (the monitor's or the watch's thread) samples it.
#pragma once
#include <cstdint>

#include "pressure/amount_policy.h"
#include "pressure/pressure_source.h"

namespace mz {

class HeadroomWindow {
 public:
  enum class Verdict {
    kRestore,       // restore up to *budget now (*budget may be 0: nothing fits)
    kWaitCalm,      // free memory is still shrinking (or the window is younger than calm_ns)
    kSourceFailed,  // the source can tell but failed to now: never restore blind; try next tick
  };
  // Samples src->FreeBeforeReclaim at now_ns. A source that cannot tell (kUnsupported) gives
  // kRestore without a fit check; any other failure, or a reading without a limit, kSourceFailed. *budget: at most o.restore_slice_bytes (0: no cap),
  // and with a fit check at most what is free beyond restore_margin of the limit.
  Verdict Sample(PressureSource* src, uint64_t now_ns, const AmountOptions& o, uint64_t* budget);
  // The next restore-ahead starts a new stability window (pressure came, or nothing to restore).
  void Reset() { watching_ = false; }
  // A slice took `bytes`: that memory is ours, not another app's, so the next sample must not
  // count it as shrinking.
  void Took(uint64_t bytes);

 private:
  bool watching_ = false;
  bool fit_check_ = false;  // the last Sample had a fit check
  uint64_t stable_since_ns_ = 0, window_max_avail_ = 0;
};

}  // namespace mz
