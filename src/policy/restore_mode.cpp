#include "policy/restore_mode.h"

#include <algorithm>

namespace mz {

RestoreModePlan PlanRestoreMode(const RestoreCosts& in) {
  RestoreModePlan p;
  const int cores = std::max(1, in.cores), n = std::max(1, in.compute_threads);
  const int asked = std::max(1, in.io_workers) + std::max(1, in.decode_workers);
  const double r = std::max(0.0, in.restore_cpu_s), w = std::max(0.0, in.restore_wait_s);
  const double c = std::max(0.0, in.compute_s);
  const int spare = cores - n;
  const bool waits = w > r;  // restoration mostly waits for storage, not for a core
  // Serial: every core restores, then compute runs on all n.
  const int serial_workers = std::min(cores, asked);
  const double serial = std::max(r / serial_workers, w) + c;
  double overlap;
  if (spare > 0) overlap = std::max({c, r / std::min(spare, asked), w});
  else if (n > 1) overlap = std::max({c * n / (n - 1), r, w});
  else overlap = std::max(c + r, w);
  if (c > 0) {
    p.overlap = overlap < serial;
    p.predicted_serial_s = serial;
    p.predicted_overlap_s = overlap;
    p.why = p.overlap ? "cost model: overlapped is faster" : "cost model: serial is no slower";
  } else {
    p.overlap = spare > 0 || waits;
    p.why = spare > 0 ? "compute unknown: a core beyond compute's restores"
            : waits   ? "compute unknown: restoration mostly waits for storage"
                      : "compute unknown: restoration competes with compute for the cores";
  }
  p.decode_workers = std::max(1, in.decode_workers);
  if (!p.overlap) {
    // Nothing computes meanwhile: CPU-bound restoration gets one worker per core; reads that mostly
    // wait keep the workers asked for in flight (at least one per core).
    p.io_workers = waits ? std::max(std::max(1, in.io_workers), cores) : std::max(1, cores - 1);
    p.compute_threads_during = n;
  } else if (spare > 0) {
    p.io_workers = waits ? std::max(1, in.io_workers) : std::max(1, std::min(in.io_workers, spare));
    p.compute_threads_during = n;  // restoration has cores of its own
  } else {
    p.io_workers = waits ? std::max(1, in.io_workers) : 1;  // one core left for it
    p.compute_threads_during = std::max(1, n - 1);
  }
  return p;
}

}  // namespace mz
