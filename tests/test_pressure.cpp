// Pressure sources, against the real kernel interfaces where this machine has them (a v1 memory
// cgroup of our own under real page-cache and anonymous-memory pressure, PSI triggers), and against
// fakes for what it cannot produce; the monitor's idle/inference phases with a manual source, a
// fake clock and sync points (no sleeps decide any ordering).
//
// Kernel tests skip (with the reason) when not root or without a v1 memory controller / PSI. Waits
// on the kernel are bounded by generous hang guards, never asserted on speed.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "api/api_internal.h"
#include "core/sync_point.h"
#include "env/env.h"
#include "pressure/cgroup_v1_source.h"
#include "pressure/manual_source.h"
#include "env/fault_env.h"
#include "pressure/monitor.h"
#include "pressure/psi_source.h"
#include "pressure/sysfs.h"
#include "pressure/watermark_source.h"
#include "pressure/wiring.h"
#include "runtime/context.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;  // Linux 5.14
#endif
constexpr uint64_t kSec = 1'000'000'000ull;

class FakeClockEnv : public EnvWrapper {
 public:
  FakeClockEnv() : EnvWrapper(Env::Default()) {}
  uint64_t NowNs() override { return now.load(); }
  std::atomic<uint64_t> now{1000 * kSec};
};

// ---------------------------------------------------------------------------------------------
// A v1 memory cgroup of our own, removed in every path; and a child process in it driven through
// a pipe (one command byte per step, one ack byte back).

std::string SkipReasonForCgroup() {
  if (geteuid() != 0) return "needs root to create a memory cgroup";
  const std::string mnt = sysfs::V1MemoryMount(Env::Default());
  if (mnt.empty()) return "no cgroup v1 memory controller mounted";
  if (!sysfs::Exists(Env::Default(), mnt + "/cgroup.event_control")) return "v1 memory controller without cgroup.event_control";
  return "";
}

class TestCgroup {
 public:
  ~TestCgroup() {
    if (path_.empty()) return;
    Env::Default()->WriteSmallFile(path_ + "/memory.limit_in_bytes", "-1", /*create=*/false);
    std::string procs;
    if (Env::Default()->ReadSmallFile(path_ + "/cgroup.procs", &procs).ok()) {
      std::istringstream ss(procs);
      for (std::string pid; ss >> pid;)
        Env::Default()->WriteSmallFile(sysfs::V1MemoryMount(Env::Default()) + "/cgroup.procs", pid, /*create=*/false);
    }
    ::rmdir(path_.c_str());
  }
  Status Create(uint64_t limit) {
    static int n = 0;
    path_ = sysfs::V1MemoryMount(Env::Default()) + "/mzcache-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    if (::mkdir(path_.c_str(), 0755) != 0) {
      Status s = Status::FromErrno(errno, "mkdir " + path_);
      path_.clear();
      return s;
    }
    Env::Default()->WriteSmallFile(path_ + "/memory.swappiness", "0", /*create=*/false);
    return Env::Default()->WriteSmallFile(path_ + "/memory.limit_in_bytes", std::to_string(limit), /*create=*/false);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A child process that runs `body(cmd_fd, ack_fd)` inside the cgroup once the parent moved it there.
class Child {
 public:
  ~Child() { Kill(); }
  template <class F>
  Status Spawn(const std::string& cgroup, F body) {
    int to[2], from[2];
    if (::pipe(to) != 0 || ::pipe(from) != 0) return Status::FromErrno(errno, "pipe");
    pid_ = ::fork();
    if (pid_ < 0) return Status::FromErrno(errno, "fork");
    if (pid_ == 0) {
      ::close(to[1]);
      ::close(from[0]);
      char go;
      if (::read(to[0], &go, 1) != 1) ::_exit(2);
      body(to[0], from[1]);
      ::_exit(0);
    }
    ::close(to[0]);
    ::close(from[1]);
    cmd_ = to[1];
    ack_ = from[0];
    MZ_RETURN_IF_ERROR(Env::Default()->WriteSmallFile(cgroup + "/cgroup.procs", std::to_string(pid_), /*create=*/false));
    char go = 'g';
    if (::write(cmd_, &go, 1) != 1) return Status::FromErrno(errno, "start child");
    return Status::Ok();
  }
  // Sends one command byte and waits for the child's ack (false if it died).
  bool Step(char c) {
    if (::write(cmd_, &c, 1) != 1) return false;
    char a;
    return ::read(ack_, &a, 1) == 1;
  }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    if (cmd_ >= 0) ::close(cmd_), cmd_ = -1;
    if (ack_ >= 0) ::close(ack_), ack_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int cmd_ = -1, ack_ = -1;
};

// Child body: writes and re-reads a file larger than the cgroup limit in a loop: the page cache is
// reclaimed over and over (vmpressure "low"/"medium", memory stalls for PSI). Never returns.
void ThrashPageCache(const std::string& file, uint64_t bytes) {
  static char buf[1 << 20];
  std::memset(buf, 'x', sizeof buf);
  while (true) {
    int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) ::_exit(3);
    for (uint64_t off = 0; off < bytes; off += sizeof buf)
      if (::pwrite(fd, buf, sizeof buf, off_t(off)) < 0) ::_exit(4);
    for (uint64_t off = 0; off < bytes; off += sizeof buf)
      if (::pread(fd, buf, sizeof buf, off_t(off)) < 0) ::_exit(5);
    ::close(fd);
  }
}

// ---------------------------------------------------------------------------------------------
// Detection

TEST(PressureDetection, SaysWhichSourceIsActiveAndWhy) {
  PressureSourceOptions o;
  std::unique_ptr<PressureSource> src;
  std::string why;
  ASSERT_TRUE(CreatePressureSource(Env::Default(), o, &src, &why).ok()) << why;
  ASSERT_TRUE(src);
  EXPECT_FALSE(why.empty());
  std::printf("auto: %s -> %s\n", src->name().c_str(), why.c_str());
  std::string psi_why;
  const bool psi = PsiSource::Probe(Env::Default(), "/proc/pressure/memory", false, 150000, 2000000, &psi_why);
  if (psi) {
    EXPECT_EQ(src->name().rfind("psi:", 0), 0u) << "PSI works here but auto chose " << src->name();
  } else {
    EXPECT_EQ(src->name().rfind("watermark:", 0), 0u) << src->name();
    EXPECT_NE(why.find("PSI unusable"), std::string::npos) << "detection must say PSI is absent: " << why;
  }
  // Explicit kinds: manual and watermark always exist; unknown names are refused.
  o.kind = "manual";
  ASSERT_TRUE(CreatePressureSource(Env::Default(), o, &src, &why).ok());
  EXPECT_EQ(src->name(), "manual");
  o.kind = "watermark";
  ASSERT_TRUE(CreatePressureSource(Env::Default(), o, &src, &why).ok());
  EXPECT_EQ(src->name(), "watermark:/proc/meminfo");
  o.kind = "bogus";
  EXPECT_EQ(CreatePressureSource(Env::Default(), o, &src, &why).code(), Status::kInvalidArgument);
  // cgroup-v1 on a directory that is not one: refused with the reason.
  o.kind = "cgroup-v1";
  o.cgroup_dir = "/tmp";
  Status st = CreatePressureSource(Env::Default(), o, &src, &why);
  EXPECT_EQ(st.code(), Status::kUnsupported);
  EXPECT_NE(st.message().find("/tmp"), std::string::npos) << st.ToString();
}

TEST(PressureDetection, AutoPrefersAV1CgroupWhenGiven) {
  const std::string skip = SkipReasonForCgroup();
  if (!skip.empty()) GTEST_SKIP() << skip;
  TestCgroup cg;
  ASSERT_TRUE(cg.Create(64 * kMiB).ok());
  PressureSourceOptions o;
  o.cgroup_dir = cg.path();
  std::unique_ptr<PressureSource> src;
  std::string why;
  ASSERT_TRUE(CreatePressureSource(Env::Default(), o, &src, &why).ok()) << why;
  EXPECT_EQ(src->name(), "cgroup-v1:" + cg.path()) << why;
}

// ---------------------------------------------------------------------------------------------
// PSI

TEST(PsiRules, ParseAndValidate) {
  PsiStats s;
  ASSERT_TRUE(ParsePsi("some avg10=1.50 avg60=0.25 avg300=0.00 total=25680\n"
                       "full avg10=0.00 avg60=0.10 avg300=0.00 total=23233\n",
                       &s)
                  .ok());
  EXPECT_DOUBLE_EQ(s.some.avg10, 1.5);
  EXPECT_DOUBLE_EQ(s.full.avg60, 0.1);
  EXPECT_EQ(s.some.total_us, 25680u);
  EXPECT_EQ(s.full.total_us, 23233u);
  EXPECT_TRUE(ParsePsi("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n", &s).ok());  // cpu-style, no full
  EXPECT_FALSE(s.full.present);
  EXPECT_EQ(ParsePsi("", &s).code(), Status::kCorruption);
  EXPECT_EQ(ParsePsi("some avg10=x avg60=0 avg300=0 total=1\n", &s).code(), Status::kCorruption);

  // Kernel rules: window 500 ms..10 s, 0 < stall <= window; unprivileged: multiple of 2 s.
  EXPECT_TRUE(ValidatePsiTrigger(150000, 1000000, true).ok());
  EXPECT_FALSE(ValidatePsiTrigger(150000, 1000000, false).ok());
  EXPECT_TRUE(ValidatePsiTrigger(150000, 2000000, false).ok());
  EXPECT_FALSE(ValidatePsiTrigger(100000, 499999, true).ok());
  EXPECT_TRUE(ValidatePsiTrigger(100000, 500000, true).ok());
  EXPECT_TRUE(ValidatePsiTrigger(100000, 10000000, true).ok());
  EXPECT_FALSE(ValidatePsiTrigger(100000, 10000001, true).ok());
  EXPECT_FALSE(ValidatePsiTrigger(0, 1000000, true).ok());
  EXPECT_TRUE(ValidatePsiTrigger(1000000, 1000000, true).ok());
  EXPECT_FALSE(ValidatePsiTrigger(1000001, 1000000, true).ok());

  const std::string t = FormatPsiTrigger(false, 150000, 1000000);
  EXPECT_EQ(t, std::string("some 150000 1000000") + '\0');
  EXPECT_EQ(FormatPsiTrigger(true, 1, 2000000).substr(0, 5), "full ");

  uint32_t stall = 150000, window = 1000000;
  MakePsiTriggerUnprivileged(&stall, &window);
  EXPECT_EQ(window, 2000000u);
  EXPECT_EQ(stall, 300000u);  // the same 15% share
  EXPECT_TRUE(ValidatePsiTrigger(stall, window, false).ok());
  stall = 9000000, window = 9500000;
  MakePsiTriggerUnprivileged(&stall, &window);
  EXPECT_EQ(window, 10000000u);
  EXPECT_TRUE(ValidatePsiTrigger(stall, window, false).ok());
}

TEST(PsiKernel, StartRefusesWhatTheKernelWouldAndStopWakesWait) {
  std::string why;
  if (!PsiSource::Probe(Env::Default(), "/proc/pressure/memory", false, 150000, 2000000, &why))
    GTEST_SKIP() << "PSI not available on this machine: " << why;
  // Invalid triggers are refused before the kernel sees them.
  PsiSource bad(Env::Default(), "/proc/pressure/memory", false, 0, 2000000);
  EXPECT_EQ(bad.Start().code(), Status::kInvalidArgument);
  PsiSource none(Env::Default(), "/nonexistent/memory.pressure", false, 150000, 2000000);
  EXPECT_EQ(none.Start().code(), Status::kUnsupported);
  // A valid one arms; Stop() from another thread ends a Wait without limit.
  PsiSource src(Env::Default(), "/proc/pressure/memory", false, 150000, 2000000);
  ASSERT_TRUE(src.Start().ok());
  PressureEvent ev;
  Status st;
  std::thread t([&] {
    do st = src.Wait(-1, &ev);
    while (st.ok());  // real pressure on a shared machine may fire first
  });
  src.Stop();
  t.join();
  EXPECT_EQ(st.code(), Status::kCancelled) << st.ToString();
}

TEST(PsiKernel, TriggerFiresUnderRealMemoryStalls) {
  std::string why;
  if (!PsiSource::Probe(Env::Default(), "/proc/pressure/memory", false, 20000, 2000000, &why))
    GTEST_SKIP() << "PSI not available on this machine: " << why;
  const std::string skip = SkipReasonForCgroup();
  if (!skip.empty()) GTEST_SKIP() << "cannot create memory pressure: " << skip;
  // A stall of 20 ms within 2 s (an unprivileged window) anywhere on the machine; our child causes
  // it by thrashing the page cache of a file four times its cgroup's limit.
  PsiSource src(Env::Default(), "/proc/pressure/memory", false, 20000, 2000000);
  ASSERT_TRUE(src.Start().ok());
  TestCgroup cg;
  ASSERT_TRUE(cg.Create(16 * kMiB).ok());
  const std::string file = test::TempDir() + "/psi-thrash.bin";
  Child child;
  ASSERT_TRUE(child.Spawn(cg.path(), [&](int, int) { ThrashPageCache(file, 64 * kMiB); }).ok());
  PressureEvent ev;
  Status st = Status::Timeout("");
  for (int i = 0; i < 120 && st.code() == Status::kTimeout; ++i) st = src.Wait(1000, &ev);  // hang guard 2 min
  child.Kill();
  ::unlink(file.c_str());
  ASSERT_TRUE(st.ok()) << "no PSI event while a child thrashed in a 16 MiB cgroup: " << st.ToString();
  EXPECT_EQ(ev.level, PressureLevel::kLow);
  EXPECT_GT(ev.time_ns, 0u);
  EXPECT_EQ(ev.source.rfind("psi:/proc/pressure/memory", 0), 0u);
}

// ---------------------------------------------------------------------------------------------
// cgroup v1 memory.pressure_level

TEST(CgroupV1Kernel, DeliversEventsUnderPageCachePressure) {
  const std::string skip = SkipReasonForCgroup();
  if (!skip.empty()) GTEST_SKIP() << skip;
  TestCgroup cg;
  ASSERT_TRUE(cg.Create(64 * kMiB).ok());
  CgroupV1Source src(Env::Default(), cg.path());
  ASSERT_TRUE(src.Start().ok());
  EXPECT_EQ(src.name(), "cgroup-v1:" + cg.path());
  // No pressure yet: a zero wait reports nothing.
  PressureEvent ev;
  EXPECT_EQ(src.Wait(0, &ev).code(), Status::kTimeout);
  const std::string file = test::TempDir() + "/v1-thrash.bin";
  Child child;
  ASSERT_TRUE(child.Spawn(cg.path(), [&](int, int) { ThrashPageCache(file, 192 * kMiB); }).ok());
  Status st = Status::Timeout("");
  for (int i = 0; i < 120 && st.code() == Status::kTimeout; ++i) st = src.Wait(1000, &ev);  // hang guard 2 min
  int events = st.ok() ? 1 : 0;
  PressureLevel highest = st.ok() ? ev.level : PressureLevel::kNone;
  while (st.ok() && events < 20 && (st = src.Wait(200, &ev)).ok()) {  // collect a few more if they come
    ++events;
    highest = std::max(highest, ev.level);
  }
  child.Kill();
  ::unlink(file.c_str());
  ASSERT_GE(events, 1) << "no memory.pressure_level event while a child thrashed the page cache: " << st.ToString();
  EXPECT_GE(highest, PressureLevel::kLow);
  std::printf("%d events, highest %s\n", events, PressureLevelName(highest));
}

TEST(CgroupV1Kernel, RefusesNonCgroupAndStopWakesWait) {
  CgroupV1Source bad(Env::Default(), "/tmp");
  EXPECT_EQ(bad.Start().code(), Status::kUnsupported);
  const std::string skip = SkipReasonForCgroup();
  if (!skip.empty()) GTEST_SKIP() << skip;
  TestCgroup cg;
  ASSERT_TRUE(cg.Create(64 * kMiB).ok());
  CgroupV1Source src(Env::Default(), cg.path());
  ASSERT_TRUE(src.Start().ok());
  Status st;
  PressureEvent ev;
  std::thread t([&] { st = src.Wait(-1, &ev); });
  src.Stop();
  t.join();
  EXPECT_EQ(st.code(), Status::kCancelled);
  EXPECT_EQ(src.Wait(0, &ev).code(), Status::kCancelled);
}

// ---------------------------------------------------------------------------------------------
// Watermark

TEST(WatermarkLevelsFake, RiseAtOnceDropWithHysteresisRepeatWhileHigh) {
  PressureSourceOptions o;
  o.low_headroom = 0.30;
  o.medium_headroom = 0.15;
  o.critical_headroom = 0.05;
  o.headroom_hysteresis = 0.05;
  o.repeat_ms = 1000;
  FakeClockEnv env;
  double headroom = 0.9;
  WatermarkSource src(&env, o, [&](uint64_t* a, uint64_t* l) {
    *l = 1000;
    *a = uint64_t(headroom * 1000 + 0.5);
    return Status::Ok();
  }, "fake");
  ASSERT_TRUE(src.Start().ok());
  PressureEvent ev;
  auto poll = [&](double h) -> Status {
    headroom = h;
    env.now += 100'000'000;  // 100 ms per poll
    return src.Wait(0, &ev);
  };
  EXPECT_EQ(poll(0.9).code(), Status::kTimeout);  // no pressure: nothing (not even kNone)
  EXPECT_EQ(poll(0.5).code(), Status::kTimeout);
  ASSERT_TRUE(poll(0.25).ok());
  EXPECT_EQ(ev.level, PressureLevel::kLow);
  EXPECT_EQ(ev.time_ns, env.now.load());
  EXPECT_EQ(ev.source, "watermark:fake");
  EXPECT_EQ(poll(0.26).code(), Status::kTimeout);
  ASSERT_TRUE(poll(0.02).ok());  // straight to critical
  EXPECT_EQ(ev.level, PressureLevel::kCritical);
  // Recovering to 0.07 (above critical 0.05 but below 0.05 + 0.05): still critical, no event.
  EXPECT_EQ(poll(0.07).code(), Status::kTimeout);
  // 0.12: clears critical's margin, still below medium: medium.
  ASSERT_TRUE(poll(0.12).ok());
  EXPECT_EQ(ev.level, PressureLevel::kMedium);
  // 0.33 is above low's mark (0.30) but within its margin: low, not none.
  ASSERT_TRUE(poll(0.33).ok());
  EXPECT_EQ(ev.level, PressureLevel::kLow);
  // Staying low: re-reported every repeat_ms (1 s of fake time).
  int repeats = 0;
  for (int i = 0; i < 10; ++i) repeats += poll(0.33).ok();
  EXPECT_EQ(repeats, 1);
  EXPECT_EQ(ev.level, PressureLevel::kLow);
  // Recovered past low + margin: pressure gone.
  ASSERT_TRUE(poll(0.36).ok());
  EXPECT_EQ(ev.level, PressureLevel::kNone);
  EXPECT_EQ(poll(0.9).code(), Status::kTimeout);
  EXPECT_NEAR(src.last_headroom(), 0.9, 1e-9);
  // A failing sampler is an error, not an event.
  WatermarkSource broken(&env, o, [](uint64_t*, uint64_t*) { return Status::IOError("gone"); }, "broken");
  EXPECT_EQ(broken.Start().code(), Status::kIOError);
  // Bad marks are refused.
  PressureSourceOptions inv = o;
  inv.medium_headroom = 0.5;
  WatermarkSource bad(&env, inv, [](uint64_t* a, uint64_t* l) { *a = *l = 1; return Status::Ok(); }, "bad");
  EXPECT_EQ(bad.Start().code(), Status::kInvalidArgument);
}

TEST(WatermarkKernel, LevelsFollowCgroupUsageTowardsTheLimit) {
  const std::string skip = SkipReasonForCgroup();
  if (!skip.empty()) GTEST_SKIP() << skip;
  TestCgroup cg;
  ASSERT_TRUE(cg.Create(64 * kMiB).ok());
  PressureSourceOptions o;
  o.cgroup_dir = cg.path();
  o.low_headroom = 0.30;
  o.medium_headroom = 0.15;
  o.critical_headroom = 0.05;
  o.repeat_ms = 0;
  WatermarkSource src(Env::Default(), o);
  EXPECT_EQ(src.name(), "watermark:" + cg.path());
  ASSERT_TRUE(src.Start().ok());
  // The child keeps anonymous memory of (command byte) MiB populated, then acks. Raw syscalls and
  // MADV_POPULATE_WRITE, no instrumented stores: under a sanitizer the child's shadow memory
  // would otherwise be charged to the cgroup too.
  Child child;
  ASSERT_TRUE(child.Spawn(cg.path(), [](int cmd, int ack) {
                  const size_t cap = 64 * kMiB;
                  long r = ::syscall(SYS_mmap, nullptr, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                  if (r == -1) ::_exit(6);
                  char* p = reinterpret_cast<char*>(r);
                  size_t have = 0;
                  for (unsigned char c; ::read(cmd, &c, 1) == 1;) {
                    const size_t want = size_t(c) * kMiB;
                    if (want > have && ::syscall(SYS_madvise, p + have, want - have, kMadvPopulateWrite) != 0) {
                      for (size_t i = have; i < want; i += 4096) p[i] = 1;  // kernel < 5.14
                    } else if (want < have) {
                      ::syscall(SYS_madvise, p + want, have - want, MADV_DONTNEED);
                    }
                    have = want;
                    if (::write(ack, "k", 1) != 1) ::_exit(7);
                  }
                }).ok());
  struct StepCase {
    int mib;
    PressureLevel want;
  };
  // 64 MiB limit: headroom 50%, 25%, 12.5%, 3% (a little less: the child's other pages).
  const StepCase steps[] = {{32, PressureLevel::kNone}, {48, PressureLevel::kLow}, {56, PressureLevel::kMedium},
                            {62, PressureLevel::kCritical}, {20, PressureLevel::kNone}};
  PressureLevel level = PressureLevel::kNone;
  for (const StepCase& s : steps) {
    ASSERT_TRUE(child.Step(char(s.mib))) << "child died at " << s.mib << " MiB";
    PressureEvent ev;
    Status st = src.Wait(0, &ev);
    if (st.ok()) level = ev.level;
    else ASSERT_EQ(st.code(), Status::kTimeout) << st.ToString();
    EXPECT_EQ(level, s.want) << "at " << s.mib << " MiB of 64: headroom " << src.last_headroom();
  }
  child.Kill();
}

// ---------------------------------------------------------------------------------------------
// ManualSource

TEST(ManualSourceTest, PushWaitStop) {
  FakeClockEnv env;
  ManualSource src(&env);
  ASSERT_TRUE(src.Start().ok());
  PressureEvent ev;
  EXPECT_EQ(src.Wait(0, &ev).code(), Status::kTimeout);
  src.Push(PressureLevel::kMedium);
  src.Push(PressureLevel::kLow, 5 * kMiB);
  EXPECT_EQ(src.pending(), 2u);
  ASSERT_TRUE(src.Wait(0, &ev).ok());
  EXPECT_EQ(ev.level, PressureLevel::kMedium);
  EXPECT_EQ(ev.time_ns, env.now.load());
  EXPECT_EQ(ev.source, "manual");
  ASSERT_TRUE(src.Wait(0, &ev).ok());
  EXPECT_EQ(ev.bytes_hint, 5 * kMiB);
  Status st;
  std::thread t([&] { st = src.Wait(-1, &ev); });
  src.Stop();
  t.join();
  EXPECT_EQ(st.code(), Status::kCancelled);
  src.Push(PressureLevel::kLow);
  EXPECT_EQ(src.pending(), 0u);
  EXPECT_EQ(src.Start().code(), Status::kCancelled);
}

// ---------------------------------------------------------------------------------------------
// PressureMonitor: phases on a real (tiny) model with a manual source.

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
  std::vector<int32_t> toks;
};

Rig MakeRig(const char* tag) {
  Rig r;
  const std::string path = test::ModelPath("tiny-qwen3");
  EXPECT_TRUE(Model::Load(Env::Default(), path, ModelOptions(), &r.model).ok());
  ContextOptions co;
  co.n_ctx = 512;
  co.kv_chunk_tokens = 16;
  co.kv_codec = "none";  // lossless placements: logits must match bit for bit
  // The storage path only: the tiny model's KV (320 KiB) is far smaller than one 8 MiB segment of
  // the in-memory swap, which would make an eviction grow RAM instead of freeing it.
  co.hybrid = false;
  co.swap_path = test::TempDir() + "/pressure-" + tag + ".swap";
  r.ctx = std::make_unique<Context>(r.model.get(), co);
  EXPECT_TRUE(r.ctx->Init().ok());
  r.ctx->set_profile(DeviceProfile::Default());
  r.toks = test::PromptTokens(path, 168);
  return r;
}

std::vector<float> Logits(Context& c) {
  const int nv = int(c.model()->hparams().n_vocab);
  return std::vector<float>(c.logits(0), c.logits(0) + nv);
}

// Collects actions from on_action; waits (hang guard only) for the n-th.
struct ActionLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<PressureAction> got;
  std::vector<std::thread::id> threads;
  void Attach(PressureMonitor& m) {
    m.set_on_action([this](const PressureAction& a) {
      std::lock_guard<std::mutex> lk(mu);
      got.push_back(a);
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
    });
  }
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::minutes(2), [&] { return got.size() >= n; });
  }
};

double Remaining(Context& c) {
  MemoryReport r = c.Report();
  return double(r.in_memory() - r.base_resident) / double(r.footprint() - r.base_total);
}

TEST(PressureMonitorPhases, IdleEventIsAppliedAtOnceOnTheMonitorThread) {
  Rig r = MakeRig("idle");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 160, false).ok());
  auto src = std::make_unique<ManualSource>();
  ManualSource* manual = src.get();
  AmountOptions ao;
  ao.step_points = 0.25;
  PressureMonitor mon(r.ctx.get(), std::move(src), ao);
  ActionLog log;
  log.Attach(mon);
  ASSERT_TRUE(mon.Start().ok());
  manual->Push(PressureLevel::kLow);
  ASSERT_TRUE(log.WaitFor(1));
  mon.Stop();
  const PressureAction a = mon.actions().at(0);
  EXPECT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_FALSE(a.deferred);
  EXPECT_EQ(a.event.level, PressureLevel::kLow);
  EXPECT_DOUBLE_EQ(a.step_points, 0.25);
  EXPECT_NEAR(double(a.requested), 0.25 * double(a.llm_bytes), 1.0);
  EXPECT_GE(a.freed, a.requested);  // EvictBytes releases at least what was asked (units are whole)
  EXPECT_LT(a.remaining, 0.76);
  EXPECT_NEAR(a.remaining, Remaining(*r.ctx), 1e-9);
  EXPECT_NE(log.threads.at(0), std::this_thread::get_id());
}

// An event arriving while a Decode holds the context is queued (the context refuses with kBusy)
// and applied at the safe point right after that Decode, on the generating thread; the
// conversation continues with exactly the logits of a run that never saw pressure.
TEST(PressureMonitorPhases, EventDuringDecodeIsDeferredToTheSafePoint) {
  Rig ref = MakeRig("ref");
  ASSERT_TRUE(ref.ctx->Decode(ref.toks.data(), 160, false).ok());
  const auto want_prompt = Logits(*ref.ctx);
  ASSERT_TRUE(ref.ctx->Decode(ref.toks.data() + 160, 8, false).ok());
  const auto want_next = Logits(*ref.ctx);

  Rig r = MakeRig("defer");
  auto src = std::make_unique<ManualSource>();
  ManualSource* manual = src.get();
  AmountOptions ao;
  ao.step_points = 0.5;
  PressureMonitor mon(r.ctx.get(), std::move(src), ao);
  mon.set_tick_ms(3'600'000);  // the monitor thread only wakes for events: the safe point must apply it
  ActionLog log;
  log.Attach(mon);

  std::mutex mu;
  std::condition_variable cv;
  bool queued = false, monitor_back_waiting = false, pushed = false;
  std::atomic<bool> evict_refused{false};
  SyncPoints::SetCallback("pressure:queued", [&](int) {
    std::lock_guard<std::mutex> lk(mu);
    queued = true;
  });
  SyncPoints::SetCallback("pressure:wait", [&](int) {
    std::lock_guard<std::mutex> lk(mu);
    if (queued) monitor_back_waiting = true;
    cv.notify_all();
  });
  SyncPoints::SetCallback("context:decode_locked", [&](int n) {
    if (n != 160) return;
    // The context is held by this Decode: a direct eviction is refused...
    // (from another thread: this one owns the context's mutex)
    std::thread([&] { evict_refused = r.ctx->EvictBytes(1 << 20, nullptr).code() == Status::kBusy; }).join();
    // ...and the monitor queues the event; hold the Decode until the monitor is waiting again.
    manual->Push(PressureLevel::kMedium);
    std::unique_lock<std::mutex> lk(mu);
    pushed = true;
    cv.wait(lk, [&] { return monitor_back_waiting; });
  });
  ASSERT_TRUE(mon.Start().ok());
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 160, false).ok());
  // The hook ran before Decode returned: the eviction is done, on this thread.
  ASSERT_TRUE(pushed);
  EXPECT_TRUE(evict_refused.load());
  ASSERT_EQ(log.got.size(), 1u);
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  EXPECT_FALSE(mon.pending());
  const PressureAction a = log.got[0];
  EXPECT_TRUE(a.deferred);
  EXPECT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.event.level, PressureLevel::kMedium);
  EXPECT_GT(a.freed, 0u);
  EXPECT_LT(Remaining(*r.ctx), 1.0);
  // Never torn: the prompt's logits and the next step's equal the run without pressure.
  EXPECT_EQ(0, std::memcmp(Logits(*r.ctx).data(), want_prompt.data(), want_prompt.size() * 4));
  ASSERT_TRUE(r.ctx->Decode(r.toks.data() + 160, 8, false).ok());
  SyncPoints::ClearAll();
  mon.Stop();
  EXPECT_EQ(int(r.ctx->history().size()), 168);
  EXPECT_EQ(0, std::memcmp(Logits(*r.ctx).data(), want_next.data(), want_next.size() * 4));
  EXPECT_EQ(mon.actions().size(), 1u);
}

// With a declared generation, events below the pause level wait for its end; critical ones pause
// it at the next safe point. Driven synchronously with Submit (no monitor thread).
TEST(PressureMonitorPhases, DeclaredGenerationDefersUntilItsEndButCriticalPauses) {
  Rig r = MakeRig("gen");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 128, false).ok());
  FakeClockEnv env;
  AmountOptions ao;
  ao.step_points = 0.25;
  ao.floor_points = 0.2;
  PressureMonitor mon(r.ctx.get(), std::make_unique<ManualSource>(&env), ao, &env);
  mon.BeginGeneration();
  PressureEvent low;
  low.level = PressureLevel::kLow;
  low.time_ns = env.now;
  PressureAction a = mon.Submit(low);
  EXPECT_EQ(a.status.code(), Status::kBusy);
  EXPECT_TRUE(a.deferred);
  EXPECT_TRUE(mon.pending());
  EXPECT_DOUBLE_EQ(Remaining(*r.ctx), 1.0);
  // Safe points inside the generation do not apply it.
  for (int i = 128; i < 132; ++i) ASSERT_TRUE(r.ctx->Decode(&r.toks[size_t(i)], 1, false).ok());
  EXPECT_TRUE(mon.pending());
  EXPECT_TRUE(mon.actions().empty());
  EXPECT_DOUBLE_EQ(Remaining(*r.ctx), 1.0);
  mon.EndGeneration();
  EXPECT_FALSE(mon.pending());
  ASSERT_EQ(mon.actions().size(), 1u);
  EXPECT_TRUE(mon.actions()[0].deferred);
  EXPECT_GT(mon.actions()[0].freed, 0u);
  EXPECT_LT(Remaining(*r.ctx), 1.0);

  // Critical during a generation: applied now (Submit runs between steps), down to the floor.
  ASSERT_TRUE(r.ctx->Decode(&r.toks[132], 1, false).ok());  // restores everything
  EXPECT_DOUBLE_EQ(Remaining(*r.ctx), 1.0);
  mon.BeginGeneration();
  env.now += 10 * kSec;
  PressureEvent crit;
  crit.level = PressureLevel::kCritical;
  crit.time_ns = env.now;
  a = mon.Submit(crit);
  EXPECT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_FALSE(a.deferred);
  EXPECT_LT(a.remaining, 0.2 + 0.4) << "critical gives back down to the floor (within one unit of it)";
  EXPECT_GE(a.remaining, 0.2) << "floor crossed";
  mon.EndGeneration();
  EXPECT_EQ(mon.actions().size(), 2u);
  // The conversation goes on.
  ASSERT_TRUE(r.ctx->Decode(&r.toks[133], 1, false).ok());
  EXPECT_EQ(int(r.ctx->history().size()), 134);
}

TEST(PressureMonitorPhases, MergedAndFloorEventsAreRecordedWithTheReason) {
  Rig r = MakeRig("merge");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 128, false).ok());
  FakeClockEnv env;
  AmountOptions ao;
  ao.step_points = 0.3;
  ao.escalation = 1.0;
  ao.floor_points = 0.2;
  PressureMonitor mon(r.ctx.get(), std::make_unique<ManualSource>(&env), ao, &env);
  auto ev = [&](PressureLevel l, uint64_t dt) {
    env.now += dt;
    PressureEvent e;
    e.level = l;
    e.time_ns = env.now;
    return mon.Submit(e);
  };
  PressureAction a = ev(PressureLevel::kLow, 0);
  EXPECT_GT(a.freed, 0u);
  EXPECT_GE(a.remaining, 0.2) << "floor crossed";
  a = ev(PressureLevel::kLow, kSec / 10);
  EXPECT_EQ(a.requested, 0u);
  EXPECT_EQ(a.note, "merged (hysteresis)");
  // Events far apart keep giving back until the floor; units move whole, so the monitor stops
  // within one unit above it rather than cross it.
  int evictions = 0;
  for (int i = 0; i < 10 && a.note != "at floor"; ++i) {
    a = ev(PressureLevel::kLow, 10 * kSec);
    evictions += a.freed > 0;
    EXPECT_GE(a.remaining, 0.2) << "floor crossed at event " << i;
  }
  EXPECT_EQ(a.note, "at floor");
  EXPECT_EQ(a.requested, 0u);
  EXPECT_GE(Remaining(*r.ctx), 0.2);
  // Identical nothing-done events coalesce into one entry (sustained kernel pressure fires many).
  const size_t n = mon.actions().size();
  ev(PressureLevel::kLow, 10 * kSec);
  ev(PressureLevel::kLow, 10 * kSec);
  ASSERT_EQ(mon.actions().size(), n);
  EXPECT_EQ(mon.actions().back().repeats, 2u);
  a = ev(PressureLevel::kCritical, 10 * kSec);
  EXPECT_EQ(a.note, "at floor");
  a = ev(PressureLevel::kNone, 10 * kSec);
  EXPECT_EQ(a.note, "pressure gone");
  EXPECT_EQ(mon.actions().size(), n + 2);
  std::printf("%d further evictions before the floor; remaining %.3f\n", evictions, Remaining(*r.ctx));
}

TEST(PressureMonitorPhases, BackgroundRestoreAheadAfterCalm) {
  Rig r = MakeRig("ahead");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 128, false).ok());
  FakeClockEnv env;
  auto src = std::make_unique<ManualSource>(&env);
  AmountOptions ao;
  ao.step_points = 0.5;
  ao.restore_ahead = AmountOptions::RestoreAhead::kBackground;
  ao.calm_ns = 30 * kSec;
  PressureMonitor mon(r.ctx.get(), std::move(src), ao, &env);
  mon.set_tick_ms(1);
  ActionLog log;
  log.Attach(mon);
  PressureEvent e;
  e.level = PressureLevel::kLow;
  e.time_ns = env.now;
  ASSERT_GT(mon.Submit(e).freed, 0u);  // before Start: the fake clock is frozen, no tick can restore
  ASSERT_LT(Remaining(*r.ctx), 1.0);
  ASSERT_TRUE(mon.Start().ok());
  env.now += 31 * kSec;  // calm long enough: the next tick restores
  ASSERT_TRUE(log.WaitFor(2));
  mon.Stop();
  const PressureAction b = log.got[1];
  EXPECT_TRUE(b.restored);
  EXPECT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_DOUBLE_EQ(b.remaining, 1.0);
  EXPECT_DOUBLE_EQ(Remaining(*r.ctx), 1.0);
}

// A fake cgroup for restore-ahead's fit check: the limit is set by the test, the usage is what
// the context holds in RAM now (so every restored slice uses up headroom, as in a real cgroup).
class FakeCgroupSource : public ManualSource {
 public:
  FakeCgroupSource(Env* env, Context* ctx) : ManualSource(env, "fake-cgroup"), ctx_(ctx) {}
  Status Headroom(uint64_t* avail, uint64_t* limit) override {
    MemoryReport r;
    if (!ctx_->TryReport(&r)) return Status::Busy("context busy");
    *limit = limit_bytes.load();
    *avail = (*limit > r.in_memory() ? *limit - r.in_memory() : 0) + cache_credit.load();
    return Status::Ok();
  }
  // Page cache the kernel would count as reclaimable (Headroom credits it, as the cgroup sources
  // credit inactive file pages); FreeBeforeReclaim does not.
  Status FreeBeforeReclaim(uint64_t* avail, uint64_t* limit) override {
    MZ_RETURN_IF_ERROR(Headroom(avail, limit));
    const uint64_t c = cache_credit.load();
    *avail = *avail > c ? *avail - c : 0;
    return Status::Ok();
  }
  std::atomic<uint64_t> limit_bytes{0};
  std::atomic<uint64_t> cache_credit{0};  // added to Headroom's available, not FreeBeforeReclaim's

 private:
  Context* ctx_;
};

// True if the resident units form a prefix of the restore order (base, layer 0 weights, its KV
// chunks, layer 1, ...): restore-ahead brings front layers back first.
bool ResidentIsForwardPrefix(Context& c) {
  const UnitTable& e = c.units();
  std::vector<UnitRef> order{UnitRef::Weights(-1)};
  for (int l = 0; l < int(c.model()->hparams().n_layer); ++l) {
    order.push_back(UnitRef::Weights(l));
    for (int ch = 0; e.has_chunk(l, ch); ++ch) order.push_back(UnitRef::Kv(l, ch));
  }
  bool gap = false;
  for (const UnitRef& u : order) {
    const bool res = e.state(u) == UnitState::kResident;
    if (res && gap) return false;
    gap |= !res;
  }
  return true;
}

TEST(PressureMonitorPhases, RestoreAheadRestoresWhatFitsFrontLayersFirst) {
  Rig r = MakeRig("fit");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 128, false).ok());
  const std::vector<float> ref = Logits(*r.ctx);
  r.ctx->Truncate(0);
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 120, false).ok());
  FakeClockEnv env;
  auto owned = std::make_unique<FakeCgroupSource>(&env, r.ctx.get());
  FakeCgroupSource* src = owned.get();
  AmountOptions ao;
  ao.step_points = 1.0;  // everything goes
  ao.restore_ahead = AmountOptions::RestoreAhead::kBackground;
  ao.calm_ns = 5 * kSec;
  ao.restore_margin = 0.0;
  ao.restore_slice_bytes = 0;  // the fit check alone limits a slice
  PressureMonitor mon(r.ctx.get(), std::move(owned), ao, &env);
  mon.set_tick_ms(1);
  PressureEvent e;
  e.level = PressureLevel::kLow;
  e.time_ns = env.now;
  ASSERT_GT(mon.Submit(e).freed, 0u);
  const MemoryReport evicted = r.ctx->Report();
  const uint64_t llm = evicted.footprint() - evicted.base_total;
  ASSERT_LT(Remaining(*r.ctx), 0.2);
  auto wait_for = [&](auto pred) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!pred() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return pred();
  };
  auto has_note = [&](const char* note) {
    for (const PressureAction& a : mon.actions())
      if (a.note == note) return true;
    return false;
  };
  auto any_restored = [&] {
    for (const PressureAction& a : mon.actions())
      if (a.restored) return true;
    return false;
  };
  // Ticks seen so far (the waiting action is coalesced: its repeats count the ticks).
  auto ticks = [&] {
    const auto v = mon.actions();
    return v.empty() ? 0u : v.back().repeats;
  };
  auto let_tick = [&] {
    const uint32_t t0 = ticks();
    ASSERT_TRUE(wait_for([&] { return ticks() >= t0 + 3; }));
  };
  // An app left room for 80% of the LLM memory and is still allocating: restore-ahead first waits
  // for a stable window; the app then takes half of that room before pressure rises, which
  // restarts the window, so nothing is restored into the app's way.
  src->limit_bytes = evicted.in_memory() + llm * 4 / 5;
  ASSERT_TRUE(mon.Start().ok());
  env.now += 6 * kSec;  // calm since the eviction event: the window starts now
  ASSERT_TRUE(wait_for([&] { return has_note("restore-ahead waits until free memory stops shrinking"); }));
  env.now += 4 * kSec;  // 4 s into the window (calm is 5 s)
  let_tick();
  const uint64_t limit = evicted.in_memory() + llm * 2 / 5;
  src->limit_bytes = limit;  // the app takes memory
  let_tick();
  env.now += 2 * kSec;  // 6 s after the window began, 2 s after the shrink
  let_tick();
  EXPECT_FALSE(any_restored());
  EXPECT_EQ(r.ctx->Report().in_memory(), evicted.in_memory());
  // Stable for longer than calm: a forward prefix that fits comes back and stays within the limit.
  env.now += 4 * kSec;
  ASSERT_TRUE(wait_for(any_restored));
  // Let it tick a while longer: nothing more fits, so nothing more is restored.
  const auto settle = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < settle) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(wait_for([&] { return has_note("restore-ahead waits for headroom"); }));
  MemoryReport part;
  ASSERT_TRUE(wait_for([&] { return r.ctx->TryReport(&part); }));
  EXPECT_LE(part.in_memory(), limit);
  EXPECT_GT(part.in_memory(), evicted.in_memory());
  EXPECT_TRUE(ResidentIsForwardPrefix(*r.ctx));
  uint64_t restored = 0;
  for (const PressureAction& a : mon.actions())
    if (a.restored) {
      EXPECT_TRUE(a.status.ok()) << a.status.ToString();
      restored += a.restored_bytes;
    }
  EXPECT_EQ(restored, part.in_memory() - evicted.in_memory());
  // The apps are gone: everything comes back, and the context answers as if never evicted.
  src->limit_bytes = UINT64_MAX / 2;
  ASSERT_TRUE(wait_for([&] { return Remaining(*r.ctx) == 1.0; }));
  mon.Stop();
  ASSERT_TRUE(r.ctx->Decode(r.toks.data() + 120, 8, false).ok());
  EXPECT_EQ(Logits(*r.ctx), ref);
}

// Backgrounding (issue 49): the app leaves the screen and Android sends onTrimMemory(UI_HIDDEN),
// then BACKGROUND, then COMPLETE. Through the mapping mz_on_trim_memory uses (mz_api::TrimLevel),
// what is given back grows with the level: nothing for UI_HIDDEN (no memory asked for), one
// escalated step for BACKGROUND, everything above the base unit for COMPLETE, after which the
// context holds no anonymous KV. On return the memory comes back front layers first, and the
// conversation goes on with the logits it would have had, bit for bit.
TEST(PressureMonitorPhases, BackgroundingGivesBackMoreAtEachLevelAndReturnsFrontFirst) {
  Rig r = MakeRig("background");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 128, false).ok());
  const std::vector<float> ref = Logits(*r.ctx);
  r.ctx->Truncate(0);
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 120, false).ok());
  PressureMonitor mon(r.ctx.get(), std::make_unique<ManualSource>(), AmountOptions());
  const MemoryReport before = r.ctx->Report();
  const uint64_t llm = before.footprint() - before.base_total;
  ASSERT_GT(before.kv_resident, 0u);
  std::vector<uint64_t> given;  // bytes given back in all after each level
  for (int32_t level : {MZ_TRIM_MEMORY_UI_HIDDEN, MZ_TRIM_MEMORY_BACKGROUND, MZ_TRIM_MEMORY_COMPLETE}) {
    PressureEvent e;
    if (mz_api::TrimLevel(level, &e.level)) {
      e.time_ns = Env::Default()->NowNs();
      e.source = "onTrimMemory(" + std::to_string(level) + ")";
      const PressureAction a = mon.Submit(e);
      EXPECT_TRUE(a.status.ok()) << level << ": " << a.status.ToString();
    }
    given.push_back(before.in_memory() - r.ctx->Report().in_memory());
  }
  EXPECT_EQ(given[0], 0u);                          // UI_HIDDEN: nothing asked for
  EXPECT_GE(double(given[1]), 0.375 * double(llm) - 1.0);  // BACKGROUND: one escalated step (25 x 1.5 points)
  EXPECT_LT(given[1], llm);
  EXPECT_GT(given[2], given[1]);                    // COMPLETE: the rest
  const MemoryReport gone = r.ctx->Report();
  EXPECT_EQ(gone.kv_resident, 0u);                  // no anonymous KV left: it is on storage
  EXPECT_EQ(gone.in_memory(), gone.base_resident);  // only the base unit (embeddings, head) stays
  EXPECT_EQ(Remaining(*r.ctx), 0.0);
  // The return: a first slice brings back a forward prefix (layer 0's weights and KV first), not
  // the last layers; then the rest.
  uint64_t restored = 0;
  ASSERT_TRUE(r.ctx->TryRestoreUpTo(llm / 3, &restored, false).ok());
  EXPECT_GT(restored, 0u);
  EXPECT_LE(restored, llm / 3);
  EXPECT_TRUE(ResidentIsForwardPrefix(*r.ctx));
  const int last = int(r.model->hparams().n_layer) - 1;
  EXPECT_EQ(r.ctx->units().state(UnitRef::Weights(0)), UnitState::kResident);
  EXPECT_NE(r.ctx->units().state(UnitRef::Weights(last)), UnitState::kResident);
  ASSERT_TRUE(r.ctx->Restore().ok());
  EXPECT_EQ(Remaining(*r.ctx), 1.0);
  ASSERT_TRUE(r.ctx->Decode(r.toks.data() + 120, 8, false).ok());
  EXPECT_EQ(Logits(*r.ctx), ref);
}

// Restore-ahead fills only what can be allocated before the cgroup reclaims: inactive page cache
// (which includes the LLM's own units just restored) is not room, since filling it makes the
// kernel reclaim, which raises the next pressure event by itself.
TEST(PressureMonitorPhases, RestoreAheadDoesNotCountPageCacheAsRoom) {
  Rig r = MakeRig("strict");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 120, false).ok());
  FakeClockEnv env;
  auto owned = std::make_unique<FakeCgroupSource>(&env, r.ctx.get());
  FakeCgroupSource* src = owned.get();
  AmountOptions ao;
  ao.step_points = 1.0;
  ao.restore_ahead = AmountOptions::RestoreAhead::kBackground;
  ao.calm_ns = 1 * kSec;
  ao.restore_margin = 0.0;
  ao.restore_slice_bytes = 0;
  PressureMonitor mon(r.ctx.get(), std::move(owned), ao, &env);
  mon.set_tick_ms(1);
  PressureEvent e;
  e.level = PressureLevel::kLow;
  e.time_ns = env.now;
  ASSERT_GT(mon.Submit(e).freed, 0u);
  const MemoryReport evicted = r.ctx->Report();
  const uint64_t llm = evicted.footprint() - evicted.base_total;
  const uint64_t limit = evicted.in_memory() + llm * 2 / 5;
  src->limit_bytes = limit;
  src->cache_credit = llm;  // Headroom alone would say everything fits
  ASSERT_TRUE(mon.Start().ok());
  auto restored_any = [&] {
    for (const PressureAction& a : mon.actions())
      if (a.restored) return true;
    return false;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!restored_any() && std::chrono::steady_clock::now() < until) {
    env.now += kSec / 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(restored_any());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // more ticks: nothing more fits
  mon.Stop();
  const MemoryReport after = r.ctx->Report();
  EXPECT_GT(after.in_memory(), evicted.in_memory());
  EXPECT_LE(after.in_memory(), limit) << "restore-ahead filled page cache it counted as free";
  EXPECT_LT(Remaining(*r.ctx), 1.0);
}

class FailingSource : public PressureSource {
 public:
  std::string name() const override { return "failing"; }
  Status Start() override { return Status::Ok(); }
  Status Wait(int, PressureEvent*) override { return Status::IOError("cgroup removed"); }
  void Stop() override {}
};

TEST(PressureMonitorPhases, SourceErrorIsRecordedAndEndsTheThread) {
  Rig r = MakeRig("fail");
  PressureMonitor mon(r.ctx.get(), std::make_unique<FailingSource>(), AmountOptions());
  ActionLog log;
  log.Attach(mon);
  ASSERT_TRUE(mon.Start().ok());
  ASSERT_TRUE(log.WaitFor(1));
  mon.Stop();
  ASSERT_EQ(mon.actions().size(), 1u);
  EXPECT_EQ(mon.actions()[0].status.code(), Status::kIOError);
  EXPECT_EQ(mon.actions()[0].requested, 0u);
}

// A monitor whose thread the OS refuses says so (kNoMemory), stops its source and never acts;
// the context goes on without it.
TEST(PressureMonitorPhases, RefusedThreadFailsStartCleanly) {
  Rig r = MakeRig("thr");
  FaultEnv env(Env::Default());
  auto src = std::make_unique<ManualSource>(&env);
  ManualSource* manual = src.get();
  PressureMonitor mon(r.ctx.get(), std::move(src), AmountOptions(), &env);
  env.fail_threads_after = 0;
  Status st = mon.Start();
  env.fail_threads_after = -1;
  EXPECT_EQ(st.code(), Status::kNoMemory) << st.ToString();
  EXPECT_NE(st.message().find("pressure monitor"), std::string::npos) << st.ToString();
  EXPECT_EQ(env.threads_refused.load(), 1);
  PressureEvent ev;
  EXPECT_EQ(manual->Wait(0, &ev).code(), Status::kCancelled) << "the source was stopped";
  mon.Stop();  // nothing to join
  EXPECT_TRUE(mon.actions().empty());
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 8, false).ok());
}

// The wiring the CLI and bench multitask's worker share: the chosen source (wrapped when asked),
// the amount policy and the action callback are what the running monitor uses; a failure leaves
// nothing running.
TEST(PressureWiring, StartPressureMonitorBuildsWhatTheToolsUsed) {
  Rig r = MakeRig("wiring");
  ASSERT_TRUE(r.ctx->Decode(r.toks.data(), 160, false).ok());
  FaultEnv env(Env::Default());
  PressureWatchOptions w;
  w.source.kind = "manual";
  w.amount.step_points = 0.25;
  ManualSource* manual = nullptr;
  int wrapped = 0;
  w.wrap_source = [&](std::unique_ptr<PressureSource> src) {
    ++wrapped;
    manual = dynamic_cast<ManualSource*>(src.get());
    return src;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<PressureAction> seen;
  w.on_action = [&](const PressureAction& a) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back(a);
    cv.notify_all();
  };
  std::unique_ptr<PressureMonitor> mon;
  std::string why;
  Status st = StartPressureMonitor(&env, r.ctx.get(), w, &mon, &why);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(mon);
  EXPECT_EQ(wrapped, 1);
  ASSERT_NE(manual, nullptr);
  EXPECT_NE(why.find("manual"), std::string::npos) << why;
  EXPECT_DOUBLE_EQ(mon->amount_options().step_points, 0.25);
  EXPECT_EQ(env.threads_started.load(), 1);  // the monitor's thread came from the Env given
  manual->Push(PressureLevel::kLow);
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::minutes(2), [&] { return !seen.empty(); }));  // hang guard
  }
  mon->Stop();
  EXPECT_EQ(seen.at(0).event.level, PressureLevel::kLow);
  EXPECT_GT(seen.at(0).requested, 0u);
  mon.reset();

  // An unknown kind: the factory's error, no monitor.
  w.source.kind = "bogus";
  st = StartPressureMonitor(&env, r.ctx.get(), w, &mon, &why);
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  EXPECT_FALSE(mon);
  // A refused thread: the monitor's Start error, no monitor.
  w.source.kind = "manual";
  env.fail_threads_after = 0;
  st = StartPressureMonitor(&env, r.ctx.get(), w, &mon, &why);
  env.fail_threads_after = -1;
  EXPECT_EQ(st.code(), Status::kNoMemory) << st.ToString();
  EXPECT_FALSE(mon);
}

}  // namespace
}  // namespace mz
