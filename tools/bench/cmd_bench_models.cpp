// bench models: several models, one memory budget (issue 45). Built on the public C API alone
// (mz_budget_*, mz_pool_*), as a server switching models would use it.
//
// A seeded sequence of requests, each to another model than the last (two models alternate; with
// three, the next is drawn among the other two). Every model has one conversation of --history
// tokens, built at setup. A request is a --query-token user turn (restore_generate) and --gen
// greedy tokens, then a commit. Three systems run the same sequence, step by step, the order of
// the systems rotated at every step (A B C, B C A, ...):
//   mzcache         one pool per model under one mz_budget of --budget-models times the mean
//                   model footprint (weights + compute buffers + its conversation): idle models
//                   give their layers back, back to front, and come back front layers first
//                   overlapped with the request's prefill;
//   unload-load     what Ollama does on a switch, with mzcache's own persistence (more than Ollama
//                   keeps: its KV is lost): the other model unloaded whole (pool and model freed,
//                   its file and the pool's files dropped from the page cache), the requested one
//                   loaded (mz_model_load) and its conversation opened from storage;
//   llama-server    llama.cpp's server restarted with the requested model on every switch (one
//                   model per process, as its users switch), its file dropped from the page cache
//                   first; it keeps no KV across a restart, so the request's prompt is the whole
//                   history (re-prefill), as Ollama's after an unload. Expert flags for a fast
//                   switch: --no-warmup, -np 1, -c sized to the history, the same threads.
//   all-in-memory   every model loaded, no budget: the lower bound.
//   mzcache-serial, mzcache-overlap   mzcache with restore_generate's overlap forced (none, full);
//   mzcache-overlap-all  overlap forced, compute on all its threads while restoring
//                   (mz_restore_params.compute_threads_while_restoring);
//   mzcache-spread  mzcache with idle models' weights given back by depth across models
//                   (mz_budget_params.spread_idle_weights);
//   mzcache-inpass  mzcache with the budget pass after a call inside it (pass_after_return off, as
//                   before 0.19);
//   mzcache-behind  mzcache with the room pass behind the restore (mz_budget_params.room_behind).
// Each system has its own copy of every GGUF (and its own folders), so no system's page cache
// serves another's reads; dropped weights leave the page cache (the library drops their range),
// so a restore reads storage, as it does after real pressure.
// One process per system: the bench re-executes itself as a worker for each system (the hidden
// `bench models-worker`), and drives the workers step by step over their stdin/stdout, one request
// at a time, so the systems stay alternated as above and only one computes at any moment. Worker
// protocol (one line each):
//   worker -> harness  `ready held=<bytes counted after setup>` once set up,
//                      `result <fields of a Request>` per `serve`, `report <json>` per `report`,
//                      `error msg=<text>` instead of any of them (setup or request failed);
//   harness -> worker  `serve <model index> <step>`, `report`; EOF: unload everything and exit.
// A sampler thread reads every worker's /proc/<pid>/status (through the Env) every --sample-ms:
// RSS, anonymous and file-backed (page-cache pages mapped: the weights) over time, per system
// (llama-server's worker plus the server it runs).
// Reported per system: TTFT of the request after a switch (median, min-max), bytes read from
// storage during it (the worker's /proc/self/io), the requested model's resident weight share
// before the request (mzcache), the memory each system's pools count after every request, and
// RSS over time (RssAnon and RssFile), as plots.
// Results: <out>/bench-models.{md,json}, bench-models-ttft.png, bench-models-memory.png,
// bench-models-rss.png (and the plots' .dat files).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "env/env.h"
#include "mzcache.h"
#include "runtime/memory_plan.h"  // ReadProcessMemory
#include "tools/bench/child_process.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/multitask.h"  // ParseFields
#include "tools/bench/os_memory.h"
#include "tools/bench/peers_common.h"  // Sprintf
#include "tools/bench/report.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/weights_option.h"

namespace mz::cli {
namespace models_bench {  // named: unity batches share anonymous namespaces

struct ModelsArgs {
  std::string models = "qwen3-0.6b,llama3.2-1b";
  std::string type = "q8_0";
  int steps = 12, history = 512, query = 32, gen = 4, threads = 2;
  double budget_models = 1.5;
  uint32_t seed = 1;
  std::string dir = "/var/tmp";
  std::string out = "results/bench-models";
  std::string systems = "mzcache,unload-load,llama-server,all-in-memory";
  std::string weights = "page-cache";
  // The mzcache system's restore_generate overlap (mz_restore_params.overlap): auto (the default:
  // chosen per call from the cores and the measured costs), full or none.
  std::string overlap = "auto";
  int sample_ms = 100;  // RSS sampling period of the workers
  // The hidden worker's own: the system it runs, its folder, the shared budget.
  std::string worker_system, worker_root;
  uint64_t worker_budget = 0;
};

struct PoolFree {
  void operator()(mz_pool* p) const { mz_pool_free(p); }
};
struct ConvFree {
  void operator()(mz_conversation* c) const { mz_conversation_release(c); }
};
struct BudgetFree {
  void operator()(mz_budget* b) const { mz_budget_free(b); }
};
using MzPool = std::unique_ptr<mz_pool, PoolFree>;
using MzConv = std::unique_ptr<mz_conversation, ConvFree>;
using MzBudget = std::unique_ptr<mz_budget, BudgetFree>;

// One model of one system: its file copy, and (while loaded) its model, pool and conversation.
struct Slot {
  std::string name, path, dir;
  MzModel model;
  MzPool pool;
  MzConv conv;
  int32_t n_vocab = 0;
  void Unload() {
    conv.reset();
    pool.reset();  // persists the conversation first
    model.reset();
  }
};

struct Request {
  std::string system, model;
  int step = 0;
  double ttft_s = 0;
  uint64_t read_bytes = 0;
  double incoming_resident = 1;  // the requested model's resident weight share before the request
  uint64_t held_after = 0;       // the system's counted memory after the request
  mz_token first = 0;
  // The restore pipeline's own figures (mz_restore_stats; the mzcache systems): its TTFT (the call
  // to the last input token's logits, before the budget pass that ends the call), time compute
  // waited for units, the reload phase's wall time, bytes from storage.
  double pipe_ttft_s = 0, wait_s = 0, reload_s = 0;
  uint64_t pipe_storage = 0;
  // The allocation phase's wall time: only a restore that runs before compute has one (overlap
  // none), so a value > 0 tells which mode the call ran (auto: which one it chose).
  double alloc_s = 0;
  double cpu_s = 0;  // the process's CPU seconds during the restore_generate call (mz_restore_stats.cpu_s)
  // The call's shared-budget passes (mz_conversation_get_call_report; the mzcache systems): the room
  // pass before the restore and the budget pass after it when that ran inside the call.
  double room_s = 0, pass_s = 0;
  uint64_t room_bytes = 0;
  // The system's processes' memory after the request (/proc/<pid>/status): RSS, anonymous, file.
  uint64_t rss = 0, rss_anon = 0, rss_file = 0;
};

std::vector<mz_token> SeededTokens(uint32_t seed, int n, int32_t n_vocab) {
  std::mt19937 rng{seed};
  std::vector<mz_token> t(static_cast<size_t>(n));
  for (auto& x : t) x = mz_token(200 + rng() % uint32_t(std::max(1000, int(n_vocab)) - 400));
  return t;
}

mz_token Argmax(mz_conversation* c, int32_t n_vocab) {
  const float* l = mz_conversation_logits(c, 0);
  if (!l) return -1;
  return mz_token(std::max_element(l, l + n_vocab) - l);
}

class System {
 public:
  System(std::string name, const ModelsArgs& a) : name_(std::move(name)), a_(a) {}
  virtual ~System() = default;
  const std::string& name() const { return name_; }
  // Copies every model, loads what this system holds, builds every conversation.
  virtual Status Setup(const std::vector<std::string>& sources, const std::string& root, uint64_t budget) = 0;
  // Makes model i ready for a request (unload-load: the switch itself); inside the TTFT.
  virtual Status Ready(int i) { (void)i; return Status::Ok(); }
  virtual double ResidentShare(int i) {
    mz_pool_weights_report w;
    if (!slots_[size_t(i)].pool || mz_pool_get_weights_report(slots_[size_t(i)].pool.get(), &w) != MZ_OK || w.total == 0)
      return 0;
    return double(w.resident) / double(w.total);
  }
  // restore_generate's mz_restore_params.compute_threads_while_restoring (0: the library's choice).
  virtual int32_t ComputeThreadsWhileRestoring() const { return 0; }
  // restore_generate's mz_restore_params.overlap.
  virtual int32_t Overlap() const {
    return a_.overlap == "none" ? MZ_OVERLAP_NONE : a_.overlap == "full" ? MZ_OVERLAP_FULL : MZ_OVERLAP_AUTO;
  }
  virtual uint64_t Held() {
    uint64_t h = 0;
    for (auto& s : slots_) {
      mz_pool_report r;
      if (s.pool && mz_pool_get_report(s.pool.get(), &r) == MZ_OK) h += r.in_memory;
    }
    return h;
  }
  // Waits for the budget passes after the request's calls (mz_budget_settle); nothing for most.
  virtual void Settle() {}
  // What the system adds to the JSON report ({} for most).
  virtual nlohmann::json Report() { return nlohmann::json::object(); }
  // A process the system runs beside its worker (llama-server), 0 if none: its memory is the system's.
  virtual int ChildPid() const { return 0; }
  // One request to model i: the TTFT (restore_generate of the query, then the first token), then
  // gen-1 more greedy tokens and a commit.
  virtual Status Serve(int i, int step, Request* r) {
    Slot& s = slots_[size_t(i)];
    r->system = name_;
    r->model = s.name;
    r->step = step;
    r->incoming_resident = ResidentShare(i);
    const auto q = SeededTokens(a_.seed * 1000u + uint32_t(step), a_.query, s.n_vocab ? s.n_vocab : 32000);
    const uint64_t rb0 = ProcReadBytes();
    const double t0 = NowSeconds();
    MZ_RETURN_IF_ERROR(Ready(i));
    mz_restore_stats rs{};
    mz_restore_params rp = mz_restore_default_params();
    rp.overlap = Overlap();
    rp.compute_threads_while_restoring = ComputeThreadsWhileRestoring();
    MZ_RETURN_IF_ERROR(
        MzStatus(mz_conversation_restore_generate(s.conv.get(), q.data(), int32_t(q.size()), &rp, &rs)));
    mz_token tok = Argmax(s.conv.get(), s.n_vocab);
    r->ttft_s = NowSeconds() - t0;
    r->pipe_ttft_s = rs.ttft_s;
    r->wait_s = rs.wait_s;
    r->reload_s = rs.reload_s;
    r->alloc_s = rs.alloc_s;
    r->cpu_s = rs.cpu_s;
    r->pipe_storage = rs.bytes_from_storage;
    r->read_bytes = ProcReadBytes() - rb0;
    r->first = tok;
    mz_call_report cr{};
    if (mz_conversation_get_call_report(s.conv.get(), &cr) == MZ_OK) {
      r->room_s = cr.room_s;
      r->room_bytes = cr.room_bytes;
      r->pass_s = cr.pass_s;
    }
    for (int g = 1; g < a_.gen; ++g) {
      MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_decode(s.conv.get(), &tok, 1, false)));
      tok = Argmax(s.conv.get(), s.n_vocab);
    }
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_commit(s.conv.get())));
    Settle();  // a budget pass handed to the budget's thread has run: what it holds now
    r->held_after = Held();
    return Status::Ok();
  }

 protected:
  // Copies source to this system's folder (its own page cache), then drops the copy's cache.
  Status CopyModels(const std::vector<std::string>& sources, const std::string& root) {
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    for (const auto& src : sources) {
      Slot s;
      s.name = std::filesystem::path(src).stem().string();
      s.path = root + "/" + s.name + ".gguf";
      s.dir = root + "/pool-" + s.name;
      std::fprintf(stderr, "[bench models] %s: copying %s\n", name_.c_str(), s.name.c_str());
      if (!std::filesystem::copy_file(src, s.path, std::filesystem::copy_options::overwrite_existing, ec))
        return Status::IOError("copying " + src + " to " + s.path + ": " + ec.message());
      DropFileCache(s.path);
      slots_.push_back(std::move(s));
    }
    return Status::Ok();
  }
  Status Load(Slot& s, mz_budget* budget) {
    mz_model* m = nullptr;
    const mz_model_params mp = ModelParamsFor(a_.weights);
    MZ_RETURN_IF_ERROR(MzStatus(mz_model_load(s.path.c_str(), &mp, &m)));
    s.model.reset(m);
    mz_model_info info;
    mz_model_get_info(m, &info);
    s.n_vocab = info.n_vocab;
    cp_ = mz_context_default_params();
    cp_.n_ctx = uint32_t(a_.history + (a_.query + a_.gen) * (a_.steps + 2) + 256);
    cp_.n_threads = a_.threads;
    mz_pool_params pp = mz_pool_default_params();
    pp.dir = s.dir.c_str();
    pp.context = &cp_;
    pp.shared_budget = budget;
    mz_pool* p = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_pool_new(m, &pp, &p)));
    s.pool.reset(p);
    mz_conversation* c = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(p, "chat", &c)));
    s.conv.reset(c);
    return Status::Ok();
  }
  // The conversation's history, committed and stored.
  Status Build(Slot& s) {
    if (mz_conversation_n_tokens(s.conv.get()) > 0) return Status::Ok();
    const auto h = SeededTokens(a_.seed, a_.history, s.n_vocab);
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_decode(s.conv.get(), h.data(), int32_t(h.size()), false)));
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_commit(s.conv.get())));
    return MzStatus(mz_pool_flush(s.pool.get()));
  }

  std::string name_;
  const ModelsArgs& a_;
  std::vector<Slot> slots_;
  mz_context_params cp_{};
};

// The mzcache systems' budget: the default, the spread order of idle models' weights
// (mz_budget_params.spread_idle_weights), or the pass after a call inside it (pass_after_return off).
enum class BudgetVariant { kDefault, kSpread, kPassInCall, kRoomBehind };

class MzcacheSystem : public System {
 public:
  using System::System;
  // overlap: this system's mz_restore_params.overlap (-1: --overlap's); variant: its budget's
  // ablation (mzcache-spread, mzcache-inpass).
  // all_threads: compute keeps all its threads while restoring (mzcache-overlap-all).
  MzcacheSystem(std::string name, const ModelsArgs& a, int32_t overlap, BudgetVariant variant = BudgetVariant::kDefault,
                bool all_threads = false)
      : System(std::move(name), a), overlap_(overlap), variant_(variant), all_threads_(all_threads) {}
  int32_t Overlap() const override { return overlap_ >= 0 ? overlap_ : System::Overlap(); }
  int32_t ComputeThreadsWhileRestoring() const override { return all_threads_ ? a_.threads : 0; }
  Status Setup(const std::vector<std::string>& sources, const std::string& root, uint64_t budget) override {
    MZ_RETURN_IF_ERROR(CopyModels(sources, root));
    mz_budget_params bp = mz_budget_default_params();
    bp.memory_budget = budget;
    bp.spread_idle_weights = variant_ == BudgetVariant::kSpread;
    bp.pass_after_return = variant_ != BudgetVariant::kPassInCall;
    bp.room_behind = variant_ == BudgetVariant::kRoomBehind;
    mz_budget* b = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_budget_new(&bp, &b)));
    budget_.reset(b);
    for (auto& s : slots_) {
      MZ_RETURN_IF_ERROR(Load(s, budget_.get()));
      MZ_RETURN_IF_ERROR(Build(s));
    }
    return Status::Ok();
  }
  uint64_t Held() override {
    mz_budget_report r;
    return mz_budget_get_report(budget_.get(), &r) == MZ_OK ? r.in_memory : 0;
  }
  void Settle() override { (void)mz_budget_settle(budget_.get()); }
  nlohmann::json Report() override {
    mz_budget_report r;
    mz_budget_get_report(budget_.get(), &r);
    return {{"memory_budget", r.memory_budget},         {"passes", r.passes},
            {"bytes_evicted", r.bytes_evicted},         {"idle_model_kv_bytes", r.idle_model_kv_bytes},
            {"idle_model_weight_bytes", r.idle_model_weight_bytes}, {"active_model_bytes", r.active_model_bytes}};
  }
  ~MzcacheSystem() override {
    for (auto& s : slots_) s.Unload();
  }

 private:
  MzBudget budget_;
  int32_t overlap_ = -1;
  BudgetVariant variant_ = BudgetVariant::kDefault;
  bool all_threads_ = false;
};

class UnloadLoadSystem : public System {
 public:
  using System::System;
  Status Setup(const std::vector<std::string>& sources, const std::string& root, uint64_t) override {
    root_ = root;
    MZ_RETURN_IF_ERROR(CopyModels(sources, root));
    for (auto& s : slots_) {  // each conversation built and stored, then the model unloaded
      MZ_RETURN_IF_ERROR(Load(s, nullptr));
      MZ_RETURN_IF_ERROR(Build(s));
      Unload(s);
    }
    return Status::Ok();
  }
  Status Ready(int i) override {
    if (current_ == i) return Status::Ok();
    if (current_ >= 0) Unload(slots_[size_t(current_)]);
    current_ = -1;
    MZ_RETURN_IF_ERROR(Load(slots_[size_t(i)], nullptr));
    current_ = i;
    return Status::Ok();
  }
  double ResidentShare(int i) override { return current_ == i ? 1.0 : 0.0; }
  ~UnloadLoadSystem() override {
    for (auto& s : slots_) s.Unload();
  }

 private:
  // The whole model goes: pool (persisted), model, and the page cache of its file and folder.
  void Unload(Slot& s) {
    s.Unload();
    DropFileCache(s.path);
    DropTreeCache(s.dir);
  }
  std::string root_;
  int current_ = -1;
};

class AllInMemorySystem : public System {
 public:
  using System::System;
  Status Setup(const std::vector<std::string>& sources, const std::string& root, uint64_t) override {
    MZ_RETURN_IF_ERROR(CopyModels(sources, root));
    for (auto& s : slots_) {
      MZ_RETURN_IF_ERROR(Load(s, nullptr));
      MZ_RETURN_IF_ERROR(Build(s));
    }
    return Status::Ok();
  }
  ~AllInMemorySystem() override {
    for (auto& s : slots_) s.Unload();
  }
};

// llama.cpp's llama-server, restarted with the requested model at every switch. Its figures are
// the same as the others': TTFT from the switch's start (stopping the old server included) to the
// first token of a /completion whose prompt is the model's whole history plus the query.
class LlamaServerSystem : public System {
 public:
  using System::System;
  Status Setup(const std::vector<std::string>& sources, const std::string& root, uint64_t) override {
    bin_ = LlamaServerPath();
    if (access(bin_.c_str(), X_OK) != 0)
      return Status::InvalidArgument("llama-server not found at " + bin_ +
                                     " (MZ_DEPS_SERVER=1 scripts/deps.sh builds it; MZ_LLAMA_SERVER overrides)");
    MZ_RETURN_IF_ERROR(CopyModels(sources, root));
    port_ = 18000 + int(getpid() % 20000);
    for (auto& s : slots_) {
      // The vocabulary size, for the same seeded tokens as the others (a short load, no weights kept).
      MZ_RETURN_IF_ERROR(Load(s, nullptr));
      history_[s.name] = SeededTokens(a_.seed, a_.history, s.n_vocab);
      s.Unload();
      std::error_code ec;
      std::filesystem::remove_all(s.dir, ec);
    }
    return Status::Ok();
  }
  Status Ready(int i) override {
    if (current_ == i) return Status::Ok();
    Stop();
    Slot& s = slots_[size_t(i)];
    DropFileCache(s.path);
    const int ctx = a_.history + (a_.query + a_.gen) * (a_.steps + 2) + 256;
    std::vector<std::string> argv = {bin_, "-m", s.path, "-t", std::to_string(a_.threads), "-c", std::to_string(ctx),
                                     "-np", "1", "--no-warmup", "--log-disable", "--host", "127.0.0.1", "--port", std::to_string(port_)};
    ChildProc cp;
    MZ_RETURN_IF_ERROR(SpawnInCgroup(argv, "", kKeepOomScore, false, &cp));
    pid_ = cp.pid;
    httplib::Client cli("127.0.0.1", port_);
    cli.set_connection_timeout(0, 200000);
    for (int tries = 0;; ++tries) {
      auto res = cli.Get("/health");
      if (res && res->status == 200) break;
      int wst = 0;
      if (waitpid(pid_, &wst, WNOHANG) == pid_) {
        pid_ = -1;
        return Status::IOError("llama-server exited while loading " + s.path);
      }
      if (tries > 6000) return Status::IOError("llama-server did not become ready in 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    current_ = i;
    return Status::Ok();
  }
  double ResidentShare(int i) override { return current_ == i ? 1.0 : 0.0; }
  int ChildPid() const override { return pid_ > 0 ? int(pid_) : 0; }
  uint64_t Held() override {
    if (pid_ < 0) return 0;
    uint64_t rss = 0, swap = 0;
    ProcMemory(pid_, &rss, &swap);
    return rss;
  }
  // The request: the whole history (re-prefill after the restart) and the query, one token back.
  Status Serve(int i, int step, Request* r) override {
    Slot& s = slots_[size_t(i)];
    r->system = name_;
    r->model = s.name;
    r->step = step;
    r->incoming_resident = ResidentShare(i);
    auto& h = history_[s.name];
    const auto q = SeededTokens(a_.seed * 1000u + uint32_t(step), a_.query, s.n_vocab);
    h.insert(h.end(), q.begin(), q.end());
    const uint64_t rb0 = ProcReadBytes();
    const double t0 = NowSeconds();
    MZ_RETURN_IF_ERROR(Ready(i));
    nlohmann::json body = {{"prompt", h}, {"n_predict", 1}, {"temperature", 0}, {"cache_prompt", true}};
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(600, 0);
    auto res = cli.Post("/completion", body.dump(), "application/json");
    r->ttft_s = NowSeconds() - t0;
    (void)rb0;
    r->read_bytes = ProcReadBytes(pid_);  // the server's own reads since it started (this switch)
    if (!res || res->status != 200)
      return Status::IOError("llama-server /completion failed: " + (res ? std::to_string(res->status) : std::string("no answer")));
    r->held_after = Held();
    return Status::Ok();
  }
  ~LlamaServerSystem() override { Stop(); }

 private:
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
    pid_ = -1;
    current_ = -1;
  }
  std::string bin_;
  int port_ = 0;
  pid_t pid_ = -1;
  int current_ = -1;
  std::map<std::string, std::vector<mz_token>> history_;
};

std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t c = s.find(',', at);
    const std::string part = s.substr(at, c == std::string::npos ? std::string::npos : c - at);
    if (!part.empty()) out.push_back(part);
    if (c == std::string::npos) break;
    at = c + 1;
  }
  return out;
}

// The systems --systems names, in the order they alternate (all-in-memory last).
const char* const kSystemOrder[] = {"mzcache",        "mzcache-serial", "mzcache-overlap", "mzcache-overlap-all",
                                    "mzcache-spread", "mzcache-inpass", "mzcache-behind",  "unload-load",
                                    "llama-server",   "all-in-memory"};

// A system by its name; nullptr for an unknown one.
std::unique_ptr<System> MakeSystem(const std::string& name, const ModelsArgs& a) {
  if (name == "mzcache") return std::make_unique<MzcacheSystem>(name, a);
  if (name == "mzcache-serial") return std::make_unique<MzcacheSystem>(name, a, MZ_OVERLAP_NONE);
  if (name == "mzcache-overlap") return std::make_unique<MzcacheSystem>(name, a, MZ_OVERLAP_FULL);
  if (name == "mzcache-overlap-all") return std::make_unique<MzcacheSystem>(name, a, MZ_OVERLAP_FULL, BudgetVariant::kDefault, true);
  if (name == "mzcache-spread") return std::make_unique<MzcacheSystem>(name, a, -1, BudgetVariant::kSpread);
  if (name == "mzcache-inpass") return std::make_unique<MzcacheSystem>(name, a, -1, BudgetVariant::kPassInCall);
  if (name == "mzcache-behind") return std::make_unique<MzcacheSystem>(name, a, -1, BudgetVariant::kRoomBehind);
  if (name == "unload-load") return std::make_unique<UnloadLoadSystem>(name, a);
  if (name == "llama-server") return std::make_unique<LlamaServerSystem>(name, a);
  if (name == "all-in-memory") return std::make_unique<AllInMemorySystem>(name, a);
  return nullptr;
}

Status ResolveSources(const ModelsArgs& a, std::vector<std::string>* names, std::vector<std::string>* sources) {
  *names = SplitComma(a.models);
  if (names->size() < 2) return Status::InvalidArgument("--models needs at least two models");
  for (const auto& n : *names) {
    std::string p;
    MZ_RETURN_IF_ERROR(BenchModelPath(n, a.type, &p));
    sources->push_back(p);
  }
  return Status::Ok();
}

// The memory of a process and of the one it runs beside it (child 0: none), summed.
SelfMemory SystemMemory(int pid, int child) {
  SelfMemory m, c;
  ReadProcessMemory(Env::Default(), pid, &m);
  if (child > 0 && ReadProcessMemory(Env::Default(), child, &c)) {
    m.rss += c.rss;
    m.rss_anon += c.rss_anon;
    m.rss_file += c.rss_file;
  }
  return m;
}

// The hidden `bench models-worker`: one system in its own process, driven by the harness over
// stdin/stdout (the protocol in the header comment). Its stdout is kept for the protocol alone:
// everything else this process (or a child it starts) writes to stdout goes to stderr.
int RunModelsWorker(const ModelsArgs& a) {
  std::fflush(stdout);
  const int proto = fcntl(1, F_DUPFD_CLOEXEC, 3);
  FILE* out = proto >= 0 ? fdopen(proto, "w") : nullptr;
  if (!out) return Fail(Status::FromErrno(errno, "models-worker: keeping stdout for the protocol"));
  dup2(2, 1);
  auto error = [&](const Status& st) {
    std::string m = st.ToString();
    std::replace(m.begin(), m.end(), '\n', ' ');
    std::fprintf(out, "error msg=%s\n", m.c_str());
    std::fflush(out);
  };
  std::vector<std::string> names, sources;
  std::unique_ptr<System> sys = MakeSystem(a.worker_system, a);
  Status st = sys ? ResolveSources(a, &names, &sources) : Status::InvalidArgument("unknown system " + a.worker_system);
  if (st.ok()) st = sys->Setup(sources, a.worker_root, a.worker_budget);
  if (!st.ok()) {
    error(st.With(a.worker_system + " setup"));
    std::fclose(out);
    return 1;
  }
  std::fprintf(out, "ready held=%llu\n", (unsigned long long)sys->Held());
  std::fflush(out);
  char* buf = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&buf, &cap, stdin)) > 0) {
    const std::string line(buf, size_t(n));
    int i = 0, step = 0;
    if (std::sscanf(line.c_str(), "serve %d %d", &i, &step) == 2) {
      Request r;
      if (i < 0 || size_t(i) >= sources.size()) st = Status::InvalidArgument("no model " + std::to_string(i));
      else st = sys->Serve(i, step, &r);
      if (!st.ok()) {
        error(st);
        continue;
      }
      const SelfMemory m = SystemMemory(0, sys->ChildPid());
      std::fprintf(out,
                   "result model=%s ttft=%.9g read=%llu resident=%.9g held=%llu first=%d pipe_ttft=%.9g wait=%.9g "
                   "reload=%.9g storage=%llu alloc=%.9g cpu=%.9g room=%.9g room_bytes=%llu pass=%.9g rss=%llu anon=%llu "
                   "file=%llu child=%d\n",
                   r.model.c_str(), r.ttft_s, (unsigned long long)r.read_bytes, r.incoming_resident,
                   (unsigned long long)r.held_after, int(r.first), r.pipe_ttft_s, r.wait_s, r.reload_s,
                   (unsigned long long)r.pipe_storage, r.alloc_s, r.cpu_s, r.room_s, (unsigned long long)r.room_bytes,
                   r.pass_s, (unsigned long long)m.rss,
                   (unsigned long long)m.rss_anon, (unsigned long long)m.rss_file, sys->ChildPid());
    } else if (line.rfind("report", 0) == 0) {
      std::fprintf(out, "report %s\n", sys->Report().dump().c_str());
    } else {
      error(Status::InvalidArgument("unknown request: " + line.substr(0, line.size() - (line.back() == '\n'))));
    }
    std::fflush(out);
  }
  std::free(buf);
  sys.reset();  // unloads (persists) every model
  std::fclose(out);
  return 0;
}

// The harness's side of one worker. Thread-safety: c is used by the main thread only; child is
// written by it and read by the sampler.
struct Worker {
  std::string name;
  PipedChild c;
  std::atomic<int> child{0};  // the process the worker runs beside it (llama-server), 0 if none
};

// The worker's next line (without its newline); an `error` line or the worker's end is an error.
Status NextLine(Worker& w, const std::string& what, std::string* line) {
  char* buf = nullptr;
  size_t cap = 0;
  const ssize_t n = getline(&buf, &cap, w.c.out);
  *line = n > 0 ? std::string(buf, size_t(n)) : std::string();
  std::free(buf);
  while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
  if (n <= 0) return Status::IOError(w.name + " worker ended during " + what + " (its stderr is above)");
  if (line->rfind("error", 0) == 0) return Status::IOError(w.name + " worker, " + what + ": " + ParseFields(*line)["msg"]);
  return Status::Ok();
}

Status Ask(Worker& w, const std::string& cmd, std::string* reply) {
  const std::string l = cmd + "\n";
  if (::write(w.c.in, l.data(), l.size()) != ssize_t(l.size()))  // SIGPIPE is ignored: EPIPE
    return Status::IOError(w.name + " worker: cannot send '" + cmd + "' (it ended?)");
  return NextLine(w, "'" + cmd + "'", reply);
}

// Starts the worker of one system and waits until it is set up; *held: its counted bytes then.
Status StartWorker(const ModelsArgs& a, const std::string& system, const std::string& root, uint64_t budget,
                   Worker* w, uint64_t* held) {
  w->name = system;
  const std::vector<std::string> argv = {
      SelfExe(), "bench", "models-worker", "--system", system, "--root", root, "--budget", std::to_string(budget),
      "--models", a.models, "--type", a.type, "--steps", std::to_string(a.steps), "--history", std::to_string(a.history),
      "--query", std::to_string(a.query), "--gen", std::to_string(a.gen), "-t", std::to_string(a.threads),
      "--seed", std::to_string(a.seed), "--weights", a.weights, "--overlap", a.overlap};
  MZ_RETURN_IF_ERROR(SpawnPiped(argv, &w->c));
  std::string line;
  MZ_RETURN_IF_ERROR(NextLine(*w, "setup", &line));
  *held = std::stoull(ParseFields(line)["held"]);
  return Status::Ok();
}

Status ServeOn(Worker& w, int model, int step, Request* r) {
  std::string line;
  MZ_RETURN_IF_ERROR(Ask(w, "serve " + std::to_string(model) + " " + std::to_string(step), &line));
  auto f = ParseFields(line);
  auto u = [&](const char* k) { return uint64_t(std::strtoull(f[k].c_str(), nullptr, 10)); };
  auto d = [&](const char* k) { return std::strtod(f[k].c_str(), nullptr); };
  r->system = w.name;
  r->model = f["model"];
  r->step = step;
  r->ttft_s = d("ttft");
  r->read_bytes = u("read");
  r->incoming_resident = d("resident");
  r->held_after = u("held");
  r->first = mz_token(std::atoi(f["first"].c_str()));
  r->pipe_ttft_s = d("pipe_ttft");
  r->wait_s = d("wait");
  r->reload_s = d("reload");
  r->pipe_storage = u("storage");
  r->alloc_s = d("alloc");
  r->cpu_s = d("cpu");
  r->room_s = d("room");
  r->room_bytes = u("room_bytes");
  r->pass_s = d("pass");
  r->rss = u("rss");
  r->rss_anon = u("anon");
  r->rss_file = u("file");
  w.child = std::atoi(f["child"].c_str());
  return Status::Ok();
}

// Samples every worker's memory (and its child's) every period_ms on a thread of its own, from
// Start to Stop. Thread-safety: Start/Stop/Take from one thread (the harness's main thread).
class RssSampler {
 public:
  struct Sample {
    double t = 0;  // seconds since Start
    uint64_t rss = 0, anon = 0, file = 0;
  };
  RssSampler(std::vector<Worker*> ws, int period_ms) : ws_(std::move(ws)), period_ms_(std::max(10, period_ms)) {}
  ~RssSampler() { Stop(); }
  Status Start() {
    t0_ = Env::Default()->NowNs();
    return Env::Default()->StartThread([this] { Loop(); }, &th_);
  }
  void Stop() {
    stop_ = true;
    if (th_.joinable()) th_.join();
  }
  // Per worker (in the order given), its samples.
  std::vector<std::vector<Sample>> Take() {
    std::lock_guard<std::mutex> lk(mu_);
    return samples_;
  }

 private:
  void Loop() {
    Env* env = Env::Default();
    while (!stop_) {
      const double t = double(env->NowNs() - t0_) * 1e-9;
      std::vector<Sample> now;
      for (Worker* w : ws_) {
        const SelfMemory m = SystemMemory(w->c.pid, w->child.load());
        now.push_back({t, m.rss, m.rss_anon, m.rss_file});
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        samples_.resize(ws_.size());
        for (size_t k = 0; k < now.size(); ++k) samples_[k].push_back(now[k]);
      }
      env->SleepNs(uint64_t(period_ms_) * 1000000ull);
    }
  }
  std::vector<Worker*> ws_;
  int period_ms_;
  uint64_t t0_ = 0;
  std::atomic<bool> stop_{false};
  std::thread th_;
  std::mutex mu_;
  std::vector<std::vector<Sample>> samples_;
};

int RunModels(const ModelsArgs& a) {
  std::vector<std::string> names, sources;
  if (Status st = ResolveSources(a, &names, &sources); !st.ok()) return Fail(st);
  const auto wanted = SplitComma(a.systems);
  for (const auto& n : wanted)
    if (std::find(std::begin(kSystemOrder), std::end(kSystemOrder), n) == std::end(kSystemOrder))
      return Fail(Status::InvalidArgument("--systems: unknown system '" + n + "'"));
  signal(SIGPIPE, SIG_IGN);  // a worker that died is an error of the write to it, not a signal
  const std::string root = a.dir + "/mzcache-bench-models-" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  const double load0 = LoadAvg1();
  std::fprintf(stderr, "[bench models] %s; load average %.2f; %zu models, %d steps; one worker process per system\n",
               MachineDescription().c_str(), load0, sources.size(), a.steps);
  // All-in-memory first: its footprint (weights, compute buffers, KV) sizes the shared budget.
  std::vector<std::unique_ptr<Worker>> systems;
  auto all = std::make_unique<Worker>();
  uint64_t all_held = 0;
  if (Status st = StartWorker(a, "all-in-memory", root + "/all", 0, all.get(), &all_held); !st.ok()) return Fail(st);
  const uint64_t mean = all_held / sources.size();
  const uint64_t budget = uint64_t(double(mean) * a.budget_models);
  std::fprintf(stderr, "[bench models] mean footprint %.0f MiB; shared budget %.0f MiB (%.2f models)\n",
               double(mean) / 1048576, double(budget) / 1048576, a.budget_models);
  auto want = [&](const std::string& n) { return std::find(wanted.begin(), wanted.end(), n) != wanted.end(); };
  const std::map<std::string, std::string> folder = {{"mzcache", "/mzcache"}, {"mzcache-serial", "/mzcache-serial"},
                                                     {"mzcache-overlap", "/mzcache-overlap"}, {"mzcache-overlap-all", "/mzcache-overlap-all"},
                                                     {"mzcache-spread", "/mzcache-spread"},
                                                     {"mzcache-inpass", "/mzcache-inpass"}, {"mzcache-behind", "/mzcache-behind"},
                                                     {"unload-load", "/unload"},
                                                     {"llama-server", "/llama"}};
  for (const char* n : kSystemOrder) {
    if (std::string(n) == "all-in-memory" || !want(n)) continue;
    auto w = std::make_unique<Worker>();
    uint64_t held = 0;
    if (Status st = StartWorker(a, n, root + folder.at(n), budget, w.get(), &held); !st.ok()) return Fail(st);
    systems.push_back(std::move(w));
  }
  if (want("all-in-memory")) systems.push_back(std::move(all));
  else ReapPiped(all->c, false);  // EOF: it unloads and exits
  // The sequence: every request to another model than the last.
  std::mt19937 rng{a.seed};
  std::vector<int> seq;
  int cur = 0;
  for (int i = 0; i < a.steps + 1; ++i) {
    seq.push_back(cur);
    int next = int(rng() % uint32_t(sources.size() - 1));
    cur = next >= cur ? next + 1 : next;
  }
  std::vector<Worker*> ws;
  for (auto& w : systems) ws.push_back(w.get());
  RssSampler sampler(ws, a.sample_ms);
  if (Status st = sampler.Start(); !st.ok()) return Fail(st.With("starting the RSS sampler"));
  std::vector<std::pair<int, double>> step_starts;  // (step, seconds since the sampler's start)
  const double ts0 = NowSeconds();
  // Step 0 makes each system's first model current (not a switch: not reported).
  std::vector<Request> reqs;
  for (int step = 0; step <= a.steps; ++step) {
    step_starts.push_back({step, NowSeconds() - ts0});
    for (size_t k = 0; k < systems.size(); ++k) {
      Worker& w = *systems[(size_t(step) + k) % systems.size()];
      Request r;
      Status st = ServeOn(w, seq[size_t(step)], step, &r);
      if (!st.ok()) return Fail(st.With(w.name + ", step " + std::to_string(step)));
      if (step == 0) continue;
      std::fprintf(stderr, "[bench models] step %d/%d %-15s -> %-20s TTFT %.3f s (pipeline %.3f, alloc %.3f, waited %.3f, "
                   "reload %.3f, cpu %.3f, room %.3f, pass %.3f), read %.0f MiB, resident %.0f%%, holds %.0f MiB, RSS %.0f MiB "
                   "(anon %.0f, file %.0f)\n",
                   step, a.steps, r.system.c_str(), r.model.c_str(), r.ttft_s, r.pipe_ttft_s, r.alloc_s, r.wait_s, r.reload_s,
                   r.cpu_s, r.room_s, r.pass_s, double(r.read_bytes) / 1048576, 100 * r.incoming_resident, double(r.held_after) / 1048576,
                   double(r.rss) / 1048576, double(r.rss_anon) / 1048576, double(r.rss_file) / 1048576);
      reqs.push_back(r);
    }
  }
  sampler.Stop();
  const auto samples = sampler.Take();
  const double load1 = LoadAvg1();
  // Report.
  nlohmann::json doc;
  doc["machine"] = MachineDescription();
  doc["load_average_before"] = load0;
  doc["load_average_after"] = load1;
  doc["args"] = {{"models", names}, {"type", a.type}, {"weights", a.weights}, {"overlap", a.overlap}, {"steps", a.steps}, {"history", a.history},
                 {"query", a.query}, {"gen", a.gen}, {"threads", a.threads}, {"budget_models", a.budget_models},
                 {"seed", a.seed}};
  doc["mean_footprint_bytes"] = mean;
  doc["budget_bytes"] = budget;
  for (auto& w : systems)
    if (w->name == "mzcache") {
      std::string line;
      if (Ask(*w, "report", &line).ok() && line.size() > 7) doc["mzcache_budget"] = nlohmann::json::parse(line.substr(7), nullptr, false);
    }
  std::map<std::string, std::vector<double>> ttft, ttft_half;
  std::map<std::string, std::vector<double>> reads;
  // Steps where the incoming model had at least half its weights resident under mzcache: the
  // issue's second target compares those steps with all-in-memory.
  std::map<int, bool> half;
  for (const auto& r : reqs)
    if (r.system == "mzcache") half[r.step] = r.incoming_resident >= 0.5;
  for (const auto& r : reqs) {
    doc["requests"].push_back({{"system", r.system}, {"model", r.model}, {"step", r.step}, {"ttft_s", r.ttft_s},
                               {"read_bytes", r.read_bytes}, {"incoming_resident", r.incoming_resident},
                               {"held_after", r.held_after}, {"first_token", r.first},
                               {"pipeline_ttft_s", r.pipe_ttft_s}, {"wait_s", r.wait_s}, {"reload_s", r.reload_s},
                               {"pipeline_bytes_from_storage", r.pipe_storage}, {"alloc_s", r.alloc_s}, {"cpu_s", r.cpu_s},
                               {"room_s", r.room_s}, {"room_bytes", r.room_bytes}, {"pass_in_call_s", r.pass_s},
                               {"rss_after", r.rss}, {"rss_anon_after", r.rss_anon}, {"rss_file_after", r.rss_file}});
    ttft[r.system].push_back(r.ttft_s);
    reads[r.system].push_back(double(r.read_bytes));
    if (half[r.step]) ttft_half[r.system].push_back(r.ttft_s);
  }
  std::string md = "# bench models: first token after a model switch\n\n";
  md += Sprintf("Machine: %s. Load average %.2f before, %.2f after. Models: %s (%s), %d threads, history %d tokens, "
                "query %d tokens, %d switches per system, systems alternated step by step, weights held %s. Shared budget %.0f MiB "
                "(%.2f x the mean footprint of %.0f MiB).\n\n",
                MachineDescription().c_str(), load0, load1, a.models.c_str(), a.type.c_str(), a.threads, a.history,
                a.query, a.steps, a.weights.c_str(), double(budget) / 1048576, a.budget_models, double(mean) / 1048576);
  md += "| system | TTFT after a switch, median (min-max) | MiB read from storage per switch, median | "
        "TTFT where mzcache's incoming model was >= 50% resident, median (n) |\n|---|---|---|---|\n";
  for (const auto& s : systems) {
    const Stats t = Summarize(ttft[s->name]);
    const Stats rd = Summarize(reads[s->name]);
    const Stats th = Summarize(ttft_half[s->name]);
    md += Sprintf("| %s | %.3f s (%.3f-%.3f) | %.0f | %s |\n", s->name.c_str(), t.median, t.min, t.max,
                  rd.median / 1048576, th.n ? Sprintf("%.3f s (%d)", th.median, th.n).c_str() : "-");
    doc["summary"][s->name] = {{"ttft_median_s", t.median}, {"ttft_min_s", t.min}, {"ttft_max_s", t.max},
                                 {"read_median_bytes", rd.median}, {"ttft_half_resident_median_s", th.median},
                                 {"ttft_half_resident_n", th.n}};
  }
  // RSS over the whole sequence, from the sampler (each system's processes, whether computing or idle).
  md += "\n| system | RSS over the run, median (min-max) MiB | of it anonymous, median MiB | file-backed (mapped page "
        "cache), median MiB |\n|---|---|---|---|\n";
  for (size_t k = 0; k < systems.size() && k < samples.size(); ++k) {
    std::vector<double> rss, anon, file;
    for (const auto& x : samples[k]) {
      rss.push_back(double(x.rss) / 1048576);
      anon.push_back(double(x.anon) / 1048576);
      file.push_back(double(x.file) / 1048576);
    }
    const Stats r = Summarize(rss), an = Summarize(anon), fi = Summarize(file);
    md += Sprintf("| %s | %.0f (%.0f-%.0f) | %.0f | %.0f |\n", systems[k]->name.c_str(), r.median, r.min, r.max,
                  an.median, fi.median);
    doc["rss"][systems[k]->name] = {{"samples", r.n}, {"rss_median_mib", r.median}, {"rss_min_mib", r.min},
                                    {"rss_max_mib", r.max}, {"anon_median_mib", an.median},
                                    {"file_median_mib", fi.median}};
  }
  doc["rss_sample_ms"] = a.sample_ms;
  for (const auto& [st, t] : step_starts) doc["step_start_s"].push_back(t);
  {
    std::vector<double> pipe, wait, rest, room, pass, other;
    int restored_first = 0;
    for (const auto& r : reqs)
      if (r.system == "mzcache") {
        restored_first += r.alloc_s > 0;
        pipe.push_back(r.pipe_ttft_s);
        wait.push_back(r.wait_s);
        rest.push_back(r.ttft_s - r.pipe_ttft_s);
        room.push_back(r.room_s);
        pass.push_back(r.pass_s);
        other.push_back(r.ttft_s - r.pipe_ttft_s - r.room_s - r.pass_s);
      }
    if (!pipe.empty()) {
      const Stats p = Summarize(pipe), w = Summarize(wait), x = Summarize(rest);
      const Stats ro = Summarize(room), pa = Summarize(pass), ot = Summarize(other);
      md += Sprintf("\nWhere mzcache's time goes (medians): the restore pipeline to the last input token's logits "
                    "%.3f s, of which compute waited for units %.3f s; the rest of the call %.3f s: the room pass "
                    "before the restore (idle models giving back) %.3f s (%.3f-%.3f), the budget pass after it inside "
                    "the call %.3f s (%.3f-%.3f; 0 when it ran on the budget's thread), the remainder (opening, "
                    "bookkeeping, the first token's argmax) %.3f s.\n",
                    p.median, w.median, x.median, ro.median, ro.min, ro.max, pa.median, pa.min, pa.max, ot.median);
      doc["mzcache_pipeline_ttft_median_s"] = p.median;
      doc["mzcache_wait_median_s"] = w.median;
      doc["mzcache_after_pipeline_median_s"] = x.median;
      doc["mzcache_room_median_s"] = ro.median;
      doc["mzcache_pass_in_call_median_s"] = pa.median;
      md += Sprintf("mzcache (--overlap %s) restored before computing in %d of %zu switches (an allocation phase "
                    "ran), overlapped in the rest.\n", a.overlap.c_str(), restored_first, pipe.size());
      doc["mzcache_restored_first"] = restored_first;
    }
  }
  const Stats m = Summarize(ttft["mzcache"]), u = Summarize(ttft["unload-load"]), al = Summarize(ttft["all-in-memory"]);
  const Stats mh = Summarize(ttft_half["mzcache"]), ah = Summarize(ttft_half["all-in-memory"]);
  if (m.n && u.n) {
    md += Sprintf("\nmzcache / unload-load (medians): %.2fx (target <= 0.5x).\n", m.median / u.median);
    doc["ratio_vs_unload_load"] = m.median / u.median;
  }
  if (mh.n && ah.n) {
    md += Sprintf("mzcache / all-in-memory where the incoming model was >= 50%% resident (medians, %d steps): %.2fx "
                  "(target <= 1.5x).\n", mh.n, mh.median / ah.median);
    doc["ratio_vs_all_in_memory_half_resident"] = mh.median / ah.median;
  }
  if (m.n && al.n) {
    md += Sprintf("mzcache / all-in-memory over every switch (medians): %.2fx.\n", m.median / al.median);
    doc["ratio_vs_all_in_memory"] = m.median / al.median;
  }
  md += "\nEach system runs in its own worker process. Memory held is each system's pools' counted bytes after every "
        "request (weights, KV, in-memory swap, compute buffers; llama-server's: its process's RSS); RSS is sampled every " +
        std::to_string(a.sample_ms) + " ms from /proc/<pid>/status (VmRSS, RssAnon, RssFile) of each system's worker "
        "(and llama-server's process), computing or idle. llama-server's bytes read are its process's since its start "
        "(the switch).\n";
  md += "Command: `mzcache bench models --models " + a.models + " --steps " + std::to_string(a.steps) +
        (a.weights != "page-cache" ? " --weights " + a.weights : std::string()) +
        (a.overlap != ModelsArgs().overlap ? " --overlap " + a.overlap : std::string()) +
        (a.systems != ModelsArgs().systems ? " --systems " + a.systems : std::string()) + "`\n";
  // Plots.
  std::string data;
  for (const auto& s : systems) {
    data += "# " + s->name + "\n";
    for (const auto& r : reqs)
      if (r.system == s->name)
        data += Sprintf("%d %.4f %.1f\n", r.step, r.ttft_s, double(r.held_after) / 1048576);
    data += "\n\n";
  }
  WriteFile(a.out, "bench-models.dat", data);
  std::string plot_ttft = "set terminal pngcairo size 900,500\nset output 'bench-models-ttft.png'\n"
                          "set title 'TTFT of the first request after a model switch'\nset xlabel 'request (switch)'\n"
                          "set ylabel 'TTFT (s)'\nset key top left\nplot ";
  std::string plot_mem = "set terminal pngcairo size 900,500\nset output 'bench-models-memory.png'\n"
                         "set title 'Memory held after each request'\nset xlabel 'request (switch)'\n"
                         "set ylabel 'MiB'\nset key top left\n" +
                         Sprintf("set arrow from graph 0, first %.1f to graph 1, first %.1f nohead dt 2\n",
                                 double(budget) / 1048576, double(budget) / 1048576) +
                         "plot ";
  for (size_t k = 0; k < systems.size(); ++k) {
    plot_ttft += Sprintf("%s'bench-models.dat' index %zu using 1:2 with linespoints title '%s'", k ? ", " : "", k,
                         systems[k]->name.c_str());
    plot_mem += Sprintf("%s'bench-models.dat' index %zu using 1:3 with linespoints title '%s'", k ? ", " : "", k,
                        systems[k]->name.c_str());
  }
  const std::string p1 = PlotPng(a.out, "bench-models-ttft", plot_ttft + "\n");
  const std::string p2 = PlotPng(a.out, "bench-models-memory", plot_mem + "\n");
  // RSS over time: one block per system (seconds since the first request, RSS, RssAnon, RssFile in MiB).
  std::string rdat = "# t_s rss_mib anon_mib file_mib; step starts (s):";
  for (const auto& [st, t] : step_starts) rdat += Sprintf(" %d:%.2f", st, t);
  rdat += "\n";
  std::string plot_rss = "set terminal pngcairo size 1000,550\nset output 'bench-models-rss.png'\n"
                         "set title 'RSS over time per system (solid: RSS; dashed: anonymous; the rest is mapped page cache)'\n"
                         "set xlabel 'seconds since the first request (systems alternated step by step)'\n"
                         "set ylabel 'MiB'\nset key outside right\n" +
                         Sprintf("set arrow from graph 0, first %.1f to graph 1, first %.1f nohead dt 3 lc rgb 'gray'\n",
                                 double(budget) / 1048576, double(budget) / 1048576) +
                         "plot ";
  for (size_t k = 0; k < systems.size() && k < samples.size(); ++k) {
    rdat += "# " + systems[k]->name + "\n";
    for (const auto& x : samples[k])
      rdat += Sprintf("%.3f %.1f %.1f %.1f\n", x.t, double(x.rss) / 1048576, double(x.anon) / 1048576,
                      double(x.file) / 1048576);
    rdat += "\n\n";
    plot_rss += Sprintf("%s'bench-models-rss.dat' index %zu using 1:2 with lines lc %zu lw 2 title '%s', "
                        "'bench-models-rss.dat' index %zu using 1:3 with lines lc %zu dt 2 title '%s anon'",
                        k ? ", " : "", k, k + 1, systems[k]->name.c_str(), k, k + 1, systems[k]->name.c_str());
  }
  WriteFile(a.out, "bench-models-rss.dat", rdat);
  const std::string p3 = PlotPng(a.out, "bench-models-rss", plot_rss + "\n");
  if (!p1.empty()) md += "\n![TTFT after a switch](" + p1 + ")\n";
  if (!p2.empty()) md += "![memory held](" + p2 + ")\n";
  if (!p3.empty()) md += "![RSS over time](" + p3 + ")\n";
  WriteReport(a.out, "bench-models", md, doc);
  std::printf("%s", md.c_str());
  for (auto& w : systems) ReapPiped(w->c, false);  // EOF: each worker unloads and exits
  systems.clear();
  std::filesystem::remove_all(root);
  return 0;
}

}  // namespace models_bench

void AddModelsBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<models_bench::ModelsArgs>();
  auto* c = bench->add_subcommand("models", "several models under one memory budget: TTFT after a switch and RSS over "
                                            "time, mzcache vs unload-and-load vs all in memory (one process per system)");
  // The hidden worker (one system in its own process, driven by `bench models`) takes the same options.
  auto* w = bench->add_subcommand("models-worker", "internal: one system of bench models, driven over stdin/stdout");
  w->group("");
  auto common = [a](CLI::App* c) {
    c->add_option("--models", a->models, "comma-separated shapes or GGUF paths (2 or more)");
    c->add_option("--type", a->type, "weight type of synthesized shapes");
    c->add_option("--steps", a->steps, "switches per system");
    c->add_option("--history", a->history, "tokens of each model's conversation, built at setup");
    c->add_option("--query", a->query, "tokens of each request's user turn");
    c->add_option("--gen", a->gen, "tokens generated per request (greedy)");
    c->add_option("-t,--threads", a->threads, "threads");
    c->add_option("--budget-models", a->budget_models, "the shared budget, in mean model footprints");
    c->add_option("--seed", a->seed, "seed of the sequence and the tokens");
    c->add_option("--systems", a->systems, "comma-separated: mzcache, mzcache-serial (restores before the prefill), "
                  "mzcache-overlap (restores overlapped with the prefill), mzcache-overlap-all (the same, compute on all its "
                  "threads while restoring), mzcache-spread (idle models' weights given back "
                  "by depth across models), mzcache-inpass (the budget pass after a call inside it, as before 0.19), "
                  "mzcache-behind (the room pass before a switch's restore on the budget's thread, beside it), "
                  "unload-load, llama-server, all-in-memory");
    AddWeightsOption(c, &a->weights);  // how the mzcache systems hold weights
    c->add_option("--overlap", a->overlap,
                  "restore_generate of the mzcache system: auto (overlapped or restore-first, chosen per call from the "
                  "cores and the measured costs: the default), full (restore overlapped with the prefill) or none "
                  "(restore first, then compute)")
        ->check(CLI::IsMember({"auto", "full", "none"}));
  };
  common(c);
  common(w);
  w->add_option("--system", a->worker_system, "the system to run")->required();
  w->add_option("--root", a->worker_root, "its folder")->required();
  w->add_option("--budget", a->worker_budget, "the shared budget, bytes (the mzcache systems)");
  c->add_option("--dir", a->dir, "scratch folder (model copies, pools)");
  c->add_option("-o,--out", a->out, "folder for bench-models.{md,json}, the plots (TTFT, memory held, RSS over time) "
                                    "and their .dat files");
  c->add_option("--sample-ms", a->sample_ms, "period of the RSS sampling of each system's process, ms")
      ->check(CLI::Range(10, 60000));
  runners.push_back([c, w, a]() -> int {
    if (c->parsed()) return models_bench::RunModels(*a);
    if (w->parsed()) return models_bench::RunModelsWorker(*a);
    return -1;
  });
}

}  // namespace mz::cli
