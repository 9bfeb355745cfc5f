// PsiSource: Linux pressure stall information triggers (kernel Documentation/accounting/psi.rst),
// the signal Android's lmkd uses today.
//
// Start() opens the pressure file (a cgroup v2 <dir>/memory.pressure, else /proc/pressure/memory),
// writes "some|full <stall us> <window us>" and Wait() polls the fd for POLLPRI: the kernel raises
// it when tasks stalled on memory for at least <stall> within a <window> (at most once per window).
// "some" reports kLow, "full" kCritical.
// Kernel rules, checked before writing (ValidatePsiTrigger): window in [500 ms, 10 s], 0 < stall <=
// window; without CAP_SYS_RESOURCE the window must also be a multiple of 2 s (unprivileged triggers
// run on the 2 s averaging clock). MakePsiTriggerUnprivileged() rounds a trigger to that rule
// keeping its stall share; the factory does this when the process lacks the capability and says so.
//
// Failure: Start() returns kUnsupported if the kernel has no PSI (file missing, or "psi=0"), the
// OS error of the write otherwise (EINVAL: the kernel refused the trigger). POLLERR (the cgroup was
// removed) ends Wait() with kIOError.
// Every OS call (the file, the trigger write, poll, the stop event) goes through the Env.
// Thread-safety: Stop() from any thread; the rest from the monitor's thread.
#pragma once
#include <atomic>
#include <memory>

#include "env/env.h"
#include "pressure/pressure_source.h"
#include "pressure/watermark_source.h"

namespace mz {

// One line of a PSI file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=25680".
struct PsiLine {
  double avg10 = 0, avg60 = 0, avg300 = 0;
  uint64_t total_us = 0;
  bool present = false;
};
struct PsiStats {
  PsiLine some, full;
};
// Parses the content of a PSI file. kCorruption if no "some" line parses.
Status ParsePsi(const std::string& content, PsiStats* out);

// Checks the kernel's trigger rules (see above). kInvalidArgument naming the broken rule.
Status ValidatePsiTrigger(uint32_t stall_us, uint32_t window_us, bool privileged);
// The text written to the pressure file (with its terminating NUL, as the kernel expects).
std::string FormatPsiTrigger(bool full, uint32_t stall_us, uint32_t window_us);
// Rounds window up to a multiple of 2 s (at most 10 s) and scales stall to keep its share.
void MakePsiTriggerUnprivileged(uint32_t* stall_us, uint32_t* window_us);

class PsiSource : public PressureSource {
 public:
  // path: the pressure file (/proc/pressure/memory or <v2 cgroup>/memory.pressure).
  PsiSource(Env* env, std::string path, bool full, uint32_t stall_us, uint32_t window_us);
  ~PsiSource() override;
  std::string name() const override;
  Status Start() override;
  Status Wait(int timeout_ms, PressureEvent* ev) override;
  void Stop() override;
  // The cgroup of a <cgroup>/memory.pressure path (if it has a limit), else /proc/meminfo.
  Status Headroom(uint64_t* available, uint64_t* limit) override;
  Status FreeBeforeReclaim(uint64_t* available, uint64_t* limit) override;
  const std::string& path() const { return path_; }
  // Opens `path` and arms the trigger once (then closes it) through env (nullptr: the default):
  // the real check that this kernel and this process can use PSI triggers. *why says why not.
  static bool Probe(Env* env, const std::string& path, bool full, uint32_t stall_us, uint32_t window_us,
                    std::string* why);

 private:
  Env* env_;
  std::string path_;
  bool full_;
  uint32_t stall_us_, window_us_;
  std::unique_ptr<WaitHandle> trigger_;  // the armed pressure file (Start)
  std::unique_ptr<WaitHandle> stop_;     // signalled by Stop(); null if it could not be made
  Status stop_status_;                   // why stop_ could not be made (Start returns it)
  std::atomic<bool> stopped_{false};
  WatermarkSource::Sampler headroom_, strict_;  // created lazily by Headroom() / FreeBeforeReclaim()
};

}  // namespace mz
