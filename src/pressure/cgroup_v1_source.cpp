#include "pressure/cgroup_v1_source.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "env/env.h"
#include "pressure/sysfs.h"

namespace mz {
namespace {
constexpr const char* kLevelNames[3] = {"low", "medium", "critical"};
}

CgroupV1Source::CgroupV1Source(Env* env, std::string cgroup_dir)
    : env_(env ? env : Env::Default()), dir_(cgroup_dir.empty() ? sysfs::OwnV1MemoryCgroup() : std::move(cgroup_dir)) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

Status CgroupV1Source::Headroom(uint64_t* available, uint64_t* limit) {
  if (!headroom_) {
    std::string what;
    headroom_ = WatermarkSource::DefaultSampler(dir_, &what);
  }
  return headroom_(available, limit);
}

CgroupV1Source::~CgroupV1Source() {
  CloseAll();
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void CgroupV1Source::CloseAll() {
  for (int& fd : efd_)
    if (fd >= 0) ::close(fd), fd = -1;
  if (level_fd_ >= 0) ::close(level_fd_), level_fd_ = -1;
}

bool CgroupV1Source::Probe(const std::string& dir, std::string* why) {
  if (dir.empty()) {
    *why = "no cgroup v1 memory controller for this process";
    return false;
  }
  if (!sysfs::IsV1MemoryCgroup(dir)) {
    *why = dir + " is not a cgroup v1 memory cgroup (no memory.pressure_level / cgroup.event_control)";
    return false;
  }
  if (::access((dir + "/cgroup.event_control").c_str(), W_OK) != 0) {
    *why = dir + "/cgroup.event_control is not writable (needs root or delegation)";
    return false;
  }
  return true;
}

Status CgroupV1Source::Start() {
  if (stop_fd_ < 0) return Status::FromErrno(errno, "eventfd");
  if (stopped_.load()) return Status::Cancelled("cgroup-v1 source was stopped");
  std::string why;
  if (!Probe(dir_, &why)) return Status::Unsupported(why);
  CloseAll();
  const std::string pl = dir_ + "/memory.pressure_level";
  level_fd_ = ::open(pl.c_str(), O_RDONLY | O_CLOEXEC);
  if (level_fd_ < 0) return Status::FromErrno(errno, "open " + pl);
  for (int i = 0; i < 3; ++i) {
    efd_[i] = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_[i] < 0) {
      Status s = Status::FromErrno(errno, "eventfd");
      CloseAll();
      return s;
    }
    const std::string line = std::to_string(efd_[i]) + " " + std::to_string(level_fd_) + " " + kLevelNames[i];
    Status s = sysfs::WriteSmall(dir_ + "/cgroup.event_control", line);
    if (!s.ok()) {
      CloseAll();
      return s.With("registering memory.pressure_level " + std::string(kLevelNames[i]));
    }
  }
  return Status::Ok();
}

Status CgroupV1Source::Wait(int timeout_ms, PressureEvent* ev) {
  if (stopped_.load()) return Status::Cancelled("pressure source stopped");
  if (efd_[0] < 0) return Status::InvalidArgument("cgroup-v1 source not started");
  pollfd p[4];
  for (int i = 0; i < 3; ++i) p[i] = {efd_[i], POLLIN, 0};
  p[3] = {stop_fd_, POLLIN, 0};
  int n;
  do n = ::poll(p, 4, timeout_ms < 0 ? -1 : timeout_ms);
  while (n < 0 && errno == EINTR);
  if (n < 0) return Status::FromErrno(errno, "poll " + dir_ + " pressure eventfds");
  if (stopped_.load() || (p[3].revents & POLLIN)) return Status::Cancelled("pressure source stopped");
  if (n == 0) return Status::Timeout("no pressure event");
  int highest = -1;
  for (int i = 0; i < 3; ++i) {
    uint64_t cnt = 0;
    // Drain every counter (a medium event also signals the low listener): the highest wins.
    if (::read(efd_[i], &cnt, sizeof cnt) == sizeof cnt && cnt > 0) highest = i;
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
  uint64_t one = 1;
  if (stop_fd_ >= 0) (void)!::write(stop_fd_, &one, sizeof one);
}

}  // namespace mz
