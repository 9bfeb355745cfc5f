#include "tools/bench/os_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "env/env.h"
#include "pressure/sysfs.h"
#include "tools/bench/bench_util.h"

namespace mz::cli {
namespace {

// Kernel files through the library's Env (one write(2) per command, as kernel interfaces want).
Status WriteSys(const std::string& path, const std::string& value) {
  return Env::Default()->WriteSmallFile(path, value, /*create=*/false);
}

// The content of a kernel file, "" if it cannot be read.
std::string ReadSys(const std::string& path) {
  std::string s;
  if (!Env::Default()->ReadSmallFile(path, &s).ok()) return "";
  return s;
}

}  // namespace

Status ZramSwap::Ensure(uint64_t bytes) {
  std::string swaps = ReadSys("/proc/swaps");
  int lines = 0;
  for (char c : swaps) lines += c == '\n';
  if (lines > 1) {
    desc_ = "existing swap (" + swaps.substr(swaps.find('\n') + 1, swaps.find(' ', swaps.find('\n') + 1) - swaps.find('\n') - 1) + ")";
    return Status::Ok();
  }
  if (geteuid() != 0) return Status::Unsupported("no swap active and not root: cannot enable zram");
  if (!sysfs::Exists(Env::Default(), "/sys/block/zram0")) return Status::Unsupported("no swap active and no /dev/zram0 on this machine");
  WriteSys("/sys/block/zram0/reset", "1");
  if (ReadSys("/sys/block/zram0/comp_algorithm").find("zstd") != std::string::npos)
    WriteSys("/sys/block/zram0/comp_algorithm", "zstd");
  MZ_RETURN_IF_ERROR(WriteSys("/sys/block/zram0/disksize", std::to_string(bytes)));
  int rc = 0;
  RunCapture("mkswap /dev/zram0 2>&1 && swapon -p 100 /dev/zram0 2>&1", &rc);
  if (rc != 0) {
    WriteSys("/sys/block/zram0/reset", "1");
    return Status::Unsupported("mkswap/swapon of /dev/zram0 failed");
  }
  created_ = true;
  std::string alg = ReadSys("/sys/block/zram0/comp_algorithm");
  auto a = alg.find('['), b = alg.find(']');
  desc_ = "zram swap " + std::to_string(bytes >> 20) + " MiB (" + (a != std::string::npos ? alg.substr(a + 1, b - a - 1) : "?") + ")";
  return Status::Ok();
}

uint64_t ZramSwap::CompressedBytes() const {
  std::istringstream ss(ReadSys("/sys/block/zram0/mm_stat"));
  uint64_t orig = 0, compr = 0;
  ss >> orig >> compr;
  return compr;
}

ZramSwap::~ZramSwap() {
  if (!created_) return;
  int rc = 0;
  RunCapture("swapoff /dev/zram0 2>&1", &rc);
  WriteSys("/sys/block/zram0/reset", "1");
}

Status MemCgroup::Create(const std::string& name) {
  if (geteuid() != 0) return Status::Unsupported("creating a memory cgroup needs root");
  const std::string root = "/sys/fs/cgroup/memory";
  if (!sysfs::Exists(Env::Default(), root + "/memory.limit_in_bytes"))
    return Status::Unsupported("no cgroup v1 memory controller at " + root);
  path_ = root + "/" + name;
  if (::mkdir(path_.c_str(), 0755) != 0 && errno != EEXIST) {
    Status s = Status::FromErrno(errno, "mkdir " + path_);
    path_.clear();
    return s;
  }
  WriteSys(path_ + "/memory.swappiness", "100");
  return Status::Ok();
}

Status MemCgroup::AddPid(int pid) { return WriteSys(path_ + "/cgroup.procs", std::to_string(pid)); }

Status MemCgroup::SetLimit(uint64_t bytes) {
  Status s = WriteSys(path_ + "/memory.limit_in_bytes", std::to_string(bytes));
  if (!s.ok()) return Status::Busy("the kernel could not reclaim down to " + std::to_string(bytes >> 20) + " MiB");
  return s;
}

Status MemCgroup::Unlimit() { return WriteSys(path_ + "/memory.limit_in_bytes", "-1"); }

uint64_t MemCgroup::Usage() const {
  uint64_t v = 0;
  return sysfs::ReadU64(Env::Default(), path_ + "/memory.usage_in_bytes", &v) ? v : 0;
}

MemCgroup::~MemCgroup() {
  if (path_.empty()) return;
  Unlimit();
  // Move any leftover task to the root so the directory can be removed.
  std::istringstream procs(ReadSys(path_ + "/cgroup.procs"));
  for (std::string pid; procs >> pid;) WriteSys("/sys/fs/cgroup/memory/cgroup.procs", pid);
  // A worker that has just exited can still count as a task for a moment (EBUSY): retry for up to
  // a second (seen: a group left behind after bench ttft's last OS Paging run at 32k).
  for (int i = 0; i < 50 && ::rmdir(path_.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(20000);
}

void ProcMemory(int pid, uint64_t* rss, uint64_t* swap) {
  *rss = *swap = 0;
  const std::string status = ReadSys("/proc/" + std::to_string(pid) + "/status");
  sysfs::ParseField(status, "VmRSS", rss);  // "VmRSS:  1234 kB", in bytes
  sysfs::ParseField(status, "VmSwap", swap);
}

CgroupMemStat ReadCgroupMemStat(const std::string& dir) {
  CgroupMemStat m;
  const std::string st = ReadSys(dir + "/memory.stat");
  sysfs::ParseField(st, "cache", &m.cache);
  sysfs::ParseField(st, "rss", &m.rss);
  sysfs::ParseField(st, "mapped_file", &m.mapped_file);
  return m;
}

bool ReadPsiMemory(uint64_t* some_us, uint64_t* full_us) {
  *some_us = *full_us = 0;
  const std::string s = ReadSys("/proc/pressure/memory");
  // "some avg10=0.00 avg60=0.00 avg300=0.00 total=123\nfull ... total=45"
  const size_t a = s.find("total="), b = a == std::string::npos ? a : s.find("total=", a + 6);
  if (b == std::string::npos) return false;
  *some_us = std::strtoull(s.c_str() + a + 6, nullptr, 10);
  *full_us = std::strtoull(s.c_str() + b + 6, nullptr, 10);
  return true;
}

Status DropPageCache() {
  ::sync();
  return WriteSys("/proc/sys/vm/drop_caches", "3");
}

double FileCachedFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return st.st_size == 0 ? 0 : -1;
  }
  void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t pages = (size_t(st.st_size) + page - 1) / page;
  std::vector<unsigned char> v(pages);
  double frac = -1;
  if (::mincore(p, size_t(st.st_size), v.data()) == 0) {
    size_t in = 0;
    for (unsigned char c : v) in += c & 1;
    frac = double(in) / double(pages);
  }
  ::munmap(p, size_t(st.st_size));
  return frac;
}

double DropFileCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ::fdatasync(fd);  // dirty pages cannot be dropped
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return FileCachedFraction(path);
}

void DropTreeCache(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec)) DropFileCache(it->path().string());
}

uint64_t ProcReadBytes(int pid) {
  std::ifstream f(pid > 0 ? "/proc/" + std::to_string(pid) + "/io" : std::string("/proc/self/io"));
  std::string key;
  uint64_t v = 0;
  while (f >> key >> v)
    if (key == "read_bytes:") return v;
  return 0;
}

uint64_t CgroupOomKills(const std::string& cg) {
  std::ifstream f(cg + "/memory.oom_control");
  std::string k;
  uint64_t v = 0;
  while (f >> k >> v)
    if (k == "oom_kill") return v;
  return 0;
}

}  // namespace mz::cli
