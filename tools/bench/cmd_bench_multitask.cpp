// bench multitask (issue 6 item 5, paper Fig. 15): the LLM process and memory-hungry "app"
// processes share one memory cgroup (v1) with a fixed limit. In rounds (seeded random sizes and
// durations, the same for every mode), apps start, touch their memory, keep using it and exit;
// then the user comes back to the LLM and asks an 8-token query over its long context. Modes:
//   ospaging  weights mmap'd from the GGUF, no mzcache eviction: the kernel reclaims, and the OOM
//             killer may kill the LLM, which then cold starts (model load + session file, or
//             re-prefill with --cold-start prefill) before it can answer;
//   mz15/mz25 mzcache with a PressureMonitor on the cgroup's pressure signal, giving back 15 or 25
//             points of LLM memory per event while idle; the query restores (restore_generate).
// Recorded per round: killed or not, TTFT on return, context intact or not (docs/multitask.md has
// the criterion); the cgroup's usage and every process's RSS are sampled every 100 ms for the
// memory trace. The design and the measured results are in docs/multitask.md.
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/child_process.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/multitask.h"
#include "tools/bench/os_memory.h"
#include "tools/bench/peers_common.h"
#include "tools/bench/real_text.h"

namespace mz::cli {
namespace {

constexpr int kExitUnsupported = 77;  // no root / no cgroup v1 memory controller (the test skips)

struct MtArgs {
  int rounds = 10;
  uint64_t seed = 1;
  int ctx = 8192;
  int query = 8;
  std::string model = "qwen3-0.6b";
  std::string type = "q8_0";
  int limit_mib = 0;          // 0: LLM usage after warm-up + free_frac x footprint
  double free_frac = 0.25;    // free memory left for apps under the auto limit (fraction of the footprint)
  std::vector<std::string> modes{"ospaging", "mz15", "mz25"};
  int pool_convs = 4;  // mode pool<NN>: conversations in the pool (the query goes to one of them)
  bool quick = false;
  std::string out = "results/bench-multitask";
  int threads = 2;
  int zram_mib = 0;
  double need_lo = 0.35, need_hi = 0.85;  // what apps take beyond the free memory (fraction of the LLM footprint)
  double hold_lo = 2.0, hold_hi = 5.0;    // seconds an app lives
  int max_apps = 2;
  double app_rate = 256;                  // MiB/s an app grows by while it starts (loading and decoding assets)
  int app_file_mib = 64;                  // each app's code/resources, read through the page cache
  int llm_oom_adj = 800;                  // the LLM is a background app (Android: cached/previous app range)
  std::string source = "cgroup-v1";
  std::string cold = "session";
  double tol = 1.0;  // q8 KV: ~0.35 measured; a lost context: ~20 (the control)
  double gap = 0.5;                       // seconds between the last app's exit and the query
  std::string swap_dir = "/var/tmp";
  int sample_ms = 100;
  int ref_reps = 3;
  bool restore_ahead = false;
  int calm_ms = 150;  // restore-ahead: pressure calm (and stable free memory) for this long, well below --gap
  double restore_margin = 0.10;  // restore-ahead: keep this fraction of the cgroup limit free
};

struct ModeSpec {
  std::string name;         // ospaging | mz15 | mz25 | mz<NN>[+ahead][+step][+noyield][@<source>]
  std::string worker_mode;  // ospaging | mzcache | pool
  double step = 0;
  std::string source;       // mzcache's pressure source for this mode
  bool ahead = false;          // +ahead: background restore-ahead (also --restore-ahead for every mode)
  bool critical_step = false;  // +step: a critical event escalates the step instead of evicting to the floor
  bool no_yield = false;       // +noyield: a restore-ahead slice runs to its end when the query arrives
  bool no_reconcile = false;   // +noreconcile: the LLM trusts its own count of resident units (the kernel is not asked)
  bool anon = false;           // +anon: anonymous weights and KV (the kernel cannot reclaim them without swap)
  bool no_touch = false;       // +notouch: restored pages are first read by compute, not by the restore thread
};

struct AppPlan {
  double start = 0, seconds = 0;
  double share = 1;  // of the round's app memory
  int mib = 0;
};
struct RoundPlan {
  double need = 0;  // beyond the free memory, fraction of the LLM footprint
  int total_mib = 0;
  std::vector<AppPlan> apps;
};

struct Sample {
  double t = 0;
  double usage = 0, llm = 0, apps = 0;  // MiB
  double cache = 0;                     // MiB of the cgroup's usage that is page cache (memory.stat)
};
struct Mark {
  double t = 0;
  std::string kind;  // kill | query | cold | evict | app
  double value = 0;
};

struct RoundResult {
  int round = 0;
  int app_mib = 0, n_apps = 0, apps_killed = 0;
  bool killed = false;
  double kill_t = -1;
  std::string back;  // kept | session | prefill (how the context was there for the query)
  double cold_start_s = 0;
  bool answered = false;
  double ttft = 0;        // on return: the query's TTFT, plus the cold start when killed
  double ttft_query = 0;  // the query alone, as the worker measured it
  double ttft_resident = NAN;       // the same query right after, all resident (paired all-in-memory TTFT)
  double resident_remaining = -1;   // mzcache: LLM memory resident before that second query
  bool intact = false, bitident = false, history_ok = false;
  double maxdiff = 0;
  int top1 = -1, ref_top1 = -1;
  bool top1_equal = false;
  double ref_margin = 0;
  double remaining = -1;  // mzcache: LLM memory resident before the query
  double llm_rss_mib = 0; // LLM process RSS right before the query
  // Right before the query: what the LLM counts resident and what the kernel holds of it (mincore),
  // the cgroup's page cache / anonymous memory; during the query: the LLM's page faults and the
  // machine's memory stall (PSI).
  double counted_mib = -1, inram_mib = -1, reconciled_mib = 0;
  double majflt = 0, minflt = 0;
  double cg_cache_mib = 0, cg_rss_mib = 0, cg_mapped_mib = 0;
  double psi_some_ms = -1, psi_full_ms = -1;
  double wait_s = 0, reload_s = 0, restored_in_query_mib = 0;  // the query's restore_generate
  int compute_threads = 0;
  double measure_ms = -1;  // request to the end of the worker's mincore pass (includes a wait for the context)
  // Mode pool: conversations the pool lists after the query, deleted by it, damaged files (-1: not a pool).
  int pool_convs = -1, pool_lost = -1, pool_damaged = -1;
  int events = 0;  // pressure events the mzcache worker received
  int evictions = 0;
  double freed_mib = 0;
  double restored_mib = 0;  // restore-ahead: restored in the background before the query
  nlohmann::json actions = nlohmann::json::array();  // the monitor's actions: t (s into the round), level, MiB
  double peak_mib = 0;
  uint64_t oom_kills = 0;
  std::string msg;
};

struct ModeResult {
  ModeSpec spec;
  std::string error;  // the mode could not run to the end (its rounds so far are kept)
  std::string swap;   // swap state while it ran
  std::vector<RoundResult> rounds;
  std::vector<Sample> samples;
  std::vector<Mark> marks;
  double warm_ttft = 0;
  bool warm_intact = false;
  uint64_t llm_usage0 = 0;  // cgroup usage after the worker's warm-up query, before any pressure
};

// ---- cleanup on every exit path, including SIGINT/SIGTERM -------------------------------------
// The handler is not async-signal-safe in the strict sense (it runs system() for swapoff): the
// process is about to exit and only these side effects matter, as in bench ttft.
ChildRegistry<64> g_children;
char g_cgroup[512];
char g_files[4][512];
std::atomic<bool> g_zram_created{false};

void RegisterChild(pid_t p) { g_children.Add(p); }
void UnregisterChild(pid_t p) { g_children.Remove(p); }
void SetCleanupPath(char* slot, const std::string& s) {
  std::snprintf(slot, 512, "%s", s.c_str());
}

void OnMultitaskSignal(int sig) {
  g_children.KillAndReapAll();
  if (g_cgroup[0]) {
    for (int i = 0; i < 50 && rmdir(g_cgroup) != 0 && errno == EBUSY; ++i) usleep(20000);
  }
  for (auto& f : g_files)
    if (f[0]) unlink(f);
  if (g_zram_created.load()) {
    if (std::system("swapoff /dev/zram0 2>/dev/null; echo 1 > /sys/block/zram0/reset 2>/dev/null") != 0) {
    }
  }
  _exit(128 + sig);
}

// ---- memory trace ---------------------------------------------------------------------------
class Sampler {
 public:
  Sampler(std::string cgroup, int period_ms, double t0) : cg_(std::move(cgroup)), period_ms_(period_ms), t0_(t0) {}
  ~Sampler() { Stop(); }
  void Start() {
    th_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    stop_ = true;
    if (th_.joinable()) th_.join();
  }
  void SetWorker(pid_t p) {
    std::lock_guard<std::mutex> lk(mu_);
    worker_ = p;
  }
  void AddApp(pid_t p) {
    std::lock_guard<std::mutex> lk(mu_);
    apps_.push_back(p);
  }
  void RemoveApp(pid_t p) {
    std::lock_guard<std::mutex> lk(mu_);
    apps_.erase(std::remove(apps_.begin(), apps_.end(), p), apps_.end());
  }
  // Highest cgroup usage (MiB) sampled since t (harness clock).
  double PeakSince(double t) {
    std::lock_guard<std::mutex> lk(mu_);
    double m = 0;
    for (auto it = samples_.rbegin(); it != samples_.rend() && it->t >= t - t0_; ++it) m = std::max(m, it->usage);
    return m;
  }
  std::vector<Sample> samples() {
    std::lock_guard<std::mutex> lk(mu_);
    return samples_;
  }

 private:
  static double Rss(pid_t p) {
    uint64_t rss = 0, swap = 0;
    if (p > 0) ProcMemory(p, &rss, &swap);
    return double(rss) / 1048576.0;
  }
  void Loop() {
    while (!stop_.load()) {
      pid_t w;
      std::vector<pid_t> apps;
      {
        std::lock_guard<std::mutex> lk(mu_);
        w = worker_;
        apps = apps_;
      }
      Sample s;
      s.t = NowSeconds() - t0_;
      std::ifstream f(cg_ + "/memory.usage_in_bytes");
      uint64_t u = 0;
      f >> u;
      s.usage = double(u) / 1048576.0;
      s.cache = double(ReadCgroupMemStat(cg_).cache) / 1048576.0;
      s.llm = Rss(w);
      for (pid_t p : apps) s.apps += Rss(p);
      {
        std::lock_guard<std::mutex> lk(mu_);
        samples_.push_back(s);
      }
      usleep(useconds_t(period_ms_) * 1000);
    }
  }
  std::string cg_;
  int period_ms_;
  double t0_;
  std::thread th_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  pid_t worker_ = -1;
  std::vector<pid_t> apps_;
  std::vector<Sample> samples_;
};



// The long context (n tokens of real text, the same text and session file as bench ttft) and the
// reference: next-token logits for the query with all memory resident, plus the all-in-memory TTFT
// (median of `reps` after one warm-up run).
struct Control {
  int window = 0;        // tokens of the context the control kept (the most recent ones)
  double maxdiff = 0;    // its max |logit - reference|
  bool top1_equal = false;
};

Status BuildReference(const std::string& model_path, const MtArgs& a, std::string* sess, MultitaskRef* ref,
                      std::vector<double>* ttfts, bool* deterministic, MemoryReport* report, Control* control) {
  std::unique_ptr<Model> model;
  MZ_RETURN_IF_ERROR(Model::Load(Env::Default(), model_path, ModelOptions(), &model));
  ContextOptions co;
  co.n_ctx = a.ctx + a.query + 64;
  co.n_threads = a.threads;
  co.swap_path = a.swap_dir + "/mzcache-multitask-" + std::to_string(getpid()) + "-ref.swap";
  Context ctx(model.get(), co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  const int n = a.ctx, q = a.query;
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(RealTokens(model_path, n + q, &toks));
  ref->context.assign(toks.begin(), toks.begin() + n);
  ref->query.assign(toks.begin() + n, toks.begin() + n + q);
  // The context comes from its session file (built once by prefill of the same real text).
  MZ_RETURN_IF_ERROR(EnsureSessionContext(ctx, model_path, toks, n, sess, nullptr));
  *report = ctx.Report();
  *deterministic = true;
  for (int rep = 0; rep <= a.ref_reps; ++rep) {
    const double t0 = NowSeconds();
    MZ_RETURN_IF_ERROR(ctx.Decode(ref->query.data(), q, false));
    const double t = NowSeconds() - t0;
    const float* l = ctx.logits(ctx.n_logit_rows() - 1);
    const size_t nv = model->hparams().n_vocab;
    if (rep == 0) ref->logits.assign(l, l + nv);
    else {
      *deterministic = *deterministic && std::equal(l, l + nv, ref->logits.begin());
      ttfts->push_back(t);
    }
    ctx.Truncate(n);
  }
  // Control, to show the tolerance tells a lost context apart: the same query over only the most
  // recent part of the context (what a context that lost its older chunks would answer).
  {
    Context c2(model.get(), co);
    MZ_RETURN_IF_ERROR(c2.Init());
    control->window = std::min(512, n / 4);
    std::vector<int32_t> w(ref->context.end() - control->window, ref->context.end());
    w.insert(w.end(), ref->query.begin(), ref->query.end());
    MZ_RETURN_IF_ERROR(c2.Decode(w.data(), int(w.size()), false));
    const IntactCheck c = CheckIntact(c2.logits(c2.n_logit_rows() - 1), *ref, true, a.tol);
    control->maxdiff = c.max_abs_diff;
    control->top1_equal = c.top1_equal;
  }
  return Status::Ok();
}

std::vector<RoundPlan> MakePlan(const MtArgs& a) {
  std::mt19937_64 rng(a.seed);
  auto uni = [&](double lo, double hi) { return lo + (hi - lo) * std::uniform_real_distribution<double>(0, 1)(rng); };
  std::vector<RoundPlan> plan;
  for (int r = 0; r < a.rounds; ++r) {
    RoundPlan p;
    p.need = uni(a.need_lo, a.need_hi);
    const int n_apps = 1 + int(rng() % uint64_t(std::max(1, a.max_apps)));
    double left = 1.0;
    for (int i = 0; i < n_apps; ++i) {
      AppPlan ap;
      ap.share = i + 1 == n_apps ? left : left * uni(0.35, 0.65);
      left -= ap.share;
      ap.start = i == 0 ? 0 : p.apps.back().start + uni(0.3, 1.0);
      ap.seconds = uni(a.hold_lo, a.hold_hi);
      if (i > 0) {  // apps of one round overlap: the first is still in use when the next starts
        AppPlan& first = p.apps.front();
        first.seconds = std::max(first.seconds, ap.start - first.start + 0.5 * ap.seconds);
      }
      p.apps.push_back(ap);
    }
    plan.push_back(p);
  }
  return plan;
}

double Median(std::vector<double> v) { return v.empty() ? NAN : Summarize(v).median; }

class MultitaskBench {
 public:
  // ospaging_model: a private copy of the model file for the OS Paging worker (see RunBench).
  MultitaskBench(const MtArgs& a, std::string model_path, std::string ospaging_model, std::string sess,
                 std::string ref_path, std::string app_file, uint64_t footprint)
      : a_(a), model_(std::move(model_path)), ospaging_model_(std::move(ospaging_model)), sess_(std::move(sess)),
        ref_(std::move(ref_path)), app_file_(std::move(app_file)), footprint_(footprint) {}

  uint64_t limit() const { return limit_; }
  void set_limit(uint64_t l) { limit_ = l; }
  uint64_t usage0() const { return usage0_; }
  std::vector<RoundPlan>& plan() { return plan_; }

  // Measures what the LLM uses in the cgroup (an mzcache worker after its warm-up query: its KV
  // and its weights, which are page-cache pages charged to the cgroup that first reads them, so the
  // page cache is dropped first, as before every mode), then fixes the limit (unless given) and the
  // apps' sizes, the same for every mode.
  Status Calibrate() {
    MemCgroup cg;
    MZ_RETURN_IF_ERROR(SetUpCgroup(&cg));
    MZ_RETURN_IF_ERROR(DropPageCache());
    MZ_RETURN_IF_ERROR(cg.SetLimit(Provisional()));
    std::map<std::string, std::string> f, res;
    Status st = StartWorker({"calibration", "mzcache", 0.25, "manual"}, &f);
    if (st.ok() && !Query(&res)) st = Status::Internal("the calibration worker died during its warm-up query");
    if (st.ok()) usage0_ = cg.Usage();
    StopWorker();
    MZ_RETURN_IF_ERROR(st);
    if (limit_ == 0) {
      limit_ = (usage0_ + uint64_t(a_.free_frac * double(footprint_)) + (1 << 20) - 1) & ~uint64_t((1 << 20) - 1);
      std::fprintf(stderr, "  limit: %.0f MiB = LLM usage after warm-up %.0f MiB + %.0f%% of the footprint\n",
                   limit_ / 1048576.0, usage0_ / 1048576.0, 100 * a_.free_frac);
    }
    // App sizes: the free memory under the limit plus `need` x the LLM footprint.
    const double free_mib = limit_ > usage0_ ? double(limit_ - usage0_) / 1048576.0 : 0;
    for (auto& p : plan_) {
      p.total_mib = int(free_mib + p.need * double(footprint_) / 1048576.0);
      for (auto& ap : p.apps) ap.mib = std::max(16, int(ap.share * p.total_mib));
    }
    return Status::Ok();
  }

  Status RunMode(const ModeSpec& m, ModeResult* out) {
    out->spec = m;
    out->swap = SwapState();
    MemCgroup cg;
    MZ_RETURN_IF_ERROR(SetUpCgroup(&cg));
    std::error_code ec;
    std::filesystem::remove_all(PoolDir(), ec);
    if (m.worker_mode == "pool") MZ_RETURN_IF_ERROR(FillPoolDir());
    // Same start for every mode: nothing of the model or the app file in the page cache (the OS
    // Paging worker's weight pages are then charged to its cgroup as it faults them in).
    MZ_RETURN_IF_ERROR(DropPageCache());
    t0_ = NowSeconds();
    Sampler sampler(cg.path(), a_.sample_ms, t0_);
    sampler_ = &sampler;
    sampler.Start();
    Status st = RunRounds(m, &cg, out);
    StopWorker();
    sampler.Stop();
    sampler_ = nullptr;
    out->samples = sampler.samples();
    out->marks = marks_;
    marks_.clear();
    std::remove(swap_path_.c_str());
    std::filesystem::remove_all(PoolDir(), ec);
    return st;
  }

 private:
  uint64_t Provisional() const { return 4 * footprint_ + (uint64_t(1) << 30); }

  // Swap on the machine and whether this benchmark's cgroup may use it.
  std::string SwapState() const {
    std::ifstream sw("/proc/swaps");
    std::string l, dev, type;
    uint64_t kib = 0, used = 0;
    std::getline(sw, l);
    std::string out;
    while (sw >> dev >> type >> kib >> used) {
      std::getline(sw, l);
      out += (out.empty() ? "" : ", ") + dev + " " + std::to_string(kib >> 10) + " MiB";
    }
    if (out.empty()) return "none on the machine";
    return out + (a_.zram_mib > 0 ? " (used by the cgroup: memory.swappiness 100)"
                                   : " on the machine, not used by the cgroup (memory.swappiness 0)");
  }

  // A fresh cgroup: swap only with --zram (else memory.swappiness 0, whatever swap other programs
  // turned on), registered for the signal handler.
  Status SetUpCgroup(MemCgroup* cg) {
    MZ_RETURN_IF_ERROR(cg->Create("mzcache-multitask-" + std::to_string(getpid())));
    SetCleanupPath(g_cgroup, cg->path());
    cg_ = cg->path();
    std::ofstream sw(cg_ + "/memory.swappiness");
    sw << (a_.zram_mib > 0 ? 100 : 0);
    sw.flush();
    if (!sw) return Status::IOError("cannot set " + cg_ + "/memory.swappiness");
    swap_path_ = a_.swap_dir + "/mzcache-multitask-" + std::to_string(getpid()) + ".swap";
    SetCleanupPath(g_files[2], swap_path_);
    return Status::Ok();
  }

  void StopWorker() {
    if (!worker_) return;
    const pid_t p = worker_->pid();
    worker_->Stop(20);
    UnregisterChild(p);
    worker_.reset();
    std::remove(swap_path_.c_str());
  }

  std::vector<std::string> WorkerArgv(const ModeSpec& m) const {
    char step[32], tol[32];
    std::snprintf(step, sizeof step, "%.4f", m.step);
    std::snprintf(tol, sizeof tol, "%.6g", a_.tol);
    const std::string& model = m.worker_mode == "ospaging" ? ospaging_model_ : model_;
    std::vector<std::string> v{SelfExe(), "multitask-worker", "--mode", m.worker_mode, "--model", model,
                               "--session", sess_, "--ref", ref_, "--ctx", std::to_string(a_.ctx + a_.query + 64),
                               "--threads", std::to_string(a_.threads), "--cgroup", cg_, "--swap-path", swap_path_,
                               "--source", m.source, "--cold-start", a_.cold, "--step", step, "--tol", tol};
    if (m.ahead) {
      char margin[32];
      std::snprintf(margin, sizeof margin, "%.4f", a_.restore_margin);
      v.insert(v.end(), {"--restore-ahead", "--calm-ms", std::to_string(a_.calm_ms), "--restore-margin", margin});
    }
    if (m.critical_step) v.push_back("--critical-step");
    if (m.no_yield) v.push_back("--no-yield");
    if (m.no_reconcile) v.push_back("--no-reconcile");
    if (m.anon) v.push_back("--anon");
    if (m.no_touch) v.push_back("--no-touch");
    if (m.worker_mode == "pool") v.insert(v.end(), {"--pool-dir", PoolDir(), "--pool-convs", std::to_string(a_.pool_convs)});
    return v;
  }

  // Mode pool: the pool's folder, kept across the worker's restarts within a mode (a killed worker
  // comes back from it), removed before and after each mode.
  std::string PoolDir() const { return swap_path_ + ".pool"; }

  // Mode pool: the conversations are copies of the session file, made here (outside the cgroup,
  // before the page cache is dropped) so the copy's page cache is not charged to the LLM.
  Status FillPoolDir() const {
    if (sess_.empty()) return Status::InvalidArgument("a pool mode needs --cold-start session (its conversations are copies of the session)");
    std::error_code ec;
    std::filesystem::create_directories(PoolDir(), ec);
    for (int i = 0; i < a_.pool_convs && !ec; ++i)
      std::filesystem::copy_file(sess_, PoolDir() + "/" + (i ? "conv-" + std::to_string(i) : std::string("ref")) + ".mzs",
                                 std::filesystem::copy_options::overwrite_existing, ec);
    return ec ? Status::IOError("filling " + PoolDir() + ": " + ec.message()) : Status::Ok();
  }

  void AddMark(const std::string& kind, double value = 0) { marks_.push_back({NowSeconds() - t0_, kind, value}); }

  // Starts a worker and waits for its `ready` line; *fields gets it.
  Status StartWorker(const ModeSpec& m, std::map<std::string, std::string>* fields) {
    worker_ = std::make_unique<WorkerProc>();
    MZ_RETURN_IF_ERROR(worker_->Start(WorkerArgv(m), cg_ + "/cgroup.procs", a_.llm_oom_adj));
    RegisterChild(worker_->pid());
    if (sampler_) sampler_->SetWorker(worker_->pid());
    std::string line;
    if (!worker_->NextReply(1800, &line) || line.rfind("ready", 0) != 0) {
      int status = 0;
      bool dead = false;
      for (int i = 0; i < 200 && !(dead = worker_->Exited(&status)); ++i) usleep(10000);  // closed its pipe: reap it
      return Status::Internal("the LLM worker did not start (" +
                              (dead ? (WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                                           : "exit status " + std::to_string(WEXITSTATUS(status)))
                                    : std::string("no answer")) +
                              ")");
    }
    *fields = ParseFields(line);
    return Status::Ok();
  }

  // Sends `query`; false if the worker died before answering.
  bool Query(std::map<std::string, std::string>* res) {
    std::string line;
    if (!worker_->Send("query")) return false;
    for (;;) {
      if (!worker_->NextReply(1800, &line)) return false;
      if (line.rfind("result", 0) == 0) break;
    }
    *res = ParseFields(line);
    return true;
  }

  bool WorkerDead(int* status) { return worker_->Exited(status); }

  static void FillAnswer(std::map<std::string, std::string>& res, RoundResult* rr) {
    auto num = [&](const char* k) { return res.count(k) ? std::stod(res[k]) : NAN; };
    rr->answered = res["ok"] == "1";
    rr->ttft_query = num("ttft");
    rr->intact = res["intact"] == "1";
    if (res.count("convs")) {
      rr->pool_convs = std::stoi(res["convs"]);
      rr->pool_lost = std::stoi(res["lost"]);
      rr->pool_damaged = std::stoi(res["damaged"]);
    }
    rr->history_ok = res["hist"] == "1";
    rr->bitident = res["bitident"] == "1";
    rr->maxdiff = num("maxdiff");
    rr->top1 = int(num("top1"));
    rr->ref_top1 = int(num("ref_top1"));
    rr->ref_margin = num("margin");
    rr->top1_equal = res["top1eq"] == "1";
    if (res.count("counted")) {
      rr->counted_mib = num("counted") / 1048576.0;
      rr->inram_mib = num("inram") / 1048576.0;
      rr->reconciled_mib = num("reconciled") / 1048576.0;
      rr->majflt = num("majflt");
      rr->minflt = num("minflt");
      rr->wait_s = num("wait");
      rr->reload_s = num("reload");
      rr->restored_in_query_mib = num("restored_bytes") / 1048576.0;
      rr->compute_threads = int(num("threads"));
      rr->measure_ms = num("measure_ms");
    }
    if (!rr->answered) rr->msg += "query failed: " + res["msg"] + "; ";
  }

  void DrainActions(RoundResult* r) {
    for (const auto& act : worker_->TakeActions()) {
      if (act.f.at("_") == "event") {
        ++r->events;
        marks_.push_back({act.t - t0_, "event", 0});
        r->actions.push_back({{"t", std::round((act.t - round_t0_) * 1000) / 1000}, {"event", act.f.count("level") ? act.f.at("level") : ""}});
        continue;
      }
      const double freed = act.f.count("freed") ? std::stod(act.f.at("freed")) / 1048576.0 : 0;
      auto get = [&](const char* k) { return act.f.count(k) ? act.f.at(k) : std::string(); };
      r->actions.push_back({{"t", std::round((act.t - round_t0_) * 1000) / 1000}, {"level", get("level")},
                            {"requested_mib", std::round(std::stod("0" + get("req")) / 1048576.0)},
                            {"freed_mib", std::round(freed)}, {"remaining", get("remaining")},
                            {"delay_ms", get("delay_ms")}, {"note", get("msg")},
                            {"restored_mib", std::round(std::stod("0" + get("restored_bytes")) / 1048576.0)}});
      if (get("restored") == "1") {
        const double mib = std::stod("0" + get("restored_bytes")) / 1048576.0;
        r->restored_mib += mib;
        marks_.push_back({act.t - t0_, "restore", mib});
      }
      if (freed > 0) {
        ++r->evictions;
        r->freed_mib += freed;
        marks_.push_back({act.t - t0_, "evict", freed});
      }
    }
  }

  Status RunRounds(const ModeSpec& m, MemCgroup* cg, ModeResult* out) {
    std::map<std::string, std::string> f;
    // The warm-up runs under a provisional limit far above the footprint (a cold worker's loading
    // is not what is measured); the cgroup has a limit from the start because a watermark source
    // decides when it starts whether it watches the cgroup or the whole machine.
    MZ_RETURN_IF_ERROR(cg->SetLimit(Provisional()));
    MZ_RETURN_IF_ERROR(StartWorker(m, &f));
    // Warm-up query with everything resident (touches every weight page of the OS Paging worker).
    std::map<std::string, std::string> res;
    if (!Query(&res)) return Status::Internal("the LLM worker died during its warm-up query");
    out->warm_ttft = std::stod(res["ttft"]);
    out->warm_intact = res["intact"] == "1";
    out->llm_usage0 = cg->Usage();
    MZ_RETURN_IF_ERROR(cg->SetLimit(limit_));
    std::fprintf(stderr, "  %s: worker ready (%s, %.1f s); warm query TTFT %.3f s, intact %s; usage %.0f MiB, limit %.0f MiB\n",
                 m.name.c_str(), f["how"].c_str(), std::stod(f["load_s"]), out->warm_ttft, out->warm_intact ? "yes" : "NO",
                 out->llm_usage0 / 1048576.0, limit_ / 1048576.0);
    for (int r = 0; r < int(plan_.size()); ++r) {
      RoundResult rr;
      rr.round = r + 1;
      const RoundPlan& p = plan_[size_t(r)];
      rr.n_apps = int(p.apps.size());
      for (auto& ap : p.apps) rr.app_mib += ap.mib;
      const uint64_t oom0 = CgroupOomKills(cg_);
      worker_->TakeActions();  // anything before the round (e.g. after the last query) is not this round's
      const double tr = NowSeconds();
      round_t0_ = tr;
      std::vector<pid_t> running;
      struct KillLeft {  // an error return leaves no app running
        std::vector<pid_t>* r;
        ~KillLeft() {
          for (pid_t pid : *r) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
            UnregisterChild(pid);
          }
        }
      } kill_left{&running};
      std::vector<bool> started(p.apps.size(), false);
      size_t n_done = 0;
      int status = 0;
      while (n_done < p.apps.size()) {
        const double now = NowSeconds() - tr;
        for (size_t i = 0; i < p.apps.size(); ++i) {
          if (started[i] || now < p.apps[i].start) continue;
          started[i] = true;
          char sec[32], rate[32];
          std::snprintf(sec, sizeof sec, "%.3f", p.apps[i].seconds);
          std::snprintf(rate, sizeof rate, "%.1f", a_.app_rate);
          std::vector<std::string> av{SelfExe(), "multitask-app", "--mib", std::to_string(p.apps[i].mib), "--seconds",
                                      sec, "--rate", rate};
          if (!app_file_.empty()) av.insert(av.end(), {"--file", app_file_});
          ChildProc c;
          MZ_RETURN_IF_ERROR(SpawnInCgroup(av, cg_ + "/cgroup.procs", 0, false, &c));
          RegisterChild(c.pid);
          sampler_->AddApp(c.pid);
          running.push_back(c.pid);
          AddMark("app", p.apps[i].mib);
        }
        for (size_t i = 0; i < running.size();) {
          int s = 0;
          if (waitpid(running[i], &s, WNOHANG) == running[i]) {
            if (WIFSIGNALED(s)) ++rr.apps_killed;
            else if (WEXITSTATUS(s) != 0) rr.msg += "app exit status " + std::to_string(WEXITSTATUS(s)) + "; ";
            sampler_->RemoveApp(running[i]);
            UnregisterChild(running[i]);
            running.erase(running.begin() + long(i));
            ++n_done;
          } else {
            ++i;
          }
        }
        if (!rr.killed && WorkerDead(&status)) {
          rr.killed = true;
          rr.kill_t = NowSeconds() - tr;
          AddMark("kill");
          if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
            rr.msg += "LLM worker ended without SIGKILL (status " + std::to_string(status) + "); ";
        }
        usleep(10000);
      }
      // The user comes back to the LLM.
      const double tg = NowSeconds() + a_.gap;
      while (NowSeconds() < tg) {
        if (!rr.killed && WorkerDead(&status)) {
          rr.killed = true;
          rr.kill_t = NowSeconds() - tr;
          AddMark("kill");
        }
        usleep(10000);
      }
      rr.peak_mib = sampler_->PeakSince(tr);
      if (!rr.killed) {
        uint64_t rss = 0, sw = 0;
        ProcMemory(worker_->pid(), &rss, &sw);
        rr.llm_rss_mib = rss / 1048576.0;
        DrainActions(&rr);
        AddMark("query");
        const CgroupMemStat ms = ReadCgroupMemStat(cg_);
        rr.cg_cache_mib = ms.cache / 1048576.0;
        rr.cg_rss_mib = ms.rss / 1048576.0;
        rr.cg_mapped_mib = ms.mapped_file / 1048576.0;
        uint64_t some0 = 0, full0 = 0, some1 = 0, full1 = 0;
        const bool psi = ReadPsiMemory(&some0, &full0);
        const bool answered = Query(&res);
        if (psi && ReadPsiMemory(&some1, &full1)) {
          rr.psi_some_ms = (some1 - some0) / 1000.0;
          rr.psi_full_ms = (full1 - full0) / 1000.0;
        }
        if (answered) {
          rr.back = "kept";
          FillAnswer(res, &rr);
          rr.ttft = rr.ttft_query;
          rr.remaining = std::stod(res["remaining"]);
        } else {
          rr.killed = true;  // died while answering
          rr.kill_t = NowSeconds() - tr;
          AddMark("kill");
          rr.msg += "killed during the query; ";
        }
        DrainActions(&rr);
      }
      if (rr.killed) {
        UnregisterChild(worker_->pid());
        worker_->Stop(5);   // reaped already; joins the reader so every action line it sent is counted
        DrainActions(&rr);
        worker_.reset();
        const double tc = NowSeconds();
        AddMark("cold");
        MZ_RETURN_IF_ERROR(StartWorker(m, &f));
        rr.back = f["how"];
        if (!Query(&res)) return Status::Internal("the cold-started LLM worker died during its first query");
        FillAnswer(res, &rr);
        rr.ttft = NowSeconds() - tc;  // the user waits for the restart and the query
        rr.cold_start_s = rr.ttft - rr.ttft_query;
      }
      marks_.push_back({NowSeconds() - t0_, "answer", rr.ttft});
      // The same query again right away, everything resident now (the answer restored or faulted
      // it in): the all-in-memory TTFT paired with this round, under the same machine load.
      if (Query(&res) && res["ok"] == "1") {
        rr.ttft_resident = std::stod(res["ttft"]);
        rr.resident_remaining = std::stod(res["remaining"]);
      }
      DrainActions(&rr);
      rr.oom_kills = CgroupOomKills(cg_) - oom0;
      std::fprintf(stderr, "  %s round %2d/%d: apps %5d MiB (%d), LLM %s, TTFT %.3f s%s, context %s%s\n", m.name.c_str(),
                   rr.round, int(plan_.size()), rr.app_mib, rr.n_apps,
                   rr.killed ? "KILLED" : "survived", rr.ttft,
                   rr.killed ? (" (cold start: " + rr.back + ")").c_str() : "",
                   (std::string(rr.intact ? (rr.bitident ? "intact (bit-identical)" : "intact") : "NOT intact") +
                    (rr.pool_convs >= 0 ? "; pool: " + std::to_string(rr.pool_convs) + " conversations, " +
                                              std::to_string(rr.pool_lost) + " lost, " + std::to_string(rr.pool_damaged) +
                                              " damaged" : std::string())).c_str(),
                   rr.evictions ? (", " + std::to_string(rr.evictions) + " evictions, " +
                                   std::to_string(int(rr.freed_mib)) + " MiB freed").c_str()
                                : "");
      out->rounds.push_back(rr);
    }
    return Status::Ok();
  }

  MtArgs a_;
  std::string model_, ospaging_model_, sess_, ref_, app_file_;
  uint64_t footprint_;
  uint64_t limit_ = 0, usage0_ = 0;
  std::vector<RoundPlan> plan_;
  std::string cg_, swap_path_;
  double t0_ = 0, round_t0_ = 0;
  Sampler* sampler_ = nullptr;
  std::unique_ptr<WorkerProc> worker_;
  std::vector<Mark> marks_;
};

std::string Fmt(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// --quick: CI-sized (docs/multitask.md): a small model whose KV is a large share of its footprint
// (so OS Paging cannot survive by dropping weight pages alone), 3 short rounds, slower apps.
// given(name): whether the option was on the command line (--quick changes only the others).
void ApplyQuick(MtArgs* a, const std::function<bool(const char*)>& given) {
  if (!a->quick) return;
  if (!given("--rounds")) a->rounds = 3;
  if (!given("--type")) a->type = "q4_0";
  if (!given("--ctx")) a->ctx = 3072;
  if (!given("--need-lo")) a->need_lo = 0.65;
  if (!given("--need-hi")) a->need_hi = 0.75;
  if (!given("--hold-lo")) a->hold_lo = 1.0;
  if (!given("--hold-hi")) a->hold_hi = 2.0;
  if (!given("--gap")) a->gap = 0.3;
  if (!given("--app-rate")) a->app_rate = 128;  // margin for a loaded CI machine (docs/multitask.md)
}

// The modes named on the command line (ospaging, mz<points>[+ahead][+step][+noyield][+noreconcile][+anon][+notouch][@<source>]).
Status ParseModes(const MtArgs& a, std::vector<ModeSpec>* modes) {
  for (const std::string& m : a.modes) {
    const size_t at = m.find('@');
    std::string body = m.substr(0, at);
    ModeSpec spec{m, "mzcache", 0, at == std::string::npos ? a.source : m.substr(at + 1)};
    spec.ahead = a.restore_ahead;
    bool flags_ok = true;
    for (size_t plus; (plus = body.rfind('+')) != std::string::npos;) {
      const std::string f = body.substr(plus + 1);
      if (f == "ahead") spec.ahead = true;
      else if (f == "step") spec.critical_step = true;
      else if (f == "noyield") spec.no_yield = true;
      else if (f == "noreconcile") spec.no_reconcile = true;
      else if (f == "anon") spec.anon = true;
      else if (f == "notouch") spec.no_touch = true;
      else flags_ok = false;
      body.resize(plus);
    }
    // pool<NN>: the LLM is a pool of --pool-conversations conversations (issue 22's pressure run).
    const bool pool = body.rfind("pool", 0) == 0;
    if (pool) spec.worker_mode = "pool";
    const std::string pts = body.size() > (pool ? 4 : 2) ? body.substr(pool ? 4 : 2) : "";
    if (pool && (spec.ahead || spec.no_yield || spec.no_reconcile || spec.anon || spec.no_touch))
      return Status::InvalidArgument("mode '" + m + "': a pool mode takes only +step and @<source>");
    if (m == "ospaging") modes->push_back({m, "ospaging", 0, ""});
    else if (flags_ok && (pool || body.rfind("mz", 0) == 0) && !pts.empty() && pts.size() <= 3 &&
             std::all_of(pts.begin(), pts.end(), ::isdigit) && std::stoi(pts) > 0 && std::stoi(pts) <= 100) {
      spec.step = std::stoi(pts) / 100.0;
      modes->push_back(spec);
    } else {
      return Status::InvalidArgument("unknown mode '" + m +
                                     "' (ospaging, mz15, mz25, mz<points>[+ahead][+step][+noyield][+noreconcile][+anon][+notouch][@<source>], "
                                     "pool<points>[+step][@<source>])");
    }
  }
  return Status::Ok();
}

// What the rounds start from: the model, the all-resident reference and the scratch files.
struct MtSetup {
  std::string path, tag, ref_path, app_file, os_model, sess;
  MultitaskRef ref;
  std::vector<double> mem_ttfts;
  double mem_ttft = 0;
  bool deterministic = false;
  MemoryReport rep;
  Control control;
  std::string swap_desc = "none (memory.swappiness 0 in the cgroup)";
};

// 1. The context and the reference, all memory resident, in this process (outside the cgroup);
// the apps' code file.
Status PrepareReference(const MtArgs& a, MtSetup* s) {
  MZ_RETURN_IF_ERROR(BuildReference(s->path, a, &s->sess, &s->ref, &s->mem_ttfts, &s->deterministic, &s->rep, &s->control));
  if (a.cold != "session") s->sess.clear();
  MZ_RETURN_IF_ERROR(WriteMultitaskRef(s->ref_path, s->ref));
  s->mem_ttft = Median(s->mem_ttfts);
  std::fprintf(stderr, "  all-in-memory TTFT %.3f s (median of %d); footprint %.0f MiB (weights %.0f, KV %.0f); "
               "repeat runs bit-identical: %s\n", s->mem_ttft, a.ref_reps, s->rep.footprint() / 1048576.0,
               s->rep.weights_total / 1048576.0, s->rep.kv_total / 1048576.0, s->deterministic ? "yes" : "no");
  std::fprintf(stderr, "  control (query over only the last %d context tokens): max logit diff %.3g, same top-1: %s%s\n",
               s->control.window, s->control.maxdiff, s->control.top1_equal ? "yes" : "no",
               s->control.maxdiff <= a.tol ? " -- WARNING: --tol cannot tell this lost context apart" : "");
  if (!s->app_file.empty()) {
    std::string cmd = "head -c " + std::to_string(uint64_t(a.app_file_mib) << 20) + " /dev/urandom > '" + s->app_file + "'";
    if (std::system(cmd.c_str()) != 0) return Status::IOError("cannot write " + s->app_file);
  }
  return Status::Ok();
}

// 3. The OS Paging worker maps a private copy of the model: page cache of the shared file that
// another process on the machine has mapped would be charged to that process's cgroup, not to
// this benchmark's, and the limit would not hold the weights.
Status CopyModelForOsPaging(const MtArgs& a, const std::vector<ModeSpec>& modes, MtSetup* s, std::vector<std::string>* files) {
  if (!std::any_of(modes.begin(), modes.end(), [](const ModeSpec& m) { return m.worker_mode == "ospaging"; }))
    return Status::Ok();
  s->os_model = a.swap_dir + "/mzcache-multitask-" + s->tag + ".gguf";
  SetCleanupPath(g_files[3], s->os_model);
  files->push_back(s->os_model);
  if (std::system(("cp '" + s->path + "' '" + s->os_model + "'").c_str()) != 0)
    return Status::IOError("cannot copy the model to " + s->os_model);
  return Status::Ok();
}

// 4. The rounds, the same plan for every mode; a mode that stops early keeps its rounds so far.
Status RunModes(const std::vector<ModeSpec>& modes, MultitaskBench* bench, std::vector<ModeResult>* results) {
  Status st = bench->Calibrate();
  g_cgroup[0] = 0;
  if (!st.ok()) return st.With("calibration");
  for (const ModeSpec& m : modes) {
    std::fprintf(stderr, "== %s ==\n", m.name.c_str());
    ModeResult r;
    st = bench->RunMode(m, &r);
    g_cgroup[0] = 0;
    if (!st.ok()) {
      r.error = st.ToString();
      std::fprintf(stderr, "  %s: stopped: %s\n", m.name.c_str(), r.error.c_str());
    }
    results->push_back(std::move(r));
  }
  return Status::Ok();
}

// The run's parameters and reference figures (JSON).
nlohmann::json MultitaskDoc(const MtArgs& a, const MtSetup& s, MultitaskBench& bench) {
  nlohmann::json doc;
  doc["machine"] = MachineDescription();
  doc["harness_pid"] = int(getpid());  // names its cgroup and scratch files (mzcache-multitask-<pid>*)
  doc["model"] = s.path;
  doc["ctx"] = a.ctx;
  doc["query_tokens"] = a.query;
  doc["threads"] = a.threads;
  doc["seed"] = a.seed;
  doc["rounds_per_mode"] = a.rounds;
  doc["footprint_bytes"] = s.rep.footprint();
  doc["weights_bytes"] = s.rep.weights_total;
  doc["kv_bytes"] = s.rep.kv_total;
  doc["limit_bytes"] = bench.limit();
  doc["llm_usage_after_warmup_bytes"] = bench.usage0();
  doc["swap"] = s.swap_desc;
  doc["pressure_source"] = a.source;
  doc["llm_oom_score_adj"] = a.llm_oom_adj;
  doc["app_rate_mib_s"] = a.app_rate;
  doc["app_file_mib"] = a.app_file_mib;
  doc["cold_start"] = a.cold;
  doc["intact_tolerance"] = a.tol;
  doc["control_lost_context"] = {{"window_tokens", s.control.window}, {"max_logit_diff", s.control.maxdiff},
                                  {"top1_equal", s.control.top1_equal}};
  doc["all_in_memory_ttft"] = {{"median", s.mem_ttft}, {"runs", s.mem_ttfts}, {"bit_identical_repeats", s.deterministic}};
  nlohmann::json plan = nlohmann::json::array();
  for (auto& p : bench.plan()) {
    nlohmann::json apps = nlohmann::json::array();
    for (auto& ap : p.apps) apps.push_back({{"mib", ap.mib}, {"start_s", ap.start}, {"seconds", ap.seconds}});
    plan.push_back({{"need", p.need}, {"total_mib", p.total_mib}, {"apps", apps}});
  }
  doc["plan"] = plan;
  return doc;
}

// The report's header and the summary table's header.
std::string MultitaskHeader(const MtArgs& a, const MtSetup& s, MultitaskBench& bench) {
  char line[1024];
  std::string md = "# bench multitask\n\nmachine: " + MachineDescription() + "\n\nmodel " + s.path + ", context " +
                   std::to_string(a.ctx) + " tokens, query " + std::to_string(a.query) + " tokens, " +
                   std::to_string(a.threads) + " threads, seed " + std::to_string(a.seed) + "\n\n";
  std::snprintf(line, sizeof line,
                "LLM footprint %.0f MiB (weights %.0f, KV %.0f); cgroup limit **%.0f MiB** (LLM usage after warm-up %.0f MiB); "
                "swap: %s; mzcache pressure source: %s; "
                "LLM oom_score_adj %d (apps 0); apps touch at %.0f MiB/s and read a %d MiB code file; cold start: %s\n\n"
                "all-in-memory TTFT: **%.3f s** (median of %d, measured in this run; repeats bit-identical: %s)\n\n",
                s.rep.footprint() / 1048576.0, s.rep.weights_total / 1048576.0, s.rep.kv_total / 1048576.0,
                bench.limit() / 1048576.0, bench.usage0() / 1048576.0, s.swap_desc.c_str(), a.source.c_str(), a.llm_oom_adj,
                a.app_rate, a.app_file_mib, a.cold.c_str(), s.mem_ttft, a.ref_reps, s.deterministic ? "yes" : "no");
  md += line;
  md += "| mode | survived (not killed, context intact) | killed | median TTFT on return s | median / all-in-memory | "
        "max / all-in-memory | median of per-round TTFT / paired resident TTFT |\n|---|---|---|---|---|---|---|\n";
  return md;
}

// A mode's section header: its parameters, how it ended, its warm-up.
std::string ModeHeader(const MtArgs& a, const ModeResult& r) {
  return "\n## " + r.spec.name +
         (r.spec.source.empty() ? std::string()
                                : " (" + Fmt("%.0f", 100 * r.spec.step) + " points per event, source " + r.spec.source +
                                      (r.spec.critical_step ? ", critical: escalated step" : ", critical: to the floor") +
                                      (r.spec.ahead ? ", restore-ahead in the background (calm " + std::to_string(a.calm_ms) +
                                                          " ms, keeping " + Fmt("%.0f", 100 * a.restore_margin) + "% of the limit free)"
                                                    : ", restore on request") + ")") +
         "\n\n" + (r.error.empty() ? std::string() : "**stopped early: " + r.error + "**\n\n") + "swap: " + r.swap +
         "\n\nwarm-up query (all resident, in the cgroup): TTFT " + Fmt("%.3f", r.warm_ttft) +
         " s, intact " + (r.warm_intact ? "yes" : "no") + "; LLM usage before pressure " +
         Fmt("%.0f", r.llm_usage0 / 1048576.0) + " MiB\n\n" +
         "| round | apps MiB | LLM killed | back by | TTFT on return s | / all-in-memory | paired resident TTFT s (ratio) | "
         "context intact | max logit diff | LLM resident before query | LLM in RAM: kernel / counted MiB | "
         "moved to evicted MiB | major faults in query | cgroup page cache / anon MiB | memory stall in query ms (some/full) | "
         "evictions (MiB freed) | restored ahead MiB | peak usage MiB |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
}

std::string RoundRow(const RoundResult& x, double mem_ttft) {
  char line[1024];
  std::snprintf(line, sizeof line, "| %d | %d (%d app%s) | %s | %s | %.3f | %.2f | %.3f (%.2f) | %s | %.3g | %s | %s | %.0f | %.0f | %.0f / %.0f | %s | %d (%.0f) | %.0f | %.0f |\n",
                x.round, x.app_mib, x.n_apps, x.n_apps > 1 ? "s" : "", x.killed ? "**yes**" : "no",
                x.back == "kept" ? "kept in memory" : ("cold start, " + x.back).c_str(), x.ttft, x.ttft / mem_ttft,
                x.ttft_resident, x.ttft / x.ttft_resident,
                x.intact ? (x.bitident ? "yes (bit-identical)" : "yes") : "**no**", x.maxdiff,
                x.killed           ? "-"
                : x.remaining >= 0 ? (Fmt("%.0f%%", 100 * x.remaining)).c_str()
                                   : (Fmt("RSS %.0f MiB", x.llm_rss_mib)).c_str(),
                x.counted_mib >= 0 ? (Fmt("%.0f", x.inram_mib) + " / " + Fmt("%.0f", x.counted_mib)).c_str() : "-",
                x.reconciled_mib, x.majflt, x.cg_cache_mib, x.cg_rss_mib,
                x.psi_some_ms >= 0 ? (Fmt("%.0f", x.psi_some_ms) + " / " + Fmt("%.0f", x.psi_full_ms)).c_str() : "-",
                x.evictions, x.freed_mib, x.restored_mib, x.peak_mib);
  return line;
}

nlohmann::json RoundJson(const RoundResult& x, double mem_ttft) {
  return {{"round", x.round}, {"app_mib", x.app_mib}, {"n_apps", x.n_apps}, {"apps_killed", x.apps_killed},
          {"killed", x.killed}, {"kill_t", x.kill_t}, {"back", x.back}, {"cold_start_s", x.cold_start_s},
          {"answered", x.answered}, {"ttft", x.ttft}, {"ttft_query", x.ttft_query},
          {"ttft_over_memory", x.ttft / mem_ttft}, {"ttft_resident", x.ttft_resident},
          {"ttft_over_resident", x.ttft / x.ttft_resident}, {"resident_remaining", x.resident_remaining}, {"intact", x.intact}, {"bit_identical", x.bitident},
          {"max_logit_diff", x.maxdiff}, {"history_ok", x.history_ok},
          {"pool_conversations", x.pool_convs}, {"pool_conversations_lost", x.pool_lost}, {"pool_damaged_files", x.pool_damaged},
          {"top1", x.top1}, {"ref_top1", x.ref_top1}, {"top1_equal", x.top1_equal}, {"ref_margin", x.ref_margin}, {"remaining_before_query", x.remaining},
          {"llm_rss_mib_before_query", x.llm_rss_mib}, {"llm_counted_resident_mib", x.counted_mib},
          {"llm_in_ram_mib", x.inram_mib}, {"reconciled_mib", x.reconciled_mib}, {"major_faults_in_query", x.majflt},
          {"minor_faults_in_query", x.minflt}, {"cgroup_cache_mib_before_query", x.cg_cache_mib},
          {"cgroup_anon_mib_before_query", x.cg_rss_mib}, {"cgroup_mapped_file_mib_before_query", x.cg_mapped_mib},
          {"psi_memory_some_ms_in_query", x.psi_some_ms}, {"psi_memory_full_ms_in_query", x.psi_full_ms},
          {"query_wait_s", x.wait_s}, {"query_reload_s", x.reload_s}, {"query_restored_mib", x.restored_in_query_mib},
          {"query_compute_threads_while_restoring", x.compute_threads}, {"query_measure_ms", x.measure_ms}, {"pressure_events", x.events}, {"evictions", x.evictions}, {"freed_mib", x.freed_mib}, {"restored_mib", x.restored_mib},
          {"peak_usage_mib", x.peak_mib}, {"oom_kills", x.oom_kills}, {"msg", x.msg},
          {"actions", x.actions}};
}

// trace-<mode>.dat (memory over time) and events-<mode>.dat (kills, queries, pressure events).
void WriteTraces(const MtArgs& a, const ModeResult& r) {
  char line[256];
  std::string dat = "# t_s cgroup_usage_MiB llm_rss_MiB apps_rss_MiB cgroup_page_cache_MiB\n";
  for (const Sample& s : r.samples) {
    std::snprintf(line, sizeof line, "%.2f %.1f %.1f %.1f %.1f\n", s.t, s.usage, s.llm, s.apps, s.cache);
    dat += line;
  }
  WriteFile(a.out, "trace-" + r.spec.name + ".dat", dat);
  std::string ev = "# t_s kind value\n";
  for (const Mark& mk : r.marks) {
    std::snprintf(line, sizeof line, "%.2f %s %.4f\n", mk.t, mk.kind.c_str(), mk.value);
    ev += line;
  }
  WriteFile(a.out, "events-" + r.spec.name + ".dat", ev);
}

// One mode: its section (*tables), its summary row (*md), its JSON and trace files.
nlohmann::json ReportMode(const MtArgs& a, const ModeResult& r, double mem_ttft, std::string* md, std::string* tables) {
  int survived = 0, killed = 0;
  std::vector<double> t, paired;
  nlohmann::json rows = nlohmann::json::array();
  *tables += ModeHeader(a, r);
  for (const RoundResult& x : r.rounds) {
    survived += !x.killed && x.intact;
    killed += x.killed;
    t.push_back(x.ttft);
    if (std::isfinite(x.ttft_resident) && x.ttft_resident > 0) paired.push_back(x.ttft / x.ttft_resident);
    *tables += RoundRow(x, mem_ttft);
    rows.push_back(RoundJson(x, mem_ttft));
  }
  if (r.spec.worker_mode == "pool") {
    // Nothing lost: the conversations the pool listed after each round's query.
    std::string convs;
    int lost = 0, damaged = 0;
    for (const RoundResult& x : r.rounds) {
      convs += (convs.empty() ? "" : ", ") + std::to_string(x.pool_convs);
      lost = std::max(lost, x.pool_lost);
      damaged = std::max(damaged, x.pool_damaged);
    }
    *tables += "\nPool: " + std::to_string(a.pool_convs) + " conversations at the start; listed after each round's query: " +
               convs + "; deleted by the pool: " + std::to_string(lost) + "; damaged files: " + std::to_string(damaged) + ".\n";
  }
  const double med = Median(t), mx = t.empty() ? NAN : *std::max_element(t.begin(), t.end());
  char line[1024];
  std::snprintf(line, sizeof line, "| %s | %d/%d | %d | %.3f | %.2f | %.2f | %.2f |\n", r.spec.name.c_str(), survived,
                int(r.rounds.size()), killed, med, med / mem_ttft, mx / mem_ttft, Median(paired));
  *md += line;
  WriteTraces(a, r);
  return {{"mode", r.spec.name}, {"step_points", r.spec.step}, {"source", r.spec.source}, {"error", r.error},
          {"swap", r.swap}, {"warm_ttft", r.warm_ttft},
          {"warm_intact", r.warm_intact}, {"llm_usage0_bytes", r.llm_usage0}, {"rounds", rows},
          {"summary", {{"survived", survived}, {"killed", killed}, {"rounds", int(r.rounds.size())},
                       {"median_ttft", med}, {"median_over_memory", med / mem_ttft},
                       {"max_over_memory", mx / mem_ttft}, {"median_over_paired_resident", Median(paired)}}}};
}

// Fig. 15: one panel per mode (memory over time, kills, queries, pressure events).
std::string TracePlotScript(const std::vector<ModeResult>& results, double lim) {
  std::string gp = "set terminal pngcairo size 1000," + std::to_string(260 * int(results.size()) + 60) +
                   "\nset output 'multitask-trace.png'\nset multiplot layout " + std::to_string(results.size()) +
                   ",1 title 'Memory trace: LLM + apps in one memory cgroup (limit " + Fmt("%.0f", lim) +
                   " MiB)'\nset ylabel 'MiB'\nset key outside right\nset yrange [0:" + Fmt("%.0f", lim * 1.15) + "]\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string n = results[i].spec.name;
    gp += "set title '" + n + "' noenhanced\n";
    if (i + 1 == results.size()) gp += "set xlabel 'time (s)'\n";
    gp += "plot 'trace-" + n + ".dat' u 1:($3+$4) w filledcurves x1 lc rgb '#f4a261' t 'apps', '' u 1:3 w filledcurves x1 "
          "lc rgb '#2a9d8f' t 'LLM', '' u 1:2 w l lc rgb 'black' t 'cgroup usage', '' u 1:5 w l dt 3 lw 2 lc rgb '#6a4c93' t 'its page cache', " + Fmt("%.1f", lim) +
          " w l dt 2 lc rgb 'red' t 'limit', 'events-" + n + ".dat' u 1:(strcol(2) eq 'kill' ? " + Fmt("%.1f", lim * 1.05) +
          " : 1/0) w p pt 2 ps 2 lw 2 lc rgb 'red' t 'LLM killed', '' u 1:(strcol(2) eq 'query' ? " +
          Fmt("%.1f", lim * 1.10) + " : 1/0) w p pt 9 ps 1.5 lc rgb 'blue' t 'query', '' u 1:(strcol(2) eq 'cold' ? " +
          Fmt("%.1f", lim * 1.10) + " : 1/0) w p pt 8 ps 1.5 lc rgb 'red' t 'cold start + query', '' u 1:(strcol(2) eq "
          "'event' ? " + Fmt("%.1f", lim * 0.03) + " : 1/0) w p pt 7 ps 0.5 lc rgb 'purple' t 'pressure event', '' u "
          "1:(strcol(2) eq 'restore' ? " + Fmt("%.1f", lim * 0.07) + " : 1/0) w p pt 6 ps 0.8 lc rgb 'dark-green' t "
          "'restore-ahead slice'\n";
  }
  return gp + "unset multiplot\n";
}

// 5. Results: JSON, markdown, trace + plot.
void ReportMultitask(const MtArgs& a, const MtSetup& s, MultitaskBench& bench, const std::vector<ModeResult>& results,
                     double t_all) {
  nlohmann::json doc = MultitaskDoc(a, s, bench);
  std::string md = MultitaskHeader(a, s, bench);
  nlohmann::json jm = nlohmann::json::array();
  std::string tables;
  for (const ModeResult& r : results) jm.push_back(ReportMode(a, r, s.mem_ttft, &md, &tables));
  doc["modes"] = jm;
  md += tables;
  md += "\n\"survived\": the LLM process was not killed and its context was intact at the query: token history "
        "unchanged, no logit off the all-resident reference by more than " + Fmt("%.3g", a.tol) +
        ", and the same greedy token (or a near-tie within twice the measured logit difference). Control: the query "
        "over only the last " + std::to_string(s.control.window) + " tokens of the context differs by " +
        Fmt("%.3g", s.control.maxdiff) + ". A killed worker is restarted (cold start) before it answers; its TTFT on "
        "return includes the restart. Paired resident TTFT: the same query sent again right after the answer, with "
        "everything resident, under the same machine load (the ratio is robust to load drift; the all-in-memory TTFT "
        "above was measured once before the modes).\n";
  const std::string png = PlotPng(a.out, "multitask-trace", TracePlotScript(results, bench.limit() / 1048576.0));
  if (!png.empty()) md += "\n![memory trace](multitask-trace.png)\n";
  char line[128];
  std::snprintf(line, sizeof line, "\nwall time of the benchmark: %.0f s\n", NowSeconds() - t_all);
  md += line;
  WriteReport(a.out, "multitask", md, doc);
  std::fputs(md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/multitask.{md,json}, traces and multitask-trace.png\n", a.out.c_str());
}

// given(name): whether the option was on the command line (--quick changes only the others).
int RunBench(MtArgs a, const std::function<bool(const char*)>& given) {
  signal(SIGPIPE, SIG_IGN);
  ApplyQuick(&a, given);
  std::vector<ModeSpec> modes;
  if (Status st = ParseModes(a, &modes); !st.ok()) return Fail(st);
  if (a.rounds < 1 || a.need_lo > a.need_hi || a.hold_lo > a.hold_hi || a.max_apps < 1)
    return Fail(Status::InvalidArgument("bad round parameters"));
  {
    MemCgroup probe;
    Status st = probe.Create("mzcache-multitask-probe-" + std::to_string(getpid()));
    if (!st.ok()) {
      std::fprintf(stderr, "bench multitask needs root and a cgroup v1 memory controller: %s\n", st.ToString().c_str());
      return kExitUnsupported;
    }
  }
  MtSetup s;
  if (Status st = BenchModelPath(a.model, a.type, &s.path); !st.ok()) return Fail(st);
  const double t_all = NowSeconds();
  std::fprintf(stderr, "bench multitask: %s, context %d, %d rounds, seed %llu, modes", s.path.c_str(), a.ctx, a.rounds,
               (unsigned long long)a.seed);
  for (auto& m : modes) std::fprintf(stderr, " %s", m.name.c_str());
  std::fprintf(stderr, "\n");

  signal(SIGINT, OnMultitaskSignal);
  signal(SIGTERM, OnMultitaskSignal);
  s.tag = std::to_string(getpid());
  s.ref_path = a.swap_dir + "/mzcache-multitask-" + s.tag + ".ref";
  s.app_file = a.app_file_mib > 0 ? a.swap_dir + "/mzcache-multitask-" + s.tag + ".app" : "";
  SetCleanupPath(g_files[0], s.ref_path);
  SetCleanupPath(g_files[1], s.app_file);
  struct Files {
    std::vector<std::string> f;
    ~Files() {
      for (auto& x : f)
        if (!x.empty()) std::remove(x.c_str());
    }
  } files{{s.ref_path, s.app_file}};
  if (Status st = PrepareReference(a, &s); !st.ok()) return Fail(st);

  // 2. Swap: none by default (the cgroup gets memory.swappiness 0, whatever swap other programs
  // have on); --zram: zram (or the swap already active), used by the cgroup, switched off on exit.
  ZramSwap zram;
  if (a.zram_mib > 0) {
    if (Status st = zram.Ensure(uint64_t(a.zram_mib) << 20); !st.ok()) return Fail(st);
    s.swap_desc = zram.description();
    g_zram_created = s.swap_desc.rfind("zram swap", 0) == 0;
  }
  std::fprintf(stderr, "  swap: %s\n", s.swap_desc.c_str());
  if (Status st = CopyModelForOsPaging(a, modes, &s, &files.f); !st.ok()) return Fail(st);

  MultitaskBench bench(a, s.path, s.os_model, s.sess, s.ref_path, s.app_file, s.rep.footprint());
  bench.plan() = MakePlan(a);
  if (a.limit_mib > 0) bench.set_limit(uint64_t(a.limit_mib) << 20);
  std::vector<ModeResult> results;
  if (Status st = RunModes(modes, &bench, &results); !st.ok()) return Fail(st);
  ReportMultitask(a, s, bench, results, t_all);
  return 0;
}

}  // namespace

void AddMultitaskCommands(CLI::App& app, Runners& runners) {
  AddMultitaskChildren(app, runners);
  CLI::App* bench = app.get_subcommand("bench");
  auto a = std::make_shared<MtArgs>();
  auto* c = bench->add_subcommand(
      "multitask",
      "LLM + memory-hungry apps in one memory cgroup (v1) with a fixed limit, in rounds: killed or not, TTFT on return, "
      "context intact, memory trace; OS Paging vs mzcache at 15/25 points per pressure event (needs root; exit 77 "
      "without root or cgroup v1)");
  c->add_option("--rounds", a->rounds, "rounds per mode")->capture_default_str();
  c->add_option("--seed", a->seed, "seed of the app sizes and durations (the same plan for every mode)")->capture_default_str();
  c->add_option("--ctx", a->ctx, "context tokens (real text, built once by prefill, kept as a session file)")->capture_default_str();
  c->add_option("-q,--query", a->query, "query tokens")->capture_default_str();
  c->add_option("-m,--model", a->model, "model shape (make-model --list) or GGUF path")->capture_default_str();
  c->add_option("--type", a->type, "weight type for a synthesized shape")->capture_default_str();
  c->add_option("--limit-mib", a->limit_mib, "cgroup limit (0: LLM usage after warm-up + --free x footprint)")->capture_default_str();
  c->add_option("--free", a->free_frac, "auto limit: free memory for apps, fraction of the LLM footprint")->capture_default_str();
  c->add_option("--modes", a->modes, "ospaging, mz15, mz25: mz<points>[+ahead][+step][+noyield][+noreconcile][+anon][+notouch][@<source>], "
                "pool<points>[+step][@<source>] (pool: the LLM is a pool of --pool-conversations conversations under a "
                "budget of the weights + one conversation, the query to one of them; +ahead: restore-ahead in the background; "
                "+step: critical events escalate the step instead of evicting to the floor; +noyield: a restore-ahead slice "
                "finishes even when the query waits; +noreconcile: the LLM trusts its own count of resident units instead of "
                "asking the kernel (mincore) which it took; +anon: anonymous weights and KV, which the kernel cannot reclaim "
                "without swap; +notouch: restored pages are first read by compute instead of the restore thread; "
                "source: see --source)")
      ->delimiter(',')
      ->capture_default_str();
  c->add_option("--pool-conversations", a->pool_convs, "conversations of a pool mode")->check(CLI::Range(1, 64))->capture_default_str();
  c->add_flag("--quick", a->quick,
              "CI-sized: 3 rounds, qwen3-0.6b q4_0, 3072-token context, apps 0.65-0.75 at 128 MiB/s, 1-2 s "
              "(options given explicitly win; docs/multitask.md)");
  c->add_option("-o,--out", a->out, "results folder")->capture_default_str();
  c->add_option("-t,--threads", a->threads, "compute threads")->capture_default_str();
  c->add_option("--zram", a->zram_mib, "enable zram swap of this many MiB if no swap is active (0: no swap)")->capture_default_str();
  c->add_option("--need-lo", a->need_lo, "apps take the free memory plus U[need-lo, need-hi] x the LLM footprint")->capture_default_str();
  c->add_option("--need-hi", a->need_hi, "see --need-lo")->capture_default_str();
  c->add_option("--hold-lo", a->hold_lo, "an app is in use U[hold-lo, hold-hi] seconds after touching its memory")
      ->capture_default_str();
  c->add_option("--hold-hi", a->hold_hi, "see --hold-lo")->capture_default_str();
  c->add_option("--max-apps", a->max_apps, "apps per round: 1..max (overlapping)")->capture_default_str();
  c->add_option("--app-rate", a->app_rate, "MiB/s an app touches its memory at when it starts (0: unthrottled)")->capture_default_str();
  c->add_option("--app-file-mib", a->app_file_mib, "each app maps and reads a code file of this size (page cache)")->capture_default_str();
  c->add_option("--llm-oom-adj", a->llm_oom_adj, "oom_score_adj of the LLM process (apps: 0)")->capture_default_str();
  c->add_option("--source", a->source,
                "mzcache's pressure source on the cgroup: cgroup-v1 (memory.pressure_level: fires once the "
                "cgroup reclaims at its limit), watermark (usage vs limit every 100 ms), auto")
      ->capture_default_str();
  c->add_option("--cold-start", a->cold, "a killed LLM comes back by: session (load its session file) or prefill")->capture_default_str();
  c->add_option("--tol", a->tol, "context intact: max |logit - reference| allowed (greedy token must match)")->capture_default_str();
  c->add_option("--gap", a->gap, "seconds between the apps' exit and the query")->capture_default_str();
  c->add_option("--swap-dir", a->swap_dir, "folder for mzcache's swap file and scratch files")->capture_default_str();
  c->add_option("--sample-ms", a->sample_ms, "memory trace period")->capture_default_str();
  c->add_option("--ref-reps", a->ref_reps, "all-in-memory TTFT repetitions")->capture_default_str();
  c->add_flag("--restore-ahead", a->restore_ahead,
              "every mzcache mode restores in the background once pressure is calm, as far as the cgroup has room "
              "(per mode: mz25+ahead)");
  c->add_option("--calm-ms", a->calm_ms, "restore-ahead: after this long without a pressure event")->capture_default_str();
  c->add_option("--restore-margin", a->restore_margin, "restore-ahead: keep this fraction of the cgroup limit free")
      ->capture_default_str();
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunBench(*a, [c](const char* opt) { return c->count(opt) > 0; });
  });
}

}  // namespace mz::cli
