// OS Paging baseline measurement (see cmd_ospaging.cpp).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace mz::cli {

struct OsPagingEnv {
  std::string swap;     // what swap is used
  void* zram = nullptr; // ZramSwap owned by the probe
};
struct OsPagingRun {
  double ttft = 0;
  double remaining = 0;  // RAM still held (incl. zram's compressed copies) / footprint
  bool reached = false;  // the kernel could reclaim down to the requested level
  uint64_t swapped = 0, zram_compressed = 0;
};

// Checks root, cgroup v1 and swap (enabling zram if needed). kUnsupported with the reason otherwise.
Status OsPagingProbe(OsPagingEnv* env);
void OsPagingTeardown(OsPagingEnv* env);
// Pid of the OS Paging worker OsPagingMeasure is running now, or -1. Async-signal-safe: a signal
// handler kills and reaps it before removing its cgroup (which a live member keeps busy).
int OsPagingWorkerPid();
Status OsPagingMeasure(OsPagingEnv* env, const std::string& model, const std::string& session, int n_ctx,
                       const std::vector<int32_t>& query, int threads, double level, OsPagingRun* out);

}  // namespace mz::cli
