// bench field-notes (issue 49): the field notes' own case (../shared/seeds/8b-on-a-mid-tier-android-
// phone.txt): Llama-3.1-8B at Q4_K_M on an 8 GB phone, where llama.cpp is killed (its default:
// weights repacked into anonymous memory) or thrashes (--no-repack: weights left in the file
// mapping). The "phone" is a memory cgroup (v1) of --phone-mib holding the LLM process and the
// harness's apps (bench multitask's `multitask-app`: processes that allocate and touch memory): a
// floor (the OS and the apps kept warm) for the whole run, and a 'camera' that arrives after
// --camera-at generated tokens, holds --camera-mib for --camera-s seconds and leaves. The systems,
// each in a fresh cgroup, alternated over --rounds (A B C, B C A, ...):
//   llama-repack     llama-server (the pinned llama.cpp), its default loader (repacked weights);
//   llama-no-repack  the same with --no-repack (every weight in the file mapping);
//   mzcache          a worker process over the public C API (`bench field-notes-worker`, hidden):
//                    MZ_WEIGHTS_REPACKED; when the camera comes the app goes to the background and
//                    receives onTrimMemory (UI_HIDDEN, BACKGROUND, and MODERATE / COMPLETE while
//                    the camera would not fit), the generation pauses (a cached app is frozen);
//                    when the camera leaves it returns: mz_restore_generate re-makes the layers
//                    front first with the next token (TTFT after the return), then decodes on.
// llama.cpp gets no trim (it has no hook): the camera's allocation meets it as it is, and the
// cgroup's OOM killer takes the largest process when nothing else can be reclaimed.
// Reported per run: survived or killed (when: at load, before / during / after the camera, after
// how many tokens), tokens/s before, during and after the camera, major faults per token (the LLM
// process's /proc/PID/stat majflt), bytes given back and TTFT after the return (mzcache), RSS and
// the cgroup's usage every --sample-ms (plot). Each run is cut at --max-run-s (a thrashing run can
// take hours on 2 cores): the report says so with the rate measured until then.
// Also: the notes' thread sweep (decode tokens/s at 1 and 2 threads, outside the cgroup, no apps:
// mzcache repacked and llama-server default) and KV sizing rows (KV bytes at 4096 tokens, f16 and
// q8_0, mz_plan_estimate, against the notes' 0.52 and 0.27 GB).
// Cleanup: the cgroups, the apps and the LLM processes are removed at every exit, SIGINT/SIGTERM
// included. Needs root and a cgroup v1 memory controller (else exit 77).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "mzcache.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/child_process.h"
#include "tools/bench/multitask.h"  // ParseFields, WorkerProc
#include "tools/bench/os_memory.h"
#include "tools/bench/peers_common.h"  // Sprintf
#include "tools/bench/report.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/weights_option.h"

namespace mz::cli {
namespace field_notes {  // named: unity batches share anonymous namespaces

constexpr int kExitUnsupportedHere = 77;

struct Args {
  std::string model = "llama3.1-8b", type = "q4_k_m";
  std::string systems = "llama-repack,llama-no-repack,mzcache";
  uint64_t phone_mib = 8192, floor_mib = 2048, camera_mib = 2048;
  int tokens = 256, camera_at = 32, threads = 2, ctx = 1024, rounds = 1, sweep_tokens = 16;
  double camera_s = 30, max_run_s = 600, sample_ms = 500;
  std::string prompt = "The wall an 8B model hits on a mid-tier Android phone is";
  std::string out = "results/bench-field-notes";
};

// The command line's options that differ from the defaults (besides those the report always
// names), so that the "Command:" line re-measures the same case.
std::string CommandExtras(const Args& a) {
  const Args d;
  std::string o;
  if (a.model != d.model) o += " --model " + a.model;
  if (a.type != d.type) o += " --type " + a.type;
  if (a.systems != d.systems) o += " --systems " + a.systems;
  if (a.phone_mib != d.phone_mib) o += " --phone-mib " + std::to_string(a.phone_mib);
  if (a.floor_mib != d.floor_mib) o += " --floor-mib " + std::to_string(a.floor_mib);
  if (a.camera_mib != d.camera_mib) o += " --camera-mib " + std::to_string(a.camera_mib);
  if (a.threads != d.threads) o += " --threads " + std::to_string(a.threads);
  if (a.ctx != d.ctx) o += " --ctx " + std::to_string(a.ctx);
  if (a.sample_ms != d.sample_ms) o += Sprintf(" --sample-ms %g", a.sample_ms);
  if (a.prompt != d.prompt) o += " --prompt '" + a.prompt + "'";
  return o;
}

// ---- cleanup on every exit path, SIGINT/SIGTERM included ------------------------------------
ChildRegistry<16> g_kids;
char g_cg[512];
void Track(pid_t p) { g_kids.Add(p); }
void Untrack(pid_t p) { g_kids.Remove(p); }
void OnSignal(int sig) {
  g_kids.KillAndReapAll();
  if (g_cg[0])
    for (int i = 0; i < 50 && rmdir(g_cg) != 0 && errno == EBUSY; ++i) usleep(20000);
  _exit(128 + sig);
}

uint64_t MajorFaults(pid_t pid) {  // /proc/PID/stat field 12 (majflt); 0 if unreadable
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream in(s.substr(rp + 2));
  std::string x;
  for (int field = 3; field <= 12 && (in >> x); ++field)
    if (field == 12) return std::strtoull(x.c_str(), nullptr, 10);
  return 0;
}


struct Sample {
  double t;  // seconds since the system's process started
  double rss_mib, cg_mib, cg_cache_mib;
  uint64_t majflt;
};

// One run of one system: everything the report needs.
struct Run {
  std::string system;
  int round = 0;
  bool loaded = false, killed = false, cut = false;
  std::string killed_when;  // "at load", "before the camera", "during the camera", "after the camera"
  int killed_after_tokens = -1;
  double load_s = 0, t_camera_in = -1, t_camera_out = -1, t_end = 0;
  std::vector<double> tok_t;  // harness time (since the process started) of every generated token
  std::vector<Sample> samples;
  uint64_t majflt_total = 0, oom_kills = 0;
  // mzcache only
  uint64_t given_back = 0, weights_before = 0, weights_after_trim = 0;
  std::string levels;
  double ttft_return_s = -1, restore_ttft_s = -1;
  int units_restored = 0;
  uint64_t restored_from_storage = 0;
  double server_tps = 0;  // llama-server's own decode rate (its final chunk's timings.predicted_per_second)
  std::string note;
};

// Samples the LLM process and the cgroup every period until stopped.
class Sampler {
 public:
  Sampler(pid_t pid, std::string cg, double t0, double period_s)
      : pid_(pid), cg_(std::move(cg)), t0_(t0), period_(period_s), th_([this] { Loop(); }) {}
  ~Sampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (th_.joinable()) th_.join();
  }
  std::vector<Sample> Take() {
    std::lock_guard<std::mutex> l(mu_);
    return s_;
  }
  uint64_t LastMajflt() {
    std::lock_guard<std::mutex> l(mu_);
    return last_majflt_;
  }

 private:
  void Loop() {
    while (!stop_) {
      uint64_t rss = 0, swap = 0;
      ProcMemory(pid_, &rss, &swap);
      std::ifstream u(cg_ + "/memory.usage_in_bytes");
      uint64_t usage = 0;
      u >> usage;
      const CgroupMemStat ms = ReadCgroupMemStat(cg_);
      const uint64_t mf = MajorFaults(pid_);
      {
        std::lock_guard<std::mutex> l(mu_);
        if (mf) last_majflt_ = mf;
        if (rss) s_.push_back({NowSeconds() - t0_, rss / 1048576.0, usage / 1048576.0, ms.cache / 1048576.0, mf});
      }
      for (double w = 0; w < period_ && !stop_; w += 0.05) usleep(50000);
    }
  }
  pid_t pid_;
  std::string cg_;
  double t0_, period_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Sample> s_;
  uint64_t last_majflt_ = 0;
  std::thread th_;
};

// An app of the phone (bench multitask's multitask-app) in the cgroup, holding mib for seconds.
Status StartApp(const std::string& cg, uint64_t mib, double seconds, pid_t* pid) {
  ChildProc cp;
  MZ_RETURN_IF_ERROR(SpawnInCgroup({SelfExe(), "multitask-app", "--mib", std::to_string(mib), "--seconds",
                                    Sprintf("%.1f", seconds), "--retouch-ms", "1000"},
                                   cg + "/cgroup.procs", kKeepOomScore, false, &cp));
  Track(cp.pid);
  *pid = cp.pid;
  return Status::Ok();
}
// true once pid exited (reaped), *st its status.
bool Reaped(pid_t pid, int* st) {
  if (pid <= 0) return true;
  if (waitpid(pid, st, WNOHANG) == pid) {
    Untrack(pid);
    return true;
  }
  return false;
}
void KillReap(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  Untrack(pid);
}

// The phone: a fresh cgroup of a.phone_mib with the floor app in it (touched before the LLM starts).
struct Phone {
  MemCgroup cg;
  pid_t floor_pid = -1;
  ~Phone() {
    KillReap(floor_pid);
    g_cg[0] = 0;
  }
  Status Make(const Args& a, const std::string& name) {
    MZ_RETURN_IF_ERROR(cg.Create(name));
    std::snprintf(g_cg, sizeof g_cg, "%s", cg.path().c_str());
    MZ_RETURN_IF_ERROR(cg.SetLimit(a.phone_mib << 20));
    MZ_RETURN_IF_ERROR(StartApp(cg.path(), a.floor_mib, 1e6, &floor_pid));
    // Wait until the floor is touched (its usage reaches ~the floor).
    for (int i = 0; i < 1200 && cg.Usage() < ((a.floor_mib - 16) << 20); ++i) usleep(50000);
    return Status::Ok();
  }
};

std::string KilledWhen(const Run& r, double t) {
  if (!r.loaded) return "at load";
  if (r.t_camera_in < 0 || t < r.t_camera_in) return "before the camera";
  if (r.t_camera_out < 0 || t < r.t_camera_out) return "during the camera";
  return "after the camera";
}

// ---- llama.cpp (llama-server) ----------------------------------------------------------------
Status RunLlama(const Args& a, const std::string& model, bool repack, const std::string& cg_procs, const std::string& cg,
                int port, const std::string& log, Run* r, int threads, int n_tokens, bool with_camera) {
  const std::string bin = LlamaServerPath();
  if (access(bin.c_str(), X_OK) != 0) return Status::InvalidArgument("llama-server not found at " + bin);
  std::string cmd = "exec " + bin + " -m " + model + " -t " + std::to_string(threads) + " -c " +
                    std::to_string(a.ctx) + " -np 1 --no-warmup --host 127.0.0.1 --port " + std::to_string(port) +
                    (repack ? "" : " --no-repack") + " > " + log + " 2>&1";
  ChildProc cp;
  MZ_RETURN_IF_ERROR(SpawnInCgroup({"/bin/sh", "-c", cmd}, cg_procs, kKeepOomScore, false, &cp));
  Track(cp.pid);
  const pid_t pid = cp.pid;
  const double t0 = NowSeconds();
  std::unique_ptr<Sampler> smp = cg.empty() ? nullptr : std::make_unique<Sampler>(pid, cg, t0, a.sample_ms / 1000);
  int st = 0;
  bool dead = false;
  httplib::Client cli("127.0.0.1", port);
  cli.set_connection_timeout(0, 200000);
  for (;;) {
    auto res = cli.Get("/health");
    if (res && res->status == 200) break;
    if (Reaped(pid, &st)) {
      dead = true;
      break;
    }
    if (NowSeconds() - t0 > a.max_run_s) break;
    usleep(100000);
  }
  r->load_s = NowSeconds() - t0;
  pid_t camera = -1;
  if (!dead && NowSeconds() - t0 <= a.max_run_s) {
    r->loaded = true;
    nlohmann::json body = {{"prompt", a.prompt}, {"n_predict", n_tokens}, {"temperature", 0}, {"ignore_eos", true},
                           {"stream", true},     {"return_tokens", true}, {"cache_prompt", false}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/completion";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = body.dump();
    std::string buf;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      buf.append(data, len);
      for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
        const std::string line = buf.substr(0, nl);
        if (line.rfind("data: ", 0) != 0) continue;
        const auto j = nlohmann::json::parse(line.substr(6), nullptr, false);
        if (j.is_discarded()) continue;
        size_t n = j.contains("tokens") && j["tokens"].is_array() ? j["tokens"].size() : 0;
        const double t = NowSeconds() - t0;
        for (size_t k = 0; k < n; ++k) r->tok_t.push_back(t);
        if (j.contains("timings") && j["timings"].contains("predicted_per_second"))
          r->server_tps = j["timings"]["predicted_per_second"].get<double>();
      }
      if (with_camera && camera < 0 && int(r->tok_t.size()) >= a.camera_at) {
        r->t_camera_in = NowSeconds() - t0;
        if (!StartApp(cg, a.camera_mib, a.camera_s, &camera).ok()) camera = -1;
      }
      int cst = 0;
      if (camera > 0 && r->t_camera_out < 0 && Reaped(camera, &cst)) {
        r->t_camera_out = NowSeconds() - t0;
        camera = 0;
      }
      if (NowSeconds() - t0 > a.max_run_s) {
        r->cut = true;
        return false;
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err;
    cli.set_read_timeout(int(a.max_run_s) + 60, 0);
    cli.send(req, res, err);
  }
  r->t_end = NowSeconds() - t0;
  if (smp) {
    smp->Stop();
    r->samples = smp->Take();
    r->majflt_total = smp->LastMajflt();
  } else {
    r->majflt_total = MajorFaults(pid);
  }
  // A stream that ended short of the tokens asked for means llama-server went away or failed the
  // request; a process the OOM killer chose closes its sockets before it can be reaped (its memory
  // is still being freed), so it is waited for (up to 10 s) before the harness stops it itself:
  // otherwise a kill would be recorded as a survival.
  const bool short_stream = !r->cut && int(r->tok_t.size()) < n_tokens;
  for (int i = 0; !dead && i < 100; ++i) {
    if (Reaped(pid, &st)) dead = true;
    else if (!short_stream) break;
    else usleep(100000);
  }
  if (!dead) {
    r->majflt_total = std::max(r->majflt_total, MajorFaults(pid));
    if (short_stream)
      r->note = Sprintf("the stream ended after %d of %d tokens with llama-server still running; log %s",
                        int(r->tok_t.size()), n_tokens, log.c_str());
    KillReap(pid);
  } else if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
    r->killed = true;
    r->killed_when = KilledWhen(*r, r->t_end);
    r->killed_after_tokens = int(r->tok_t.size());
  } else {
    r->note = Sprintf("llama-server exited (status %d) before answering; log %s", st, log.c_str());
  }
  if (camera > 0) {
    int cst = 0;
    while (!Reaped(camera, &cst)) usleep(100000);  // the camera holds its time either way
    if (r->t_camera_out < 0) r->t_camera_out = NowSeconds() - t0;
  }
  if (!cg.empty()) r->oom_kills = CgroupOomKills(cg);
  return Status::Ok();
}

// ---- mzcache (a worker process over the public C API) ---------------------------------------
struct WorkerArgs {
  std::string model, weights = "repacked", prompt;
  int threads = 2, ctx = 1024, tokens = 256;
};

// Protocol (stdout lines; tools/bench/multitask.h's `key=value` fields):
//   -> `ready load_s=S weights=B`, then `tok i=N` per generated token;
//   <- `background`: onTrimMemory UI_HIDDEN, BACKGROUND, then MODERATE and COMPLETE while
//      `need=BYTES` (sent with it) more than the cgroup leaves free; -> `trimmed freed=B weights=B levels=L`;
//   <- `return`: the next token through mz_restore_generate -> `returned ttft=S pipe_ttft=S units=N storage=B`;
//   -> `done n=N`.
int RunWorker(const WorkerArgs& w) {
  auto say = [](const std::string& s) {
    std::fputs((s + "\n").c_str(), stdout);
    std::fflush(stdout);
  };
  const double t0 = NowSeconds();
  mz_model* m = nullptr;
  const mz_model_params mp = ModelParamsFor(w.weights);
  if (int rc = mz_model_load(w.model.c_str(), &mp, &m)) return Fail(MzStatus(rc));
  MzModel model(m);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(w.ctx);
  cp.n_threads = w.threads;
  cp.memory_check = false;  // the harness's phone decides what fits, as a phone would
  mz_context* c = nullptr;
  if (int rc = mz_context_new(m, &cp, &c)) return Fail(MzStatus(rc));
  MzContext ctx(c);
  mz_sampler_params sp = mz_sampler_default_params();
  sp.temperature = 0;
  MzSampler smp(mz_sampler_new(&sp));
  std::vector<mz_token> toks(4096);
  int32_t n = 0;
  if (int rc = mz_tokenize(m, w.prompt.c_str(), true, false, toks.data(), int32_t(toks.size()), &n))
    return Fail(MzStatus(rc));
  toks.resize(size_t(n));
  auto weights_resident = [&] {
    mz_memory_report r{};
    mz_get_memory_report(c, &r);
    return r.weights_resident;
  };
  say(Sprintf("ready load_s=%.3f weights=%llu", NowSeconds() - t0, (unsigned long long)weights_resident()));
  if (int rc = mz_decode(c, toks.data(), n, false)) return Fail(MzStatus(rc));
  bool restore_next = false;
  double t_return = 0;
  for (int i = 0; i < w.tokens; ++i) {
    const mz_token t = mz_sampler_sample(smp.get(), c, 0);
    if (t < 0) return Fail(MzStatus(t));
    say("tok i=" + std::to_string(i + 1));
    if (i + 1 == w.tokens) break;
    pollfd pf{0, POLLIN, 0};
    if (poll(&pf, 1, 0) > 0) {
      char line[256];
      if (!std::fgets(line, sizeof line, stdin)) return 0;  // harness gone
      auto f = ParseFields(line);
      if (f["_"] == "background") {
        const uint64_t need = std::strtoull(f["need"].c_str(), nullptr, 10);
        const uint64_t before = weights_resident();
        mz_memory_report r0{};
        mz_get_memory_report(c, &r0);
        std::string levels;
        const int32_t seq[] = {MZ_TRIM_MEMORY_UI_HIDDEN, MZ_TRIM_MEMORY_BACKGROUND, MZ_TRIM_MEMORY_MODERATE,
                               MZ_TRIM_MEMORY_COMPLETE};
        for (int k = 0; k < 4; ++k) {
          // Past BACKGROUND only while the camera would not fit (the cgroup's room, read by the harness
          // as `need`: bytes still missing before this step; decreases as memory is given back).
          if (k >= 2) {
            mz_memory_report r{};
            mz_get_memory_report(c, &r);
            const uint64_t freed = r0.in_memory > r.in_memory ? r0.in_memory - r.in_memory : 0;
            if (freed >= need) break;
          }
          mz_on_trim_memory(c, seq[k]);
          levels += (levels.empty() ? "" : ",") + std::to_string(seq[k]);
        }
        mz_memory_report r1{};
        mz_get_memory_report(c, &r1);
        say(Sprintf("trimmed freed=%llu weights_before=%llu weights=%llu levels=%s",
                    (unsigned long long)(r0.in_memory > r1.in_memory ? r0.in_memory - r1.in_memory : 0),
                    (unsigned long long)before, (unsigned long long)weights_resident(), levels.c_str()));
        // Backgrounded: the generation waits for the return (a cached app is frozen).
        for (;;) {
          if (!std::fgets(line, sizeof line, stdin)) return 0;
          if (ParseFields(line)["_"] == "return") break;
        }
        restore_next = true;
        t_return = NowSeconds();
      }
    }
    if (restore_next) {
      mz_restore_params rp = mz_restore_default_params();
      mz_restore_stats rs{};
      if (int rc = mz_restore_generate(c, &t, 1, &rp, &rs)) return Fail(MzStatus(rc));
      say(Sprintf("returned ttft=%.3f pipe_ttft=%.3f units=%d storage=%llu weights=%llu", NowSeconds() - t_return,
                  rs.ttft_s, rs.units_restored, (unsigned long long)rs.bytes_from_storage,
                  (unsigned long long)weights_resident()));
      restore_next = false;
    } else if (int rc = mz_decode(c, &t, 1, false)) {
      return Fail(MzStatus(rc));
    }
  }
  say("done n=" + std::to_string(w.tokens));
  return 0;
}

Status RunMz(const Args& a, const std::string& model, const std::string& cg, Run* r, int threads, int n_tokens,
             bool with_camera) {
  WorkerProc wp;
  std::vector<std::string> argv = {SelfExe(), "bench", "field-notes-worker", "--model", model, "--threads",
                                   std::to_string(threads), "--ctx", std::to_string(a.ctx), "--tokens",
                                   std::to_string(n_tokens), "--prompt", a.prompt};
  MZ_RETURN_IF_ERROR(wp.Start(argv, cg.empty() ? "" : cg + "/cgroup.procs", kKeepOomScore));
  Track(wp.pid());
  const double t0 = NowSeconds();
  std::unique_ptr<Sampler> smp = cg.empty() ? nullptr : std::make_unique<Sampler>(wp.pid(), cg, t0, a.sample_ms / 1000);
  pid_t camera = -1;
  std::string line;
  bool done = false;
  while (!done) {
    const double left = a.max_run_s - (NowSeconds() - t0);
    if (left <= 0) {
      r->cut = true;
      break;
    }
    if (!wp.NextReply(std::min(left, 1.0), &line)) {
      int st = 0;
      if (wp.Exited(&st)) {
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
          r->killed = true;
          r->killed_when = KilledWhen(*r, NowSeconds() - t0);
          r->killed_after_tokens = int(r->tok_t.size());
        } else {
          r->note = Sprintf("worker exited with status %d", st);
        }
        break;
      }
      int cst = 0;
      if (camera > 0 && r->t_camera_out < 0 && Reaped(camera, &cst)) {
        r->t_camera_out = NowSeconds() - t0;
        camera = 0;
        wp.Send("return");
      }
      continue;
    }
    auto f = ParseFields(line);
    const double t = NowSeconds() - t0;
    if (f["_"] == "ready") {
      r->loaded = true;
      r->load_s = t;
      r->weights_before = std::strtoull(f["weights"].c_str(), nullptr, 10);
    } else if (f["_"] == "tok") {
      r->tok_t.push_back(t);
      if (with_camera && camera < 0 && int(r->tok_t.size()) == a.camera_at) {
        r->t_camera_in = t;
        // What the camera needs beyond the phone's free room now (the app must give back that).
        const uint64_t limit = a.phone_mib << 20;
        std::ifstream u(cg + "/memory.usage_in_bytes");
        uint64_t used = 0;
        u >> used;
        const uint64_t want = (a.camera_mib + 256) << 20;  // 256 MiB of slack for the kernel's own
        const uint64_t room = limit > used ? limit - used : 0;
        wp.Send(Sprintf("background need=%llu", (unsigned long long)(want > room ? want - room : 0)));
      }
    } else if (f["_"] == "trimmed") {
      r->given_back = std::strtoull(f["freed"].c_str(), nullptr, 10);
      r->weights_after_trim = std::strtoull(f["weights"].c_str(), nullptr, 10);
      r->levels = f["levels"];
      if (!StartApp(cg, a.camera_mib, a.camera_s, &camera).ok()) camera = -1;
    } else if (f["_"] == "returned") {
      r->ttft_return_s = std::atof(f["ttft"].c_str());
      r->restore_ttft_s = std::atof(f["pipe_ttft"].c_str());
      r->units_restored = std::atoi(f["units"].c_str());
      r->restored_from_storage = std::strtoull(f["storage"].c_str(), nullptr, 10);
    } else if (f["_"] == "done") {
      done = true;
    }
    int cst = 0;
    if (camera > 0 && r->t_camera_out < 0 && Reaped(camera, &cst)) {
      r->t_camera_out = NowSeconds() - t0;
      camera = 0;
      wp.Send("return");
    }
  }
  r->t_end = NowSeconds() - t0;
  if (smp) {
    smp->Stop();
    r->samples = smp->Take();
    r->majflt_total = smp->LastMajflt();
  }
  r->majflt_total = std::max(r->majflt_total, MajorFaults(wp.pid()));
  Untrack(wp.pid());
  wp.Stop(done ? 30 : 0);
  if (camera > 0) KillReap(camera);
  if (!cg.empty()) r->oom_kills = CgroupOomKills(cg);
  return Status::Ok();
}

// tokens/s over the tokens whose times fall in [from, to) (the rate between the first and the last).
double Rate(const std::vector<double>& tt, double from, double to, int* n_out = nullptr) {
  std::vector<double> in;
  for (double t : tt)
    if (t >= from && t < to) in.push_back(t);
  if (n_out) *n_out = int(in.size());
  if (in.size() < 2) return 0;
  return double(in.size() - 1) / (in.back() - in.front());
}

int RunFieldNotes(const Args& a) {
  signal(SIGPIPE, SIG_IGN);
  std::string model;
  if (Status st = BenchModelPath(a.model, a.type, &model); !st.ok()) return Fail(st);
  {
    MemCgroup probe;
    if (Status st = probe.Create("mz-fieldnotes-probe-" + std::to_string(getpid())); !st.ok()) {
      std::fprintf(stderr, "bench field-notes needs root and a cgroup v1 memory controller: %s\n",
                   st.ToString().c_str());
      return kExitUnsupportedHere;
    }
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::vector<std::string> systems;
  for (std::stringstream ss(a.systems); ss.good();) {
    std::string s;
    std::getline(ss, s, ',');
    if (s != "llama-repack" && s != "llama-no-repack" && s != "mzcache")
      return Fail(Status::InvalidArgument("--systems: unknown system '" + s + "' (llama-repack, llama-no-repack, mzcache)"));
    systems.push_back(s);
  }
  std::error_code ec;
  std::filesystem::create_directories(a.out, ec);
  nlohmann::json doc;
  std::string md = "# bench field-notes: Llama-3.1-8B Q4_K_M on an 8 GB \"phone\" (issue 49)\n\n";
  struct stat sb{};
  ::stat(model.c_str(), &sb);
  mz_plan_params pp = mz_plan_default_params();
  pp.n_ctx = 4096;
  mz_plan_result pr{}, pq{};
  mz_plan_estimate(model.c_str(), &pp, &pr);
  pp.kv_type = MZ_KV_Q8_0;
  mz_plan_estimate(model.c_str(), &pp, &pq);
  const double bpw = pr.weight_params ? 8.0 * double(sb.st_size) / double(pr.weight_params) : 0;
  md += Sprintf("Machine: %s. Load average (1 min) at the start: %.2f.\n", MachineDescription().c_str(), LoadAvg1());
  md += Sprintf("Model: `%s`: %.3f GB (the notes: 4.92 GB), %.3f B parameters, %.2f bits per weight (the notes: "
                "4.90).\n\n",
                model.c_str(), sb.st_size / 1e9, pr.weight_params / 1e9, bpw);
  doc["model"] = {{"path", model}, {"bytes", uint64_t(sb.st_size)}, {"params", pr.weight_params}, {"bits_per_weight", bpw}};
  doc["load_avg_start"] = LoadAvg1();
  // KV sizing rows.
  md += "## KV at 4096 tokens (the notes' KV sizing rows; mz_plan_estimate, whole chunks)\n\n| KV type | bytes per "
        "token | GB at 4096 | the notes |\n|---|---:|---:|---:|\n";
  md += Sprintf("| f16 | %llu | %.3f | 0.52 |\n| q8_0 | %llu | %.3f | 0.27 |\n\n", (unsigned long long)pr.kv_bytes_per_token,
                pr.kv / 1e9, (unsigned long long)pq.kv_bytes_per_token, pq.kv / 1e9);
  md += "mzcache's q8_0 rows carry one fp16 scale per row of head_dim (128) values: 130 bytes per 128, where "
        "llama.cpp's q8_0 carries one per 32 (136 per 128, 0.285 GB at 4096).\n\n";
  doc["kv_4096"] = {{"f16_bytes", pr.kv}, {"q8_0_bytes", pq.kv}, {"f16_per_token", pr.kv_bytes_per_token},
                    {"q8_0_per_token", pq.kv_bytes_per_token}};
  const int port = 19000 + int(getpid() % 20000);
  // Thread sweep (no cgroup, no apps).
  if (a.sweep_tokens > 0) {
    md += Sprintf("## Thread sweep (decode, %d tokens, no cgroup, no apps)\n\n| system | threads | tokens/s | load "
                  "avg before |\n|---|---:|---:|---:|\n",
                  a.sweep_tokens);
    for (int th : {1, 2})
      for (const std::string& s : {std::string("mzcache"), std::string("llama-repack")}) {
        Run r;
        const double la = LoadAvg1();
        std::fprintf(stderr, "sweep: %s, %d thread(s)...\n", s.c_str(), th);
        Status st = s == "mzcache" ? RunMz(a, model, "", &r, th, a.sweep_tokens, false)
                                   : RunLlama(a, model, true, "", "", port, a.out + "/sweep-llama.log", &r, th,
                                              a.sweep_tokens, false);
        if (!st.ok()) return Fail(st);
        // The rate after the first token (the prefill and first token excluded); llama-server streams
        // tokens in bursts, so its own decode timing is the figure for it.
        const double rate = r.server_tps > 0 ? r.server_tps : r.tok_t.size() > 2 ? Rate(r.tok_t, r.tok_t[1], 1e18) : 0;
        md += Sprintf("| %s | %d | %.3f | %.2f |\n", s.c_str(), th, rate, la);
        doc["sweep"].push_back({{"system", s}, {"threads", th}, {"tokens_per_s", rate}, {"tokens", r.tok_t.size()},
                                {"load_avg_before", la}});
        std::fprintf(stderr, "  %.3f tokens/s\n", rate);
      }
    md += "\nmzcache: tokens after the first over their time (the worker's stream); llama-server: its own "
          "timings.predicted_per_second (its stream delivers tokens in bursts).\n\n";
  }
  // The phone.
  md += Sprintf("## The phone: a memory cgroup of %llu MiB\n\nApps: a floor of %llu MiB (the OS and the apps kept "
                "warm) for the whole run; a camera of %llu MiB arriving after %d generated tokens, for %.0f s. %d "
                "tokens asked per run, %d threads, context %d, each run cut at %.0f s.\n\n",
                (unsigned long long)a.phone_mib, (unsigned long long)a.floor_mib, (unsigned long long)a.camera_mib,
                a.camera_at, a.camera_s, a.tokens, a.threads, a.ctx, a.max_run_s);
  std::vector<Run> runs;
  for (int round = 0; round < a.rounds; ++round)
    for (size_t k = 0; k < systems.size(); ++k) {
      const std::string& s = systems[(k + size_t(round)) % systems.size()];
      Run r;
      r.system = s;
      r.round = round;
      DropFileCache(model);  // every system reads the weights from storage, charged to its phone
      Phone ph;
      if (Status st = ph.Make(a, "mz-fieldnotes-" + std::to_string(getpid())); !st.ok()) return Fail(st);
      const double la = LoadAvg1();
      std::fprintf(stderr, "round %d: %s (load avg %.2f)...\n", round + 1, s.c_str(), la);
      Status st = s == "mzcache" ? RunMz(a, model, ph.cg.path(), &r, a.threads, a.tokens, true)
                                 : RunLlama(a, model, s == "llama-repack", ph.cg.path() + "/cgroup.procs", ph.cg.path(),
                                            port, a.out + "/" + s + "-" + std::to_string(round + 1) + ".log", &r,
                                            a.threads, a.tokens, true);
      if (!st.ok()) return Fail(st);
      r.note += Sprintf("%sload avg %.2f before, %.2f after", r.note.empty() ? "" : "; ", la, LoadAvg1());
      std::fprintf(stderr, "  %s: %zu tokens in %.1f s%s\n", s.c_str(), r.tok_t.size(), r.t_end,
                   r.killed ? (" - killed " + r.killed_when).c_str() : "");
      runs.push_back(std::move(r));
    }
  // Report.
  md += "| system | round | loaded (s) | survived | tokens | tok/s before camera | during | after | major faults "
        "per token | given back | TTFT after return (s) | cut |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  std::string data;
  for (const Run& r : runs) {
    const double tin = r.t_camera_in < 0 ? 1e18 : r.t_camera_in, tout = r.t_camera_out < 0 ? 1e18 : r.t_camera_out;
    int nb = 0, nd = 0, na = 0;
    const double before = Rate(r.tok_t, r.tok_t.empty() ? 0 : r.tok_t.front(), tin, &nb);
    const double during = Rate(r.tok_t, tin, tout, &nd);
    const double after = Rate(r.tok_t, tout, 1e18, &na);
    const double mf = r.tok_t.empty() ? 0 : double(r.majflt_total) / double(r.tok_t.size());
    const std::string survived =
        r.killed ? Sprintf("**killed %s** (after %d tokens)", r.killed_when.c_str(), r.killed_after_tokens)
                 : (r.loaded ? std::string("yes") : "no (did not load in time)");
    md += Sprintf("| %s | %d | %.1f | %s | %zu | %.3f (%d) | %s | %.3f (%d) | %.0f | %s | %s | %s |\n", r.system.c_str(),
                  r.round + 1, r.load_s, survived.c_str(), r.tok_t.size(), before, nb,
                  r.system == "mzcache" ? "paused (background)" : Sprintf("%.3f (%d)", during, nd).c_str(), after, na,
                  mf, r.system == "mzcache" ? MibText(r.given_back).c_str() : "-",
                  r.ttft_return_s >= 0 ? Sprintf("%.2f", r.ttft_return_s).c_str() : "-",
                  r.cut ? Sprintf("at %.0f s", a.max_run_s).c_str() : "no");
    nlohmann::json j = {{"system", r.system}, {"round", r.round + 1}, {"loaded", r.loaded}, {"load_s", r.load_s},
                        {"killed", r.killed}, {"killed_when", r.killed_when}, {"killed_after_tokens", r.killed_after_tokens},
                        {"tokens", r.tok_t.size()}, {"tokens_per_s_before_camera", before},
                        {"tokens_per_s_during_camera", during}, {"tokens_per_s_after_camera", after},
                        {"major_faults", r.majflt_total}, {"major_faults_per_token", mf}, {"cut", r.cut},
                        {"camera_in_s", r.t_camera_in}, {"camera_out_s", r.t_camera_out}, {"end_s", r.t_end},
                        {"oom_kills", r.oom_kills}, {"note", r.note}, {"token_times_s", r.tok_t},
                        {"server_tokens_per_s", r.server_tps}};
    if (r.system == "mzcache")
      j.update({{"given_back_bytes", r.given_back}, {"weights_before", r.weights_before},
                {"weights_after_trim", r.weights_after_trim}, {"trim_levels", r.levels},
                {"ttft_after_return_s", r.ttft_return_s}, {"restore_pipeline_ttft_s", r.restore_ttft_s},
                {"units_restored", r.units_restored}, {"restored_from_storage_bytes", r.restored_from_storage}});
    doc["runs"].push_back(j);
    data += "# " + r.system + " round " + std::to_string(r.round + 1) + "\n";
    for (const Sample& s : r.samples)
      data += Sprintf("%.2f %.1f %.1f %.1f %llu\n", s.t, s.rss_mib, s.cg_mib, s.cg_cache_mib, (unsigned long long)s.majflt);
    data += "\n\n";
  }
  for (const Run& r : runs)
    if (r.system == "mzcache" && r.levels.size())
      md += Sprintf("\nmzcache round %d: onTrimMemory levels %s gave back %s (weights resident %s -> %s); %d units "
                    "re-made on return, %s from storage.\n",
                    r.round + 1, r.levels.c_str(), MibText(r.given_back).c_str(), MibText(r.weights_before).c_str(),
                    MibText(r.weights_after_trim).c_str(), r.units_restored, MibText(r.restored_from_storage).c_str());
  md += "\nRates: tokens after the first of each phase over the time between the phase's first and last token; the "
        "count of tokens in the phase in brackets. Major faults: the LLM process's majflt (/proc/PID/stat) at the "
        "end over its tokens. Killed: SIGKILL from the cgroup's OOM killer (memory.oom_control oom_kill in the "
        "JSON).\n";
  WriteFile(a.out, "bench-field-notes-rss.dat", data);
  std::string gp = "set terminal pngcairo size 1000,550\nset output 'bench-field-notes-rss.png'\n"
                   "set title 'RSS of the LLM process in the 8 GB phone (camera in/out: dashed)'\n"
                   "set xlabel 'seconds since the process started'\nset ylabel 'MiB'\nset key outside right\n";
  for (const Run& r : runs)
    if (r.t_camera_in >= 0 && r.round == 0)
      gp += Sprintf("set arrow from %.1f, graph 0 to %.1f, graph 1 nohead dt 2\nset arrow from %.1f, graph 0 to "
                    "%.1f, graph 1 nohead dt 3\n",
                    r.t_camera_in, r.t_camera_in, r.t_camera_out, r.t_camera_out);
  gp += "plot ";
  for (size_t k = 0; k < runs.size(); ++k)
    gp += Sprintf("%s'bench-field-notes-rss.dat' index %zu using 1:2 with lines lw 2 title '%s r%d'", k ? ", " : "",
                  k, runs[k].system.c_str(), runs[k].round + 1);
  const std::string png = PlotPng(a.out, "bench-field-notes-rss", gp + "\n");
  if (!png.empty()) md += "\n![RSS over time](" + png + ")\n";
  md += Sprintf("\nLoad average (1 min) at the end: %.2f.\n", LoadAvg1());
  doc["load_avg_end"] = LoadAvg1();
  md += "\nCommand: `mzcache bench field-notes --tokens " + std::to_string(a.tokens) + " --camera-at " +
        std::to_string(a.camera_at) + Sprintf(" --camera-s %.0f --max-run-s %.0f", a.camera_s, a.max_run_s) +
        " --rounds " + std::to_string(a.rounds) + " --sweep-tokens " + std::to_string(a.sweep_tokens) +
        CommandExtras(a) + " -o " + a.out + "`\n";
  WriteReport(a.out, "bench-field-notes", md, doc);
  std::printf("%s", md.c_str());
  return 0;
}

}  // namespace field_notes

void AddFieldNotesBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<field_notes::Args>();
  auto* c = bench->add_subcommand(
      "field-notes", "the field notes' 8B on an 8 GB phone: llama.cpp default (killed?) and --no-repack (thrash?) "
                     "vs mzcache repacked with its pressure response, in a memory cgroup with apps (root)");
  c->add_option("--model", a->model, "shape or GGUF (default llama3.1-8b, made with --type if missing: ~4.9 GB)");
  c->add_option("--type", a->type, "weight recipe of a synthesized shape (default q4_k_m)");
  c->add_option("--systems", a->systems, "comma-separated: llama-repack, llama-no-repack, mzcache");
  c->add_option("--phone-mib", a->phone_mib, "the phone's memory: the cgroup's limit (default 8192)");
  c->add_option("--floor-mib", a->floor_mib, "memory of the floor app (the OS and warm apps; default 2048)");
  c->add_option("--camera-mib", a->camera_mib, "memory of the camera app (default 2048)");
  c->add_option("--camera-at", a->camera_at, "generated tokens before the camera arrives (default 32)");
  c->add_option("--camera-s", a->camera_s, "seconds the camera holds its memory (default 30)");
  c->add_option("-n,--tokens", a->tokens, "tokens to generate per run (default 256)")->check(CLI::Range(2, 100000));
  c->add_option("-t,--threads", a->threads, "threads (default 2)");
  c->add_option("-c,--ctx", a->ctx, "context of each system (default 1024)");
  c->add_option("--rounds", a->rounds, "rounds, the systems' order rotated every round (default 1)");
  c->add_option("--max-run-s", a->max_run_s, "cut a run (load included) after this many seconds (default 600)");
  c->add_option("--sweep-tokens", a->sweep_tokens, "tokens of the thread sweep at 1 and 2 threads (0: no sweep)");
  c->add_option("--sample-ms", a->sample_ms, "RSS sampling period (default 500)");
  c->add_option("--prompt", a->prompt, "prompt text");
  c->add_option("-o,--out", a->out, "folder for bench-field-notes.{md,json}, the RSS plot and the servers' logs");
  runners.push_back([c, a]() -> int { return c->parsed() ? field_notes::RunFieldNotes(*a) : -1; });

  auto w = std::make_shared<field_notes::WorkerArgs>();
  auto* wc = bench->add_subcommand("field-notes-worker", "internal: the mzcache process of bench field-notes");
  wc->group("");  // hidden
  wc->add_option("--model", w->model)->required();
  AddWeightsOption(wc, &w->weights);
  wc->add_option("--threads", w->threads);
  wc->add_option("--ctx", w->ctx);
  wc->add_option("--tokens", w->tokens);
  wc->add_option("--prompt", w->prompt);
  runners.push_back([wc, w]() -> int { return wc->parsed() ? field_notes::RunWorker(*w) : -1; });
}

}  // namespace mz::cli
