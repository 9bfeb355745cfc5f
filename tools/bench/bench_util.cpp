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

double MeasureDirectRead(const std::string& dir, size_t bytes, size_t request, int threads) {
  return MeasureDirectReads(dir, bytes, request, {threads})[0];
}

double MeasurePopulateCost() {
  Env* env = Env::Default();
  const size_t bytes = size_t(256) << 20;
  double best = 1e9;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = NowSeconds();
    void* p = env->MapAnon(bytes);
    if (!p) return -1;
    env->Prefault(p, bytes);
    const double dt = NowSeconds() - t0;
    env->Unmap(p, bytes);
    best = std::min(best, dt / double(bytes));
  }
  return best;
}

double MeasureMappedRead(const std::string& path, size_t bytes, size_t piece) {
  Env* env = Env::Default();
  std::unique_ptr<File> file;
  if (!env->Open(path, OpenMode::kRead, false, &file).ok()) return 0;
  File* f = file.get();
  if (piece == 0) return 0;
  double best = 0;
  for (int rep = 0; rep < 2; ++rep) {
    char* region = static_cast<char*>(env->MapAnon(bytes));
    if (!region) return 0;
    if (!env->DropCached(f, 0, bytes).ok()) {
      env->Unmap(region, bytes);
      return 0;
    }
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    auto reader = [&] {
      for (size_t off; (off = next.fetch_add(piece)) < bytes && !failed;) {
        const size_t n = std::min(piece, bytes - off);
        if (!env->MapFileAt(f, off, n, region + off, false).ok() || !env->PopulateMapped(f, region + off, n).ok())
          failed = true;
      }
    };
    const double t0 = NowSeconds();
    std::thread t1(reader);
    reader();
    t1.join();
    const double dt = NowSeconds() - t0;
    env->Unmap(region, bytes);
    (void)env->DropCached(f, 0, bytes);
    if (failed) return 0;
    best = std::max(best, double(bytes) / dt);
  }
  return best;
}

namespace {
// Writes a `bytes` test file at path with O_DIRECT (4 MiB writes) and syncs it. false on error.
bool WriteReadTestFile(const std::string& path, size_t bytes) {
  std::unique_ptr<File> f;
  if (!Env::Default()->Open(path, OpenMode::kCreateTrunc, true, &f).ok()) return false;
  const size_t blk = size_t(4) << 20;
  void* buf = std::aligned_alloc(4096, blk);
  if (!buf) return false;
  std::memset(buf, 0x5a, blk);
  bool ok = true;
  for (size_t off = 0; off < bytes && ok; off += blk) ok = f->Write(buf, blk, off).ok();
  std::free(buf);
  return ok && f->Sync().ok();
}

// One pass of `request`-sized direct reads over [0, bytes) of f by `nt` readers taking the
// requests in turn (that many in flight); bytes/s, 0 on error.
double DirectReadPass(File* f, size_t bytes, size_t request, int nt) {
  nt = std::max(1, nt);
  void* buf = std::aligned_alloc(4096, request * size_t(nt));
  if (!buf) return 0;
  std::atomic<bool> failed{false};
  auto reader = [&](int t) {
    char* b = static_cast<char*>(buf) + size_t(t) * request;
    for (size_t off = size_t(t) * request; off < bytes && !failed; off += request * size_t(nt)) {
      size_t got = 0;
      if (!f->Read(b, request, off, &got).ok()) failed = true;
    }
  };
  const double t0 = NowSeconds();
  std::vector<std::thread> ts;
  for (int t = 1; t < nt; ++t) ts.emplace_back(reader, t);
  reader(0);
  for (auto& t : ts) t.join();
  const double dt = NowSeconds() - t0;
  std::free(buf);
  return failed ? 0 : double(bytes) / dt;
}
}  // namespace

std::vector<double> MeasureDirectReads(const std::string& dir, size_t bytes, size_t request,
                                       const std::vector<int>& threads, double* mapped_Bps) {
  std::vector<double> best(threads.size(), 0.0);
  const std::string path = dir + "/mzcache-read-test.bin";
  bytes = AlignUp(bytes, size_t(4) << 20);
  bool ok = WriteReadTestFile(path, bytes);
  std::unique_ptr<File> f;
  if (ok && Env::Default()->Open(path, OpenMode::kRead, true, &f).ok()) {
    for (size_t k = 0; k < threads.size() && ok; ++k)
      for (int rep = 0; rep < 2 && ok; ++rep) {
        const double bps = DirectReadPass(f.get(), bytes, request, threads[k]);
        ok = bps > 0;
        best[k] = std::max(best[k], bps);
      }
    f.reset();
  }
  if (mapped_Bps) *mapped_Bps = ok ? MeasureMappedRead(path, bytes) : 0.0;
  Env::Default()->Remove(path);
  if (!ok) std::fill(best.begin(), best.end(), 0.0);
  return best;
}

StorageProbe::StorageProbe(const std::string& dir, size_t bytes)
    : path_(dir + "/mzcache-read-probe.bin"), bytes_(AlignUp(bytes, size_t(4) << 20)) {
  ok_ = WriteReadTestFile(path_, bytes_);
}

StorageProbe::~StorageProbe() { Env::Default()->Remove(path_); }

double StorageProbe::ReadNow() {
  if (!ok_) return 0;
  std::unique_ptr<File> f;
  double direct = 0;
  if (Env::Default()->Open(path_, OpenMode::kRead, true, &f).ok())
    for (int nt : {1, 2}) direct = std::max(direct, DirectReadPass(f.get(), bytes_, size_t(4) << 20, nt));
  f.reset();
  return std::max(direct, MeasureMappedRead(path_, bytes_));
}

bool WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string cmd = "mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return false;
  std::ofstream f(dir + "/" + name);
  f << text;
  return bool(f);
}

std::string MachineDescription() {
  std::string cpu = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  struct utsname u;
  uname(&u);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  long mem = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %ld cores, %.0f GiB RAM, %s %s", cpu.c_str(), cores, double(mem) / (1 << 30),
                u.sysname, u.release);
  return buf;
}

}  // namespace mz::cli
