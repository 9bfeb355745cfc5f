// Env: the one seam between mzcache and the operating system (files, anonymous memory, threads,
// clock).
// Everything that touches the OS goes through an Env so tests can inject faults (see FaultEnv) and
// count I/O. Thread-safety: Env and File methods are safe for concurrent use unless noted.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"

namespace mz {

struct FileInfo {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
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
  virtual Status PopulateMapped(File* f, void* p, size_t bytes) = 0;
  // Asks the kernel to drop [off, off+len) of f from the page cache (POSIX_FADV_DONTNEED), so the
  // memory of file-backed pages nobody maps any more goes back to the OS now. Pages some mapping
  // still holds (another unit's boundary page, another process) stay. Errors: a bad handle (or
  // what posix_fadvise refuses, EINVAL/ESPIPE).
  virtual Status DropCached(File* f, uint64_t off, uint64_t len) = 0;
  // Bytes of [off, off+len) of f now in the page cache (whole pages; mincore), for checks that
  // the page cache is not what a measurement or a test sees.
  virtual Status CachedBytes(File* f, uint64_t off, uint64_t len, uint64_t* out) = 0;
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

  // Starts fn on a new thread and hands it to *out (joinable; the caller joins it). When the OS
  // refuses a thread (EAGAIN: a thread or memory limit, as under heavy memory pressure) returns
  // kNoMemory, *out is left empty and fn is not run: callers degrade to the threads they have
  // (RunOnThreads) instead of failing the operation.
  virtual Status StartThread(std::function<void()> fn, std::thread* out) = 0;

  virtual uint64_t NowNs() = 0;
  // The size of a memory page (what MapFileAt offsets and addresses must be aligned to).
  virtual size_t PageSize() = 0;

  // The process-wide POSIX Env. Never freed.
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
  void* MapAnon(size_t n) override { return target_->MapAnon(n); }
  Status MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) override {
    return target_->MapFileAt(f, off, len, at, writable);
  }
  void Unmap(void* p, size_t n) override { target_->Unmap(p, n); }
  Status PopulateMapped(File* f, void* p, size_t n) override { return target_->PopulateMapped(f, p, n); }
  Status DropCached(File* f, uint64_t off, uint64_t len) override { return target_->DropCached(f, off, len); }
  Status CachedBytes(File* f, uint64_t off, uint64_t len, uint64_t* out) override {
    return target_->CachedBytes(f, off, len, out);
  }
  void Prefault(void* p, size_t n) override { target_->Prefault(p, n); }
  Status SetThreadNice(int nice) override { return target_->SetThreadNice(nice); }
  int ThreadNice() override { return target_->ThreadNice(); }
  Status StartThread(std::function<void()> fn, std::thread* out) override {
    return target_->StartThread(std::move(fn), out);
  }
  uint64_t NowNs() override { return target_->NowNs(); }
  size_t PageSize() override { return target_->PageSize(); }
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

// Reads [off, off+n) fully; a short read (EOF inside the range) is a kCorruption error naming what.
Status ReadFully(File* f, void* buf, size_t n, uint64_t off, const std::string& what);

}  // namespace mz
