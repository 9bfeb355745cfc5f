// PressureLevelName and the factory: detection of what the machine supports.
#include "pressure/pressure_source.h"

#include "env/env.h"
#include "pressure/cgroup_v1_source.h"
#include "pressure/manual_source.h"
#include "pressure/psi_source.h"
#include "pressure/sysfs.h"
#include "pressure/watermark_source.h"

namespace mz {

const char* PressureLevelName(PressureLevel l) {
  switch (l) {
    case PressureLevel::kNone: return "none";
    case PressureLevel::kLow: return "low";
    case PressureLevel::kMedium: return "medium";
    case PressureLevel::kCritical: return "critical";
  }
  return "?";
}

namespace {

// The PSI file for opts: <cgroup_dir>/memory.pressure if it exists, else the system-wide one.
std::string PsiPath(Env* env, const PressureSourceOptions& opts, std::string* note) {
  if (!opts.cgroup_dir.empty()) {
    if (sysfs::Exists(env, opts.cgroup_dir + "/memory.pressure")) return opts.cgroup_dir + "/memory.pressure";
    *note = opts.cgroup_dir + " has no memory.pressure (not cgroup v2): using the system-wide file; ";
  }
  return "/proc/pressure/memory";
}

// Tries to make a PSI source; false with *why_not if PSI is unusable here.
bool TryPsi(Env* env, const PressureSourceOptions& opts, std::unique_ptr<PressureSource>* out, std::string* why,
            std::string* why_not) {
  std::string note;
  const std::string path = PsiPath(env, opts, &note);
  uint32_t stall = opts.psi_stall_us, window = opts.psi_window_us;
  if (!sysfs::HasCapSysResource(env) && ValidatePsiTrigger(stall, window, true).ok() &&
      !ValidatePsiTrigger(stall, window, false).ok()) {
    MakePsiTriggerUnprivileged(&stall, &window);
    note += "no CAP_SYS_RESOURCE: trigger rounded to " + std::to_string(stall) + "/" + std::to_string(window) +
            " us (unprivileged windows are multiples of 2 s); ";
  }
  std::string probe;
  if (!PsiSource::Probe(env, path, opts.psi_full, stall, window, &probe)) {
    *why_not = note + "PSI unusable: " + probe;
    return false;
  }
  *out = std::make_unique<PsiSource>(env, path, opts.psi_full, stall, window);
  *why += note + "PSI trigger armed on " + path;
  return true;
}

}  // namespace

Status CreatePressureSource(Env* env, const PressureSourceOptions& opts, std::unique_ptr<PressureSource>* out,
                            std::string* why) {
  out->reset();
  if (!env) env = Env::Default();
  std::string local_why;
  if (!why) why = &local_why;
  why->clear();
  const std::string& k = opts.kind;
  if (k == "manual") {
    *out = std::make_unique<ManualSource>(env);
    *why = "manual: events come from the host app (mz_on_trim_memory, mz_evict)";
    return Status::Ok();
  }
  if (k == "cgroup-v1" || k == "auto") {
    const std::string dir = opts.cgroup_dir.empty() && k == "cgroup-v1" ? sysfs::OwnV1MemoryCgroup(env) : opts.cgroup_dir;
    std::string why_not;
    if (!dir.empty() && CgroupV1Source::Probe(env, dir, &why_not)) {
      *out = std::make_unique<CgroupV1Source>(env, dir);
      *why = "cgroup v1 memory.pressure_level notifications on " + dir;
      return Status::Ok();
    }
    if (dir.empty()) why_not = k == "auto" ? "cgroup-v1: no --cgroup directory given" : "no cgroup v1 memory controller";
    if (k == "cgroup-v1") return Status::Unsupported("cgroup-v1: " + why_not);
    *why = "cgroup-v1 not used (" + why_not + "); ";
  }
  if (k == "psi" || k == "auto") {
    std::string why_not;
    if (TryPsi(env, opts, out, why, &why_not)) return Status::Ok();
    if (k == "psi") return Status::Unsupported(why_not);
    *why += why_not + "; ";
  }
  if (k == "watermark" || k == "auto") {
    auto w = std::make_unique<WatermarkSource>(env, opts);
    *why += "watermark poller on " + w->name().substr(10) + " every " + std::to_string(opts.poll_ms) + " ms";
    *out = std::move(w);
    return Status::Ok();
  }
  return Status::InvalidArgument("unknown pressure source '" + k + "' (auto, psi, cgroup-v1, watermark, manual)");
}

}  // namespace mz
