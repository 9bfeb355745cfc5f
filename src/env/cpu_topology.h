// CPU topology: which CPUs are online and how fast each kind is, read from sysfs through an Env
// (so tests serve a fake tree with FaultEnv), and the default choice of compute CPUs on a
// heterogeneous (big.LITTLE) machine: only the fastest cluster.
//
// Why: decode is bandwidth-bound and every compute thread joins ggml's barrier after each op, so a
// token takes as long as the slowest thread; a little core (in-order, a shallow load queue) adds a
// full participant to the barrier and little bandwidth. On a 1+3+4 phone the fastest cluster is
// the one prime core. Homogeneous machines (one cluster, or no capacity/frequency files, as on
// this VM) are left alone: all CPUs, no pinning.
//
// Thread-safety: pure functions over their inputs (ReadCpuTopology only reads files).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"

namespace mz {

constexpr const char* kSysCpuRoot = "/sys/devices/system/cpu";

struct CpuInfo {
  int id = 0;
  uint32_t capacity = 0;      // cpuN/cpu_capacity (arm64: 1024 = the fastest core); 0 if absent
  uint64_t max_freq_khz = 0;  // cpuN/cpufreq/cpuinfo_max_freq; 0 if absent
};

// CPUs of one kind (see ReadCpuTopology for how kinds are told apart).
struct CpuCluster {
  std::vector<int> cpus;  // ascending ids
  uint32_t capacity = 0;      // of its fastest CPU
  uint64_t max_freq_khz = 0;  // of its fastest CPU
};

struct CpuTopology {
  std::vector<CpuInfo> cpus;         // online CPUs, ascending id
  std::vector<CpuCluster> clusters;  // fastest first (capacity, then max frequency, descending)
  // More than one kind of CPU (big.LITTLE, or performance + efficiency cores).
  bool heterogeneous() const { return clusters.size() > 1; }
};

// Parses a kernel CPU list ("0-3,5,7-8\n"). kInvalidArgument (naming the text) on anything else;
// *out then empty.
Status ParseCpuList(const std::string& text, std::vector<int>* out);

// Reads the topology under root (default the real sysfs): the CPUs are the entries cpuN of
// ListDir(root); the online ones are those in root/online (when that file is missing: those whose
// cpuN/online is not "0"; cpu0 usually has none and counts online). For each online CPU,
// cpuN/cpu_capacity and cpuN/cpufreq/cpuinfo_max_freq are read when present (absent files are 0,
// not errors). CPUs are grouped by speed: capacity where CPUs differ in it, else max frequency; a
// CPU below 90% of its cluster's fastest starts the next cluster (turbo bins of one core type stay
// together). Without either file on any CPU, or all equal, there is one cluster. Failure: the Env's error listing root or reading root/online
// (unparseable: kInvalidArgument), or no online CPU found (kIOError); *out then empty.
// Callers treat a failure as "homogeneous, unknown" and do not pin.
Status ReadCpuTopology(Env* env, CpuTopology* out, const std::string& root = kSysCpuRoot);

// The default compute threads: on a heterogeneous machine, the CPUs of the fastest cluster, as
// many as min(its size, n_requested), threads pinned to them (cpus non-empty); otherwise
// n_requested threads, not pinned (cpus empty). n_requested < 1 counts as 1.
struct ComputeCpus {
  int n_threads = 1;
  std::vector<int> cpus;  // empty: no pinning
};
ComputeCpus ChooseComputeCpus(const CpuTopology& topo, int n_requested);

}  // namespace mz
