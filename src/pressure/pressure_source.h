// Memory-pressure sources behind one interface (paper section 6.6; issue 6).
//
// A PressureSource turns one OS signal into PressureEvents: a level and a timestamp. Concrete
// sources (each in its own file pair in src/pressure/):
//   - PsiSource: Linux PSI triggers (/proc/pressure/memory, or a cgroup v2 memory.pressure file),
//     "some|full <stall us> <window us>" written to the file, POLLPRI on the fd; the kernel's rules
//     (window 500 ms..10 s, threshold <= window) are validated before writing.
//   - CgroupV1Source: memory.pressure_level notifications through cgroup.event_control and an
//     event counter (one per level: low, medium, critical; made through the Env).
//   - WatermarkSource: polls MemAvailable (/proc/meminfo) or a cgroup's usage vs limit and maps
//     the headroom to a level (the fallback that works everywhere).
//   - ManualSource: events pushed by the host app: Android's onTrimMemory levels via
//     mz_on_trim_memory(), explicit requests, and tests (a fake).
// DetectPressureSource() picks the best source the machine supports and says which and why.
//
// Thread-safety: Wait() is called from one thread (the monitor's); Stop() may be called from any
// thread and makes a blocked Wait() return kCancelled promptly. Push() (ManualSource) is
// thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace mz {

class Env;

enum class PressureLevel : int {
  kNone = 0,      // pressure gone (watermark back above its high mark, or trim level "UI hidden")
  kLow = 1,       // the system would like memory back soon (PSI some / v1 "low" / TRIM_MEMORY_RUNNING_LOW)
  kMedium = 2,    // reclaim is hurting (v1 "medium" / TRIM_MEMORY_RUNNING_CRITICAL / BACKGROUND)
  kCritical = 3,  // about to kill someone (v1 "critical" / PSI full / TRIM_MEMORY_COMPLETE)
};
const char* PressureLevelName(PressureLevel l);

struct PressureEvent {
  PressureLevel level = PressureLevel::kNone;
  uint64_t time_ns = 0;        // Env clock (monotonic) when the source observed it
  uint64_t bytes_hint = 0;     // >0 when the source asks for an exact amount (explicit request)
  std::string source;          // source name, e.g. "cgroup-v1:mzcache-bench"
};

class PressureSource {
 public:
  virtual ~PressureSource() = default;
  virtual std::string name() const = 0;
  // Arms the source (opens files, writes triggers). Fails with a clear message if unsupported.
  virtual Status Start() = 0;
  // Blocks up to timeout_ms for the next event (< 0: no limit; 0: only what is already there).
  // kOk with *ev filled, kTimeout if none arrived, kCancelled after Stop(), or an I/O error.
  virtual Status Wait(int timeout_ms, PressureEvent* ev) = 0;
  virtual void Stop() = 0;
  // Memory that can still be allocated before the watched limit, for restore-ahead's fit check:
  // *available bytes (limit minus non-reclaimable usage) and the *limit they are measured against.
  // Kernel sources read their cgroup (v1 or v2, when it has a limit) or /proc/meminfo; sources that
  // cannot know (manual, fakes) return kUnsupported and restore-ahead then restores without a fit
  // check. Called from the monitor's thread only.
  virtual Status Headroom(uint64_t* available, uint64_t* limit) {
    (void)available;
    (void)limit;
    return Status::Unsupported(name() + " does not report headroom");
  }
  // Like Headroom, but no page cache counts as available: *available is the limit minus all the
  // watched cgroup is charged, i.e. what can still be allocated before the kernel reclaims anything
  // there. Reclaim in a memory cgroup raises a pressure event by itself, and its inactive page
  // cache includes the LLM's own file-backed units just restored (new page-cache pages start
  // inactive), so restore-ahead sizes its slices with this, not Headroom. Without a cgroup limit
  // (/proc/meminfo) it is Headroom's MemAvailable. Default: Headroom.
  virtual Status FreeBeforeReclaim(uint64_t* available, uint64_t* limit) { return Headroom(available, limit); }
};

// Which source to use. "auto" tries cgroup-v1 (if `cgroup_dir` is a v1 memory cgroup), then PSI
// (cgroup v2 memory.pressure or /proc/pressure/memory), then the watermark poller.
struct PressureSourceOptions {
  std::string kind = "auto";   // auto | psi | cgroup-v1 | watermark | manual
  std::string cgroup_dir;      // e.g. /sys/fs/cgroup/memory/foo (v1) or a v2 cgroup dir; empty: own/global
  // PSI trigger: stall of psi_stall_us within psi_window_us ("some" unless psi_full).
  uint32_t psi_stall_us = 150000;
  uint32_t psi_window_us = 1000000;
  bool psi_full = false;
  // Watermark poller: levels by headroom fraction (available / limit).
  int poll_ms = 100;
  double low_headroom = 0.15, medium_headroom = 0.08, critical_headroom = 0.03;
  double headroom_hysteresis = 0.05;  // a level drops only once headroom >= its mark + this
  int repeat_ms = 1000;               // re-report a level >= low this often while it lasts (0: never)
};

// Creates the source `opts.kind` (or the best available for "auto"); *why says which was chosen
// and why the others were not (for logs and `--watch-pressure`'s banner).
Status CreatePressureSource(Env* env, const PressureSourceOptions& opts, std::unique_ptr<PressureSource>* out,
                            std::string* why);

}  // namespace mz
