// Sync points (after RocksDB's TEST_SYNC_POINT): named places in concurrent code where a test can
// install a callback to force an interleaving deterministically, e.g. "restoration of layer 5
// finishes only after compute has reached layer 5", without sleeps. With no callback installed a
// sync point costs one relaxed atomic load.
//
// Thread-safety: SetCallback/ClearAll must not race with Process on the same name; tests install
// callbacks before starting the work and clear them after it is joined.
#pragma once
#include <atomic>
#include <functional>
#include <string>

namespace mz {

class SyncPoints {
 public:
  // arg: a point-specific integer (layer index, unit index, ...).
  using Callback = std::function<void(int arg)>;
  static void SetCallback(const std::string& name, Callback cb);
  static void ClearAll();
  static void Process(const char* name, int arg);
  static std::atomic<bool> enabled;
};

}  // namespace mz

#define MZ_SYNC_POINT(name, arg)                                                   \
  do {                                                                             \
    if (::mz::SyncPoints::enabled.load(std::memory_order_relaxed)) ::mz::SyncPoints::Process(name, arg); \
  } while (0)
