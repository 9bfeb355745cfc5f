// CgroupV1Source: cgroup v1 memory.pressure_level notifications (the kernel's vmpressure), the
// pressure signal of the machines this project runs on and of Android's lmkd before PSI.
//
// Start() creates one event counter per level (low, medium, critical; through the Env) and registers each by writing
// "<counter fd> <fd of memory.pressure_level> <level>" to <cgroup>/cgroup.event_control (default
// hierarchy mode: an event in a child cgroup without listeners is passed to its ancestors). The
// kernel signals a level's counter for that level and every higher one, so on each wake-up Wait()
// drains all three counters and reports the highest level fired. Levels mean (kernel docs):
// low = reclaiming to make room for new allocations, medium = swapping / dropping the active page
// cache, critical = about to OOM or reclaim failing.
//
// Failure: Start() fails with kUnsupported if the directory is not a v1 memory cgroup, or with the
// OS error (EACCES without root, ...). Registrations are removed by the kernel when the eventfds are
// closed (the destructor) or when the cgroup is removed; Wait() then never fires again.
// Every OS call (the files, the eventfds, poll) goes through the Env.
// Thread-safety: Stop() from any thread; the rest from the monitor's thread.
#pragma once
#include <atomic>
#include <memory>

#include "env/env.h"
#include "pressure/pressure_source.h"
#include "pressure/watermark_source.h"

namespace mz {

class CgroupV1Source : public PressureSource {
 public:
  // cgroup_dir: a v1 memory cgroup directory ("" = this process's own v1 memory cgroup).
  CgroupV1Source(Env* env, std::string cgroup_dir);
  ~CgroupV1Source() override;
  std::string name() const override { return "cgroup-v1:" + dir_; }
  Status Start() override;
  // timeout_ms < 0 waits without limit.
  Status Wait(int timeout_ms, PressureEvent* ev) override;
  void Stop() override;
  // Limit minus usage (less inactive file pages) of the watched cgroup (WatermarkSource's sampler).
  Status Headroom(uint64_t* available, uint64_t* limit) override;
  Status FreeBeforeReclaim(uint64_t* available, uint64_t* limit) override;
  const std::string& dir() const { return dir_; }
  // Checks through env (nullptr: the default) that `dir` can be watched (exists, is a v1 memory
  // cgroup, the control file is writable); *why says why not.
  static bool Probe(Env* env, const std::string& dir, std::string* why);

 private:
  void CloseAll();
  Env* env_;
  std::string dir_;
  std::unique_ptr<WaitHandle> level_;   // memory.pressure_level (Start)
  std::unique_ptr<WaitHandle> efd_[3];  // event counters: low, medium, critical (Start)
  std::unique_ptr<WaitHandle> stop_;    // signalled by Stop(); null if it could not be made
  Status stop_status_;                  // why stop_ could not be made (Start returns it)
  std::atomic<bool> stopped_{false};
  WatermarkSource::Sampler headroom_, strict_;  // created lazily by Headroom() / FreeBeforeReclaim()
};

}  // namespace mz
