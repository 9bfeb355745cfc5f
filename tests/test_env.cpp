// The Env as the one seam to the OS: small kernel files, environment variables, clocks and the
// wake-up handles, through FaultEnv's fakes and injected faults. What these tests show: the
// watermark source and the sysfs helpers read only what the Env serves (a fake /proc and cgroup
// tree), an injected failure comes back as a Status that names what failed, and the cache-directory
// rule reads MZ_CACHE_DIR / HOME through the Env. No sleeps decide anything here.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include <unistd.h>

#include "env/env.h"
#include "env/fault_env.h"
#include "policy/device_profile.h"
#include "pressure/cgroup_v1_source.h"
#include "pressure/pressure_source.h"
#include "pressure/sysfs.h"
#include "pressure/watermark_source.h"

namespace mz {
namespace {

constexpr uint64_t kKiB = 1024;

// /proc/meminfo with MemTotal and MemAvailable in kB (the kernel's format).
std::string Meminfo(uint64_t total_kb, uint64_t avail_kb) {
  return "MemTotal:       " + std::to_string(total_kb) + " kB\nMemFree:          1000 kB\nMemAvailable:   " +
         std::to_string(avail_kb) + " kB\nBuffers:            10 kB\n";
}

// A FaultEnv that sees only its fake /proc and /sys (never the machine's).
struct FakeMachine {
  FaultEnv env{Env::Default()};
  FakeMachine() {
    env.HideRealFilesUnder("/proc/");
    env.HideRealFilesUnder("/sys/");
    env.HideRealFilesUnder("/fake/");
  }
};

TEST(EnvFakeFiles, WatermarkSourceReadsTheFakeMeminfo) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/meminfo", Meminfo(1000000, 20000));  // 2% free: critical
  PressureSourceOptions o;
  o.kind = "watermark";
  WatermarkSource w(&m.env, o);
  EXPECT_EQ(w.name(), "watermark:/proc/meminfo");
  uint64_t avail = 0, limit = 0;
  ASSERT_TRUE(w.Headroom(&avail, &limit).ok());
  EXPECT_EQ(limit, 1000000 * kKiB);
  EXPECT_EQ(avail, 20000 * kKiB);
  ASSERT_TRUE(w.Start().ok());
  PressureEvent ev;
  Status st = w.Wait(0, &ev);  // one sample, no sleep
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ev.level, PressureLevel::kCritical);
  EXPECT_NEAR(w.last_headroom(), 0.02, 1e-9);
  // The next sample sees what the fake file says now: plenty free, the level drops to none.
  m.env.SetFakeFile("/proc/meminfo", Meminfo(1000000, 900000));
  st = w.Wait(0, &ev);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ev.level, PressureLevel::kNone);
}

TEST(EnvFakeFiles, WatermarkSamplesAFakeCgroupV2AndV1) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/meminfo", Meminfo(8000000, 4000000));
  // v2: limit 100 MiB, 90 MiB charged of which 10 MiB inactive page cache: 20 MiB free.
  m.env.SetFakeFile("/fake/v2/memory.max", std::to_string(100ull << 20) + "\n");
  m.env.SetFakeFile("/fake/v2/memory.current", std::to_string(90ull << 20) + "\n");
  m.env.SetFakeFile("/fake/v2/memory.stat", "anon 1\ninactive_file " + std::to_string(10ull << 20) + "\n");
  std::string what;
  auto v2 = WatermarkSource::DefaultSampler(&m.env, "/fake/v2", &what);
  EXPECT_EQ(what, "/fake/v2");
  uint64_t avail = 0, limit = 0;
  ASSERT_TRUE(v2(&avail, &limit).ok());
  EXPECT_EQ(limit, 100ull << 20);
  EXPECT_EQ(avail, 20ull << 20);
  // The limit lifted ("max" does not parse): the system's headroom from /proc/meminfo.
  m.env.SetFakeFile("/fake/v2/memory.max", "max\n");
  ASSERT_TRUE(v2(&avail, &limit).ok());
  EXPECT_EQ(limit, 8000000 * kKiB);
  EXPECT_EQ(avail, 4000000 * kKiB);

  // v1: limit 64 MiB, usage 60 MiB with 8 MiB total_inactive_file: 12 MiB free.
  m.env.SetFakeFile("/fake/v1/memory.limit_in_bytes", std::to_string(64ull << 20));
  m.env.SetFakeFile("/fake/v1/memory.usage_in_bytes", std::to_string(60ull << 20));
  m.env.SetFakeFile("/fake/v1/memory.stat", "cache 5\ntotal_inactive_file " + std::to_string(8ull << 20) + "\n");
  auto v1 = WatermarkSource::DefaultSampler(&m.env, "/fake/v1", &what);
  EXPECT_EQ(what, "/fake/v1");
  ASSERT_TRUE(v1(&avail, &limit).ok());
  EXPECT_EQ(limit, 64ull << 20);
  EXPECT_EQ(avail, 12ull << 20);

  // A cgroup without a limit file: /proc/meminfo, and the description says why.
  auto none = WatermarkSource::DefaultSampler(&m.env, "/fake/nolimit", &what);
  EXPECT_EQ(what, "/proc/meminfo (/fake/nolimit has no limit)");
  ASSERT_TRUE(none(&avail, &limit).ok());
  EXPECT_EQ(limit, 8000000 * kKiB);
}

TEST(EnvFakeFiles, SysfsHelpersFindTheFakeCgroups) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/self/mounts",
                    "sysfs /sys sysfs rw 0 0\n"
                    "cgroup2 /fake/unified cgroup2 rw,nosuid 0 0\n"
                    "cgroup /fake/cpu cgroup rw,cpu,cpuacct 0 0\n"
                    "cgroup /fake/memory cgroup rw,nosuid,memory 0 0\n");
  m.env.SetFakeFile("/proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:/apps/llm\n0::/user.slice\n");
  m.env.SetFakeFile("/fake/memory/apps/llm/memory.pressure_level", "");
  m.env.SetFakeFile("/fake/memory/apps/llm/cgroup.event_control", "");
  EXPECT_EQ(sysfs::V1MemoryMount(&m.env), "/fake/memory");
  EXPECT_EQ(sysfs::V2Mount(&m.env), "/fake/unified");
  EXPECT_EQ(sysfs::OwnV1MemoryCgroup(&m.env), "/fake/memory/apps/llm");
  EXPECT_EQ(sysfs::OwnV2Cgroup(&m.env), "/fake/unified/user.slice");
  EXPECT_TRUE(sysfs::IsV1MemoryCgroup(&m.env, "/fake/memory/apps/llm"));
  EXPECT_FALSE(sysfs::IsV1MemoryCgroup(&m.env, "/fake/memory/apps"));
  // A cgroup v1 directory is watchable when both control files are there (and writable).
  std::string why;
  EXPECT_TRUE(CgroupV1Source::Probe(&m.env, "/fake/memory/apps/llm", &why)) << why;
  EXPECT_FALSE(CgroupV1Source::Probe(&m.env, "/fake/memory/apps", &why));
  EXPECT_NE(why.find("not a cgroup v1 memory cgroup"), std::string::npos) << why;

  // CapEff bit 24 is CAP_SYS_RESOURCE.
  m.env.SetFakeFile("/proc/self/status", "Name:\ttest\nCapEff:\t0000000001000000\n");
  EXPECT_TRUE(sysfs::HasCapSysResource(&m.env));
  m.env.SetFakeFile("/proc/self/status", "Name:\ttest\nCapEff:\t0000000000000000\n");
  EXPECT_FALSE(sysfs::HasCapSysResource(&m.env));
  // The machine's own files are hidden: no mounts file, no cgroups.
  m.env.RemoveFakeFile("/proc/self/mounts");
  EXPECT_EQ(sysfs::V1MemoryMount(&m.env), "");
  EXPECT_EQ(sysfs::OwnV1MemoryCgroup(&m.env), "");
}

// The factory probes through the Env too: on a fake machine without PSI or a v1 cgroup, "auto"
// falls back to the watermark poller on the fake /proc/meminfo and says why.
TEST(EnvFakeFiles, AutoDetectionProbesThroughTheEnv) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/meminfo", Meminfo(1000000, 500000));
  std::unique_ptr<PressureSource> src;
  std::string why;
  PressureSourceOptions o;
  ASSERT_TRUE(CreatePressureSource(&m.env, o, &src, &why).ok());
  EXPECT_EQ(src->name(), "watermark:/proc/meminfo");
  EXPECT_NE(why.find("/proc/pressure/memory does not exist"), std::string::npos) << why;
  uint64_t avail = 0, limit = 0;
  ASSERT_TRUE(src->Headroom(&avail, &limit).ok());
  EXPECT_EQ(avail, 500000 * kKiB);
  // Asked for PSI explicitly: kUnsupported with the reason.
  o.kind = "psi";
  Status st = CreatePressureSource(&m.env, o, &src, &why);
  EXPECT_EQ(st.code(), Status::kUnsupported) << st.ToString();
}

// A v1 cgroup with a limit: Headroom credits its inactive page cache as available (reclaimed
// cheaply); FreeBeforeReclaim does not (what restore-ahead may fill without the kernel reclaiming,
// which would itself raise a pressure event).
TEST(EnvFakeFiles, FreeBeforeReclaimCountsNoPageCache) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/meminfo", Meminfo(24000000, 20000000));
  const std::string cg = "/fake/memory/llm";
  m.env.SetFakeFile(cg + "/memory.limit_in_bytes", std::to_string(1000 << 20));
  m.env.SetFakeFile(cg + "/memory.usage_in_bytes", std::to_string(900 << 20));
  m.env.SetFakeFile(cg + "/memory.stat", "cache 400000000\ntotal_inactive_file " + std::to_string(300 << 20) + "\n");
  PressureSourceOptions o;
  o.kind = "watermark";
  o.cgroup_dir = cg;
  WatermarkSource w(&m.env, o);
  uint64_t avail = 0, limit = 0;
  ASSERT_TRUE(w.Headroom(&avail, &limit).ok());
  EXPECT_EQ(limit, uint64_t(1000) << 20);
  EXPECT_EQ(avail, uint64_t(400) << 20) << "limit - (usage - inactive file)";
  ASSERT_TRUE(w.FreeBeforeReclaim(&avail, &limit).ok());
  EXPECT_EQ(avail, uint64_t(100) << 20) << "limit - usage: no page cache counts as free";
  // Without a limit below the machine's memory: both are MemAvailable.
  WatermarkSource g(&m.env, PressureSourceOptions());
  ASSERT_TRUE(g.FreeBeforeReclaim(&avail, &limit).ok());
  EXPECT_EQ(avail, 20000000 * kKiB);
}

TEST(EnvFakeFiles, ParseFieldReadsProcStatusAndMeminfo) {
  uint64_t v = 0;
  const std::string status = "Name:\tx\nVmRSS:\t    1234 kB\nVmRSSx:\t1 kB\nVmSwap:\t       0 kB\n";
  ASSERT_TRUE(sysfs::ParseField(status, "VmRSS", &v));
  EXPECT_EQ(v, 1234 * kKiB);
  ASSERT_TRUE(sysfs::ParseField(status, "VmSwap", &v));
  EXPECT_EQ(v, 0u);
  EXPECT_FALSE(sysfs::ParseField(status, "VmHWM", &v));
  ASSERT_TRUE(sysfs::ParseField("inactive_file 4096\n", "inactive_file", &v));
  EXPECT_EQ(v, 4096u);  // no unit: bytes
}

TEST(EnvFaults, AnInjectedReadFailureNamesTheFile) {
  FakeMachine m;
  m.env.SetFakeFile("/proc/meminfo", Meminfo(1000, 500));
  PressureSourceOptions o;
  WatermarkSource w(&m.env, o);
  m.env.fail_small_reads_after = 0;
  uint64_t avail = 0, limit = 0;
  Status st = w.Headroom(&avail, &limit);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("/proc/meminfo"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
  // The fault fired once: the next sample reads again.
  EXPECT_TRUE(w.Headroom(&avail, &limit).ok());
  // A missing counter file is an error naming it too (not a silent zero).
  m.env.RemoveFakeFile("/proc/meminfo");
  st = w.Headroom(&avail, &limit);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/meminfo"), std::string::npos) << st.ToString();
  // A file without the fields: kUnsupported naming the field.
  m.env.SetFakeFile("/proc/meminfo", "MemTotal: 1000 kB\n");
  st = w.Headroom(&avail, &limit);
  EXPECT_EQ(st.code(), Status::kUnsupported) << st.ToString();
  EXPECT_NE(st.message().find("MemAvailable"), std::string::npos) << st.ToString();
}


// PopulateMapped with the file offset: where the mapping and the file are congruent modulo 2 MiB
// the interior is read in 2 MiB folios (a different kernel path from the 4 KiB way); either way
// every byte mapped is the file's and every page is in RAM when it returns. Offsets cover an
// unaligned head and tail, and a mapping that is not congruent (the 4 KiB way throughout).
TEST(EnvPageCache, PopulateMappedMapsTheFileWhetherOrNotItIsCongruent) {
  Env* env = Env::Default();
  const std::string path = ::testing::TempDir() + "/mz_env_populate_" + std::to_string(::getpid());
  constexpr size_t kPmd = Env::kPmdBytes, kFile = 5 * kPmd + 3 * 4096;
  std::string data(kFile, '\0');
  for (size_t i = 0; i < kFile; ++i) data[i] = char((i * 2654435761u) >> 13);
  ASSERT_TRUE(env->WriteSmallFile(path, data, true).ok());
  std::unique_ptr<File> f;
  ASSERT_TRUE(env->Open(path, OpenMode::kRead, false, &f).ok());
  for (size_t skew : {size_t(0), size_t(4096)}) {
    const uint64_t off = 3 * 4096;  // the head: 2 MiB - 12 KiB before the first aligned block
    const size_t len = kFile - off;
    char* raw = static_cast<char*>(env->MapAnon(len + 2 * kPmd));
    ASSERT_NE(raw, nullptr);
    const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
    char* at = raw + ((off % kPmd + kPmd - a % kPmd) % kPmd) + skew;
    ASSERT_TRUE(env->DropCached(f.get(), 0, kFile).ok());
    ASSERT_TRUE(env->MapFileAt(f.get(), off, len, at, false).ok());
    Status st = env->PopulateMapped(f.get(), at, len, off);
    ASSERT_TRUE(st.ok()) << st.ToString();
    uint64_t in_ram = 0;
    ASSERT_TRUE(env->ResidentBytes(at, len, &in_ram).ok());
    EXPECT_EQ(in_ram, len) << "skew " << skew;
    EXPECT_EQ(std::memcmp(at, data.data() + off, len), 0) << "skew " << skew;
    env->Unmap(raw, len + 2 * kPmd);
  }
  f.reset();
  (void)env->Remove(path);
}

TEST(EnvFaults, CacheDirFollowsTheEnvVariables) {
  FaultEnv env(Env::Default());
  std::string dir;
  env.SetEnvVar("MZ_CACHE_DIR", "/data/local/tmp/mz");
  env.SetEnvVar("HOME", "/home/app");
  ASSERT_TRUE(CacheDir(&env, &dir).ok());
  EXPECT_EQ(dir, "/data/local/tmp/mz");
  env.SetEnvVar("MZ_CACHE_DIR", "");  // unset and empty alike
  ASSERT_TRUE(CacheDir(&env, &dir).ok());
  EXPECT_EQ(dir, "/home/app/.cache/mzcache");
  env.SetEnvVar("HOME", "");
  ASSERT_TRUE(CacheDir(&env, &dir).ok());
  EXPECT_EQ(dir, "/tmp/.cache/mzcache");
  // A failing lookup is reported, naming the variable, and no directory is guessed.
  env.fail_env_vars_after = 0;
  Status st = CacheDir(&env, &dir);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("MZ_CACHE_DIR"), std::string::npos) << st.ToString();
  EXPECT_EQ(dir, "");
}

TEST(EnvFaults, DeviceProfileIoGoesThroughTheEnv) {
  FakeMachine m;
  const std::string path = "/fake/cache/profile.json";
  DeviceProfile p = DeviceProfile::Default();
  p.threads = 3;
  // Save lands in the fake file (the real /fake is never touched).
  ASSERT_TRUE(p.Save(path, &m.env).ok());
  std::string text;
  ASSERT_TRUE(m.env.FakeFile(path, &text));
  EXPECT_NE(text.find("\"threads\": 3"), std::string::npos) << text;
  DeviceProfile q;
  ASSERT_TRUE(DeviceProfile::Load(path, &q, &m.env).ok());
  EXPECT_EQ(q.threads, 3);
  m.env.fail_small_writes_after = 0;
  p.threads = 5;
  Status st = p.Save(path, &m.env);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  // A failed save leaves the previous profile whole and no temporary file behind.
  std::string after;
  ASSERT_TRUE(m.env.FakeFile(path, &after));
  EXPECT_EQ(after, text);
  EXPECT_FALSE(m.env.FakeFile(path + ".tmp", &after));
  m.env.fail_small_reads_after = 0;
  st = DeviceProfile::Load(path, &q, &m.env);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
  m.env.SetFakeFile(path, "{ not json");
  EXPECT_EQ(DeviceProfile::Load(path, &q, &m.env).code(), Status::kCorruption);
}

TEST(EnvWakeups, EventCounterWakesPollAndDrains) {
  Env* env = Env::Default();
  std::unique_ptr<WaitHandle> a, b;
  ASSERT_TRUE(env->NewEventCounter(&a).ok());
  ASSERT_TRUE(env->NewEventCounter(&b).ok());
  PollEntry p[2];
  p[0].handle = a.get();
  p[1].handle = b.get();
  int n = -1;
  ASSERT_TRUE(env->Poll(p, 2, 0, &n).ok());  // nothing signalled: timeout 0 returns at once
  EXPECT_EQ(n, 0);
  EXPECT_FALSE(p[0].ready || p[1].ready);
  ASSERT_TRUE(SignalEvent(b.get()).ok());
  ASSERT_TRUE(SignalEvent(b.get()).ok());
  ASSERT_TRUE(env->Poll(p, 2, -1, &n).ok());  // ready now: no wait
  EXPECT_EQ(n, 1);
  EXPECT_FALSE(p[0].ready);
  EXPECT_TRUE(p[1].ready);
  EXPECT_FALSE(p[1].error);
  EXPECT_EQ(DrainEvent(b.get()), 2u);
  EXPECT_EQ(DrainEvent(b.get()), 0u);  // reset by the read; non-blocking
  ASSERT_TRUE(env->Poll(p, 2, 0, &n).ok());
  EXPECT_EQ(n, 0);
}

TEST(EnvWakeups, InjectedEventAndPollFailuresReachTheSource) {
  FaultEnv env(Env::Default());
  // The stop counter cannot be made: the source's Start says why instead of running blind.
  env.fail_events_after = 0;
  CgroupV1Source src(&env, "/nonexistent-cgroup");
  Status st = src.Start();
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("eventfd"), std::string::npos) << st.ToString();
  // Poll failures come back as the poll's error.
  std::unique_ptr<WaitHandle> h;
  ASSERT_TRUE(env.NewEventCounter(&h).ok());
  PollEntry p;
  p.handle = h.get();
  int n = 0;
  env.fail_polls_after = 0;
  st = env.Poll(&p, 1, -1, &n);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_EQ(n, 0);
}

TEST(EnvClocks, ProcessCpuTimeAdvancesWithWork) {
  Env* env = Env::Default();
  const uint64_t c0 = env->ProcessCpuNs();
  volatile uint64_t x = 0;
  uint64_t c1 = c0;
  // Spin until the CPU clock moves (it counts this thread's work); bounded by iterations, not time.
  for (int i = 0; i < 1000 && c1 == c0; ++i) {
    for (int j = 0; j < 100000; ++j) x = x + uint64_t(j);
    c1 = env->ProcessCpuNs();
  }
  EXPECT_GT(c1, c0);
  EXPECT_GT(c0, 0u);
}

// A TCP listener of the test on a free loopback port (accepts nothing by itself).
struct Listener {
  int fd = -1, port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd, 4) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

// Env::ConnectTcp: refused and unresolvable addresses are named errors; a peer that says nothing
// is a timeout, one that closes is "closed"; bytes written arrive; FaultEnv refuses and breaks.
TEST(EnvSockets, ConnectReadWriteAndTheirFailuresAreNamed) {
  Env* env = Env::Default();
  std::unique_ptr<Socket> s;
  int refused_port;
  {
    Listener gone;
    refused_port = gone.port;
  }
  Status st = env->ConnectTcp("127.0.0.1", refused_port, 1000, &s);
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(refused_port)), std::string::npos) << st.ToString();
  st = env->ConnectTcp("no-such-host.invalid", 6379, 1000, &s);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_FALSE(s);

  Listener l;
  ASSERT_GT(l.port, 0);
  ASSERT_TRUE(env->ConnectTcp("127.0.0.1", l.port, 200, &s).ok());
  EXPECT_EQ(s->peer(), "127.0.0.1:" + std::to_string(l.port));
  const int peer = accept(l.fd, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  ASSERT_TRUE(s->WriteAll("ping\n", 5).ok());
  char buf[16];
  ASSERT_EQ(read(peer, buf, sizeof buf), 5);
  size_t got = 0;
  st = s->ReadSome(buf, sizeof buf, &got);  // the peer says nothing: the receive timeout
  EXPECT_NE(st.message().find("timed out"), std::string::npos) << st.ToString();
  ASSERT_EQ(write(peer, "ok", 2), 2);
  ASSERT_TRUE(s->ReadSome(buf, sizeof buf, &got).ok());
  EXPECT_EQ(std::string(buf, got), "ok");
  close(peer);
  st = s->ReadSome(buf, sizeof buf, &got);
  EXPECT_NE(st.message().find("closed"), std::string::npos) << st.ToString();

  FaultEnv fenv(env);
  fenv.fail_connects_after = 1;  // the second connect
  ASSERT_TRUE(fenv.ConnectTcp("127.0.0.1", l.port, 1000, &s).ok());
  const int p2 = accept(l.fd, nullptr, nullptr);
  ASSERT_GE(p2, 0);
  std::unique_ptr<Socket> s2;
  EXPECT_NE(fenv.ConnectTcp("127.0.0.1", l.port, 1000, &s2).message().find("injected"), std::string::npos);
  ASSERT_EQ(write(p2, "abc", 3), 3);
  fenv.fail_socket_reads_after = 0;
  EXPECT_NE(s->ReadSome(buf, sizeof buf, &got).message().find("injected"), std::string::npos);
  ASSERT_TRUE(s->ReadSome(buf, sizeof buf, &got).ok());  // disarmed: the bytes are still there
  EXPECT_EQ(std::string(buf, got), "abc");
  close(p2);
}

}  // namespace
}  // namespace mz
