#include "pressure/sysfs.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "env/env.h"

namespace mz::sysfs {

bool Exists(Env* env, const std::string& path) {
  FileInfo fi;
  return env->StatPath(path, &fi).ok();
}

bool ReadU64(Env* env, const std::string& path, uint64_t* v) {
  std::string s;
  if (!env->ReadSmallFile(path, &s).ok()) return false;
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

Status ReadFields(Env* env, const std::string& path, const char* key1, uint64_t* v1, const char* key2, uint64_t* v2) {
  std::string m;
  MZ_RETURN_IF_ERROR(env->ReadSmallFile(path, &m));
  if (!ParseField(m, key1, v1)) return Status::Unsupported(path + " has no " + key1);
  if (!ParseField(m, key2, v2)) return Status::Unsupported(path + " has no " + key2);
  return Status::Ok();
}

namespace {
// Mount point of the cgroup filesystem whose options contain `opt` (v1) or of type cgroup2.
std::string FindMount(Env* env, bool v2, const std::string& opt) {
  std::string m;
  if (!env->ReadSmallFile("/proc/self/mounts", &m).ok()) return "";
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
bool OwnPath(Env* env, const std::string& ctrl, std::string* path) {
  std::string c;
  if (!env->ReadSmallFile("/proc/self/cgroup", &c).ok()) return false;
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

std::string V1MemoryMount(Env* env) { return FindMount(env, false, "memory"); }
std::string V2Mount(Env* env) { return FindMount(env, true, ""); }

std::string OwnV1MemoryCgroup(Env* env) {
  std::string mnt = V1MemoryMount(env), p;
  if (mnt.empty() || !OwnPath(env, "memory", &p)) return "";
  std::string dir = p == "/" ? mnt : mnt + p;
  return IsV1MemoryCgroup(env, dir) ? dir : "";
}

std::string OwnV2Cgroup(Env* env) {
  std::string mnt = V2Mount(env), p;
  if (mnt.empty() || !OwnPath(env, "", &p)) return "";
  return p == "/" ? mnt : mnt + p;
}

bool IsV1MemoryCgroup(Env* env, const std::string& dir) {
  return !dir.empty() && Exists(env, dir + "/memory.pressure_level") && Exists(env, dir + "/cgroup.event_control");
}

bool HasCapSysResource(Env* env) {
  std::string s;
  uint64_t eff = 0;
  if (!env->ReadSmallFile("/proc/self/status", &s).ok()) return false;
  size_t p = s.find("CapEff:");
  if (p == std::string::npos) return false;
  eff = std::strtoull(s.c_str() + p + 7, nullptr, 16);
  constexpr int kCapSysResource = 24;
  return (eff >> kCapSysResource) & 1;
}

}  // namespace mz::sysfs
