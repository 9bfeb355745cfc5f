// Real memory pressure for the OS Paging baseline: a memory cgroup (v1) whose limit is lowered to
// force the kernel to reclaim a process's pages, and zram swap so anonymous pages (the KV cache)
// can be swapped out compressed, as on Android. Everything created is removed by the destructors.
// Requires root; every method says clearly why it cannot work on a machine that lacks something.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"

namespace mz::cli {

class ZramSwap {
 public:
  ~ZramSwap();
  // Uses active swap if there is one; else sets up /dev/zram0 (zstd if available) of `bytes`.
  Status Ensure(uint64_t bytes);
  std::string description() const { return desc_; }
  // Compressed bytes zram holds now (0 if swap is not zram).
  uint64_t CompressedBytes() const;

 private:
  bool created_ = false;
  std::string desc_;
};

class MemCgroup {
 public:
  ~MemCgroup();
  Status Create(const std::string& name);
  const std::string& path() const { return path_; }
  Status AddPid(int pid);
  // Lowers (or raises) memory.limit_in_bytes; kBusy if the kernel cannot reclaim down to it.
  Status SetLimit(uint64_t bytes);
  Status Unlimit();
  uint64_t Usage() const;

 private:
  std::string path_;
};

// A cgroup v1 memory.stat at one moment, in bytes (0 where the field is missing).
struct CgroupMemStat {
  uint64_t cache = 0;        // page cache charged to the cgroup (mapped file pages included)
  uint64_t rss = 0;          // anonymous memory
  uint64_t mapped_file = 0;  // page cache mapped by its processes
};
CgroupMemStat ReadCgroupMemStat(const std::string& cgroup_dir);
// Totals of /proc/pressure/memory (PSI, whole machine), in microseconds: time some / all
// non-idle tasks stalled on memory. false if PSI is not there.
bool ReadPsiMemory(uint64_t* some_us, uint64_t* full_us);

// VmRSS and VmSwap of a process, in bytes.
void ProcMemory(int pid, uint64_t* rss, uint64_t* swap);
Status DropPageCache();
// Writes the file's dirty pages back and asks the kernel to drop its page cache
// (posix_fadvise DONTNEED). Pages mapped by some process stay. Returns the fraction of the file's
// pages still cached afterwards (mincore), or -1 if the file cannot be opened.
double DropFileCache(const std::string& path);
// Fraction of the file's pages in the page cache now (mincore on a fresh mapping), -1 on error.
double FileCachedFraction(const std::string& path);
// DropFileCache for every regular file under dir (recursively).
void DropTreeCache(const std::string& dir);
// Bytes process pid (0: this one) caused to be read from storage so far (/proc/<pid>/io
// read_bytes: page faults of mapped files and direct reads included, page-cache hits not); 0 if
// unreadable.
uint64_t ProcReadBytes(int pid = 0);

// OOM kills in memory cgroup v1 folder cg (memory.oom_control's oom_kill, kernel >= 4.13); 0 if
// unreadable.
uint64_t CgroupOomKills(const std::string& cg);

}  // namespace mz::cli
