// Env: the one seam between mzcache and the operating system (files, anonymous memory, threads,
// clocks, small kernel interface files (procfs, sysfs, cgroupfs), environment variables, the
// wake-up handles the pressure sources wait on (eventfd, poll), and TCP connections (the remote
// tier's Redis)).
// Everything that touches the OS goes through an Env so tests can inject faults and fake kernel
// files (see FaultEnv) and count I/O. src/env/ is the only place that calls the OS directly
// (tests/check_os_calls.sh checks it). Thread-safety: Env and File methods are safe for concurrent
// use unless noted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace mz {

struct FileInfo {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // Status change time (st_ctim): moves on every write, chmod or utimes, and cannot be set back by
  // a user. 0 where the Env does not report it (fakes): then nothing may be concluded from it.
  int64_t ctime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
};

// Direct I/O requires buffers, offsets and lengths aligned to kDirectIoAlign.
constexpr size_t kDirectIoAlign = 4096;
inline uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class File {
 public:
  virtual ~File() = default;
  // Reads exactly n bytes at off into buf unless EOF comes first; *got receives the count read.
  // A short count is only returned at end of file. Errors (EIO, ...) return non-OK; *got is then
  // the count read before the error.
  virtual Status Read(void* buf, size_t n, uint64_t off, size_t* got) = 0;
  // Scatter read: the file range [off, off + sum of lens) into the n buffers in order (with
  // direct I/O every buffer and length must be kDirectIoAlign aligned), as one request where the
  // OS allows it (preadv), so adjacent extents bound for separate buffers are read with one large
  // request rather than several small ones. Same contract as Read for the whole range: *got is
  // the total count read, short only at end of file. This default reads segment by segment.
  struct Segment {
    void* buf;
    size_t len;
  };
  virtual Status ReadV(const Segment* segs, int n, uint64_t off, size_t* got) {
    *got = 0;
    for (int i = 0; i < n; ++i) {
      size_t g = 0;
      Status st = Read(segs[i].buf, segs[i].len, off, &g);
      *got += g;
      if (!st.ok() || g < segs[i].len) return st;
      off += segs[i].len;
    }
    return Status::Ok();
  }
  // Writes all n bytes at off or returns non-OK (ENOSPC -> kNoSpace). Partial writes are an error.
  virtual Status Write(const void* buf, size_t n, uint64_t off) = 0;
  virtual Status Sync() = 0;
  virtual Status Truncate(uint64_t size) = 0;
  virtual Status Stat(FileInfo* info) = 0;
  // True if the file was opened with O_DIRECT (alignment rules apply).
  virtual bool direct() const = 0;
  virtual const std::string& path() const = 0;
  // The OS descriptor (what Env's mapping and page-cache calls act on); -1 if the file has none.
  // Owned by the File: valid until it is destroyed.
  virtual int native_handle() const = 0;
};

// A descriptor the pressure sources wait on with Env::Poll: an event counter (Env::NewEventCounter,
// an eventfd) or a kernel notification file (Env::OpenNotifyFile: a PSI trigger file, a cgroup v1
// memory.pressure_level). Owns its descriptor: the destructor closes it (which also removes a PSI
// trigger or a cgroup v1 registration made through it).
// Thread-safety: WriteOnce on an event counter (a wake-up) from any thread; the rest from the one
// thread that polls it.
class WaitHandle {
 public:
  virtual ~WaitHandle() = default;
  // Exactly one write(2) of [data, data+n) (EINTR retried): a kernel interface file takes one
  // command per write; on an event counter an 8-byte count is added to it. The OS error otherwise
  // (EINVAL: the kernel refused the command, kIOError; EOPNOTSUPP: the feature is disabled,
  // kUnsupported); a short write is kIOError.
  virtual Status WriteOnce(const void* data, size_t n) = 0;
  // One non-blocking read(2) of at most n bytes; *got is the count (0 with OK when nothing is
  // ready: EAGAIN is not an error). On an event counter: 8 bytes, the count, which is reset to 0.
  virtual Status ReadOnce(void* buf, size_t n, size_t* got) = 0;
  // The descriptor number (cgroup.event_control wants it written as text). Valid while this lives.
  virtual int native_handle() const = 0;
  // What it is, for messages: the path, or "eventfd".
  virtual const std::string& name() const = 0;
};

// Adds 1 to an event counter (wakes a Poll waiting on it). The OS error of the write otherwise.
Status SignalEvent(WaitHandle* h);
// Reads and resets an event counter: its count, 0 if nothing was signalled (or on an error).
uint64_t DrainEvent(WaitHandle* h);

// One entry of Env::Poll.
struct PollEntry {
  WaitHandle* handle = nullptr;
  bool priority = false;  // wait for POLLPRI (a PSI trigger fired) instead of readable (POLLIN)
  // Out: what Poll saw on this handle.
  bool ready = false;     // the awaited event is there
  bool error = false;     // POLLERR / POLLHUP / POLLNVAL (e.g. the cgroup of a PSI trigger was removed)
};

// A connected TCP stream (Env::ConnectTcp). Owns its descriptor (the destructor closes it). Every
// wait is bounded by the timeout it was connected with (SO_RCVTIMEO, SO_SNDTIMEO): a peer that
// stops answering is an error, never a hang. Thread-safety: one caller at a time (a connection
// pool hands a socket to one thread).
class Socket {
 public:
  virtual ~Socket() = default;
  // Sends all n bytes (EINTR retried). kIOError naming the cause: the send timeout expired, the
  // peer reset or closed the connection (EPIPE: no SIGPIPE is raised), the OS error.
  virtual Status WriteAll(const void* buf, size_t n) = 0;
  // One read of at most cap (> 0) bytes: *got >= 1 on success. kIOError naming the cause: "the
  // server closed the connection" (end of stream), "timed out waiting for a reply" (the receive
  // timeout), the OS error. *got is 0 on error.
  virtual Status ReadSome(void* buf, size_t cap, size_t* got) = 0;
  // "host:port" as connected to (messages).
  virtual const std::string& peer() const = 0;
};

enum class OpenMode {
  kRead,          // existing file, read-only
  kReadWrite,     // existing file or create, read-write, not truncated
  kCreateTrunc,   // create or truncate, read-write
};

class Env {
 public:
  virtual ~Env() = default;
  // Opens path. With direct=true tries O_DIRECT and silently falls back to buffered I/O when the
  // file system refuses it (tmpfs): check File::direct().
  virtual Status Open(const std::string& path, OpenMode mode, bool direct,
                      std::unique_ptr<File>* out) = 0;
  virtual Status StatPath(const std::string& path, FileInfo* info) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Remove(const std::string& path) = 0;
  // fsync of the directory holding path (makes a rename durable).
  virtual Status SyncDir(const std::string& path) = 0;
  // Creates directory dir (mode 0700) and missing parents; Ok if it exists as a directory.
  virtual Status MakeDir(const std::string& dir) = 0;

  // Anonymous private memory, page aligned, zero-filled, returned to the OS by Unmap (not kept in a
  // malloc arena, so freeing a unit really shrinks RSS). On failure returns nullptr.
  virtual void* MapAnon(size_t bytes) = 0;
  // The calls below that take a File act on a file this Env opened (any mode; O_DIRECT does not
  // matter to them), held by the caller for as long as it uses them: no open per call.
  //
  // Maps [off, off+len) of file f (MAP_PRIVATE, MAP_FIXED) at address `at`, which must lie
  // inside a mapping this Env made. File-backed pages: the kernel may drop them under pressure and
  // fault them back (the OS Paging baseline). off and at must be PageSize() aligned. writable:
  // PROT_WRITE too; a write copies the page into anonymous memory (the file never changes). The
  // mapping stays valid after f is closed.
  virtual Status MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) = 0;
  virtual void Unmap(void* p, size_t bytes) = 0;
  // Brings the pages of a read-only file mapping made by MapFileAt at [p, p+bytes) into memory and
  // maps them, so that later reads take no fault: readahead is queued one 4 MiB window ahead of the
  // window being waited for (large requests, a bounded queue), and the call waits for every page. The pages
  // come from the page cache: no anonymous memory is allocated or zeroed. f is the mapped file (its
  // path names it in messages and fault filters; its device sets the readahead piece). Failure (an
  // I/O error: kIOError): pages already read stay cached and mapped; the caller unmaps them (and
  // may DropCached them).
  // file_off: the offset in f that p maps, or kPopulateSmallPages. When p and file_off are
  // congruent modulo 2 MiB (kPmdBytes), the 2 MiB-aligned interior of the range is read in
  // 2 MiB folios the kernel maps with one PMD entry each (MADV_HUGEPAGE on that part of the
  // mapping): far less CPU to read, and far fewer page-table entries to walk for the first time
  // (under a hypervisor that shadows page tables each first walk of a 4 KiB entry is an exit,
  // docs/design.md "Weights in 2 MiB folios"). The unaligned head and tail are read first, the
  // 4 KiB way, so no large folio is ever mapped by 4 KiB entries (which that hypervisor makes
  // ~10x slower to read after any TLB flush). kPopulateSmallPages: the whole range the 4 KiB way.
  static constexpr uint64_t kPopulateSmallPages = ~uint64_t(0);
  static constexpr size_t kPmdBytes = size_t(2) << 20;
  virtual Status PopulateMapped(File* f, void* p, size_t bytes, uint64_t file_off) = 0;
  // Asks the kernel to drop [off, off+len) of f from the page cache (POSIX_FADV_DONTNEED), so the
  // memory of file-backed pages nobody maps any more goes back to the OS now. Pages some mapping
  // still holds (another unit's boundary page, another process) stay. Errors: a bad handle (or
  // what posix_fadvise refuses, EINVAL/ESPIPE).
  virtual Status DropCached(File* f, uint64_t off, uint64_t len) = 0;
  // Bytes of [off, off+len) of f now in the page cache (whole pages; mincore), for checks that
  // the page cache is not what a measurement or a test sees.
  virtual Status CachedBytes(File* f, uint64_t off, uint64_t len, uint64_t* out) = 0;
  // Bytes of [p, p+bytes) that are in RAM now (mincore over a mapping of this process, whole pages;
  // p page aligned): what the kernel agrees is resident. A page of a file mapping the kernel
  // reclaimed, or an anonymous page swapped out, is not counted. Errors: the OS error (ENOMEM for
  // a range that is not mapped), *out then 0.
  virtual Status ResidentBytes(const void* p, size_t bytes, uint64_t* out) = 0;
  // Page faults taken by this process so far, all threads (getrusage): major (the page had to be
  // read from storage or swap) and minor. Never fails on POSIX (zeros where unsupported).
  virtual void ProcessFaults(uint64_t* major, uint64_t* minor) = 0;
  // Faults in every page of [p, p+bytes) for writing (allocation + zeroing done now, not on first
  // touch). Best effort.
  virtual void Prefault(void* p, size_t bytes) = 0;

  // Scheduling priority of the calling thread as a nice value (-20 first .. 19 last; Linux
  // threads each have their own). SetThreadNice fails (kUnsupported, the OS's refusal in the
  // message) when the thread may not take that value: a lower nice than the current one needs
  // CAP_SYS_NICE or RLIMIT_NICE; a higher one is always allowed. The thread's priority is then
  // unchanged.
  virtual Status SetThreadNice(int nice) = 0;
  virtual int ThreadNice() = 0;

  // CPUs the calling thread may run on (sched_getaffinity), ascending ids, into *cpus. Failure: the
  // OS error, *cpus then empty.
  virtual Status GetThreadAffinity(std::vector<int>* cpus) = 0;
  // Restricts the calling thread to `cpus` (sched_setaffinity; ids as the kernel numbers them).
  // kInvalidArgument for an empty set or an id outside [0, 1024); the OS error (EINVAL: none of
  // them is online or allowed to this process) otherwise. On failure the affinity is unchanged.
  virtual Status SetThreadAffinity(const std::vector<int>& cpus) = 0;

  // Starts fn on a new thread and hands it to *out (joinable; the caller joins it). When the OS
  // refuses a thread (EAGAIN: a thread or memory limit, as under heavy memory pressure) returns
  // kNoMemory, *out is left empty and fn is not run: callers degrade to the threads they have
  // (RunOnThreads) instead of failing the operation.
  virtual Status StartThread(std::function<void()> fn, std::thread* out) = 0;

  // Monotonic clock (steady, not wall time), in ns since an arbitrary origin.
  virtual uint64_t NowNs() = 0;
  // Wall-clock time (CLOCK_REALTIME) in milliseconds since the Unix epoch: for times stored in
  // files or shown to people (a conversation's last use), never for intervals (NowNs).
  virtual uint64_t WallClockMs() = 0;
  // CPU time used so far by the whole process, all threads (CLOCK_PROCESS_CPUTIME_ID), in ns.
  virtual uint64_t ProcessCpuNs() = 0;
  // Blocks the calling thread for at least ns nanoseconds of the monotonic clock (0: returns at
  // once). For pacing (a sustained mode's duty cycle, src/runtime/sustained.h); never fails.
  virtual void SleepNs(uint64_t ns) = 0;
  // The size of a memory page (what MapFileAt offsets and addresses must be aligned to).
  virtual size_t PageSize() = 0;

  // ---- Small files: kernel interfaces (procfs, sysfs, cgroupfs) and small settings files ----
  // The whole content of path into *out, read with read(2) until end of file (kernel files report
  // size 0, so the size is not asked first). Meant for files of a few KiB to a few MiB. Failure:
  // the OS error naming the path (kIOError; ENOENT for a missing file), *out then empty.
  virtual Status ReadSmallFile(const std::string& path, std::string* out) = 0;
  // Writes data to path. create = false: a kernel interface file that must already exist, written
  // with exactly one write(2) (a kernel file takes one command per write; a short write is
  // kIOError). create = true: a regular file, created or truncated, written fully and fsynced; not
  // atomic (a crash can leave it partial: write a temporary path and Rename it). Failure: the OS
  // error naming the path (ENOSPC -> kNoSpace) and, for a kernel file, the value.
  virtual Status WriteSmallFile(const std::string& path, const std::string& data, bool create) = 0;
  // Names of the entries of directory `path` (not "." and ".."), sorted, into *out (for sysfs
  // trees such as /sys/devices/system/cpu). Failure: the OS error naming the path (ENOENT, ENOTDIR,
  // EACCES), *out then empty.
  virtual Status ListDir(const std::string& path, std::vector<std::string>* out) = 0;
  // OK if path exists and, with write = true, this process may write it (access(2)); else the OS
  // error (ENOENT, EACCES) naming the path.
  virtual Status CheckAccess(const std::string& path, bool write) = 0;

  // The value of environment variable `name` into *value, "" when it is unset (every mzcache
  // setting treats unset and empty alike). The POSIX Env never fails; a FaultEnv can inject a
  // failure (kIOError naming the variable), which callers report rather than guess a value.
  virtual Status GetEnvVar(const std::string& name, std::string* value) = 0;

  // ---- Wake-ups for the pressure sources ----
  // A new event counter (eventfd, non-blocking, close-on-exec) starting at 0: Poll sees it
  // readable while its count is above 0. Failure: the OS error (EMFILE, ENOMEM), *out empty.
  virtual Status NewEventCounter(std::unique_ptr<WaitHandle>* out) = 0;
  // Opens a kernel notification file, non-blocking, close-on-exec, read-only or (write) read-write:
  // a PSI trigger file (write the trigger with WriteOnce, then Poll it with priority) or cgroup v1
  // memory.pressure_level (its descriptor is registered through cgroup.event_control). Failure: the
  // OS error naming the path (EOPNOTSUPP, PSI disabled: kUnsupported), *out empty.
  virtual Status OpenNotifyFile(const std::string& path, bool write, std::unique_ptr<WaitHandle>* out) = 0;
  // Waits until at least one entry's event is there, an entry has an error, or timeout_ms passes
  // (< 0: no limit; 0: no wait). Fills every entry's ready / error and *n_ready (the count of
  // entries with either; 0: the timeout passed). EINTR is retried with the whole timeout again.
  // Failure: the OS error of poll(2) (every entry's ready / error false).
  virtual Status Poll(PollEntry* entries, int n, int timeout_ms, int* n_ready) = 0;

  // ---- Network ----
  // A TCP connection to host:port: host is a name (resolved with getaddrinfo; every address it
  // gives is tried in turn) or an IPv4/IPv6 literal. Each connect waits at most timeout_ms (> 0),
  // and so does every later read and write of the socket; TCP_NODELAY is set (pipelined requests
  // go out at once). Failure: kIOError naming host:port and the cause (the name does not resolve,
  // connection refused, timed out), *out empty.
  virtual Status ConnectTcp(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) = 0;

  // The process-wide POSIX Env. Never freed. Created on first use, which also applies the
  // MZ_VERBOSE setting (non-empty and not "0": everything ggml and llama.cpp log reaches stderr) to
  // the library logger (core/ggml_log.h).
  static Env* Default();
};

// Forwards every call to a target Env; test doubles override only what they need.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Status Open(const std::string& p, OpenMode m, bool d, std::unique_ptr<File>* o) override {
    return target_->Open(p, m, d, o);
  }
  Status StatPath(const std::string& p, FileInfo* i) override { return target_->StatPath(p, i); }
  Status Rename(const std::string& a, const std::string& b) override { return target_->Rename(a, b); }
  Status Remove(const std::string& p) override { return target_->Remove(p); }
  Status SyncDir(const std::string& p) override { return target_->SyncDir(p); }
  Status MakeDir(const std::string& d) override { return target_->MakeDir(d); }
  void* MapAnon(size_t n) override { return target_->MapAnon(n); }
  Status MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) override {
    return target_->MapFileAt(f, off, len, at, writable);
  }
  void Unmap(void* p, size_t n) override { target_->Unmap(p, n); }
  Status PopulateMapped(File* f, void* p, size_t n, uint64_t off) override { return target_->PopulateMapped(f, p, n, off); }
  Status DropCached(File* f, uint64_t off, uint64_t len) override { return target_->DropCached(f, off, len); }
  Status CachedBytes(File* f, uint64_t off, uint64_t len, uint64_t* out) override {
    return target_->CachedBytes(f, off, len, out);
  }
  Status ResidentBytes(const void* p, size_t n, uint64_t* out) override { return target_->ResidentBytes(p, n, out); }
  void ProcessFaults(uint64_t* major, uint64_t* minor) override { target_->ProcessFaults(major, minor); }
  void Prefault(void* p, size_t n) override { target_->Prefault(p, n); }
  Status SetThreadNice(int nice) override { return target_->SetThreadNice(nice); }
  int ThreadNice() override { return target_->ThreadNice(); }
  Status GetThreadAffinity(std::vector<int>* cpus) override { return target_->GetThreadAffinity(cpus); }
  Status SetThreadAffinity(const std::vector<int>& cpus) override { return target_->SetThreadAffinity(cpus); }
  Status StartThread(std::function<void()> fn, std::thread* out) override {
    return target_->StartThread(std::move(fn), out);
  }
  uint64_t NowNs() override { return target_->NowNs(); }
  uint64_t WallClockMs() override { return target_->WallClockMs(); }
  uint64_t ProcessCpuNs() override { return target_->ProcessCpuNs(); }
  void SleepNs(uint64_t ns) override { target_->SleepNs(ns); }
  size_t PageSize() override { return target_->PageSize(); }
  Status ReadSmallFile(const std::string& p, std::string* out) override { return target_->ReadSmallFile(p, out); }
  Status WriteSmallFile(const std::string& p, const std::string& d, bool create) override {
    return target_->WriteSmallFile(p, d, create);
  }
  Status ListDir(const std::string& p, std::vector<std::string>* out) override { return target_->ListDir(p, out); }
  Status CheckAccess(const std::string& p, bool write) override { return target_->CheckAccess(p, write); }
  Status GetEnvVar(const std::string& name, std::string* value) override { return target_->GetEnvVar(name, value); }
  Status NewEventCounter(std::unique_ptr<WaitHandle>* out) override { return target_->NewEventCounter(out); }
  Status OpenNotifyFile(const std::string& p, bool write, std::unique_ptr<WaitHandle>* out) override {
    return target_->OpenNotifyFile(p, write, out);
  }
  Status Poll(PollEntry* e, int n, int timeout_ms, int* n_ready) override {
    return target_->Poll(e, n, timeout_ms, n_ready);
  }
  Status ConnectTcp(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) override {
    return target_->ConnectTcp(host, port, timeout_ms, out);
  }
  Env* target() const { return target_; }

 private:
  Env* target_;
};

// Runs work(0) .. work(n-1), work(0) on the calling thread and the others on threads started
// through env, then joins them. A thread the OS refuses (StartThread fails) is not retried: its
// index is never run, so work must be a loop that pulls items from a shared queue (every caller's
// is), and the items get done by the threads that did start. Returns the number of threads that
// ran work (1..n); n <= 1 runs work(0) alone.
int RunOnThreads(Env* env, int n, const std::function<void(int)>& work);

// The directory mzcache keeps its files in (models, profile.json, contexts): $MZ_CACHE_DIR when
// set and not empty, else $HOME/.cache/mzcache ($HOME unset or empty: /tmp/.cache/mzcache). Read
// through env->GetEnvVar; its failure is returned (naming the variable) and *dir is then empty.
// Nothing is created.
Status CacheDir(Env* env, std::string* dir);

// Reads [off, off+n) fully; a short read (EOF inside the range) is a kCorruption error naming what.
Status ReadFully(File* f, void* buf, size_t n, uint64_t off, const std::string& what);

}  // namespace mz
