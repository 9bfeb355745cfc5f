// `mzcache demo`: the story of what mzcache is for, measured in one run on one screen (README's
// main job, scripts/demo.sh). Every figure is measured in this run; nothing is stored or assumed.
//
//   1. a conversation of a few thousand tokens of real text is built; its resident memory shown;
//   2. the system asks for memory back (Android's onTrimMemory(level), the pool's
//      mz_pool_on_trim_memory): what was given back, the process's RSS before and after;
//   3. the user returns with a new message: time to first token restored (front layers first while
//      the prefill runs), beside the same message with everything in memory and with the history
//      computed again (what a runtime that was killed or dropped its KV pays), in the same run;
//   4. the process is killed (kill -9) and started again: the conversation continues from storage.
//
// Shape: the conversation lives in a worker process (this binary, `demo --worker`, hidden), so the
// kill in step 4 is a real SIGKILL of the process that held it; the harness (this process) only
// sends commands and collects figures. Both speak lines: the harness writes a command, the worker
// answers `PROGRESS done total`* then `RESULT {json}` or `ERROR text`. The worker uses the public
// C API only (include/mzcache.h), as an app would.
//
// Storage figures: before each return the worker drops the page cache of the model file and of the
// pool's files (posix_fadvise DONTNEED after fdatasync), so what is read back comes from the disk,
// as it would after a real app took the memory (the OS drops the page cache first).
//
// Output: the screen (stdout), <out>/demo.md, demo.json and demo.png (gnuplot). Errors: a failed
// step prints the worker's error and exits 1; the worker is killed and reaped on every path.
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "mzcache.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/child_process.h"
#include "tools/bench/os_memory.h"
#include "tools/bench/real_text.h"
#include "tools/bench/report.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

using nlohmann::json;

// The user's message when they come back, and after the restart (fixed: the same in both runs).
constexpr const char* kReturnMessage =
    "\n\nWelcome back. Before we go on, tell me in two sentences what this passage says about patience.";
constexpr const char* kAfterRestartMessage = "\n\nAnd after all that, what should I read next?";
constexpr const char* kConversation = "demo";

struct DemoArgs {
  std::string model, out;
  int tokens = 3072, threads = 2, reps = 3, reply_tokens = 16, trim_level = 80;
  bool quick = false, worker = false;
  std::string pool_dir;  // worker: the pool's folder
  std::string json_path;
};

// ---- the worker: holds the conversation ----

uint64_t SelfRss() {
  uint64_t rss = 0, swap = 0;
  ProcMemory(int(getpid()), &rss, &swap);
  return rss;
}

void DropCaches(const std::string& model, const std::string& dir) {
  DropFileCache(model);
  DropTreeCache(dir);
}

class Worker {
 public:
  explicit Worker(const DemoArgs& a) : a_(a) {}
  ~Worker() {
    if (conv_) mz_conversation_release(conv_);
    if (pool_) mz_pool_free(pool_);
    if (sampler_) mz_sampler_free(sampler_);
    if (model_) mz_model_free(model_);
  }
  int Run();

 private:
  bool Fail(const std::string& what, int rc) {
    std::printf("ERROR %s: %s (%s)\n", what.c_str(), mz_status_str(rc), mz_last_error());
    std::fflush(stdout);
    return false;
  }
  void Result(const json& j) {
    std::printf("RESULT %s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  bool Open();
  bool Build(int n);
  bool Ttft(const std::string& how);
  bool Trim(int level);
  bool Reply(int k);
  bool Continue();
  json Memory();
  // restore_generate of the return message on conv; *stats filled. The conversation grows by it.
  int Return(mz_conversation* conv, const std::vector<mz_token>& msg, mz_restore_stats* stats);

  DemoArgs a_;
  mz_model* model_ = nullptr;
  mz_pool* pool_ = nullptr;
  mz_conversation* conv_ = nullptr;
  mz_sampler* sampler_ = nullptr;
  std::vector<mz_token> history_, message_;
};

json Worker::Memory() {
  mz_pool_report p{};
  mz_pool_get_report(pool_, &p);
  return {{"rss", SelfRss()},
          {"in_memory", p.in_memory},
          {"weights_resident", p.weights_resident},
          {"weights_total", p.weights_total},
          {"kv_resident", p.kv_resident},
          {"kv_mem_compressed", p.kv_mem_compressed},
          {"kv_storage", p.kv_storage}};
}

bool Worker::Open() {
  const auto t0 = std::chrono::steady_clock::now();
  if (int rc = mz_model_load(a_.model.c_str(), nullptr, &model_)) return Fail("loading " + a_.model, rc);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a_.tokens + 1024);
  cp.n_threads = a_.threads;
  mz_pool_params pp = mz_pool_default_params();
  pp.dir = a_.pool_dir.c_str();
  pp.context = &cp;
  pp.share_prefixes = false;  // the recompute baseline must compute, not copy the demo's chunks
  if (int rc = mz_pool_new(model_, &pp, &pool_)) return Fail("opening the pool in " + a_.pool_dir, rc);
  if (int rc = mz_pool_open(pool_, kConversation, &conv_)) return Fail("opening the conversation", rc);
  mz_sampler_params sp = mz_sampler_default_params();
  sp.temperature = 0.0f;
  sampler_ = mz_sampler_new(&sp);
  if (!sampler_) return Fail("the sampler", MZ_ERR_INTERNAL);
  if (int rc = TokenizeText(model_, std::string(kReturnMessage), false, false, &message_)) return Fail("tokenizing", rc);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json r = Memory();
  r["load_s"] = load_s;
  r["found_tokens"] = mz_conversation_n_tokens(conv_);
  std::printf("READY %s\n", r.dump().c_str());
  std::fflush(stdout);
  return true;
}

bool Worker::Build(int n) {
  std::string text;
  if (Status st = RealText(size_t(n) * 8, &text); !st.ok()) {
    std::printf("ERROR real text: %s\n", st.ToString().c_str());
    std::fflush(stdout);
    return false;
  }
  if (int rc = TokenizeText(model_, text, true, false, &history_)) return Fail("tokenizing the text", rc);
  history_.resize(std::min(history_.size(), size_t(n)));
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kStep = 256;
  for (size_t i = 0; i < history_.size(); i += kStep) {
    const int32_t k = int32_t(std::min<size_t>(kStep, history_.size() - i));
    if (int rc = mz_conversation_decode(conv_, history_.data() + i, k, false)) return Fail("prefill", rc);
    std::printf("PROGRESS %zu %zu\n", i + size_t(k), history_.size());
    std::fflush(stdout);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (int rc = mz_conversation_commit(conv_)) return Fail("commit", rc);
  if (int rc = mz_pool_flush(pool_)) return Fail("persisting", rc);
  json r = Memory();
  r["tokens"] = history_.size();
  r["build_s"] = s;
  Result(r);
  return true;
}

int Worker::Return(mz_conversation* conv, const std::vector<mz_token>& msg, mz_restore_stats* stats) {
  mz_restore_params rp = mz_restore_default_params();
  return mz_conversation_restore_generate(conv, msg.data(), int32_t(msg.size()), &rp, stats);
}

// how: "memory" (nothing evicted), "restored" (after a trim, page cache dropped), "recompute" (a
// new conversation computes the history and the message). The conversation is cut back to the
// history after each measurement, so every repetition answers the same state.
bool Worker::Ttft(const std::string& how) {
  std::vector<double> ttft;
  json last;
  int skipped = 0;  // restored: repetitions whose trim gave nothing back
  const int reps = how == "recompute" ? 1 : a_.reps;
  if (how == "memory") {  // a return not timed first: every unit back in memory, then cut back
    mz_restore_stats st{};
    if (int rc = Return(conv_, message_, &st)) return Fail("return", rc);
    if (int rc = mz_conversation_truncate(conv_, int32_t(history_.size()))) return Fail("truncate", rc);
  }
  for (int i = 0; i < reps; ++i) {
    mz_restore_stats st{};
    if (how == "recompute") {
      mz_conversation* fresh = nullptr;
      if (int rc = mz_pool_open(pool_, "demo-recompute", &fresh)) return Fail("opening the baseline", rc);
      std::vector<mz_token> all = history_;
      all.insert(all.end(), message_.begin(), message_.end());
      const int rc = Return(fresh, all, &st);
      mz_conversation_release(fresh);
      mz_pool_delete(pool_, "demo-recompute");
      if (rc) return Fail("recompute", rc);
    } else {
      if (how == "restored") {
        // Trims within a second of each other merge (mz_pool_on_trim_memory's hysteresis): a
        // repetition that came sooner finds the KV still resident and trims again after a second.
        // One whose KV is still resident then is not a return after pressure: it is left out of
        // the figures and counted.
        auto trimmed = [&] {
          mz_pool_report p{};
          return mz_pool_get_report(pool_, &p) == MZ_OK && p.kv_resident == 0 && p.weights_resident < p.weights_total;
        };
        for (int attempt = 0; attempt < 2; ++attempt) {
          if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
          uint64_t freed = 0;
          if (int rc = mz_pool_on_trim_memory(pool_, a_.trim_level, &freed)) return Fail("trim", rc);
          if (trimmed()) break;
        }
        if (!trimmed()) {
          ++skipped;
          continue;
        }
        DropCaches(a_.model, a_.pool_dir);
      }
      if (int rc = Return(conv_, message_, &st)) return Fail("return", rc);
      if (int rc = mz_conversation_truncate(conv_, int32_t(history_.size()))) return Fail("truncate", rc);
    }
    ttft.push_back(st.ttft_s);
    last = {{"bytes_from_storage", st.bytes_from_storage}, {"units_restored", st.units_restored},
            {"reload_s", st.reload_s}, {"wait_s", st.wait_s}};
  }
  if (ttft.empty()) return Fail("no repetition's trim gave memory back", MZ_ERR_INTERNAL);
  const Stats s = Summarize(ttft);
  last["skipped"] = skipped;
  last["ttft_s"] = s.median;
  last["ttft_min_s"] = s.min;
  last["ttft_max_s"] = s.max;
  last["reps"] = int(ttft.size());
  last["message_tokens"] = message_.size();
  Result(last);
  return true;
}

bool Worker::Trim(int level) {
  json before = Memory();
  uint64_t freed = 0;
  if (int rc = mz_pool_on_trim_memory(pool_, level, &freed)) return Fail("trim", rc);
  Result({{"before", before}, {"after", Memory()}, {"freed", freed}, {"level", level}});
  return true;
}

// The user's message and a short reply, committed and persisted: the turn a kill may now hit.
bool Worker::Reply(int k) {
  mz_restore_stats st{};
  if (int rc = Return(conv_, message_, &st)) return Fail("return", rc);
  json after_return = Memory();
  mz_token t = mz_conversation_sample(conv_, sampler_, 0);
  for (int i = 0; i < k; ++i) {
    if (int rc = mz_conversation_decode(conv_, &t, 1, false)) return Fail("decode", rc);
    t = mz_conversation_sample(conv_, sampler_, 0);
  }
  if (int rc = mz_conversation_commit(conv_)) return Fail("commit", rc);
  if (int rc = mz_pool_flush(pool_)) return Fail("persisting", rc);
  Result({{"tokens", mz_conversation_n_tokens(conv_)}, {"ttft_s", st.ttft_s}, {"after_return", after_return}});
  return true;
}

// After a restart: the next message continues the stored conversation (restored front layers first).
bool Worker::Continue() {
  std::vector<mz_token> msg;
  if (int rc = TokenizeText(model_, std::string(kAfterRestartMessage), false, false, &msg)) return Fail("tokenizing", rc);
  DropCaches(a_.model, a_.pool_dir);
  mz_restore_stats st{};
  if (int rc = Return(conv_, msg, &st)) return Fail("continue", rc);
  json r = Memory();
  r["ttft_s"] = st.ttft_s;
  r["bytes_from_storage"] = st.bytes_from_storage;
  r["units_restored"] = st.units_restored;
  r["tokens"] = mz_conversation_n_tokens(conv_);
  Result(r);
  return true;
}

int Worker::Run() {
  if (!Open()) return 1;
  std::string line;
  while (std::getline(std::cin, line)) {
    char cmd[32] = {0};
    int arg = 0;
    std::sscanf(line.c_str(), "%31s %d", cmd, &arg);
    const std::string c = cmd;
    bool ok = true;
    if (c == "build") ok = Build(arg);
    else if (c == "ttft-memory") ok = Ttft("memory");
    else if (c == "ttft-restored") ok = Ttft("restored");
    else if (c == "ttft-recompute") ok = Ttft("recompute");
    else if (c == "trim") ok = Trim(arg);
    else if (c == "reply") ok = Reply(arg);
    else if (c == "continue") ok = Continue();
    else {
      std::printf("ERROR unknown command %s\n", c.c_str());
      std::fflush(stdout);
      ok = false;
    }
    if (!ok) return 1;
  }
  return 0;
}

// ---- the harness ----

class Harness {
 public:
  explicit Harness(const DemoArgs& a) : a_(a) {}
  int Run();

 private:
  Status Start(PipedChild* w, json* ready);
  // Sends cmd, shows PROGRESS lines as a progress bar labelled what, returns RESULT's json.
  Status Ask(PipedChild& w, const std::string& cmd, const char* what, json* out);
  void Screen(const json& d);
  std::string Plot(const json& d);

  DemoArgs a_;
};

Status Harness::Start(PipedChild* w, json* ready) {
  std::vector<std::string> argv = {SelfExe(), "demo", "--worker", "--pool-dir", a_.pool_dir, "-m", a_.model,
                                   "-t", std::to_string(a_.threads), "--tokens", std::to_string(a_.tokens),
                                   "--reps", std::to_string(a_.reps), "--trim-level", std::to_string(a_.trim_level)};
  MZ_RETURN_IF_ERROR(SpawnPiped(argv, w));
  char buf[65536];
  while (std::fgets(buf, sizeof buf, w->out)) {
    std::string l = buf;
    if (l.rfind("READY ", 0) == 0) {
      *ready = json::parse(l.substr(6), nullptr, false);
      return Status::Ok();
    }
    if (l.rfind("ERROR ", 0) == 0) return Status::Internal("worker: " + l.substr(6));
  }
  return Status::Internal("the worker exited before it was ready");
}

Status Harness::Ask(PipedChild& w, const std::string& cmd, const char* what, json* out) {
  const std::string l = cmd + "\n";
  if (write(w.in, l.data(), l.size()) != ssize_t(l.size())) return Status::Internal("the worker is gone");
  char buf[65536];
  while (std::fgets(buf, sizeof buf, w.out)) {
    std::string s = buf;
    unsigned long long done = 0, total = 0;
    if (std::sscanf(s.c_str(), "PROGRESS %llu %llu", &done, &total) == 2) {
      const bool tty = isatty(2);
      std::fprintf(stderr, tty ? "\r  %s: %llu / %llu tokens" : "  %s: %llu / %llu tokens\n", what, done, total);
      if (tty && done == total) std::fprintf(stderr, "\n");
      continue;
    }
    if (s.rfind("RESULT ", 0) == 0) {
      *out = json::parse(s.substr(7), nullptr, false);
      if (out->is_discarded()) return Status::Internal("the worker's answer is not JSON: " + s);
      return Status::Ok();
    }
    if (s.rfind("ERROR ", 0) == 0) return Status::Internal(std::string(what) + ": " + s.substr(6));
  }
  return Status::Internal(std::string(what) + ": the worker exited");
}

std::string Mib(uint64_t b) {
  char buf[32];
  const double m = double(b) / 1048576.0;
  std::snprintf(buf, sizeof buf, m < 10 ? "%.1f MiB" : "%.0f MiB", m);
  return buf;
}
std::string Sec(double s) {
  char buf[48];
  if (s < 1.0) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}
std::string Range(const json& t) {
  std::string r = "median of " + std::to_string(t["reps"].get<int>()) + ", " + Sec(t["ttft_min_s"]) + "-" + Sec(t["ttft_max_s"]);
  if (t.value("skipped", 0) > 0) r += ", " + std::to_string(t["skipped"].get<int>()) + " left out: their KV was still in memory";
  return r;
}

void Harness::Screen(const json& d) {
  const json &b = d["build"], &tr = d["trim"], &mem = d["ttft_memory"], &res = d["ttft_restored"],
             &rec = d["ttft_recompute"], &re = d["restart"];
  std::printf("\nmzcache demo: what happens to a conversation when the system takes its memory back\n");
  std::printf("machine: %s, %d threads; model: %s (real shapes and tokenizer, random weights: the words are noise, "
              "the timings are real)\n\n",
              d["machine"].get<std::string>().c_str(), a_.threads, d["model"].get<std::string>().c_str());
  std::printf("1. A conversation of %d tokens of real text, computed in %s.\n", b["tokens"].get<int>(),
              Sec(b["build_s"]).c_str());
  std::printf("   In memory: RSS %s (weights %s, KV %s).\n", Mib(b["rss"]).c_str(), Mib(b["weights_resident"]).c_str(),
              Mib(b["kv_resident"]).c_str());
  std::printf("2. The system asks for memory (onTrimMemory(%d), as Android sends it).\n", tr["level"].get<int>());
  std::printf("   Given back %s: RSS %s -> %s; the KV went to compressed memory (%s) and storage (%s).\n",
              Mib(tr["freed"]).c_str(), Mib(tr["before"]["rss"]).c_str(), Mib(tr["after"]["rss"]).c_str(),
              Mib(tr["after"]["kv_mem_compressed"]).c_str(), Mib(tr["after"]["kv_storage"]).c_str());
  std::printf("3. The user comes back with a new message (%d tokens). Time to first token:\n",
              mem["message_tokens"].get<int>());
  std::printf("   restored, front layers first while prefill runs  %8s  (%s; read %s, page cache dropped)\n",
              Sec(res["ttft_s"]).c_str(), Range(res).c_str(), Mib(res["bytes_from_storage"]).c_str());
  std::printf("   everything still in memory                       %8s  (%s)\n", Sec(mem["ttft_s"]).c_str(),
              Range(mem).c_str());
  std::printf("   history computed again (killed, or KV dropped)   %8s  (%.0fx the restored return)\n",
              Sec(rec["ttft_s"]).c_str(), rec["ttft_s"].get<double>() / std::max(1e-6, res["ttft_s"].get<double>()));
  std::printf("4. kill -9 of the process, started again: %d of %d tokens found on storage.\n",
              re["found_tokens"].get<int>(), d["reply"]["tokens"].get<int>());
  // The TTFT is timed from the message, after the restarted process loaded the model: say so, as
  // "answered after X (model load Y)" read as if Y were inside X.
  std::printf("   Model loaded again in %s; the next message's first token %s after it.\n", Sec(re["load_s"]).c_str(),
              Sec(re["ttft_s"]).c_str());
  // Before the run only: the demo itself keeps its threads busy (a load of about --threads after it).
  const double load = d["load_average_before"].get<double>();
  if (load > 1.0)
    std::printf("\nNote: the machine was busy before the run (load average %.1f over the last minute, %u cores): the "
                "times above may be slower and noisier than on a quiet machine.\n",
                load, std::thread::hardware_concurrency());
  std::printf("\nNext: build/mzcache chat (a conversation kept between runs) · scripts/demo.sh serve (OpenAI API "
              "and a page at http://127.0.0.1:8080/) · build/mzcache bench --help (every figure of docs/results.md)\n");
}

std::string Harness::Plot(const json& d) {
  const json &tr = d["trim"], &mem = d["ttft_memory"], &res = d["ttft_restored"], &rec = d["ttft_recompute"],
             &re = d["restart"];
  char dat[1024];
  std::snprintf(dat, sizeof dat,
                "$rss << EOD\n\"built\" %.1f\n\"after trim\" %.1f\n\"after return\" %.1f\nEOD\n"
                "$ttft << EOD\n\"in memory\" %.4f\n\"restored\" %.4f\n\"after kill -9\" %.4f\n\"recomputed\" %.4f\nEOD\n",
                tr["before"]["rss"].get<double>() / 1048576.0, tr["after"]["rss"].get<double>() / 1048576.0,
                d["reply"]["after_return"]["rss"].get<double>() / 1048576.0, mem["ttft_s"].get<double>(),
                res["ttft_s"].get<double>(), re["ttft_s"].get<double>(), rec["ttft_s"].get<double>());
  std::string gp = std::string("set terminal pngcairo size 1100,420 font ',11'\nset output 'demo.png'\n") + dat +
                   "set multiplot layout 1,2 title 'mzcache demo: " + d["machine"].get<std::string>() + ", " +
                   d["model"].get<std::string>() + "' noenhanced\n"
                   "set style fill solid 0.8 border -1\nset boxwidth 0.6\nset grid y\nset yrange [0:*]\n"
                   "set title 'process memory (RSS, MiB)'\nplot $rss using 0:2:xtic(1) with boxes lc rgb '#4477aa' notitle, "
                   "'' using 0:2:(sprintf('%.0f',$2)) with labels offset 0,0.8 notitle\n"
                   "set title 'time to first token of the return (s, log)'\nset logscale y\nset yrange [*:*]\n"
                   "plot $ttft using 0:2:xtic(1) with boxes lc rgb '#cc6677' notitle, "
                   "'' using 0:2:(sprintf('%.2f',$2)) with labels offset 0,0.8 notitle\n"
                   "unset multiplot\n";
  return PlotPng(a_.out, "demo", gp);
}

int Harness::Run() {
  if (a_.out.empty()) a_.out = CacheDir() + "/demo";
  a_.pool_dir = a_.out + "/pool";
  std::error_code ec;
  std::filesystem::remove_all(a_.pool_dir, ec);
  std::filesystem::create_directories(a_.pool_dir, ec);
  if (ec) return Fail(Status::IOError("cannot create " + a_.pool_dir + ": " + ec.message()));
  json d;
  d["machine"] = MachineDescription();
  d["model"] = std::filesystem::path(a_.model).filename().string();
  d["threads"] = a_.threads;
  d["load_average_before"] = LoadAvg1();
  Status st = [&]() -> Status {
    PipedChild w;
    json ready;
    std::fprintf(stderr, "[demo] starting the app (a worker process that holds the conversation)\n");
    MZ_RETURN_IF_ERROR(Start(&w, &ready));
    std::fprintf(stderr, "[demo] 1/4 building a conversation of %d tokens\n", a_.tokens);
    MZ_RETURN_IF_ERROR(Ask(w, "build " + std::to_string(a_.tokens), "prefill", &d["build"]));
    std::fprintf(stderr, "[demo] 2/4 the system asks for memory: onTrimMemory(%d)\n", a_.trim_level);
    MZ_RETURN_IF_ERROR(Ask(w, "trim " + std::to_string(a_.trim_level), "trim", &d["trim"]));
    std::fprintf(stderr, "[demo] 3/4 the user returns: restored, in memory, recomputed (%d repetitions)\n", a_.reps);
    MZ_RETURN_IF_ERROR(Ask(w, "ttft-restored", "restored", &d["ttft_restored"]));
    MZ_RETURN_IF_ERROR(Ask(w, "ttft-memory", "in memory", &d["ttft_memory"]));
    MZ_RETURN_IF_ERROR(Ask(w, "ttft-recompute", "recompute", &d["ttft_recompute"]));
    std::fprintf(stderr, "[demo] 4/4 one more turn, then kill -9 of the app and a restart\n");
    MZ_RETURN_IF_ERROR(Ask(w, "reply " + std::to_string(a_.reply_tokens), "reply", &d["reply"]));
    const int status = ReapPiped(w, /*kill_it=*/true);
    d["killed"] = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    PipedChild w2;
    MZ_RETURN_IF_ERROR(Start(&w2, &d["restart"]));
    json cont;
    MZ_RETURN_IF_ERROR(Ask(w2, "continue", "continue", &cont));
    d["restart"].update(cont);
    ReapPiped(w2, false);
    return Status::Ok();
  }();
  if (!st.ok()) return Fail(st);
  d["load_average_after"] = LoadAvg1();
  Screen(d);
  const std::string png = Plot(d);
  d["png"] = png;
  std::string md = "# mzcache demo\n\n" + d["machine"].get<std::string>() + ", model " + d["model"].get<std::string>() +
                   "\n\n```json\n" + d.dump(2) + "\n```\n";
  WriteReport(a_.out, "demo", md, d);
  if (!a_.json_path.empty()) {
    std::ofstream f(a_.json_path, std::ios::trunc);
    f << d.dump(2) << "\n";
    if (!f) std::fprintf(stderr, "[demo] warning: cannot write %s\n", a_.json_path.c_str());
  }
  std::printf("Results: %s/demo.md, demo.json%s\n", a_.out.c_str(), png.empty() ? " (no plot: gnuplot failed)" : ", demo.png");
  return 0;
}

}  // namespace

void AddDemoCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<DemoArgs>();
  auto* c = app.add_subcommand("demo",
                               "the story in one screen: a conversation built, memory given back when the system "
                               "asks, the return's time to first token against recomputing, a kill -9 survived");
  c->add_option("-m,--model", a->model, "GGUF (default: the synthesized Qwen3-0.6B q8_0)");
  c->add_option("--tokens", a->tokens, "tokens of real text in the conversation (default 3072; --quick 1024)")
      ->check(CLI::Range(64, 1 << 20));
  c->add_option("-t,--threads", a->threads, "compute threads (default 2)")->check(CLI::Range(1, 512));
  c->add_option("--reps", a->reps, "repetitions of each return measured (default 3; the median is shown)")
      ->check(CLI::Range(1, 100));
  c->add_option("--trim-level", a->trim_level, "onTrimMemory level the system sends (default 80, COMPLETE)")
      ->check(CLI::Range(0, 100));
  c->add_option("--out", a->out, "folder of demo.md, demo.json, demo.png and the pool (default <cache>/demo)");
  c->add_option("--json", a->json_path, "also write the figures as JSON to this file");
  c->add_flag("--quick", a->quick, "a shorter conversation (1024 tokens): under a minute on 2 cores");
  c->add_flag("--worker", a->worker, "(internal) the process that holds the conversation")->group("");
  c->add_option("--pool-dir", a->pool_dir, "(internal) the worker's pool folder")->group("");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    DemoArgs args = *a;
    if (args.quick && c->count("--tokens") == 0) args.tokens = 1024;
    if (args.worker) return Worker(args).Run();
    if (args.model.empty()) {
      Status st = EnsureDefaultModel(&args.model);
      if (!st.ok()) return Fail(st);
    }
    return Harness(args).Run();
  });
}

}  // namespace mz::cli
