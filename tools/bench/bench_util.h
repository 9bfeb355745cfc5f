// Benchmark helpers: statistics, subprocess capture, memory bandwidth, result files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mz::cli {

struct Stats {
  double mean = 0, stddev = 0, median = 0, min = 0, max = 0;
  int n = 0;
};
Stats Summarize(const std::vector<double>& xs);

double NowSeconds();
// Runs a shell command, returns its stdout; *rc receives the exit status (-1 if it could not run).
std::string RunCapture(const std::string& cmd, int* rc);
// Sequential read bandwidth of RAM in bytes/s (n_threads threads summing a buffer of `bytes`),
// best of `reps`. Used to print the memory-bandwidth bound next to measurements.
double MeasureReadBandwidth(int n_threads, size_t bytes = size_t(512) << 20, int reps = 3);
// Sequential direct-I/O read bandwidth (bytes/s, best of 2) of the storage holding `dir`: writes a
// `bytes` test file there, reads it back with `request`-sized O_DIRECT reads from `threads` readers
// taking the requests in turn (that many requests in flight), removes it. 0 on error.
double MeasureDirectRead(const std::string& dir, size_t bytes, size_t request = size_t(4) << 20, int threads = 1);
// Page-cache read bandwidth of the existing file `path` ([0, bytes)), read the way file-backed weight
// units and mapped KV chunks are: `piece`-sized pieces (a weight layer, a KV chunk) mapped and
// populated (Env::PopulateMapped) by two threads in turn, as the restore pipeline's two storage
// workers do. Best of 2 (bytes/s), the file's pages dropped from the page cache before each; 0 on
// error.
double MeasureMappedRead(const std::string& path, size_t bytes, size_t piece = size_t(64) << 20);
// The same for each reader count in `threads`, from one test file (written once). 0s on error.
// mapped_Bps (optional): also the page-cache read bandwidth of the same file, as file-backed weight
// units are read (Env::PopulateMapped of 64 MiB pieces by two threads, the file's pages dropped
// from the page cache first; best of 2; 0 on error).
std::vector<double> MeasureDirectReads(const std::string& dir, size_t bytes, size_t request,
                                       const std::vector<int>& threads, double* mapped_Bps = nullptr);
// A read-test file kept for a whole benchmark run, so that the storage's read rate can be measured
// again between repetitions (a disk whose rate drifts within a run: the bound of each cell then
// uses the rate measured during that cell). Not thread-safe; the file is removed by the destructor.
class StorageProbe {
 public:
  // Writes a `bytes` (rounded up to 4 MiB) test file in dir with direct I/O; ok() tells if it did.
  StorageProbe(const std::string& dir, size_t bytes);
  ~StorageProbe();
  StorageProbe(const StorageProbe&) = delete;
  StorageProbe& operator=(const StorageProbe&) = delete;
  bool ok() const { return ok_; }
  // The best of, measured now (bytes/s, 0 on error): one pass of direct reads with 4 MiB requests,
  // 1 in flight, one with 2 in flight (as the pipeline's two storage workers), and page-cache
  // reads of 64 MiB mapped pieces by two threads (MeasureMappedRead: best of 2, the file dropped
  // from the page cache first): the kinds of read the run-start figure takes the best of.
  double ReadNow();

 private:
  std::string path_;
  size_t bytes_;
  bool ok_ = false;
};
// Cost of making fresh anonymous memory usable (Env::MapAnon + Prefault, the restore pipeline's
// way), seconds per byte, best of 3 over 256 MiB. -1 if the mapping fails.
double MeasurePopulateCost();
// Writes text to dir/name (creating dir); returns false on failure.
bool WriteFile(const std::string& dir, const std::string& name, const std::string& text);
std::string MachineDescription();

}  // namespace mz::cli
