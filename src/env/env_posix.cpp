#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <system_error>
#include <vector>

#include "core/ggml_log.h"
#include "env/env.h"
#include "env/tcp_socket.h"

namespace mz {
namespace {

// EOPNOTSUPP from a kernel notification file (PSI disabled: psi=0) is kUnsupported.
Status NotifyError(int err, const std::string& what) {
  if (err == EOPNOTSUPP) return Status::Unsupported(what + ": " + std::strerror(err));
  return Status::FromErrno(err, what);
}

class PosixWaitHandle final : public WaitHandle {
 public:
  PosixWaitHandle(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  ~PosixWaitHandle() override { ::close(fd_); }
  Status WriteOnce(const void* data, size_t n) override {
    ssize_t r;
    do r = ::write(fd_, data, n);
    while (r < 0 && errno == EINTR);
    if (r < 0) return NotifyError(errno, "write to " + name_);
    if (size_t(r) != n) return Status::IOError("short write to " + name_);
    return Status::Ok();
  }
  Status ReadOnce(void* buf, size_t n, size_t* got) override {
    *got = 0;
    ssize_t r;
    do r = ::read(fd_, buf, n);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return Status::FromErrno(errno, "read " + name_);
    }
    *got = size_t(r);
    return Status::Ok();
  }
  int native_handle() const override { return fd_; }
  const std::string& name() const override { return name_; }

 private:
  int fd_;
  std::string name_;
};

#ifdef MADV_POPULATE_READ
constexpr int kMadvPopulateRead = MADV_POPULATE_READ;
#else
constexpr int kMadvPopulateRead = 22;
#endif

class PosixFile final : public File {
 public:
  PosixFile(int fd, std::string path, bool direct) : fd_(fd), path_(std::move(path)), direct_(direct) {}
  ~PosixFile() override { ::close(fd_); }

  Status Read(void* buf, size_t n, uint64_t off, size_t* got) override {
    size_t done = 0;
    while (done < n) {
      size_t want = n - done;
      if (want > (size_t(1) << 30)) want = size_t(1) << 30;
      ssize_t r = ::pread(fd_, static_cast<char*>(buf) + done, want, off + done);
      if (r < 0) {
        if (errno == EINTR) continue;
        *got = done;
        return Status::FromErrno(errno, "read " + path_);
      }
      if (r == 0) break;
      done += size_t(r);
    }
    *got = done;
    return Status::Ok();
  }

  Status ReadV(const Segment* segs, int n, uint64_t off, size_t* got) override {
    // preadv, resumed after a partial transfer (EINTR, a signal, a request the kernel split) from
    // the segment and byte where it stopped. IOV_MAX bounds one call.
    std::vector<struct iovec> iov(size_t(std::max(n, 0)));
    for (int i = 0; i < n; ++i) iov[size_t(i)] = {segs[i].buf, segs[i].len};
    size_t done = 0, first = 0;
    *got = 0;
    while (first < iov.size()) {
      const int cnt = int(std::min<size_t>(iov.size() - first, IOV_MAX));
      ssize_t r = ::preadv(fd_, iov.data() + first, cnt, off_t(off + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        *got = done;
        return Status::FromErrno(errno, "read " + path_);
      }
      if (r == 0) break;
      done += size_t(r);
      for (size_t left = size_t(r); left > 0 && first < iov.size();) {
        if (left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        } else {
          iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
          left = 0;
        }
      }
    }
    *got = done;
    return Status::Ok();
  }

  Status Write(const void* buf, size_t n, uint64_t off) override {
    size_t done = 0;
    while (done < n) {
      size_t want = n - done;
      if (want > (size_t(1) << 30)) want = size_t(1) << 30;
      ssize_t r = ::pwrite(fd_, static_cast<const char*>(buf) + done, want, off + done);
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write " + path_);
      }
      if (r == 0) return Status::IOError("write " + path_ + ": wrote nothing");
      done += size_t(r);
    }
    return Status::Ok();
  }

  Status Sync() override {
    if (::fdatasync(fd_) != 0) return Status::FromErrno(errno, "fsync " + path_);
    return Status::Ok();
  }
  Status Truncate(uint64_t size) override {
    if (::ftruncate(fd_, off_t(size)) != 0) return Status::FromErrno(errno, "truncate " + path_);
    return Status::Ok();
  }
  Status Stat(FileInfo* info) override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return Status::FromErrno(errno, "stat " + path_);
    info->size = uint64_t(st.st_size);
    info->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    info->ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000LL + st.st_ctim.tv_nsec;
    info->inode = st.st_ino;
    info->device = st.st_dev;
    return Status::Ok();
  }
  bool direct() const override { return direct_; }
  const std::string& path() const override { return path_; }
  int native_handle() const override { return fd_; }

 private:
  int fd_;
  std::string path_;
  bool direct_;
};

class PosixEnv final : public Env {
 public:
  Status Open(const std::string& path, OpenMode mode, bool direct, std::unique_ptr<File>* out) override {
    int flags = O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead: flags |= O_RDONLY; break;
      case OpenMode::kReadWrite: flags |= O_RDWR | O_CREAT; break;
      case OpenMode::kCreateTrunc: flags |= O_RDWR | O_CREAT | O_TRUNC; break;
    }
    int fd = -1;
    bool is_direct = false;
    if (direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
      if (fd >= 0) is_direct = true;
      else if (errno != EINVAL) return Status::FromErrno(errno, "open " + path);
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    out->reset(new PosixFile(fd, path, is_direct));
    return Status::Ok();
  }
  Status StatPath(const std::string& path, FileInfo* info) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
    info->size = uint64_t(st.st_size);
    info->mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    info->ctime_ns = int64_t(st.st_ctim.tv_sec) * 1000000000LL + st.st_ctim.tv_nsec;
    info->inode = st.st_ino;
    info->device = st.st_dev;
    return Status::Ok();
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) return Status::FromErrno(errno, "rename " + from + " -> " + to);
    return Status::Ok();
  }
  Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "remove " + path);
    return Status::Ok();
  }
  Status SyncDir(const std::string& path) override {
    std::string dir = path;
    auto slash = dir.find_last_of('/');
    dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : dir.substr(0, slash));
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open dir " + dir);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync dir " + dir);
    return Status::Ok();
  }
  Status MakeDir(const std::string& dir) override {
    if (dir.empty()) return Status::InvalidArgument("MakeDir: empty path");
    for (size_t i = 1; i <= dir.size(); ++i) {
      if (i < dir.size() && dir[i] != '/') continue;
      const std::string part = dir.substr(0, i);
      if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + part);
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + dir);
    if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + " exists and is not a directory");
    return Status::Ok();
  }
  void* MapAnon(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    // No MADV_HUGEPAGE: with the common defrag=madvise setting it makes faults compact memory
    // synchronously, which stalled restoration by hundreds of milliseconds in measurements here.
    return p == MAP_FAILED ? nullptr : p;
  }
  void Unmap(void* p, size_t bytes) override {
    if (p) ::munmap(p, bytes);
  }
  Status MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) override {
    // MAP_PRIVATE: writable needs only read access to the file (writes go to private copies).
    void* p = ::mmap(at, len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_PRIVATE | MAP_FIXED, f->native_handle(), off_t(off));
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mmap " + f->path());
    return Status::Ok();
  }
  Status PopulateMapped(File* f, void* p, size_t bytes, uint64_t file_off) override {
    char* c = static_cast<char*>(p);
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (file_off == kPopulateSmallPages || a % kPmdBytes != file_off % kPmdBytes) return PopulateSmall(f, c, bytes);
    const size_t head = std::min(bytes, size_t(AlignUp(a, kPmdBytes) - a));
    const size_t mid = AlignDown(bytes - head, kPmdBytes);
    const size_t tail = bytes - head - mid;
    if (mid == 0) return PopulateSmall(f, c, bytes);
    // The edges first, in 4 KiB folios: the 2 MiB blocks they lie in are shared with the
    // neighbouring unit, so a 2 MiB folio there could only be mapped by 4 KiB entries.
    if (head > 0) MZ_RETURN_IF_ERROR(PopulateSmall(f, c, head));
    if (tail > 0) MZ_RETURN_IF_ERROR(PopulateSmall(f, c + head + mid, tail));
    // The interior: a fault on a MADV_HUGEPAGE file mapping reads its aligned 2 MiB block as one
    // folio (and, without MADV_RANDOM, the next one ahead), which the kernel maps with one PMD
    // entry. The last kRandomTail bytes are MADV_RANDOM: no readahead is left in flight past the
    // range when the call returns (what readahead reaches past it lands in the tail's block, whose
    // 4 KiB pages are already cached, or in at most that much of the next unit).
    char* m = c + head;
    constexpr size_t kRandomTail = 2 * kPmdBytes;
    const size_t seq = mid > kRandomTail ? mid - kRandomTail : 0;
    if (::madvise(m, mid, MADV_HUGEPAGE) != 0) return PopulateSmall(f, m, mid);  // no THP: the 4 KiB way
    if (seq > 0) {
      (void)::madvise(m, seq, MADV_NORMAL);
      MZ_RETURN_IF_ERROR(PopulateRead(f->path(), m, seq));
    }
    (void)::madvise(m + seq, mid - seq, MADV_RANDOM);
    return PopulateRead(f->path(), m + seq, mid - seq);
  }
  // PopulateMapped the 4 KiB way: windowed readahead, every page mapped.
  Status PopulateSmall(File* f, char* c, size_t bytes) {
    const std::string& path = f->path();
    // Readahead is queued one 4 MiB window ahead of the window being waited for, not for the whole
    // range at once: a deep queue of readahead delays every other read behind it (the pipeline's
    // KV chunk reads for the layer compute waits on), while two windows in flight keep the disk busy.
    // The kernel queues at most max(read_ahead_kb, max_sectors_kb) per MADV_WILLNEED, so a window
    // is advised in pieces of that size.
    constexpr size_t kWindow = size_t(4) << 20;
    const size_t piece = std::min(kWindow, ReadaheadLimit(f->native_handle()));
    // No readahead from page faults on this mapping: only the windows advised below are read, so
    // nothing beyond the range is still being read into the page cache after the call returns
    // (such pages would escape a DropCached of a neighbouring range that is dropped meanwhile).
    (void)::madvise(c, bytes, MADV_RANDOM);
    auto advise = [&](size_t off, size_t n) {
      for (size_t o = 0; o < n; o += piece) (void)::madvise(c + off + o, std::min(piece, n - o), MADV_WILLNEED);
    };
    advise(0, std::min(bytes, kWindow));
    for (size_t off = 0; off < bytes; off += kWindow) {
      const size_t n = std::min(kWindow, bytes - off);
      if (off + n < bytes) advise(off + n, std::min(kWindow, bytes - off - n));
      MZ_RETURN_IF_ERROR(PopulateRead(path, c + off, n));
    }
    return Status::Ok();
  }
  // Bytes one MADV_WILLNEED queues on the device holding file fd: max(read_ahead_kb,
  // max_sectors_kb) from sysfs, remembered per device; 128 KiB where sysfs does not tell.
  static size_t ReadaheadLimit(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return size_t(128) << 10;
    static std::mutex mu;
    static std::map<dev_t, size_t> known;
    std::lock_guard<std::mutex> lk(mu);
    auto it = known.find(st.st_dev);
    if (it != known.end()) return it->second;
    auto read_kb = [&](const std::string& name) -> size_t {
      const std::string base = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
      for (const std::string& dir : {base + "/queue/", base + "/../queue/"}) {
        std::ifstream f(dir + name);
        size_t kb = 0;
        if (f >> kb) return kb;
      }
      return 0;
    };
    const size_t kb = std::max({read_kb("read_ahead_kb"), read_kb("max_sectors_kb"), size_t(128)});
    return known[st.st_dev] = kb << 10;
  }
  // Waits for and maps every page of [p, p+bytes) of a file mapping.
  static Status PopulateRead(const std::string& path, char* p, size_t bytes) {
    // Linux 5.14+; EINVAL from older kernels (headers may lack the constant: its value is ABI).
    if (::madvise(p, bytes, kMadvPopulateRead) == 0) return Status::Ok();
    const int err = errno;
    if (err != EINVAL)
      return Status::FromErrno(err == EFAULT ? EIO : err, "reading " + std::to_string(bytes) + " mapped bytes of " + path);
    // Kernels before 5.14: touch every page. An I/O error then raises SIGBUS instead of a status.
    volatile const char* c = p;
    unsigned sum = 0;
    for (size_t i = 0; i < bytes; i += 4096) sum += unsigned(c[i]);
    (void)sum;
    return Status::Ok();
  }
  Status DropCached(File* f, uint64_t off, uint64_t len) override {
    const int rc = ::posix_fadvise(f->native_handle(), off_t(off), off_t(len), POSIX_FADV_DONTNEED);
    if (rc != 0) return Status::FromErrno(rc, "dropping cached pages of " + f->path());
    return Status::Ok();
  }
  Status CachedBytes(File* f, uint64_t off, uint64_t len, uint64_t* out) override {
    *out = 0;
    if (len == 0) return Status::Ok();
    const uint64_t page = 4096, a = AlignDown(off, page), n = AlignUp(off + len, page) - a;
    void* m = ::mmap(nullptr, n, PROT_READ, MAP_SHARED, f->native_handle(), off_t(a));
    if (m == MAP_FAILED) return Status::FromErrno(errno, "mmap " + f->path());
    const std::string& path = f->path();
    std::vector<unsigned char> v(n / page);
    const int rc = ::mincore(m, n, v.data());
    const int err2 = errno;
    ::munmap(m, n);
    if (rc != 0) return Status::FromErrno(err2, "mincore " + path);
    for (unsigned char c : v) *out += (c & 1) ? page : 0;
    return Status::Ok();
  }
  Status ResidentBytes(const void* p, size_t bytes, uint64_t* out) override {
    *out = 0;
    if (bytes == 0) return Status::Ok();
    const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t a = AlignDown(uintptr_t(p), page);
    const size_t n = size_t(AlignUp(uintptr_t(p) + bytes, page) - a);
    std::vector<unsigned char> v(n / page);
    if (::mincore(reinterpret_cast<void*>(a), n, v.data()) != 0) return Status::FromErrno(errno, "mincore");
    for (unsigned char c : v) *out += (c & 1) ? page : 0;
    return Status::Ok();
  }
  void ProcessFaults(uint64_t* major, uint64_t* minor) override {
    struct rusage ru;
    if (::getrusage(RUSAGE_SELF, &ru) != 0) {
      *major = *minor = 0;
      return;
    }
    *major = uint64_t(ru.ru_majflt);
    *minor = uint64_t(ru.ru_minflt);
  }
  void Prefault(void* p, size_t bytes) override {
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
    volatile char* c = static_cast<volatile char*>(p);
    for (size_t i = 0; i < bytes; i += 4096) c[i] = 0;
  }
  Status SetThreadNice(int nice) override {
    // PRIO_PROCESS with a thread id sets that thread alone on Linux.
    const id_t tid = id_t(::syscall(SYS_gettid));
    if (::setpriority(PRIO_PROCESS, tid, nice) != 0)
      return Status::Unsupported("setpriority(thread, " + std::to_string(nice) + "): " + std::strerror(errno));
    return Status::Ok();
  }
  int ThreadNice() override {
    errno = 0;
    const int v = ::getpriority(PRIO_PROCESS, id_t(::syscall(SYS_gettid)));
    return errno != 0 ? 0 : v;
  }
  Status GetThreadAffinity(std::vector<int>* cpus) override {
    cpus->clear();
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) return Status::FromErrno(errno, "sched_getaffinity");
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) cpus->push_back(i);
    return Status::Ok();
  }
  Status SetThreadAffinity(const std::vector<int>& cpus) override {
    if (cpus.empty()) return Status::InvalidArgument("sched_setaffinity: an empty CPU set");
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) {
      if (c < 0 || c >= CPU_SETSIZE) return Status::InvalidArgument("sched_setaffinity: CPU " + std::to_string(c));
      CPU_SET(c, &set);
    }
    // pid 0: the calling thread alone (Linux affinity is per thread).
    if (::sched_setaffinity(0, sizeof set, &set) != 0) return Status::FromErrno(errno, "sched_setaffinity");
    return Status::Ok();
  }
  Status StartThread(std::function<void()> fn, std::thread* out) override {
    try {
      *out = std::thread(std::move(fn));
    } catch (const std::system_error& e) {
      return Status::NoMemory(std::string("cannot start a thread: ") + e.what());
    } catch (const std::bad_alloc&) {
      return Status::NoMemory("cannot start a thread: out of memory");
    }
    return Status::Ok();
  }
  uint64_t NowNs() override {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }
  uint64_t WallClockMs() override {
    return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count());
  }
  uint64_t ProcessCpuNs() override {
    timespec ts{};
    if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  }
  void SleepNs(uint64_t ns) override {
    if (ns > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  }
  Status ReadSmallFile(const std::string& path, std::string* out) override {
    out->clear();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    char buf[4096];
    while (true) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::close(fd);
        out->clear();
        return Status::FromErrno(e, "read " + path);
      }
      if (n == 0) break;
      out->append(buf, size_t(n));
    }
    ::close(fd);
    return Status::Ok();
  }
  Status WriteSmallFile(const std::string& path, const std::string& data, bool create) override {
    if (create) {
      std::unique_ptr<File> f;
      MZ_RETURN_IF_ERROR(Open(path, OpenMode::kCreateTrunc, /*direct=*/false, &f));
      MZ_RETURN_IF_ERROR(f->Write(data.data(), data.size(), 0));
      return f->Sync();
    }
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    ssize_t n;
    do n = ::write(fd, data.data(), data.size());
    while (n < 0 && errno == EINTR);
    const int e = errno;
    ::close(fd);
    if (n < 0) return Status::FromErrno(e, "write '" + data + "' to " + path);
    if (size_t(n) != data.size()) return Status::IOError("short write of '" + data + "' to " + path);
    return Status::Ok();
  }
  Status ListDir(const std::string& path, std::vector<std::string>* out) override {
    out->clear();
    DIR* d = ::opendir(path.c_str());
    if (!d) return Status::FromErrno(errno, "opendir " + path);
    while (true) {
      errno = 0;
      dirent* e = ::readdir(d);
      if (!e) {
        const int err = errno;
        ::closedir(d);
        if (err != 0) {
          out->clear();
          return Status::FromErrno(err, "readdir " + path);
        }
        break;
      }
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      out->push_back(e->d_name);
    }
    std::sort(out->begin(), out->end());
    return Status::Ok();
  }
  Status CheckAccess(const std::string& path, bool write) override {
    if (::access(path.c_str(), write ? W_OK : F_OK) != 0) return Status::FromErrno(errno, "access " + path);
    return Status::Ok();
  }
  Status GetEnvVar(const std::string& name, std::string* value) override {
    const char* v = std::getenv(name.c_str());
    *value = v ? v : "";
    return Status::Ok();
  }
  Status NewEventCounter(std::unique_ptr<WaitHandle>* out) override {
    out->reset();
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return Status::FromErrno(errno, "eventfd");
    out->reset(new PosixWaitHandle(fd, "eventfd"));
    return Status::Ok();
  }
  Status OpenNotifyFile(const std::string& path, bool write, std::unique_ptr<WaitHandle>* out) override {
    out->reset();
    const int fd = ::open(path.c_str(), (write ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NotifyError(errno, "open " + path);
    out->reset(new PosixWaitHandle(fd, path));
    return Status::Ok();
  }
  Status Poll(PollEntry* entries, int n, int timeout_ms, int* n_ready) override {
    *n_ready = 0;
    std::vector<pollfd> p(size_t(std::max(n, 0)));
    for (int i = 0; i < n; ++i) {
      entries[i].ready = entries[i].error = false;
      p[size_t(i)] = {entries[i].handle ? entries[i].handle->native_handle() : -1,
                      short(entries[i].priority ? POLLPRI : POLLIN), 0};
    }
    int r;
    do r = ::poll(p.data(), nfds_t(p.size()), timeout_ms < 0 ? -1 : timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r < 0) return Status::FromErrno(errno, "poll");
    for (int i = 0; i < n; ++i) {
      const short re = p[size_t(i)].revents;
      entries[i].ready = (re & p[size_t(i)].events) != 0;
      entries[i].error = (re & (POLLERR | POLLHUP | POLLNVAL)) != 0;
      *n_ready += entries[i].ready || entries[i].error;
    }
    return Status::Ok();
  }
  Status ConnectTcp(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) override {
    return ConnectTcpPosix(host, port, timeout_ms, out);
  }
  size_t PageSize() override {
    const long n = ::sysconf(_SC_PAGESIZE);
    return n > 0 ? size_t(n) : kDirectIoAlign;
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv* env = [] {
    auto* e = new PosixEnv();
    std::string v;
    (void)e->GetEnvVar("MZ_VERBOSE", &v);  // the POSIX Env never fails here
    SetLibraryLogVerbose(!v.empty() && v != "0");
    return e;
  }();
  return env;
}

Status SignalEvent(WaitHandle* h) {
  const uint64_t one = 1;
  return h->WriteOnce(&one, sizeof one);
}

uint64_t DrainEvent(WaitHandle* h) {
  uint64_t cnt = 0;
  size_t got = 0;
  if (!h->ReadOnce(&cnt, sizeof cnt, &got).ok() || got != sizeof cnt) return 0;
  return cnt;
}

Status CacheDir(Env* env, std::string* dir) {
  dir->clear();
  std::string cache, home;
  MZ_RETURN_IF_ERROR(env->GetEnvVar("MZ_CACHE_DIR", &cache).With("reading MZ_CACHE_DIR"));
  if (!cache.empty()) {
    *dir = cache;
    return Status::Ok();
  }
  MZ_RETURN_IF_ERROR(env->GetEnvVar("HOME", &home).With("reading HOME"));
  *dir = (home.empty() ? std::string("/tmp") : home) + "/.cache/mzcache";
  return Status::Ok();
}

int RunOnThreads(Env* env, int n, const std::function<void(int)>& work) {
  std::vector<std::thread> ts;
  ts.reserve(size_t(std::max(0, n - 1)));  // no allocation (that could throw) after a thread started
  for (int t = 1; t < n; ++t) {
    std::thread th;
    if (!env->StartThread([&work, t] { work(t); }, &th).ok()) continue;
    ts.push_back(std::move(th));
  }
  work(0);
  for (auto& t : ts) t.join();
  return 1 + int(ts.size());
}

Status ReadFully(File* f, void* buf, size_t n, uint64_t off, const std::string& what) {
  size_t got = 0;
  Status st = f->Read(buf, n, off, &got);
  if (!st.ok()) return st.With(what);
  if (got < n)
    return Status::Corruption(what + ": file truncated (wanted " + std::to_string(n) + " bytes at offset " +
                              std::to_string(off) + ", got " + std::to_string(got) + ")");
  return Status::Ok();
}

}  // namespace mz
