#include "tools/bench/bench_util.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include "env/env.h"

namespace mz::cli {

Stats Summarize(const std::vector<double>& xs) {
  Stats s;
  s.n = int(xs.size());
  if (xs.empty()) return s;
  std::vector<double> v = xs;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / double(v.size() - 1)) : 0.0;
  return s;
}

double LoadAvg1() {
  std::string s;
  if (!Env::Default()->ReadSmallFile("/proc/loadavg", &s).ok()) return -1;
  try {
    return std::stod(s);
  } catch (...) {
    return -1;
  }
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string RunCapture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    *rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

double MeasureReadBandwidth(int n_threads, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  double best = 0;
  std::atomic<uint64_t> sink{0};
  for (int r = 0; r < reps; ++r) {
    double t0 = NowSeconds();
    std::vector<std::thread> ts;
    for (int t = 0; t < n_threads; ++t)
      ts.emplace_back([&, t] {
        const size_t a = n * size_t(t) / size_t(n_threads), b = n * size_t(t + 1) / size_t(n_threads);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = a; i + 4 <= b; i += 4) s0 += buf[i], s1 += buf[i + 1], s2 += buf[i + 2], s3 += buf[i + 3];
        sink += s0 + s1 + s2 + s3;
      });
    for (auto& t : ts) t.join();
    best = std::max(best, double(bytes) / (NowSeconds() - t0));
  }
  return best;
}

bool WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string cmd = "mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return false;
  std::ofstream f(dir + "/" + name);
  f << text;
  return bool(f);
}

}  // namespace mz::cli
