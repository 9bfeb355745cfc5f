// RestoreRates: what restoring a byte of each kind of unit has cost, learned from the restores
// that actually ran (the restore pipeline times every unit it restores: wall time and, where the
// Env can tell, the restoring thread's CPU time), so the restore-mode plan (restore_mode.h) prices
// the next restore at this machine's real rate instead of the device profile's figure. The profile
// stays the prior: a kind not observed yet is priced as before (Context::RestoreModeCostsLocked).
//
// Why: the profile prices a re-read of dropped file-backed weights through the page cache as CPU
// at its mapped-read rate (the default profile: ~1.6 GB/s on two threads), but the kernel maps
// page-cached weights in 2 MiB folios: the Llama-3.2-1B reload was 0.33 s of wall time and about
// 0.1 s of CPU (session 36), so every model switch was planned "restore first" while overlapping
// measured 0.71x-0.83x of that. One fixed profile share would be wrong across models (Qwen3-0.6B's
// smaller units have more 4 KiB heads and tails), so the rate is learned, per kind.
//
// Kinds: page-cache reads of file-backed weights, KV chunks mapped from the swap file, and direct
// reads (KV or weights read from storage into fresh memory). Decoding and loads of compressed
// chunks are not learned (priced from the profile as before).
//
// What a sample is: one restore call's units of one kind: their bytes (RAM restored), the summed
// wall time of the threads that restored them (unit by unit: the table's restore, and the unit's
// allocation where none ran ahead of it) and the summed CPU time of those threads over the same units. So
// wall_s_per_byte is one restoring thread's seconds per byte with the workers that ran beside it,
// cpu_s_per_byte the part of it the thread spent on a core, and the rest is waiting (for the disk,
// for kernel locks). A sample of fewer than min_bytes is ignored (fixed costs would dominate); so
// is a sample with no wall time. Learning is a moving average: the newest sample weighs a half (as
// the context's prefill rate).
//
// Thread-safety: every method may be called from any thread (one mutex). Shared by the contexts
// of a pool (ContextOptions::restore_rates, filled by Pool::Init), or a context's own.
#pragma once
#include <cstdint>
#include <mutex>

namespace mz {

enum class RestoreKind { kMappedWeights = 0, kMappedKv = 1, kDirectRead = 2 };
constexpr int kRestoreKinds = 3;
const char* RestoreKindName(RestoreKind k);

// One restore's units of one kind (see above). cpu_known false: the Env could not measure thread
// CPU time (Env::ThreadCpuNs); then cpu_s is ignored and the sample counts as all CPU for the
// page-cache kinds (as the profile prices them) and as all waiting for direct reads.
struct RestoreSample {
  uint64_t bytes = 0;
  double wall_s = 0;
  double cpu_s = 0;
  bool cpu_known = false;
};

struct RestoreRate {
  int samples = 0;             // samples learned from (0: not observed: use the prior)
  double wall_s_per_byte = 0;  // one restoring thread's seconds per byte
  double cpu_s_per_byte = 0;   // of them, on a core (<= wall_s_per_byte)
  double wait_s_per_byte() const { return wall_s_per_byte - cpu_s_per_byte; }
};

class RestoreRates {
 public:
  explicit RestoreRates(uint64_t min_bytes = uint64_t(1) << 20) : min_bytes_(min_bytes) {}
  // Learns from one sample of kind k; returns whether it was taken (see above for what is not).
  bool Note(RestoreKind k, const RestoreSample& s);
  RestoreRate Get(RestoreKind k) const;
  uint64_t min_bytes() const { return min_bytes_; }

 private:
  const uint64_t min_bytes_;
  mutable std::mutex mu_;
  RestoreRate r_[kRestoreKinds];
};

}  // namespace mz
