#include "env/cpu_topology.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

namespace mz {
namespace {

// Leading decimal of s (whitespace around it allowed); false if there is none.
bool ParseUint(const std::string& s, uint64_t* v) {
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i == s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  uint64_t x = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) x = x * 10 + uint64_t(s[i] - '0');
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  if (i != s.size()) return false;
  *v = x;
  return true;
}

// A number file under root: 0 when absent or unparseable (an optional attribute).
uint64_t ReadOptional(Env* env, const std::string& path) {
  std::string s;
  uint64_t v = 0;
  if (!env->ReadSmallFile(path, &s).ok() || !ParseUint(s, &v)) return 0;
  return v;
}

}  // namespace

Status ParseCpuList(const std::string& text, std::vector<int>* out) {
  out->clear();
  std::string t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return Status::Ok();  // no CPU (e.g. an empty "offline" list)
  std::vector<int> cpus;
  size_t pos = 0;
  while (pos <= t.size()) {
    size_t comma = t.find(',', pos);
    if (comma == std::string::npos) comma = t.size();
    const std::string item = t.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    uint64_t a = 0, b = 0;
    const bool ok = dash == std::string::npos ? ParseUint(item, &a) && (b = a, true)
                                              : ParseUint(item.substr(0, dash), &a) && ParseUint(item.substr(dash + 1), &b);
    if (!ok || a > b || b >= 4096) return Status::InvalidArgument("not a CPU list: '" + text + "'");
    for (uint64_t c = a; c <= b; ++c) cpus.push_back(int(c));
    pos = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  *out = std::move(cpus);
  return Status::Ok();
}

Status ReadCpuTopology(Env* env, CpuTopology* out, const std::string& root) {
  *out = CpuTopology();
  std::vector<std::string> names;
  MZ_RETURN_IF_ERROR(env->ListDir(root, &names));
  std::vector<int> present;
  for (const std::string& n : names) {
    uint64_t id = 0;
    if (n.size() > 3 && n.compare(0, 3, "cpu") == 0 && ParseUint(n.substr(3), &id) && id < 4096) present.push_back(int(id));
  }
  std::sort(present.begin(), present.end());
  std::vector<int> online;
  std::string text;
  Status st = env->ReadSmallFile(root + "/online", &text);
  if (st.ok()) {
    std::vector<int> listed;
    MZ_RETURN_IF_ERROR(ParseCpuList(text, &listed).With(root + "/online"));
    for (int c : present)
      if (std::binary_search(listed.begin(), listed.end(), c)) online.push_back(c);
  } else {
    for (int c : present) {
      std::string o;
      const std::string p = root + "/cpu" + std::to_string(c) + "/online";
      uint64_t v = 1;
      if (env->ReadSmallFile(p, &o).ok() && ParseUint(o, &v) && v == 0) continue;
      online.push_back(c);
    }
  }
  if (online.empty()) return Status::IOError("no online CPU under " + root);
  for (int c : online) {
    const std::string d = root + "/cpu" + std::to_string(c);
    CpuInfo ci;
    ci.id = c;
    ci.capacity = uint32_t(ReadOptional(env, d + "/cpu_capacity"));
    ci.max_freq_khz = ReadOptional(env, d + "/cpufreq/cpuinfo_max_freq");
    out->cpus.push_back(ci);
  }
  // The speed metric: capacity where the kernel gives different ones, else the maximum frequency
  // (cpufreq), else none (one cluster). Fastest first; a CPU starts a new cluster when its metric
  // is below kSameKind of the current cluster's fastest, so turbo bins a few percent apart on one
  // core type (x86 "favoured cores") stay one cluster while big/mid/little (15-60% apart) split.
  constexpr double kSameKind = 0.9;
  bool capacities_differ = false;
  for (const CpuInfo& ci : out->cpus) capacities_differ |= ci.capacity != out->cpus.front().capacity;
  auto metric = [&](const CpuInfo& ci) { return capacities_differ ? double(ci.capacity) : double(ci.max_freq_khz); };
  std::vector<CpuInfo> by_speed = out->cpus;
  std::stable_sort(by_speed.begin(), by_speed.end(),
                   [&](const CpuInfo& a, const CpuInfo& b) { return metric(a) > metric(b); });
  double top = -1;
  for (const CpuInfo& ci : by_speed) {
    if (out->clusters.empty() || metric(ci) < kSameKind * top) {
      out->clusters.emplace_back();
      out->clusters.back().capacity = ci.capacity;
      out->clusters.back().max_freq_khz = ci.max_freq_khz;
      top = metric(ci);
    }
    out->clusters.back().cpus.push_back(ci.id);
  }
  for (CpuCluster& cl : out->clusters) std::sort(cl.cpus.begin(), cl.cpus.end());
  return Status::Ok();
}

ComputeCpus ChooseComputeCpus(const CpuTopology& topo, int n_requested) {
  ComputeCpus r;
  r.n_threads = std::max(1, n_requested);
  if (!topo.heterogeneous()) return r;
  const std::vector<int>& fast = topo.clusters.front().cpus;
  r.n_threads = std::min(r.n_threads, int(fast.size()));
  r.cpus.assign(fast.begin(), fast.begin() + r.n_threads);
  return r;
}

}  // namespace mz
