// Benchmark helpers: statistics, subprocess capture, memory bandwidth, result files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "env/env.h"
#include "policy/profiler.h"

namespace mz::cli {

struct Stats {
  double mean = 0, stddev = 0, median = 0, min = 0, max = 0;
  int n = 0;
};
Stats Summarize(const std::vector<double>& xs);

double NowSeconds();
// 1-minute load average now (/proc/loadavg), -1 if unreadable: how busy the machine was.
double LoadAvg1();
// Runs a shell command, returns its stdout; *rc receives the exit status (-1 if it could not run).
std::string RunCapture(const std::string& cmd, int* rc);
// Sequential read bandwidth of RAM in bytes/s (n_threads threads summing a buffer of `bytes`),
// best of `reps`. Used to print the memory-bandwidth bound next to measurements.
double MeasureReadBandwidth(int n_threads, size_t bytes = size_t(512) << 20, int reps = 3);
// The storage and allocation measurements of the device profiler (policy/profiler.h), on the
// process's Env: see there for what each measures.
using mz::StorageProbe;
inline double MeasureMappedRead(const std::string& path, size_t bytes, size_t piece = size_t(64) << 20) {
  return mz::MeasureMappedRead(Env::Default(), path, bytes, piece);
}
inline std::vector<double> MeasureDirectReads(const std::string& dir, size_t bytes, size_t request,
                                              const std::vector<int>& threads, double* mapped_Bps = nullptr) {
  return mz::MeasureDirectReads(Env::Default(), dir, bytes, request, threads, mapped_Bps);
}
// Direct reads with one reader count: MeasureDirectReads(dir, bytes, request, {threads})[0].
inline double MeasureDirectRead(const std::string& dir, size_t bytes, size_t request = size_t(4) << 20,
                                int threads = 1) {
  return MeasureDirectReads(dir, bytes, request, {threads})[0];
}
inline double MeasurePopulateCost() { return mz::MeasurePopulateCost(Env::Default()); }
inline std::string MachineDescription() { return mz::MachineDescription(Env::Default()); }
// Writes text to dir/name (creating dir); returns false on failure.
bool WriteFile(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace mz::cli
