#include "pressure/cgroup_v1_source.h"

#include "env/env.h"
#include "pressure/sysfs.h"

namespace mz {
namespace {
constexpr const char* kLevelNames[3] = {"low", "medium", "critical"};
}

CgroupV1Source::CgroupV1Source(Env* env, std::string cgroup_dir)
    : env_(env ? env : Env::Default()),
      dir_(cgroup_dir.empty() ? sysfs::OwnV1MemoryCgroup(env_) : std::move(cgroup_dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  stop_status_ = env_->NewEventCounter(&stop_);
}

Status CgroupV1Source::Headroom(uint64_t* available, uint64_t* limit) {
  if (!headroom_) {
    std::string what;
    headroom_ = WatermarkSource::DefaultSampler(env_, dir_, &what);
  }
  return headroom_(available, limit);
}

Status CgroupV1Source::FreeBeforeReclaim(uint64_t* available, uint64_t* limit) {
  if (!strict_) {
    std::string what;
    strict_ = WatermarkSource::DefaultSampler(env_, dir_, &what, /*credit_inactive=*/false);
  }
  return strict_(available, limit);
}

CgroupV1Source::~CgroupV1Source() { CloseAll(); }

void CgroupV1Source::CloseAll() {
  for (auto& h : efd_) h.reset();
  level_.reset();
}

bool CgroupV1Source::Probe(Env* env, const std::string& dir, std::string* why) {
  if (!env) env = Env::Default();
  if (dir.empty()) {
    *why = "no cgroup v1 memory controller for this process";
    return false;
  }
  if (!sysfs::IsV1MemoryCgroup(env, dir)) {
    *why = dir + " is not a cgroup v1 memory cgroup (no memory.pressure_level / cgroup.event_control)";
    return false;
  }
  if (!env->CheckAccess(dir + "/cgroup.event_control", /*write=*/true).ok()) {
    *why = dir + "/cgroup.event_control is not writable (needs root or delegation)";
    return false;
  }
  return true;
}

Status CgroupV1Source::Start() {
  if (!stop_) return stop_status_;
  if (stopped_.load()) return Status::Cancelled("cgroup-v1 source was stopped");
  std::string why;
  if (!Probe(env_, dir_, &why)) return Status::Unsupported(why);
  CloseAll();
  MZ_RETURN_IF_ERROR(env_->OpenNotifyFile(dir_ + "/memory.pressure_level", /*write=*/false, &level_));
  for (int i = 0; i < 3; ++i) {
    Status s = env_->NewEventCounter(&efd_[i]);
    if (!s.ok()) {
      CloseAll();
      return s;
    }
    const std::string line = std::to_string(efd_[i]->native_handle()) + " " + std::to_string(level_->native_handle()) +
                             " " + kLevelNames[i];
    s = env_->WriteSmallFile(dir_ + "/cgroup.event_control", line, /*create=*/false);
    if (!s.ok()) {
      CloseAll();
      return s.With("registering memory.pressure_level " + std::string(kLevelNames[i]));
    }
  }
  return Status::Ok();
}

Status CgroupV1Source::Wait(int timeout_ms, PressureEvent* ev) {
  if (stopped_.load()) return Status::Cancelled("pressure source stopped");
  if (!efd_[0]) return Status::InvalidArgument("cgroup-v1 source not started");
  PollEntry p[4];
  for (int i = 0; i < 3; ++i) p[i].handle = efd_[i].get();
  p[3].handle = stop_.get();
  int n = 0;
  MZ_RETURN_IF_ERROR(env_->Poll(p, 4, timeout_ms, &n).With("waiting on " + dir_ + " pressure eventfds"));
  if (stopped_.load() || p[3].ready) return Status::Cancelled("pressure source stopped");
  if (n == 0) return Status::Timeout("no pressure event");
  int highest = -1;
  for (int i = 0; i < 3; ++i) {
    // Drain every counter (a medium event also signals the low listener): the highest wins.
    if (DrainEvent(efd_[i].get()) > 0) highest = i;
  }
  if (highest < 0) return Status::Timeout("spurious wake-up");
  ev->level = PressureLevel(highest + 1);
  ev->time_ns = env_->NowNs();
  ev->bytes_hint = 0;
  ev->source = name();
  return Status::Ok();
}

void CgroupV1Source::Stop() {
  stopped_.store(true);
  if (stop_) (void)SignalEvent(stop_.get());  // a full counter (never here) still leaves stopped_ set
}

}  // namespace mz
