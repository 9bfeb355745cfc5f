// FaultEnv: an Env that injects the faults a swap file on a phone meets: EIO on reads or writes,
// short reads, ENOSPC after a byte budget, bit flips in data read back, failing allocations.
// Faults apply to files whose path contains `path_filter` (empty: all files). Deterministic: each
// fault is armed explicitly and counts down. Thread-safe (atomics; the fake maps under a mutex).
//
// It also fakes what the library reads of the machine, so code that watches procfs / sysfs /
// cgroupfs can be tested anywhere: fake files (a map path -> content, e.g. /proc/meminfo, a cgroup's
// memory.max, later a sysfs CPU topology tree) served by ReadSmallFile, StatPath and CheckAccess
// (and replaced by WriteSmallFile), optionally hiding every real file under a prefix; and fake
// environment variables for GetEnvVar. The new OS calls (small files, environment variables,
// event counters, poll) can be made to fail.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "env/env.h"

namespace mz {

class FaultEnv : public EnvWrapper {
 public:
  explicit FaultEnv(Env* target) : EnvWrapper(target) {}

  std::string path_filter;
  std::atomic<int64_t> fail_reads_after{-1};     // >= 0: after this many more reads, reads fail with EIO
  std::atomic<int64_t> short_reads_after{-1};    // >= 0: after this many more reads, one read returns half
  std::atomic<int64_t> fail_writes_after{-1};    // >= 0: after this many more writes, writes fail with EIO
  std::atomic<int64_t> write_budget{-1};         // >= 0: bytes that may still be written; then ENOSPC
  std::atomic<int64_t> flip_bit_read_after{-1};  // >= 0: after this many more reads, one read gets a bit flipped
  std::atomic<int64_t> fail_maps_after{-1};      // >= 0: after this many more MapAnon calls, MapAnon fails
  std::atomic<int64_t> fail_threads_after{-1};   // >= 0: after this many more StartThread calls, every one fails (kNoMemory)
  std::atomic<int> threads_started{0};           // StartThread calls that started a thread
  std::atomic<int> threads_refused{0};           // StartThread calls refused by fail_threads_after
  std::atomic<bool> refuse_nice{false};          // SetThreadNice fails as without CAP_SYS_NICE
  std::atomic<int> nice_calls{0};                 // SetThreadNice calls (granted or not)
  std::atomic<int64_t> n_reads{0}, n_writes{0}, bytes_read{0}, bytes_written{0};
  // Small files, environment, wake-ups (path_filter applies to the small-file faults):
  std::atomic<int64_t> fail_small_reads_after{-1};   // >= 0: ReadSmallFile fails with EIO after this many more
  std::atomic<int64_t> fail_small_writes_after{-1};  // >= 0: WriteSmallFile fails with EIO after this many more
  std::atomic<int64_t> fail_env_vars_after{-1};      // >= 0: GetEnvVar fails (kIOError) after this many more
  std::atomic<int64_t> fail_events_after{-1};        // >= 0: NewEventCounter / OpenNotifyFile fail with EMFILE after this many more
  std::atomic<int64_t> fail_polls_after{-1};         // >= 0: Poll fails with EIO after this many more
  // Folder syncs and removals (path_filter applies; real paths only). Once fired, every later call
  // fails too until the test disarms it (sets -1): a disk that went bad stays bad.
  std::atomic<int64_t> fail_sync_dirs_after{-1};     // >= 0: SyncDir fails with EIO after this many more
  std::atomic<int64_t> fail_removes_after{-1};       // >= 0: Remove fails with EIO after this many more
  std::atomic<int> n_small_reads{0}, n_small_writes{0};
  // TCP (ConnectTcp; path_filter does not apply). Countdowns that disarm once fired, as the
  // wake-up ones: one connection refused, one connection that breaks.
  std::atomic<int64_t> fail_connects_after{-1};      // >= 0: ConnectTcp fails (connection refused) after this many more
  std::atomic<int64_t> fail_socket_reads_after{-1};  // >= 0: after this many more socket reads (any socket it made), one fails (reset)
  std::atomic<int> n_connects{0}, n_socket_reads{0};

  // Fake files: ReadSmallFile returns `content`, StatPath reports its size, CheckAccess succeeds,
  // WriteSmallFile replaces it (a kernel file: the last command written). Fake files never fail
  // unless a fault above fires.
  void SetFakeFile(const std::string& path, std::string content);
  void RemoveFakeFile(const std::string& path);
  // Fake files take part in Rename (from a fake file: the entry moves), Remove (a fake file: the
  // entry goes) and SyncDir (a fake or hidden path: nothing to sync); real paths are forwarded.
  Status Rename(const std::string& from, const std::string& to) override;
  Status Remove(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  // Counts down a sticky countdown for path (path_filter applies): true once it reached 0.
  bool Fires(std::atomic<int64_t>& countdown, const std::string& path) const;
  // Called (on the calling thread) at the start of every SyncDir of a real path, before it is
  // forwarded: a test holds a writer there (a slow disk). Set it before the calls it concerns.
  std::function<void(const std::string& path)> on_sync_dir;
  // Content of a fake file; false if there is none.
  bool FakeFile(const std::string& path, std::string* content) const;
  // Paths starting with prefix (e.g. "/proc/", "/sys/") that are not fake files do not exist
  // (ENOENT) for ReadSmallFile, WriteSmallFile, StatPath, CheckAccess and OpenNotifyFile, so a test
  // sees only its fake tree, never the real machine's.
  void HideRealFilesUnder(const std::string& prefix);
  // Fake environment variables: GetEnvVar returns `value` ("" = unset) instead of the real one.
  void SetEnvVar(const std::string& name, std::string value);

  Status Open(const std::string& path, OpenMode mode, bool direct, std::unique_ptr<File>* out) override;
  void* MapAnon(size_t bytes) override;
  // Records writable file mappings (flip_bit_read_after can only corrupt those).
  Status MapFileAt(File* f, uint64_t off, size_t len, void* at, bool writable) override;
  void Unmap(void* p, size_t bytes) override;
  // Counts as one read of f (fail_reads_after applies, and short_reads_after fails it as a file
  // cut short would; the pages stay as they were). When
  // flip_bit_read_after fires on a writable mapping (MapFileAt), one bit of its first byte is
  // flipped in the process's private copy of the page, as a read from a failing disk would give.
  Status PopulateMapped(File* f, void* p, size_t bytes, uint64_t file_off) override;
  Status SetThreadNice(int nice) override {
    ++nice_calls;
    if (refuse_nice.load()) return Status::Unsupported("setpriority: Permission denied (injected)");
    return EnvWrapper::SetThreadNice(nice);
  }

  // Thread affinity: every SetThreadAffinity call is recorded (the CPU set asked for, in call
  // order, under a mutex: affinity_log()), granted or not. refuse_affinity: the call fails as the
  // kernel's EINVAL does (no allowed CPU in the set) and the affinity stays. Otherwise forwarded.
  std::atomic<bool> refuse_affinity{false};
  Status SetThreadAffinity(const std::vector<int>& cpus) override;
  std::vector<std::vector<int>> affinity_log() const;
  void clear_affinity_log();

  // Unlike the other countdowns, fail_threads_after stays fired: a process out of threads stays
  // out of them until the test disarms it (sets -1).
  Status StartThread(std::function<void()> fn, std::thread* out) override {
    int64_t v = fail_threads_after.load();
    while (v > 0 && !fail_threads_after.compare_exchange_weak(v, v - 1)) {
    }
    if (v == 0) {
      ++threads_refused;
      return Status::NoMemory("cannot start a thread: Resource temporarily unavailable (injected)");
    }
    Status st = EnvWrapper::StartThread(std::move(fn), out);
    if (st.ok()) ++threads_started;
    return st;
  }

  // The kernel taking pages back (ResidentBytes): when set, called instead of the real mincore, so
  // a test can play the kernel reclaiming part of a unit. Set it before the calls it should see
  // (not synchronized with them).
  std::function<Status(const void* p, size_t bytes, uint64_t* out)> resident_bytes;
  Status ResidentBytes(const void* p, size_t bytes, uint64_t* out) override {
    if (resident_bytes) return resident_bytes(p, bytes, out);
    return EnvWrapper::ResidentBytes(p, bytes, out);
  }

  Status StatPath(const std::string& path, FileInfo* info) override;
  Status ReadSmallFile(const std::string& path, std::string* out) override;
  Status WriteSmallFile(const std::string& path, const std::string& data, bool create) override;
  Status CheckAccess(const std::string& path, bool write) override;
  // A directory of the fake tree: the names of the fake files and folders right under path (a
  // fake file "/a/b/c" makes "/a" list "b" and "/a/b" list "c"), merged with the real directory's
  // entries unless path is hidden (HideRealFilesUnder). Hidden and with no fake entry: ENOENT.
  // fail_small_reads_after applies (EIO), as for ReadSmallFile.
  Status ListDir(const std::string& path, std::vector<std::string>* out) override;
  Status GetEnvVar(const std::string& name, std::string* value) override;
  Status NewEventCounter(std::unique_ptr<WaitHandle>* out) override;
  Status OpenNotifyFile(const std::string& path, bool write, std::unique_ptr<WaitHandle>* out) override;
  Status Poll(PollEntry* entries, int n, int timeout_ms, int* n_ready) override;
  // Its sockets count their reads (n_socket_reads) and fail one when fail_socket_reads_after fires.
  Status ConnectTcp(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) override;

  // True (and disarms) when a countdown reaches zero.
  static bool Fire(std::atomic<int64_t>& countdown);

 private:
  std::mutex mu_;
  std::map<uintptr_t, size_t> writable_;  // start -> length of writable file mappings
  // Fakes (fake_mu_): what a real path lookup would see. Fake() is 1 for a fake file (content in
  // *content), -1 for a hidden real path, 0 for a real one.
  int Fake(const std::string& path, std::string* content) const;
  bool Filtered(const std::string& path) const {
    return path_filter.empty() || path.find(path_filter) != std::string::npos;
  }
  mutable std::mutex fake_mu_;
  std::map<std::string, std::string> fake_files_;
  std::vector<std::string> hidden_prefixes_;
  std::map<std::string, std::string> fake_env_;
  mutable std::mutex affinity_mu_;
  std::vector<std::vector<int>> affinity_log_;
};

}  // namespace mz
