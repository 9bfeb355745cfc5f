// Small helpers for the pressure sources: reading and writing kernel interface files (procfs,
// cgroupfs), the process's own cgroups, and capability checks. Linux only; every function reports
// failure through Status or an empty result, never throws.
// Thread-safety: all functions are stateless and safe to call concurrently.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace mz::sysfs {

// Whole content of a small kernel file (procfs, sysfs, cgroupfs). kIOError (with errno) if it
// cannot be opened or read.
Status ReadSmall(const std::string& path, std::string* out);
// Writes `value` to a kernel file with one write(2) (kernel interfaces want a single write).
Status WriteSmall(const std::string& path, const std::string& value);
bool Exists(const std::string& path);
// The first unsigned integer in the file, or false.
bool ReadU64(const std::string& path, uint64_t* v);
// A "key value [kB]" field of /proc/meminfo-like content (memory.stat too); kB scaled to bytes
// when the line says kB. False if absent.
bool ParseField(const std::string& content, const std::string& key, uint64_t* v);

// Mount point of the cgroup v1 memory controller ("" if none), e.g. /sys/fs/cgroup/memory.
std::string V1MemoryMount();
// Mount point of the unified (v2) hierarchy ("" if none).
std::string V2Mount();
// This process's v1 memory cgroup directory ("" if there is none), from /proc/self/cgroup.
std::string OwnV1MemoryCgroup();
// This process's v2 cgroup directory ("" if none or not mounted).
std::string OwnV2Cgroup();
// True if `dir` is a v1 memory cgroup directory (has memory.pressure_level).
bool IsV1MemoryCgroup(const std::string& dir);
// True if the process has CAP_SYS_RESOURCE (PSI triggers: privileged windows and rtpoll).
bool HasCapSysResource();

}  // namespace mz::sysfs
