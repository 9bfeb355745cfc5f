// Small helpers for the pressure sources: reading kernel interface files (procfs, cgroupfs)
// through an Env, the process's own cgroups, and capability checks. Linux only; every function
// reports failure through Status or an empty / false result, never throws. The reads go through
// env (Env::ReadSmallFile, StatPath, ...), so a FaultEnv can serve a fake /proc and cgroup tree.
// Thread-safety: all functions are stateless and safe to call concurrently (as env is).
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace mz {
class Env;
}

namespace mz::sysfs {

// True if path exists (env->StatPath succeeds).
bool Exists(Env* env, const std::string& path);
// The first unsigned integer in the file, or false (unreadable, or no number: "max").
bool ReadU64(Env* env, const std::string& path, uint64_t* v);
// A "key value [kB]" field of /proc/meminfo-like content (memory.stat, /proc/<pid>/status too);
// kB scaled to bytes when the line says kB. False if absent.
bool ParseField(const std::string& content, const std::string& key, uint64_t* v);
// ReadSmallFile of /proc/meminfo-like `path`, then ParseField of each key in turn into the
// matching output. Failure: the read's error, or kUnsupported naming the first key missing.
Status ReadFields(Env* env, const std::string& path, const char* key1, uint64_t* v1, const char* key2, uint64_t* v2);

// Mount point of the cgroup v1 memory controller ("" if none), e.g. /sys/fs/cgroup/memory.
std::string V1MemoryMount(Env* env);
// Mount point of the unified (v2) hierarchy ("" if none).
std::string V2Mount(Env* env);
// This process's v1 memory cgroup directory ("" if there is none), from /proc/self/cgroup.
std::string OwnV1MemoryCgroup(Env* env);
// This process's v2 cgroup directory ("" if none or not mounted).
std::string OwnV2Cgroup(Env* env);
// True if `dir` is a v1 memory cgroup directory (has memory.pressure_level).
bool IsV1MemoryCgroup(Env* env, const std::string& dir);
// True if the process has CAP_SYS_RESOURCE (PSI triggers: privileged windows and rtpoll).
bool HasCapSysResource(Env* env);

}  // namespace mz::sysfs
