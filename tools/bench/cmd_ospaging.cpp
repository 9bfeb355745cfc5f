// The OS Paging baseline (paper §6.1): weights mmap'd from the GGUF (file-backed) and KV in
// anonymous memory, left to the kernel. A worker process holds the context inside a memory cgroup;
// lowering the cgroup's limit makes the kernel reclaim (drop weight pages, swap KV to zram); then
// the limit is lifted (the memory-hungry app went away) and the query's page faults restore
// everything on demand. Hidden subcommand `ospaging-worker` is that worker.
#include <atomic>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "tools/bench/child_process.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/os_memory.h"
#include "tools/bench/ospaging.h"

namespace mz::cli {

void AddOsPagingWorker(CLI::App& app, Runners& runners) {
  struct Args {
    std::string model, session, cgroup, query;
    int threads = 2;
    int n_ctx = 0;
  };
  auto a = std::make_shared<Args>();
  auto* w = app.add_subcommand("ospaging-worker", "internal: the OS Paging baseline's worker process");
  w->group("");  // hidden
  w->add_option("--model", a->model)->required();
  w->add_option("--session", a->session)->required();
  w->add_option("--cgroup", a->cgroup);
  w->add_option("--query", a->query, "comma-separated token ids")->required();
  w->add_option("--threads", a->threads);
  w->add_option("--ctx", a->n_ctx)->required();
  runners.push_back([w, a]() -> int {
    if (!w->parsed()) return -1;
    if (!a->cgroup.empty()) {
      FILE* f = std::fopen((a->cgroup + "/cgroup.procs").c_str(), "w");
      if (!f) return Fail(Status::IOError("cannot join cgroup " + a->cgroup));
      std::fprintf(f, "%d", int(getpid()));
      std::fclose(f);
    }
    ModelOptions mo;
    mo.weights = WeightMemory::kOsPaging;
    mo.direct_io = false;
    std::unique_ptr<Model> model;
    Status st = Model::Load(Env::Default(), a->model, mo, &model);
    if (!st.ok()) return Fail(st);
    ContextOptions co;
    co.n_ctx = a->n_ctx;
    co.n_threads = a->threads;
    Context ctx(model.get(), co);
    st = ctx.Init();
    if (st.ok()) st = LoadSession(ctx, a->session);
    if (!st.ok()) return Fail(st);
    std::vector<int32_t> q;
    std::stringstream ss(a->query);
    for (std::string t; std::getline(ss, t, ',');) q.push_back(std::stoi(t));
    // Touch every weight page once (as a first inference would) so the starting state is all-resident.
    {
      std::vector<int32_t> warm{q[0]};
      st = ctx.Decode(warm.data(), 1, false);
      if (!st.ok()) return Fail(st);
      ctx.Truncate(int(ctx.history().size()) - 1);
    }
    MemoryReport r = ctx.Report();
    std::printf("READY %llu\n", (unsigned long long)r.footprint());
    std::fflush(stdout);
    std::string go;
    if (!std::getline(std::cin, go)) return 1;
    double t0 = NowSeconds();
    st = ctx.Decode(q.data(), int(q.size()), false);
    double ttft = NowSeconds() - t0;
    if (!st.ok()) return Fail(st);
    std::printf("TTFT %.6f\n", ttft);
    std::fflush(stdout);
    return 0;
  });
}

namespace {

std::atomic<int> g_worker{-1};  // the running worker's pid, for OsPagingWorkerPid

std::string ReadLine(PipedChild& c) {
  char buf[256];
  if (!std::fgets(buf, sizeof buf, c.out)) return "";
  return buf;
}

}  // namespace

Status OsPagingProbe(OsPagingEnv* env) {
  static ZramSwap* zram = nullptr;
  if (!zram) zram = new ZramSwap();
  Status st = zram->Ensure(uint64_t(12) << 30);
  if (!st.ok()) return st;
  env->swap = zram->description();
  env->zram = zram;
  MemCgroup probe;
  return probe.Create("mzcache-probe-" + std::to_string(getpid()));
}

void OsPagingTeardown(OsPagingEnv* env) {
  delete static_cast<ZramSwap*>(env->zram);
  env->zram = nullptr;
}

int OsPagingWorkerPid() { return g_worker.load(); }

Status OsPagingMeasure(OsPagingEnv* env, const std::string& model, const std::string& session, int n_ctx,
                       const std::vector<int32_t>& query, int threads, double level, OsPagingRun* out) {
  MemCgroup cg;
  MZ_RETURN_IF_ERROR(cg.Create("mzcache-ospaging-" + std::to_string(getpid())));
  MZ_RETURN_IF_ERROR(DropPageCache());  // weight pages must be charged to the worker's cgroup
  std::string q;
  for (size_t i = 0; i < query.size(); ++i) q += (i ? "," : "") + std::to_string(query[i]);
  PipedChild c;  // after cg: destroyed (worker killed and reaped) before the cgroup is removed
  struct Forget {
    ~Forget() { g_worker = -1; }
  } forget;
  MZ_RETURN_IF_ERROR(SpawnPiped({SelfExe(), "ospaging-worker", "--model", model, "--session", session, "--cgroup", cg.path(),
                            "--query", q, "--threads", std::to_string(threads), "--ctx", std::to_string(n_ctx)},
                           &c));
  g_worker = c.pid;
  std::string line = ReadLine(c);
  if (line.rfind("READY", 0) != 0) {
    ReapPiped(c, true);
    return Status::Internal("OS Paging worker failed to start");
  }
  const uint64_t footprint = std::stoull(line.substr(6));
  uint64_t rss0, swap0;
  ProcMemory(c.pid, &rss0, &swap0);
  const uint64_t usage0 = cg.Usage();
  const uint64_t overhead = usage0 > footprint ? usage0 - footprint : 0;
  const uint64_t z0 = static_cast<ZramSwap*>(env->zram)->CompressedBytes();
  // "A memory-hungry app arrives": the limit drops to the level; the kernel reclaims.
  const uint64_t target = overhead + uint64_t(level * double(footprint));
  Status lim = cg.SetLimit(std::max<uint64_t>(target, 64 << 20));
  out->reached = lim.ok();
  uint64_t rss1, swap1;
  ProcMemory(c.pid, &rss1, &swap1);
  const uint64_t usage1 = cg.Usage();
  const uint64_t zc = static_cast<ZramSwap*>(env->zram)->CompressedBytes() - z0;
  // Remaining: what the LLM still holds in RAM (cgroup usage less its non-LLM overhead) plus the
  // compressed copies zram keeps in RAM for it, over the full footprint (paper §6.1 estimates the
  // latter from the compression ratio; here zram reports it).
  out->remaining = (double(usage1 > overhead ? usage1 - overhead : 0) + double(zc)) / double(footprint);
  out->swapped = swap1;
  out->zram_compressed = zc;
  // "The user returns": pressure is gone, the query runs and faults everything back.
  cg.Unlimit();
  if (write(c.in, "GO\n", 3) != 3) {
    ReapPiped(c, true);
    return Status::IOError("worker pipe");
  }
  line = ReadLine(c);
  int status = ReapPiped(c, false);
  if (line.rfind("TTFT", 0) != 0)
    return Status::Internal("OS Paging worker died (status " + std::to_string(status) + ")");
  out->ttft = std::stod(line.substr(5));
  return Status::Ok();
}

}  // namespace mz::cli
