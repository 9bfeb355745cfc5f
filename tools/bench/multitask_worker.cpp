// The two hidden child commands of `bench multitask` (see multitask.h):
//   multitask-worker  the LLM process: holds the long context and answers queries; in mode
//                     `mzcache` a PressureMonitor on the cgroup gives memory back while idle, in
//                     mode `ospaging` weights are mmap'd from the GGUF and the kernel reclaims.
//   multitask-app     a memory-hungry app: maps and reads its "code" file, touches N MiB of
//                     anonymous memory at a given rate, keeps using it for S more seconds (writes
//                     every page again every retouch-ms), exits.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>

#include "model/model.h"
#include "pool/pool.h"
#include "pressure/monitor.h"
#include "pressure/pressure_source.h"
#include "pressure/wiring.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "tools/bench/bench_util.h"
#include "tools/common.h"
#include "tools/commands.h"
#include "tools/bench/multitask.h"

namespace mz::cli {
namespace {

std::mutex g_out_mu;  // the monitor thread and the main thread both write protocol lines

void Out(const char* fmt, ...) {
  std::lock_guard<std::mutex> lk(g_out_mu);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string OneLine(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// Reports every pressure event the monitor receives (protocol line `event level=<name>`) before
// the monitor acts on it: the harness marks them on the memory trace and can tell "no signal" from
// "signal too late".
class ReportingSource : public PressureSource {
 public:
  explicit ReportingSource(std::unique_ptr<PressureSource> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  Status Start() override { return inner_->Start(); }
  Status Wait(int timeout_ms, PressureEvent* ev) override {
    Status st = inner_->Wait(timeout_ms, ev);
    if (st.ok()) Out("event level=%s", PressureLevelName(ev->level));
    return st;
  }
  void Stop() override { inner_->Stop(); }
  Status Headroom(uint64_t* available, uint64_t* limit) override { return inner_->Headroom(available, limit); }
  Status FreeBeforeReclaim(uint64_t* available, uint64_t* limit) override {
    return inner_->FreeBeforeReclaim(available, limit);
  }

 private:
  std::unique_ptr<PressureSource> inner_;
};

struct WorkerArgs {
  std::string mode = "mzcache";  // mzcache | ospaging
  std::string model, session, ref, cgroup, swap_path;
  std::string source = "cgroup-v1";
  std::string cold = "session";  // session | prefill
  int threads = 2;
  int n_ctx = 0;
  double step = 0.25;
  double tol = 1.0;
  bool restore_ahead = false;
  int calm_ms = 10000;
  double restore_margin = 0.20;
  bool critical_step = false;
  bool no_yield = false;
  bool no_reconcile = false;  // trust the unit table's count (the kernel is not asked): the ablation
  bool anon = false;          // anonymous weights and KV (nothing the kernel can reclaim without swap)
  bool no_touch = false;      // restored pages first read by compute, not by the restore thread
  // Mode pool: the context is conversation "ref" of a pool in pool_dir, beside pool_convs - 1
  // others (copies of the session), under a budget of the weights + one conversation.
  std::string pool_dir;
  int pool_convs = 4;
};

// The protocol line of one pressure action (`action level=... msg=...`), for the context's monitor
// and the pool's watch alike.
std::string ActionLine(const PressureEvent& ev, uint64_t requested, uint64_t freed, double remaining, bool deferred,
                       bool restored, uint64_t restored_bytes, const Status& st, double step, uint64_t applied_ns,
                       const std::string& note) {
  char b[1024];
  std::snprintf(b, sizeof b,
                "action level=%s req=%" PRIu64 " freed=%" PRIu64 " remaining=%.4f deferred=%d restored=%d "
                "restored_bytes=%" PRIu64 " ok=%d step=%.3f delay_ms=%.1f msg=%s",
                PressureLevelName(ev.level), requested, freed, remaining, int(deferred), int(restored), restored_bytes,
                int(st.ok()), step, applied_ns > ev.time_ns ? double(applied_ns - ev.time_ns) / 1e6 : 0.0,
                OneLine(note.empty() ? st.ToString() : note).c_str());
  return b;
}

// The worker's protocol after its `ready` line: one `result` line per `query` (answer() writes
// it) until `quit` or the end of its input.
void Serve(const std::function<void()>& answer) {
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "quit") break;
    if (line != "query") {
      Out("result ok=0 msg=unknown command");
      continue;
    }
    answer();
  }
}

// Mode pool: the multitask protocol over a Pool (issue 22's pressure run). Its pressure watch
// (Pool::WatchPressure) gives back in the pool's order; a query goes to conversation "ref". Each
// result line also says how many conversations the pool lists (convs), how many it deleted
// (lost: the disk budget, none here) and how many stored files were damaged.
int RunPoolWorker(const WorkerArgs& a, const MultitaskRef& ref, double t_start) {
  std::unique_ptr<Model> model;
  Status st = Model::Load(Env::Default(), a.model, ModelOptions(), &model);
  if (!st.ok()) return Fail(st);
  if (model->hparams().n_vocab != ref.logits.size())
    return Fail(Status::InvalidArgument("reference file does not match the model's vocabulary"));
  if (a.pool_dir.empty() || a.pool_convs < 1) return Fail(Status::InvalidArgument("--pool-dir and --pool-convs >= 1"));
  // First start: the conversations are copies of the session file (read whole once, then
  // persisted in the pool's codec); a cold start after a kill finds them stored.
  std::error_code ec;
  std::filesystem::create_directories(a.pool_dir, ec);
  // "pool-stored": the pool's files as the harness copied them or a previous worker left them.
  std::string how = std::filesystem::exists(a.pool_dir + "/ref.mzs") ? "pool-stored" : "pool-copied";
  if (how == "pool-copied") {
    if (a.session.empty()) return Fail(Status::InvalidArgument("mode pool needs --session"));
    for (int i = 0; i < a.pool_convs; ++i) {
      const std::string to = a.pool_dir + "/" + (i ? "conv-" + std::to_string(i) : std::string("ref")) + ".mzs";
      std::filesystem::copy_file(a.session, to, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return Fail(Status::IOError("copying the session to " + to + ": " + ec.message()));
    }
  }
  PoolOptions po;
  po.dir = a.pool_dir;
  po.context.n_ctx = a.n_ctx;
  po.context.n_threads = a.threads;
  po.persist_codec = po.context.kv_codec;
  const uint64_t kv_conv = uint64_t(ref.context.size() + ref.query.size()) * model->hparams().kv_bytes_per_token();
  po.memory_budget = model->tensor_bytes() + kv_conv;
  std::unique_ptr<Pool> pool;
  st = Pool::Open(model.get(), po, &pool);
  if (!st.ok()) return Fail(st);
  const int listed0 = int(pool->List().size());
  // The other conversations were in use before: each restored once (the budget then moves them out).
  for (int i = 1; i < a.pool_convs; ++i) {
    std::shared_ptr<Conversation> c;
    st = pool->OpenConversation("conv-" + std::to_string(i), &c);
    if (st.ok() && c->n_tokens() > 0) {
      const int n = c->n_tokens();
      const int32_t last = ref.context.back();
      st = c->RestoreGenerate(&last, 1, PipelineOptions(), nullptr);
      if (st.ok()) st = c->Truncate(n);
    }
    if (!st.ok()) return Fail(st.With("conversation conv-" + std::to_string(i)));
  }
  std::shared_ptr<Conversation> conv;
  st = pool->OpenConversation("ref", &conv);
  if (!st.ok()) return Fail(st);
  if (conv->n_tokens() != int(ref.context.size()))
    return Fail(Status::Corruption("conversation ref holds " + std::to_string(conv->n_tokens()) + " tokens, not " +
                                   std::to_string(ref.context.size())));
  PoolPressureOptions pp;
  pp.source.kind = a.source;
  pp.source.cgroup_dir = a.cgroup;
  pp.amount.step_points = a.step;
  pp.amount.critical_to_floor = !a.critical_step;
  pp.wrap_source = [](std::unique_ptr<PressureSource> src) -> std::unique_ptr<PressureSource> {
    return std::make_unique<ReportingSource>(std::move(src));
  };
  const uint64_t llm0 = model->tensor_bytes() + uint64_t(a.pool_convs) * kv_conv;
  pp.on_action = [&](const PoolPressureAction& x) {
    Out("%s", ActionLine(x.event, 0, x.freed, double(x.in_memory) / double(llm0), false, false, 0, x.status, a.step,
                         Env::Default()->NowNs(), "").c_str());
  };
  std::string why;
  st = pool->WatchPressure(pp, &why);
  if (!st.ok()) return Fail(st);
  std::fprintf(stderr, "multitask-worker: pool of %d conversations; pressure source: %s; step %.0f points\n",
               listed0, why.c_str(), 100 * a.step);
  Out("ready how=%s load_s=%.3f footprint=%" PRIu64 " llm=%" PRIu64 " base=%" PRIu64, how.c_str(),
      NowSeconds() - t_start, po.memory_budget, po.memory_budget, uint64_t(0));
  const int base = int(ref.context.size());
  Serve([&] {
    const double t0 = NowSeconds();
    const bool hist_before = conv->context() && conv->context()->history() == ref.context;
    RestoreGenerateStats rs;
    st = conv->RestoreGenerate(ref.query.data(), int(ref.query.size()), PipelineOptions(), &rs);
    const double ttft = NowSeconds() - t0;
    IntactCheck c = CheckIntact(st.ok() ? conv->logits(conv->n_logit_rows() - 1) : nullptr, ref, hist_before, a.tol);
    // Back to the stored state (the write-behind may rewrite it once idle; no commit per query).
    if (conv->n_tokens() > base) conv->Truncate(base);
    const PoolStats ps = pool->Stats();
    Out("result ok=%d ttft=%.6f intact=%d hist=%d top1=%d ref_top1=%d top1eq=%d margin=%.6g maxdiff=%.6g bitident=%d "
        "remaining=%.4f counted=0 inram=0 reconciled=0 majflt=0 minflt=0 wait=%.4f reload=%.4f restored_bytes=%" PRIu64
        " threads=%d measure_ms=-1 convs=%d lost=%" PRIu64 " damaged=%d msg=%s",
        int(st.ok()), ttft, int(c.intact), int(c.history_ok), c.top1, c.ref_top1, int(c.top1_equal), c.ref_margin,
        c.max_abs_diff, int(c.bit_identical), rs.remaining_at_start, rs.wait_s, rs.pipeline.reload_s,
        rs.pipeline.bytes_restored, rs.compute_threads_during_restore, ps.n_conversations, ps.conversations_lost,
        ps.n_damaged, OneLine(st.ToString()).c_str());
  });
  pool->StopWatchingPressure();
  return 0;
}

int RunWorker(const WorkerArgs& a) {
  signal(SIGPIPE, SIG_IGN);
  const double t_start = NowSeconds();
  MultitaskRef ref;
  Status st = ReadMultitaskRef(a.ref, &ref);
  if (!st.ok()) return Fail(st);
  if (a.mode == "pool") return RunPoolWorker(a, ref, t_start);
  const bool mz = a.mode == "mzcache";
  if (!mz && a.mode != "ospaging") return Fail(Status::InvalidArgument("--mode must be mzcache, pool or ospaging"));
  ModelOptions mo;
  if (mz && a.anon) mo.weights = WeightMemory::kAnonymous;
  if (!mz) {
    mo.weights = WeightMemory::kOsPaging;  // OS Paging: file-backed weights the kernel may drop and fault back
    mo.direct_io = false;
  }
  std::unique_ptr<Model> model;
  st = Model::Load(Env::Default(), a.model, mo, &model);
  if (!st.ok()) return Fail(st);
  if (model->hparams().n_vocab != ref.logits.size())
    return Fail(Status::InvalidArgument("reference file does not match the model's vocabulary"));
  ContextOptions co;
  co.n_ctx = a.n_ctx;
  co.n_threads = a.threads;
  if (!a.swap_path.empty()) co.swap_path = a.swap_path;
  if (a.no_reconcile) co.reconcile_min_missing = 0;
  if (a.anon) co.map_swap = false;
  if (a.no_touch) co.touch_restored = false;
  Context ctx(model.get(), co);
  st = ctx.Init();
  if (!st.ok()) return Fail(st);
  // The context: the session file (fast path of a cold start) or a re-prefill of the same tokens.
  std::string how = "prefill";
  FileInfo fi;
  if (a.cold == "session" && !a.session.empty() && Env::Default()->StatPath(a.session, &fi).ok()) {
    st = LoadSession(ctx, a.session);
    if (st.ok()) how = "session";
    else std::fprintf(stderr, "multitask-worker: session unusable (%s): re-prefilling\n", st.ToString().c_str());
  }
  if (how == "prefill") {
    ctx.Truncate(0);
    for (size_t off = 0; off < ref.context.size(); off += 512) {
      const int m = int(std::min<size_t>(512, ref.context.size() - off));
      st = ctx.Decode(ref.context.data() + off, m, false);
      if (!st.ok()) return Fail(st);
    }
  }
  if (ctx.history() != ref.context) return Fail(Status::Corruption("the loaded context is not the reference context"));
  const MemoryReport r0 = ctx.Report();
  std::unique_ptr<PressureMonitor> mon;
  if (mz) {
    PressureWatchOptions w;
    w.source.kind = a.source;
    w.source.cgroup_dir = a.cgroup;
    w.amount.step_points = a.step;
    if (a.restore_ahead) {
      w.amount.restore_ahead = AmountOptions::RestoreAhead::kBackground;
      w.amount.calm_ns = uint64_t(std::max(0, a.calm_ms)) * 1000000ull;
      w.amount.restore_margin = a.restore_margin;
    }
    w.amount.critical_to_floor = !a.critical_step;
    w.amount.restore_yields = !a.no_yield;
    w.wrap_source = [](std::unique_ptr<PressureSource> src) -> std::unique_ptr<PressureSource> {
      return std::make_unique<ReportingSource>(std::move(src));
    };
    w.on_action = [](const PressureAction& x) {
      Out("%s", ActionLine(x.event, x.requested, x.freed, x.remaining, x.deferred, x.restored, x.restored_bytes,
                           x.status, x.step_points, x.applied_ns, x.note).c_str());
    };
    std::string why;
    st = StartPressureMonitor(Env::Default(), &ctx, w, &mon, &why);
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr, "multitask-worker: pressure source: %s; step %.0f points\n", why.c_str(), 100 * a.step);
  }
  Out("ready how=%s load_s=%.3f footprint=%" PRIu64 " llm=%" PRIu64 " base=%" PRIu64, how.c_str(),
      NowSeconds() - t_start, r0.footprint(), r0.footprint() - r0.base_total, r0.base_total);

  const int base = int(ref.context.size());
  Serve([&] {
    // TTFT as the user sees it: from the request to the logits, including any wait for an
    // eviction the monitor is still applying (RestoreGenerate's own ttft_s starts after that).
    // "remaining" is what RestoreGenerate found resident when it got the context (a restore-ahead
    // slice under way at the request stops for it first).
    // On the clock (the user waits for it, and for an eviction it waits behind): what the LLM
    // counts resident against what the kernel holds of it (mincore over every resident unit),
    // and the process's page faults so far (measure_ms below).
    const double t0 = NowSeconds();
    KernelResidency kr;
    const Status kst = ctx.MeasureInRam(&kr);
    const double t_measured = NowSeconds();
    uint64_t maj0 = 0, min0 = 0, maj1 = 0, min1 = 0;
    Env::Default()->ProcessFaults(&maj0, &min0);
    double remaining = -1;
    uint64_t reconciled = 0;
    RestoreGenerateStats rs;
    const bool hist_before = ctx.history() == ref.context;
    if (mz) {
      st = ctx.RestoreGenerate(ref.query.data(), int(ref.query.size()), PipelineOptions(), &rs);
      remaining = rs.remaining_at_start;
      reconciled = rs.reconciled.bytes;
    } else {
      st = ctx.Decode(ref.query.data(), int(ref.query.size()), false);
    }
    const double ttft = NowSeconds() - t0;
    Env::Default()->ProcessFaults(&maj1, &min1);
    // From the request to the end of the mincore pass: its cost, plus any wait for the context
    // (an eviction or restore-ahead slice holding it).
    const double measure_ms = kst.ok() ? (t_measured - t0) * 1e3 : -1;
    IntactCheck c = CheckIntact(st.ok() ? ctx.logits(ctx.n_logit_rows() - 1) : nullptr, ref, hist_before, a.tol);
    ctx.Truncate(base);
    const bool hist_after = ctx.history() == ref.context;
    c.history_ok = c.history_ok && hist_after;  // (Truncate dropped the logits: adjust the verdict)
    c.intact = c.intact && hist_after;
    if (mon) mon->OnSafePoint();  // a pressure event that arrived during the query is applied now
    Out("result ok=%d ttft=%.6f intact=%d hist=%d top1=%d ref_top1=%d top1eq=%d margin=%.6g maxdiff=%.6g bitident=%d "
        "remaining=%.4f counted=%" PRIu64 " inram=%" PRIu64 " reconciled=%" PRIu64 " majflt=%" PRIu64
        " minflt=%" PRIu64 " wait=%.4f reload=%.4f restored_bytes=%" PRIu64 " threads=%d measure_ms=%.2f msg=%s",
        int(st.ok()), ttft, int(c.intact), int(c.history_ok), c.top1, c.ref_top1, int(c.top1_equal), c.ref_margin,
        c.max_abs_diff, int(c.bit_identical), remaining, kst.ok() ? kr.counted() : 0, kst.ok() ? kr.in_ram() : 0,
        reconciled, maj1 - maj0, min1 - min0, rs.wait_s, rs.pipeline.reload_s, rs.pipeline.bytes_restored,
        rs.compute_threads_during_restore, measure_ms, OneLine(st.ToString()).c_str());
  });
  if (mon) mon->Stop();
  return 0;
}

struct AppArgs {
  int mib = 256;
  double seconds = 3;    // in use after its memory is touched
  double rate = 0;       // MiB/s while touching the first time (0: as fast as possible)
  std::string file;      // the app's "code and resources", read through the page cache
  int retouch_ms = 500;  // while holding: write every page again this often (the app is in use)
};

void SleepUntil(double t) {
  const double d = t - NowSeconds();
  if (d > 0) usleep(useconds_t(d * 1e6));
}

int RunApp(const AppArgs& a) {
  if (!a.file.empty()) {
    const int fd = open(a.file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd >= 0 && fstat(fd, &sb) == 0 && sb.st_size > 0) {
      void* p = mmap(nullptr, size_t(sb.st_size), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        volatile uint64_t sum = 0;
        for (size_t off = 0; off < size_t(sb.st_size); off += 4096) sum = sum + static_cast<const uint8_t*>(p)[off];
        (void)sum;  // the mapping stays until exit: mapped file pages, like an app's code
      }
    }
    if (fd >= 0) close(fd);
  }
  const size_t bytes = size_t(a.mib) << 20;
  auto* m = static_cast<uint64_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (m == MAP_FAILED) return Fail(Status::IOError("mmap of the app's memory failed"));
  // Half of each page random, half zero: about 2:1 for a compressing swap (zram), like app heaps.
  uint64_t x = 0x9E3779B97F4A7C15ull ^ uint64_t(getpid());
  const size_t words_per_page = 4096 / 8;
  const double t_touch = NowSeconds();
  for (size_t mib = 0; mib < size_t(a.mib); ++mib) {
    uint64_t* w = m + mib * (size_t(1) << 20) / 8;
    for (size_t pg = 0; pg < 256; ++pg)
      for (size_t i = 0; i < words_per_page / 2; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[pg * words_per_page + i] = x;
      }
    if (a.rate > 0) SleepUntil(t_touch + double(mib + 1) / a.rate);
  }
  const double t_end = NowSeconds() + a.seconds;  // held (in use) for `seconds` once all touched
  while (NowSeconds() < t_end) {
    SleepUntil(std::min(t_end, NowSeconds() + a.retouch_ms / 1000.0));
    for (size_t pg = 0; pg < bytes / 4096; ++pg) m[pg * words_per_page] += 1;
  }
  return 0;
}

}  // namespace

void AddMultitaskChildren(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<WorkerArgs>();
  auto* w = app.add_subcommand("multitask-worker", "internal: the LLM process of bench multitask");
  w->group("");  // hidden
  w->add_option("--mode", a->mode)->required();
  w->add_option("--model", a->model)->required();
  w->add_option("--session", a->session);
  w->add_option("--ref", a->ref)->required();
  w->add_option("--ctx", a->n_ctx)->required();
  w->add_option("--threads", a->threads);
  w->add_option("--cgroup", a->cgroup);
  w->add_option("--swap-path", a->swap_path);
  w->add_option("--source", a->source);
  w->add_option("--cold-start", a->cold);
  w->add_option("--step", a->step);
  w->add_option("--tol", a->tol);
  w->add_flag("--restore-ahead", a->restore_ahead);
  w->add_option("--calm-ms", a->calm_ms);
  w->add_option("--restore-margin", a->restore_margin);
  w->add_flag("--critical-step", a->critical_step);
  w->add_flag("--no-yield", a->no_yield);
  w->add_flag("--no-reconcile", a->no_reconcile);
  w->add_flag("--anon", a->anon);
  w->add_flag("--no-touch", a->no_touch);
  w->add_option("--pool-dir", a->pool_dir);
  w->add_option("--pool-convs", a->pool_convs);
  runners.push_back([w, a]() -> int { return w->parsed() ? RunWorker(*a) : -1; });

  auto b = std::make_shared<AppArgs>();
  auto* p = app.add_subcommand("multitask-app", "internal: a memory-hungry app of bench multitask");
  p->group("");
  p->add_option("--mib", b->mib)->required();
  p->add_option("--seconds", b->seconds)->required();
  p->add_option("--rate", b->rate);
  p->add_option("--file", b->file);
  p->add_option("--retouch-ms", b->retouch_ms);
  runners.push_back([p, b]() -> int { return p->parsed() ? RunApp(*b) : -1; });
}

}  // namespace mz::cli
