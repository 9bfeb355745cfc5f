#include "pressure/sysfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace mz::sysfs {

Status ReadSmall(const std::string& path, std::string* out) {
  out->clear();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      return Status::FromErrno(e, "read " + path);
    }
    if (n == 0) break;
    out->append(buf, size_t(n));
  }
  ::close(fd);
  return Status::Ok();
}

Status WriteSmall(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  ssize_t n;
  do n = ::write(fd, value.data(), value.size());
  while (n < 0 && errno == EINTR);
  int e = errno;
  ::close(fd);
  if (n < 0) return Status::FromErrno(e, "write '" + value + "' to " + path);
  if (size_t(n) != value.size()) return Status::IOError("short write of '" + value + "' to " + path);
  return Status::Ok();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool ReadU64(const std::string& path, uint64_t* v) {
  std::string s;
  if (!ReadSmall(path, &s).ok()) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno != 0) return false;
  *v = x;
  return true;
}

bool ParseField(const std::string& content, const std::string& key, uint64_t* v) {
  std::istringstream ss(content);
  for (std::string line; std::getline(ss, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    size_t p = key.size();
    if (p < line.size() && line[p] == ':') ++p;
    if (p >= line.size() || (line[p] != ' ' && line[p] != '\t')) continue;  // a longer key
    std::istringstream ls(line.substr(p));
    unsigned long long x = 0;
    std::string unit;
    if (!(ls >> x)) return false;
    ls >> unit;
    *v = unit == "kB" ? uint64_t(x) * 1024 : uint64_t(x);
    return true;
  }
  return false;
}

namespace {
// Mount point of the cgroup filesystem whose options contain `opt` (v1) or of type cgroup2.
std::string FindMount(bool v2, const std::string& opt) {
  std::string m;
  if (!ReadSmall("/proc/self/mounts", &m).ok()) return "";
  std::istringstream ss(m);
  for (std::string line; std::getline(ss, line);) {
    std::istringstream ls(line);
    std::string dev, dir, type, opts;
    ls >> dev >> dir >> type >> opts;
    if (v2 && type == "cgroup2") return dir;
    if (!v2 && type == "cgroup") {
      std::istringstream os(opts);
      for (std::string o; std::getline(os, o, ',');)
        if (o == opt) return dir;
    }
  }
  return "";
}

// The path of this process in the hierarchy whose controller list contains `ctrl` ("" = v2 line).
bool OwnPath(const std::string& ctrl, std::string* path) {
  std::string c;
  if (!ReadSmall("/proc/self/cgroup", &c).ok()) return false;
  std::istringstream ss(c);
  for (std::string line; std::getline(ss, line);) {
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1);
    bool match = false;
    if (ctrl.empty()) {
      match = ctrls.empty();
    } else {
      std::istringstream cs(ctrls);
      for (std::string x; std::getline(cs, x, ',');) match = match || x == ctrl;
    }
    if (match) {
      *path = line.substr(b + 1);
      return true;
    }
  }
  return false;
}
}  // namespace

std::string V1MemoryMount() { return FindMount(false, "memory"); }
std::string V2Mount() { return FindMount(true, ""); }

std::string OwnV1MemoryCgroup() {
  std::string mnt = V1MemoryMount(), p;
  if (mnt.empty() || !OwnPath("memory", &p)) return "";
  std::string dir = p == "/" ? mnt : mnt + p;
  return IsV1MemoryCgroup(dir) ? dir : "";
}

std::string OwnV2Cgroup() {
  std::string mnt = V2Mount(), p;
  if (mnt.empty() || !OwnPath("", &p)) return "";
  return p == "/" ? mnt : mnt + p;
}

bool IsV1MemoryCgroup(const std::string& dir) {
  return !dir.empty() && Exists(dir + "/memory.pressure_level") && Exists(dir + "/cgroup.event_control");
}

bool HasCapSysResource() {
  std::string s;
  uint64_t eff = 0;
  if (!ReadSmall("/proc/self/status", &s).ok()) return false;
  size_t p = s.find("CapEff:");
  if (p == std::string::npos) return false;
  eff = std::strtoull(s.c_str() + p + 7, nullptr, 16);
  constexpr int kCapSysResource = 24;
  return (eff >> kCapSysResource) & 1;
}

}  // namespace mz::sysfs
