// bench peers: time to first token of a short query over a long context, against what people run
// today, on the same GGUF, threads, context and query:
//   a. llama.cpp state file: a NEW process loads the model, creates a context, loads the sequence
//      state saved once with llama_state_seq_save_file, and decodes the query (cold page cache);
//   b. cold start (Ollama's unload, an app killed by the low-memory killer): a new process loads the
//      model and re-prefills context + query, with llama.cpp and with mzcache;
//   c. llama.cpp with mmap'd weights in a memory cgroup (v1) whose limit is lowered to a
//      remaining-memory level with zram swap, then lifted before the query (as our OS Paging
//      baseline, tools/bench/cmd_ospaging.cpp), and all-resident for reference;
//   d. mzcache: restore_generate from 100/50/0% remaining (in this process), and a new process that
//      loads the model and its session file (KV from storage) and restore_generates the query.
// Every new-process measurement runs in `mzcache bench peers-worker` (hidden). Before each, the
// model, state and session files are dropped from the page cache (posix_fadvise DONTNEED, checked
// with mincore), so what should come from storage does.
#include <llama.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>

#include "core/ggml_log.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "tools/bench/child_process.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/os_memory.h"
#include "tools/bench/ospaging.h"
#include "tools/bench/accuracy_metrics.h"
#include "tools/bench/peers_common.h"

namespace mz::cli {
namespace {

// ---------------------------------------------------------------------------------------------
// Worker (a fresh process per measurement).

struct PeersWorkerArgs {
  std::string mode;    // llama-build | llama-state | llama-cold | llama-mmap | mz-session | mz-cold
  std::string model;
  std::string file;    // llama state file or mzcache session file
  std::string tokens;  // binary int32: n context tokens then q query tokens
  std::string cgroup;  // llama-mmap: cgroup v1 folder to join first
  std::string logits_out;  // if set: the first token's logits (n_vocab floats) are written there
  std::string llama_fa = "auto";  // llama.cpp flash attention: auto (library default) | on | off
  int n = 0, q = 8, threads = 2, n_ctx = 0;
  uint64_t kv_bytes_per_token = 0;
};

Status ReadTokens(const std::string& path, std::vector<int32_t>* t) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::IOError("cannot read " + path);
  f.seekg(0, std::ios::end);
  const size_t bytes = size_t(f.tellg());
  f.seekg(0);
  t->resize(bytes / 4);
  f.read(reinterpret_cast<char*>(t->data()), std::streamsize(t->size() * 4));
  return f ? Status::Ok() : Status::IOError("short read of " + path);
}

struct LlamaHandles {
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  ~LlamaHandles() {
    if (ctx) llama_free(ctx);
    if (model) llama_model_free(model);
  }
};

// Decodes toks[0, n) at positions pos0.. in batches of at most 512; logits for the last one if asked.
Status LlamaDecode(llama_context* ctx, const int32_t* toks, int n, int pos0, bool last_logits, bool progress) {
  const double t0 = NowSeconds();
  for (int off = 0; off < n; off += 512) {
    const int m = std::min(512, n - off);
    llama_batch b = llama_batch_init(m, 0, 1);
    for (int i = 0; i < m; ++i) {
      b.token[i] = toks[off + i];
      b.pos[i] = pos0 + off + i;
      b.n_seq_id[i] = 1;
      b.seq_id[i][0] = 0;
      b.logits[i] = last_logits && off + i == n - 1;
    }
    b.n_tokens = m;
    const int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) return Status::Internal("llama_decode failed (" + std::to_string(rc) + ")");
    if (progress) std::fprintf(stderr, "\r  llama.cpp prefill %d/%d tokens (%.0f s)", off + m, n, NowSeconds() - t0);
  }
  if (progress) std::fprintf(stderr, "\n");
  return Status::Ok();
}

int Top1(const float* l, int nv) { return l ? int(std::max_element(l, l + nv) - l) : -1; }

// Writes the first token's logits (nv floats at last) to a.logits_out, if asked.
Status SaveLogits(const PeersWorkerArgs& a, const float* last, int nv) {
  if (a.logits_out.empty() || !last) return Status::Ok();
  std::ofstream f(a.logits_out, std::ios::binary);
  f.write(reinterpret_cast<const char*>(last), std::streamsize(size_t(nv) * 4));
  return f ? Status::Ok() : Status::IOError("cannot write " + a.logits_out);
}

// llama-mmap: touch every weight page once (a first inference would), forget that token, drop the
// state file's page cache, say READY <footprint>, wait for GO, then time the query.
Status LlamaMmapQuery(const PeersWorkerArgs& a, const LlamaHandles& h, const int32_t* query, int nv, const float** last,
                      nlohmann::json* out) {
  MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, query, 1, a.n, true, false));
  llama_memory_seq_rm(llama_get_memory(h.ctx), 0, a.n, -1);
  // The state file was read with buffered I/O inside the cgroup: its page cache would be charged
  // to the process's "other memory" and be the first thing reclaimed, so drop it now.
  (*out)["state_file_cached_after_drop"] = DropFileCache(a.file);
  const uint64_t foot = llama_model_size(h.model) + a.kv_bytes_per_token * llama_n_ctx(h.ctx);
  std::printf("READY %llu\n", (unsigned long long)foot);
  std::fflush(stdout);
  std::string go;
  if (!std::getline(std::cin, go)) return Status::Cancelled("no GO from the harness");
  const double q0 = NowSeconds();
  MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, query, a.q, a.n, true, false));
  (*out)["top1"] = Top1(*last = llama_get_logits_ith(h.ctx, -1), nv);
  (*out)["query_s"] = (*out)["ttft_s"] = NowSeconds() - q0;
  return Status::Ok();
}

// The llama.cpp side of a worker: load, create a context, then the mode's work (build: prefill and
// save the state; state / mmap: load the state and decode the query; cold: re-prefill + query).
Status RunLlamaWorker(const PeersWorkerArgs& a, const std::vector<int32_t>& toks, nlohmann::json* out) {
  InitLibraryLogging();
  llama_backend_init();
  LlamaHandles h;
  llama_model_params mp = llama_model_default_params();
  if (a.mode == "llama-mmap") mp.load_mode = LLAMA_LOAD_MODE_MMAP;
  (*out)["llama_load_mode"] = llama_load_mode_name(mp.load_mode);
  LogCapture cap;
  const double t0 = NowSeconds();
  h.model = llama_model_load_from_file(a.model.c_str(), mp);
  if (!h.model) return Status::Internal("llama.cpp cannot load " + a.model + ": " + cap.text());
  const double t1 = NowSeconds();
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(a.n_ctx);
  cp.n_threads = cp.n_threads_batch = a.threads;
  if (a.llama_fa == "on") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
  if (a.llama_fa == "off") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  h.ctx = llama_init_from_model(h.model, cp);
  if (!h.ctx) return Status::Internal("llama.cpp cannot create a context: " + cap.text());
  const double t2 = NowSeconds();
  (*out)["model_load_s"] = t1 - t0;
  (*out)["context_s"] = t2 - t1;
  (*out)["flash_attn"] = llama_flash_attn_type_name(cp.flash_attn_type);
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(h.model));
  const int32_t* query = toks.data() + a.n;
  const float* last = nullptr;  // first token's logits, valid until h is freed
  if (a.mode == "llama-build") {
    MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, toks.data(), a.n, 0, false, true));
    const double t3 = NowSeconds();
    const std::string tmp = a.file + ".tmp";
    if (llama_state_seq_save_file(h.ctx, tmp.c_str(), 0, toks.data(), size_t(a.n)) == 0)
      return Status::IOError("llama_state_seq_save_file failed: " + cap.text());
    if (std::rename(tmp.c_str(), a.file.c_str()) != 0) return Status::FromErrno(errno, "rename " + tmp);
    (*out)["prefill_s"] = t3 - t2;
    (*out)["save_s"] = NowSeconds() - t3;
  } else if (a.mode == "llama-state" || a.mode == "llama-mmap") {
    std::vector<int32_t> got(size_t(a.n_ctx));
    size_t n_got = 0;
    if (llama_state_seq_load_file(h.ctx, a.file.c_str(), 0, got.data(), got.size(), &n_got) == 0)
      return Status::Corruption("llama_state_seq_load_file failed on " + a.file + ": " + cap.text());
    const double t3 = NowSeconds();
    if (int(n_got) != a.n || !std::equal(got.begin(), got.begin() + a.n, toks.begin()))
      return Status::Corruption(a.file + " holds other tokens than this context");
    (*out)["state_load_s"] = t3 - t2;
    if (a.mode == "llama-mmap") {
      MZ_RETURN_IF_ERROR(LlamaMmapQuery(a, h, query, nv, &last, out));
    } else {
      MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, query, a.q, a.n, true, false));
      (*out)["top1"] = Top1(last = llama_get_logits_ith(h.ctx, -1), nv);
      const double t4 = NowSeconds();
      (*out)["query_s"] = t4 - t3;
      (*out)["ttft_s"] = t4 - t0;
    }
  } else if (a.mode == "llama-cold") {
    MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, toks.data(), a.n, 0, false, false));
    const double t3 = NowSeconds();
    MZ_RETURN_IF_ERROR(LlamaDecode(h.ctx, query, a.q, a.n, true, false));
    (*out)["top1"] = Top1(last = llama_get_logits_ith(h.ctx, -1), nv);
    const double t4 = NowSeconds();
    (*out)["prefill_s"] = t3 - t2;
    (*out)["query_s"] = t4 - t3;
    (*out)["ttft_s"] = t4 - t0;
  } else {
    return Status::InvalidArgument("unknown mode " + a.mode);
  }
  return SaveLogits(a, last, nv);
}

// The mzcache side of a worker: load, create a context, then load the session file and
// restore_generate the query (mz-session) or re-prefill the context and decode the query
// (mz-cold). Internal classes, not the C API: the session check compares the restored token
// history, which the C API does not hand out.
Status RunMzWorker(const PeersWorkerArgs& a, const std::vector<int32_t>& toks, nlohmann::json* out) {
  const int32_t* query = toks.data() + a.n;
  const double t0 = NowSeconds();
  std::unique_ptr<Model> model;
  MZ_RETURN_IF_ERROR(Model::Load(Env::Default(), a.model, ModelOptions(), &model));
  const double t1 = NowSeconds();
  ContextOptions co;
  co.n_ctx = a.n_ctx;
  co.n_threads = a.threads;
  Context ctx(model.get(), co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  const double t2 = NowSeconds();
  (*out)["model_load_s"] = t1 - t0;
  (*out)["context_s"] = t2 - t1;
  const int nv = int(model->hparams().n_vocab);
  const float* last = nullptr;
  if (a.mode == "mz-session") {
    MZ_RETURN_IF_ERROR(LoadSession(ctx, a.file));
    const double t3 = NowSeconds();
    if (int(ctx.history().size()) != a.n || !std::equal(ctx.history().begin(), ctx.history().end(), toks.begin()))
      return Status::Corruption(a.file + " holds other tokens than this context");
    RestoreGenerateStats rs;
    MZ_RETURN_IF_ERROR(ctx.RestoreGenerate(query, a.q, PipelineOptions(), &rs));
    (*out)["top1"] = Top1(last = ctx.logits(ctx.n_logit_rows() - 1), nv);
    const double t4 = NowSeconds();
    (*out)["state_load_s"] = t3 - t2;
    (*out)["query_s"] = t4 - t3;
    (*out)["ttft_s"] = t4 - t0;
  } else {
    for (int off = 0; off < a.n; off += 512) MZ_RETURN_IF_ERROR(ctx.Decode(toks.data() + off, std::min(512, a.n - off), false));
    const double t3 = NowSeconds();
    MZ_RETURN_IF_ERROR(ctx.Decode(query, a.q, false));
    (*out)["top1"] = Top1(last = ctx.logits(ctx.n_logit_rows() - 1), nv);
    const double t4 = NowSeconds();
    (*out)["prefill_s"] = t3 - t2;
    (*out)["query_s"] = t4 - t3;
    (*out)["ttft_s"] = t4 - t0;
  }
  return SaveLogits(a, last, nv);
}

// A worker process: joins its cgroup if given, reads the tokens, runs its mode and prints
// "RESULT <json>" (or "ERROR <status>", exit code 1).
int RunWorker(const PeersWorkerArgs& a) {
  nlohmann::json out;
  out["mode"] = a.mode;
  auto fail = [&](const Status& st) {
    std::printf("ERROR %s\n", st.ToString().c_str());
    std::fflush(stdout);
    return 1;
  };
  if (!a.cgroup.empty()) {
    FILE* f = std::fopen((a.cgroup + "/cgroup.procs").c_str(), "w");
    if (!f) return fail(Status::IOError("cannot join cgroup " + a.cgroup));
    std::fprintf(f, "%d", int(getpid()));
    std::fclose(f);
  }
  std::vector<int32_t> toks;
  Status st = ReadTokens(a.tokens, &toks);
  if (!st.ok()) return fail(st);
  if (int(toks.size()) < a.n + a.q) return fail(Status::InvalidArgument("token file shorter than n + q"));
  if (a.mode.rfind("llama-", 0) == 0) st = RunLlamaWorker(a, toks, &out);
  else if (a.mode == "mz-session" || a.mode == "mz-cold") st = RunMzWorker(a, toks, &out);
  else st = Status::InvalidArgument("unknown mode " + a.mode);
  if (st.code() == Status::kCancelled) return 1;  // the harness went away before GO
  if (!st.ok()) return fail(st);
  std::printf("RESULT %s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Parent side.

int g_child = -1;
std::string g_peers_cgroup;
OsPagingEnv* g_env = nullptr;

void OnPeersSignal(int sig) {
  if (g_child > 0) kill(g_child, SIGKILL);
  if (!g_peers_cgroup.empty()) {
    // Move leftovers out so the folder can be removed (same as ~MemCgroup).
    std::system(("cat '" + g_peers_cgroup + "/cgroup.procs' 2>/dev/null | while read p; do echo $p > "
                 "/sys/fs/cgroup/memory/cgroup.procs; done; rmdir '" + g_peers_cgroup + "' 2>/dev/null").c_str());
  }
  if (g_env) OsPagingTeardown(g_env);
  _exit(128 + sig);
}

// The worker, remembered for OnPeersSignal (which kills it).
Status Spawn(const std::vector<std::string>& argv, PipedChild* c) {
  MZ_RETURN_IF_ERROR(SpawnPiped(argv, c));
  g_child = c->pid;
  return Status::Ok();
}

// Next protocol line of the worker (READY / RESULT / ERROR); other output is skipped.
std::string ReadProtocolLine(PipedChild& c) {
  std::string line;
  char buf[8192];
  while (std::fgets(buf, sizeof buf, c.out)) {
    line += buf;
    if (line.empty() || line.back() != '\n') continue;
    if (line.rfind("READY ", 0) == 0 || line.rfind("RESULT ", 0) == 0 || line.rfind("ERROR ", 0) == 0) return line;
    line.clear();
  }
  return line;
}

int Reap(PipedChild& c, bool kill_it) {
  g_child = -1;
  return ReapPiped(c, kill_it);
}

Status ParseResult(const std::string& line, nlohmann::json* out) {
  if (line.rfind("RESULT ", 0) != 0) {
    std::string msg = line.rfind("ERROR ", 0) == 0 ? line.substr(6) : "worker died without a result";
    while (!msg.empty() && msg.back() == '\n') msg.pop_back();
    return Status::Internal("worker: " + msg);
  }
  try {
    *out = nlohmann::json::parse(line.substr(7));
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("worker result: ") + e.what());
  }
  return Status::Ok();
}

std::vector<std::string> WorkerArgv(const PeersWorkerArgs& w) {
  std::vector<std::string> v{SelfExe(), "bench", "peers-worker", "--mode", w.mode, "--model", w.model,
                             "--tokens", w.tokens, "-n", std::to_string(w.n), "-q", std::to_string(w.q),
                             "-t", std::to_string(w.threads), "--n-ctx", std::to_string(w.n_ctx)};
  if (!w.file.empty()) v.insert(v.end(), {"--file", w.file});
  if (!w.cgroup.empty()) v.insert(v.end(), {"--cgroup", w.cgroup});
  if (!w.logits_out.empty()) v.insert(v.end(), {"--logits-out", w.logits_out});
  if (w.kv_bytes_per_token) v.insert(v.end(), {"--kv-bytes-per-token", std::to_string(w.kv_bytes_per_token)});
  if (w.llama_fa != "auto") v.insert(v.end(), {"--llama-fa", w.llama_fa});
  return v;
}

// Runs a worker to completion (no cgroup); returns its RESULT.
Status RunToEnd(const PeersWorkerArgs& w, nlohmann::json* out, double* wall) {
  PipedChild c;
  const double t0 = NowSeconds();
  MZ_RETURN_IF_ERROR(Spawn(WorkerArgv(w), &c));
  close(c.in);
  c.in = -1;
  const std::string line = ReadProtocolLine(c);
  const int status = Reap(c, false);
  if (wall) *wall = NowSeconds() - t0;
  Status st = ParseResult(line, out);
  if (!st.ok() && line.empty()) return Status::Internal("worker " + w.mode + " exited with status " + std::to_string(status));
  return st;
}

struct MmapRun {
  nlohmann::json result;
  double remaining = 0;
  bool limit_ok = true;  // the kernel reclaimed down to the cgroup limit
  bool reached = true;   // ... and remaining (zram's compressed copies included) is within 5 points of the level
  uint64_t swapped = 0, zram_compressed = 0, footprint = 0, overhead = 0;
};

// llama.cpp (mmap'd weights) in a memory cgroup: READY, limit to the level, lift, query.
Status RunUnderPressure(OsPagingEnv* env, PeersWorkerArgs w, double level, MmapRun* r) {
  MemCgroup cg;
  MZ_RETURN_IF_ERROR(cg.Create("mzcache-peers-" + std::to_string(getpid())));
  g_peers_cgroup = cg.path();
  struct ClearName {
    ~ClearName() { g_peers_cgroup.clear(); }
  } clear_name;
  w.cgroup = cg.path();
  PipedChild c;
  MZ_RETURN_IF_ERROR(Spawn(WorkerArgv(w), &c));
  std::string line = ReadProtocolLine(c);
  if (line.rfind("READY ", 0) != 0) {
    Reap(c, true);
    nlohmann::json dummy;
    Status st = ParseResult(line, &dummy);
    return st.ok() ? Status::Internal("llama-mmap worker did not get ready") : st;
  }
  r->footprint = std::stoull(line.substr(6));
  const uint64_t usage0 = cg.Usage();
  r->overhead = usage0 > r->footprint ? usage0 - r->footprint : 0;
  ZramSwap* zram = static_cast<ZramSwap*>(env->zram);
  const uint64_t z0 = zram ? zram->CompressedBytes() : 0;
  if (level < 1.0) {
    const uint64_t target = r->overhead + uint64_t(std::max(0.0, level) * double(r->footprint));
    r->limit_ok = cg.SetLimit(std::max<uint64_t>(target, uint64_t(64) << 20)).ok();
  }
  uint64_t rss = 0;
  ProcMemory(c.pid, &rss, &r->swapped);
  const uint64_t usage1 = cg.Usage();
  const uint64_t z1 = zram ? zram->CompressedBytes() : 0;
  r->zram_compressed = z1 > z0 ? z1 - z0 : 0;
  r->remaining = (double(usage1 > r->overhead ? usage1 - r->overhead : 0) + double(r->zram_compressed)) /
                 double(r->footprint);
  r->reached = r->limit_ok && r->remaining <= std::max(0.0, level) + 0.05;
  cg.Unlimit();
  if (write(c.in, "GO\n", 3) != 3) {
    Reap(c, true);
    return Status::IOError("worker pipe");
  }
  line = ReadProtocolLine(c);
  Reap(c, false);
  return ParseResult(line, &r->result);
}

struct PeersArgs {
  std::string model = "qwen3-0.6b";
  std::string type = "q8_0";
  std::vector<int> ctxs{8192};
  std::vector<int> levels{100, 50, 0};
  int reps = 3;
  int query = 8;
  int threads = 2;
  std::string out = "results/bench-peers";
  std::string swap_dir = "/var/tmp";
  bool quick = false, no_cold = false, no_pressure = false;
  std::string llama_fa = "auto";
};

double Med(const std::vector<double>& v) { return Summarize(v).median; }
std::string Cell(const std::vector<double>& v) {
  if (v.empty()) return "not measured";
  Stats s = Summarize(v);
  return v.size() == 1 ? Sprintf("%.3f", s.median) : Sprintf("%.3f (%.3f-%.3f)", s.median, s.min, s.max);
}
nlohmann::json JStats(const std::vector<double>& v) {
  Stats s = Summarize(v);
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", v}};
}

// One bench peers run: the model, the pressure baseline's state, and the report being built.
struct PeersRun {
  explicit PeersRun(PeersArgs& args) : a(args) {}
  PeersArgs& a;
  std::string path, stem;
  std::unique_ptr<Model> model;
  OsPagingEnv ose;
  std::string os_reason;  // empty: llama.cpp is measured under memory pressure
  nlohmann::json doc;
  std::string md;
  nlohmann::json jctx = nlohmann::json::array();
};

// One context length: the inputs every engine gets and every run measured.
struct PeersCell {
  int n = 0, n_ctx = 0;
  std::vector<int32_t> toks, query;
  std::string tok_file;    // the tokens, for the workers
  std::string sess, state;  // mzcache's session file, llama.cpp's state file
  uint64_t sess_bytes = 0, state_bytes = 0;
  PeersWorkerArgs w;            // the workers' common arguments
  std::map<std::string, std::vector<nlohmann::json>> res;  // system -> new-process worker results
  std::map<int, std::vector<LevelRun>> mz_lv;              // level -> mzcache restore_generate runs
  std::map<int, std::vector<MmapRun>> ll_lv;               // level -> llama.cpp mmap runs under pressure
  std::vector<double> cached_after_drop;
  std::map<std::string, std::string> logits_files;  // system -> first token's logits of its first run
};

// Whether llama.cpp can be measured under memory pressure here (R->os_reason says why not).
void ProbePressure(PeersRun* R) {
  if (!R->a.no_pressure) {
    Status ps = OsPagingProbe(&R->ose);
    if (!ps.ok()) R->os_reason = ps.ToString();
    std::fprintf(stderr, "memory pressure (llama.cpp mmap): %s\n",
                 ps.ok() ? ("memory cgroup v1 + " + R->ose.swap).c_str() : R->os_reason.c_str());
  } else {
    R->os_reason = "skipped (--no-pressure)";
  }
}

void PeersHeader(PeersRun* R) {
  const PeersArgs& a = R->a;
  const std::string& name = R->model->hparams().name;
  nlohmann::json& doc = R->doc;
  doc["machine"] = MachineDescription();
  doc["model"] = R->path;
  doc["model_name"] = name;
  doc["threads"] = a.threads;
  doc["reps"] = a.reps;
  doc["query_tokens"] = a.query;
  doc["memory_pressure"] = R->os_reason.empty() ? "memory cgroup v1 + " + R->ose.swap : R->os_reason;
  R->md = "# bench peers\n\nmodel `" + R->path + "` (" + name + "); machine: " + MachineDescription() +
          "; threads " + std::to_string(a.threads) + " for every engine; query: the " +
          std::to_string(a.query) + " real-text tokens that follow the context; medians of " +
          std::to_string(a.reps) + " runs (min-max), systems alternated A/B (order flipped every rep).\n\n"
          "Page cache: before every new-process run the model file and the state/session file are "
          "dropped from the page cache (posix_fadvise DONTNEED; the cached fraction checked with mincore "
          "is reported below), so they are read from storage. mzcache reads weights, session files and "
          "its swap file with direct I/O; llama.cpp reads its state file with buffered I/O and maps "
          "the weights (its default load mode). New-process TTFT is measured inside the worker from "
          "before the model load to the first token's logits (process exec and library loading not "
          "included; wall time with them is in the JSON).\n";
}

// llama.cpp's own saved context (built once by a worker; named by the tokens it holds), and both
// engines' saved-context sizes.
Status EnsureLlamaState(PeersRun* R, PeersCell* c) {
  const uint64_t th = XXH64(c->toks.data(), size_t(c->n) * 4, 0);
  c->state = CacheDir() + "/contexts/" + R->stem + "-" + std::to_string(c->n) + "-" +
             Sprintf("%016llx", (unsigned long long)th) +
             (R->a.llama_fa == "auto" ? std::string() : "-fa-" + R->a.llama_fa) + ".llama-state";
  FileInfo fi;
  if (!Env::Default()->StatPath(c->state, &fi).ok()) {
    std::fprintf(stderr, "  llama.cpp: building its context by prefill (once; saved to %s)\n", c->state.c_str());
    PeersWorkerArgs b = c->w;
    b.mode = "llama-build";
    b.file = c->state;
    nlohmann::json r;
    MZ_RETURN_IF_ERROR(RunToEnd(b, &r, nullptr));
    std::fprintf(stderr, "  llama.cpp prefill %.1f s, state saved in %.1f s\n", r.value("prefill_s", 0.0),
                 r.value("save_s", 0.0));
  }
  Env::Default()->StatPath(c->state, &fi);
  c->state_bytes = fi.size;
  Env::Default()->StatPath(c->sess, &fi);
  c->sess_bytes = fi.size;
  return Status::Ok();
}

void DropFromPageCache(PeersCell* c, std::initializer_list<std::string> files) {
  for (const auto& f : files) c->cached_after_drop.push_back(DropFileCache(f));
}

// One new-process run of system `sys` (worker mode `mode`, saved file `file` or none), its files
// dropped from the page cache first; its first run also writes the first token's logits.
Status NewProcessRun(PeersRun* R, PeersCell* c, const std::string& sys, const std::string& mode, const std::string& file) {
  PeersWorkerArgs x = c->w;
  x.mode = mode;
  x.file = file;
  if (!c->logits_files.count(sys)) x.logits_out = c->logits_files[sys] = c->tok_file + "." + mode + ".logits";
  if (file.empty()) DropFromPageCache(c, {R->path});
  else DropFromPageCache(c, {R->path, file});
  nlohmann::json r;
  double wall = 0;
  MZ_RETURN_IF_ERROR(RunToEnd(x, &r, &wall));
  r["wall_s"] = wall;
  std::fprintf(stderr, "  %-26s TTFT %.3f s (model %.3f, context %.3f, state %.3f, prefill %.3f, query %.3f)\n",
               sys.c_str(), r.value("ttft_s", 0.0), r.value("model_load_s", 0.0), r.value("context_s", 0.0),
               r.value("state_load_s", 0.0), r.value("prefill_s", 0.0), r.value("query_s", 0.0));
  c->res[sys].push_back(r);
  return Status::Ok();
}

// mzcache: restore_generate of the query from `lv` percent remaining, in this process.
Status MzLevelRun(PeersCell* c, Context& ctx, int lv) {
  LevelRun r;
  MZ_RETURN_IF_ERROR(MeasureLevel(ctx, lv / 100.0, c->query, c->n, &r));
  std::fprintf(stderr, "  mzcache from %3d%%            TTFT %.3f s (remaining %.1f%%, %.0f MiB from storage, %.0f MiB decoded)\n",
               lv, r.ttft, 100 * r.remaining, r.bytes_from_storage / 1048576.0, r.bytes_decoded / 1048576.0);
  c->mz_lv[lv].push_back(r);
  return Status::Ok();
}

// llama.cpp with mmap'd weights squeezed to `lv` percent by a memory cgroup; a failure stops the
// pressure runs for the rest of the bench (R->os_reason), not the bench.
Status LlamaLevelRun(PeersRun* R, PeersCell* c, int lv) {
  if (!R->os_reason.empty()) return Status::Ok();
  PeersWorkerArgs x = c->w;
  x.mode = "llama-mmap";
  x.file = c->state;
  DropFromPageCache(c, {R->path, c->state});
  MmapRun r;
  Status s = RunUnderPressure(&R->ose, x, lv / 100.0, &r);
  if (!s.ok()) {
    R->os_reason = s.ToString();
    std::fprintf(stderr, "  llama.cpp mmap under pressure failed: %s (skipping it from now on)\n", R->os_reason.c_str());
    return Status::Ok();
  }
  std::fprintf(stderr, "  llama.cpp mmap at %3d%%       TTFT %.3f s (remaining %.1f%%%s, swapped %.0f MiB, zram holds %.0f MiB)\n",
               lv, r.result.value("ttft_s", 0.0), 100 * r.remaining, r.reached ? "" : r.limit_ok ? ", level NOT reached (zram holds the KV)" : ", limit NOT reclaimable",
               r.swapped / 1048576.0, r.zram_compressed / 1048576.0);
  c->ll_lv[lv].push_back(r);
  return Status::Ok();
}

// Runs first then second, or second then first when flip (A/B alternation).
Status InOrder(bool flip, const std::function<Status()>& first, const std::function<Status()>& second) {
  if (!flip) {
    MZ_RETURN_IF_ERROR(first());
    return second();
  }
  MZ_RETURN_IF_ERROR(second());
  return first();
}

// Every scenario a.reps times, the two engines alternated (order flipped every rep).
Status MeasurePeers(PeersRun* R, Context& ctx, PeersCell* c) {
  const PeersArgs& a = R->a;
  for (int rep = 0; rep < a.reps; ++rep) {
    std::fprintf(stderr, " rep %d/%d\n", rep + 1, a.reps);
    const bool flip = rep % 2 == 1;
    MZ_RETURN_IF_ERROR(InOrder(flip, [&] { return NewProcessRun(R, c, "llama.cpp state load", "llama-state", c->state); },
                               [&] { return NewProcessRun(R, c, "mzcache session load", "mz-session", c->sess); }));
    if (!a.no_cold)
      MZ_RETURN_IF_ERROR(InOrder(flip, [&] { return NewProcessRun(R, c, "llama.cpp cold re-prefill", "llama-cold", ""); },
                                 [&] { return NewProcessRun(R, c, "mzcache cold re-prefill", "mz-cold", ""); }));
    for (int lv : a.levels)
      MZ_RETURN_IF_ERROR(InOrder(flip, [&] { return LlamaLevelRun(R, c, lv); }, [&] { return MzLevelRun(c, ctx, lv); }));
  }
  return Status::Ok();
}

std::vector<double> Ttfts(PeersCell& c, const std::string& sys) {
  std::vector<double> v;
  for (auto& r : c.res[sys]) v.push_back(r.value("ttft_s", 0.0));
  return v;
}
double Part(PeersCell& c, const std::string& sys, const char* key) {
  std::vector<double> v;
  for (auto& r : c.res[sys]) v.push_back(r.value(key, 0.0));
  return Med(v);
}
std::vector<double> MzTtfts(PeersCell& c, int lv) {
  std::vector<double> v;
  for (auto& r : c.mz_lv[lv]) v.push_back(r.ttft);
  return v;
}
std::vector<double> LlamaTtfts(PeersCell& c, int lv) {
  std::vector<double> v;
  for (auto& r : c.ll_lv[lv]) v.push_back(r.result.value("ttft_s", 0.0));
  return v;
}

// A scenario's row: markdown and JSON.
void AddScenario(PeersRun* R, nlohmann::json* rows, const std::string& scen, const std::string& peer_what,
                 const std::vector<double>& peer, const std::string& mz_what, const std::vector<double>& mz) {
  const double ratio = peer.empty() || mz.empty() ? 0 : Med(mz) / Med(peer);
  R->md += "| " + scen + " | " + peer_what + " | " + Cell(peer) + " | " + mz_what + " | " + Cell(mz) + " | " +
           (ratio > 0 ? Sprintf("%.2f", ratio) : std::string("-")) + " |\n";
  rows->push_back({{"scenario", scen}, {"peer", peer_what}, {"mzcache", mz_what}, {"peer_ttft", JStats(peer)},
                   {"mzcache_ttft", JStats(mz)}, {"ratio_mzcache_over_peer", ratio}});
}

// What llama.cpp did at level lv (under pressure, or not measured and why).
std::string PeerUnderPressure(const PeersRun& R, PeersCell& c, int lv) {
  std::string peer_what = "llama.cpp, mmap'd weights, all resident (no pressure)";
  std::vector<double> rem, zc;
  bool reached = true, limit_ok = true;
  for (auto& r : c.ll_lv[lv])
    rem.push_back(r.remaining), zc.push_back(r.zram_compressed / 1048576.0), reached = reached && r.reached,
        limit_ok = limit_ok && r.limit_ok;
  if (c.ll_lv[lv].empty()) {
    peer_what = "llama.cpp mmap: not measured (" + R.os_reason + ")";
  } else if (lv < 100) {
    if (reached)
      peer_what = Sprintf("llama.cpp mmap, cgroup limit to %d%% then lifted (reached %.0f%%)", lv, 100 * Med(rem));
    else if (!limit_ok)
      peer_what = Sprintf("llama.cpp mmap, cgroup limit to %d%%: the kernel could NOT reclaim down to it; "
                          "stopped at %.0f%% remaining", lv, 100 * Med(rem));
    else
      peer_what = Sprintf("llama.cpp mmap, cgroup limit to %d%%: level NOT reached, zram still holds %.0f MiB of "
                          "poorly compressed KV in RAM (%.0f%% remaining)", lv, Med(zc), 100 * Med(rem));
  }
  return peer_what;
}

// The scenario table (restart, cold start, each level of memory pressure); *dat gets the levels'
// plot rows.
void ReportScenarios(PeersRun* R, PeersCell& c, nlohmann::json* rows, std::string* dat) {
  const PeersArgs& a = R->a;
  double max_cached = 0;
  for (double x : c.cached_after_drop) max_cached = std::max(max_cached, x);
  R->md += "\n## " + R->stem + ", context " + std::to_string(c.n) + " tokens\n\n";
  R->md += Sprintf("llama.cpp state file %.0f MiB (`%s`), mzcache session file %.0f MiB (raw fp16 KV); after each "
                   "page-cache drop at most %.1f%% of a dropped file was still cached (mincore).\n\n",
                   c.state_bytes / 1048576.0, c.state.c_str(), c.sess_bytes / 1048576.0, 100 * max_cached);
  R->md += "| scenario | peer: what it does | peer TTFT s | mzcache: what it does | mzcache TTFT s | mzcache / peer |\n"
           "|---|---|---|---|---|---|\n";
  AddScenario(R, rows, "process restarted, context saved", "llama.cpp: new process, load model, llama_state_seq_load_file, decode query",
              Ttfts(c, "llama.cpp state load"), "new process, load model, load session file, restore_generate query",
              Ttfts(c, "mzcache session load"));
  if (!a.no_cold) {
    AddScenario(R, rows, "process restarted, nothing saved (cold start)", "llama.cpp: new process, load model, re-prefill context + query",
                Ttfts(c, "llama.cpp cold re-prefill"), "new process, load model, re-prefill context + query (same work)",
                Ttfts(c, "mzcache cold re-prefill"));
    AddScenario(R, rows, "process restarted: each engine's best", "llama.cpp cold re-prefill", Ttfts(c, "llama.cpp cold re-prefill"),
                "new process, load model + session file", Ttfts(c, "mzcache session load"));
  }
  for (int lv : a.levels) {
    std::vector<double> mrem;
    for (auto& r : c.mz_lv[lv]) mrem.push_back(r.remaining);
    const std::string mz_what =
        lv >= 100 ? "all in memory" : Sprintf("restore_generate from %d%% remaining (reached %.1f%%)", lv, 100 * Med(mrem));
    AddScenario(R, rows, lv >= 100 ? "memory pressure: none" : Sprintf("memory pressure, %d%% remaining", lv),
                PeerUnderPressure(*R, c, lv), LlamaTtfts(c, lv), mz_what, MzTtfts(c, lv));
    const auto lv_l = LlamaTtfts(c, lv), lv_m = MzTtfts(c, lv);
    *dat += Sprintf("\"%d%%\\nremaining\" %.4f %s\n", lv, Med(lv_m), lv_l.empty() ? "NaN" : Sprintf("%.4f", Med(lv_l)).c_str());
  }
  if (std::find(a.levels.begin(), a.levels.end(), 0) != a.levels.end())
    AddScenario(R, rows, "killed (llama.cpp) vs fully evicted (mzcache)", "llama.cpp state file load in a new process",
                Ttfts(c, "llama.cpp state load"), "restore_generate from 0% (weights and KV off RAM, process alive)", MzTtfts(c, 0));
}

// The parts of the new-process runs (medians) and llama.cpp's load mode.
void ReportParts(PeersRun* R, PeersCell& c) {
  std::string& md = R->md;
  md += "\nParts of the new-process runs (medians, s):\n\n| system | model load | context create | state/session load | "
        "prefill | query | TTFT | first token (top-1) |\n|---|---|---|---|---|---|---|---|\n";
  std::vector<std::string> syss{"llama.cpp state load", "mzcache session load"};
  if (!R->a.no_cold) syss.insert(syss.end(), {"llama.cpp cold re-prefill", "mzcache cold re-prefill"});
  for (const auto& s : syss) {
    md += Sprintf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %d |\n", s.c_str(), Part(c, s, "model_load_s"),
                  Part(c, s, "context_s"), Part(c, s, "state_load_s"), Part(c, s, "prefill_s"), Part(c, s, "query_s"),
                  Med(Ttfts(c, s)), c.res[s].empty() ? -1 : c.res[s].front().value("top1", -1));
  }
  if (!c.res["llama.cpp state load"].empty())
    md += "\nllama.cpp load mode: " + c.res["llama.cpp state load"].front().value("llama_load_mode", std::string("?")) +
          ", flash attention: " + c.res["llama.cpp state load"].front().value("flash_attn", std::string("?")) +
          " (library defaults).\n";
}

// Probability of the top-1 token (its id in *top) and of the runner-up.
std::pair<double, double> TopTwo(const std::vector<float>& l, int* top) {
  std::vector<float> lp(l.size());
  LogSoftmax(l.data(), int(l.size()), lp.data());
  double p1 = 0, p2 = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double p = std::exp(double(lp[i]));
    if (p > p1) p2 = p1, p1 = p, *top = int(i);
    else if (p > p2) p2 = p;
  }
  return std::make_pair(p1, p2);
}

// Do the engines agree on the first token's distribution? (A check that both restored the same
// context; the synthesized model's distributions are flat, so top-1 can differ at near-ties.) The
// logits files are removed.
nlohmann::json ReportAgreement(PeersRun* R, PeersCell& c) {
  const int nv = int(R->model->hparams().n_vocab);
  nlohmann::json agreement;
  std::map<std::string, std::vector<float>> lg;
  for (auto& [sys, f] : c.logits_files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<float> v(static_cast<size_t>(nv));
    if (in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4))) lg[sys] = std::move(v);
    std::remove(f.c_str());
  }
  std::string line;
  for (auto& [sys, l] : lg) {
    int top = -1;
    auto [p1, p2] = TopTwo(l, &top);
    line += Sprintf("%s%s: top-1 %d (p %.3f, next %.3f)", line.empty() ? "" : "; ", sys.c_str(), top, p1, p2);
    agreement[sys] = {{"top1", top}, {"p_top1", p1}, {"p_top2", p2}};
  }
  auto pairkl = [&](const std::string& x, const std::string& y) {
    if (!lg.count(x) || !lg.count(y)) return;
    const double kl = KlFromLogits(lg[x].data(), lg[y].data(), nv);
    line += Sprintf("; KL(%s || %s) = %.2e", x.c_str(), y.c_str(), kl);
    agreement["kl"][x + " || " + y] = kl;
  };
  pairkl("llama.cpp state load", "llama.cpp cold re-prefill");
  pairkl("mzcache session load", "mzcache cold re-prefill");
  pairkl("llama.cpp state load", "mzcache session load");
  pairkl("llama.cpp cold re-prefill", "mzcache cold re-prefill");
  if (!line.empty())
    R->md += "\nFirst token's distribution (first run of each; KL in nats; the synthesized model's distributions are flat, "
             "so top-1 may differ between engines at a near-tie while KL stays small): " + line + ".\n";
  return agreement;
}

// llama.cpp under memory pressure: what each level reached.
void ReportPressure(PeersRun* R, PeersCell& c) {
  bool any_mmap = false;
  for (auto& [lv, v] : c.ll_lv) any_mmap = any_mmap || !v.empty();
  if (!any_mmap) return;
  R->md += "\nllama.cpp under memory pressure (medians): footprint = weights + KV cells allocated; remaining = (cgroup "
           "usage - the process's other memory + zram's compressed bytes) / footprint.\n\n"
           "| level | reached remaining | cgroup limit reclaimed | level reached | swapped MiB | zram holds MiB | TTFT s |\n"
           "|---|---|---|---|---|---|---|\n";
  for (int lv : R->a.levels) {
    if (c.ll_lv[lv].empty()) continue;
    std::vector<double> rem, sw, zc;
    bool reached = true, limit_ok = true;
    for (auto& r : c.ll_lv[lv])
      rem.push_back(r.remaining), sw.push_back(r.swapped / 1048576.0), zc.push_back(r.zram_compressed / 1048576.0),
          reached = reached && r.reached, limit_ok = limit_ok && r.limit_ok;
    R->md += Sprintf("| %d%% | %.1f%% | %s | %s | %.0f | %.0f | %s |\n", lv, 100 * Med(rem),
                     lv >= 100 ? "-" : limit_ok ? "yes" : "NO", lv >= 100 ? "-" : reached ? "yes" : "NO", Med(sw),
                     Med(zc), Cell(LlamaTtfts(c, lv)).c_str());
  }
}

// peers-<stem>-<n>.{dat,png}: TTFT per scenario, both engines (levels_dat: the levels' rows).
void PlotPeers(PeersRun* R, PeersCell& c, const std::string& levels_dat) {
  const PeersArgs& a = R->a;
  const std::string tag = R->stem + "-" + std::to_string(c.n);
  const std::string dat =
      Sprintf("\"restart\\n(saved)\" %.4f %.4f\n", Med(Ttfts(c, "mzcache session load")), Med(Ttfts(c, "llama.cpp state load"))) +
      (a.no_cold ? std::string()
                 : Sprintf("\"cold\\nre-prefill\" %.4f %.4f\n", Med(Ttfts(c, "mzcache cold re-prefill")),
                           Med(Ttfts(c, "llama.cpp cold re-prefill")))) +
      levels_dat;
  WriteFile(a.out, "peers-" + tag + ".dat", dat);
  const std::string png = PlotPng(
      a.out, "peers-" + tag,
      "set terminal pngcairo noenhanced size 900,500\nset output 'peers-" + tag + ".png'\nset title 'TTFT, " + R->stem + ", " +
          std::to_string(c.n) + "-token context, " + std::to_string(a.query) +
          "-token query'\nset style data histogram\nset style histogram clustered gap 1\nset style fill solid 0.8 border -1\n"
          "set ylabel 'TTFT (s)'\nset xlabel 'scenario (restart, or remaining in memory under pressure)' offset 0,-1\nset bmargin 5\n"
          "set logscale y\nset yrange [0.01:*]\nset key top right\nplot 'peers-" + tag +
          ".dat' u 2:xtic(1) t 'mzcache', '' u 3 t 'peer (llama.cpp)'\n");
  if (!png.empty()) R->md += "\n![TTFT vs peers " + tag + "](" + png + ")\n";
}

nlohmann::json CellJson(PeersCell& c, const nlohmann::json& rows, const nlohmann::json& agreement) {
  double max_cached = 0;
  for (double x : c.cached_after_drop) max_cached = std::max(max_cached, x);
  nlohmann::json mz_levels, ll_levels;
  for (auto& [lv, v] : c.mz_lv)
    for (auto& r : v)
      mz_levels[std::to_string(lv)].push_back({{"ttft", r.ttft}, {"remaining", r.remaining},
                                               {"bytes_from_storage", r.bytes_from_storage},
                                               {"bytes_decoded", r.bytes_decoded}, {"top1", r.top1}});
  for (auto& [lv, v] : c.ll_lv)
    for (auto& r : v)
      ll_levels[std::to_string(lv)].push_back({{"result", r.result}, {"remaining", r.remaining},
                                               {"reached", r.reached}, {"limit_ok", r.limit_ok}, {"swapped", r.swapped},
                                               {"zram_compressed", r.zram_compressed},
                                               {"footprint", r.footprint}, {"overhead", r.overhead}});
  return {{"ctx", c.n},
          {"state_file", c.state},
          {"state_bytes", c.state_bytes},
          {"session_bytes", c.sess_bytes},
          {"max_cached_fraction_after_drop", max_cached},
          {"rows", rows},
          {"first_token_agreement", agreement},
          {"new_process_runs", c.res},
          {"mzcache_levels", mz_levels},
          {"llama_mmap_levels", ll_levels}};
}

// One context length: inputs, both engines' saved contexts, every scenario, the report sections.
Status RunPeersCell(PeersRun* R, int n) {
  const PeersArgs& a = R->a;
  std::fprintf(stderr, "== %s, context %d, query %d ==\n", R->stem.c_str(), n, a.query);
  PeersCell c;
  c.n = n;
  MZ_RETURN_IF_ERROR(RealTokens(R->path, n + a.query, &c.toks));
  c.query.assign(c.toks.begin() + n, c.toks.end());
  c.tok_file = a.swap_dir + "/mzcache-peers-" + std::to_string(getpid()) + ".tokens";
  if (!WriteFile(a.swap_dir, c.tok_file.substr(c.tok_file.find_last_of('/') + 1),
                 std::string(reinterpret_cast<const char*>(c.toks.data()), c.toks.size() * 4)))
    return Status::IOError("cannot write " + c.tok_file);
  struct RmTok {
    std::string p;
    ~RmTok() { std::remove(p.c_str()); }
  } rm_tok{c.tok_file};
  c.n_ctx = n + a.query + 64;
  ContextOptions co;
  co.n_ctx = c.n_ctx;
  co.n_threads = a.threads;
  co.swap_path = a.swap_dir + "/mzcache-peers-" + std::to_string(getpid()) + ".swap";
  Context ctx(R->model.get(), co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  MZ_RETURN_IF_ERROR(EnsureSessionContext(ctx, R->path, c.toks, n, &c.sess));
  PeersWorkerArgs& w = c.w;
  w.model = R->path;
  w.tokens = c.tok_file;
  w.n = n;
  w.q = a.query;
  w.threads = a.threads;
  w.llama_fa = a.llama_fa;
  w.n_ctx = c.n_ctx;
  w.kv_bytes_per_token = R->model->hparams().kv_bytes_per_token();
  MZ_RETURN_IF_ERROR(EnsureLlamaState(R, &c));
  MZ_RETURN_IF_ERROR(MeasurePeers(R, ctx, &c));
  nlohmann::json rows = nlohmann::json::array();
  std::string levels_dat;
  ReportScenarios(R, c, &rows, &levels_dat);
  ReportParts(R, c);
  const nlohmann::json agreement = ReportAgreement(R, c);
  ReportPressure(R, c);
  PlotPeers(R, c, levels_dat);
  R->jctx.push_back(CellJson(c, rows, agreement));
  return Status::Ok();
}

// bench peers: every context length, then the report.
Status RunPeers(PeersArgs& a) {
  PeersRun R(a);
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &R.path, &R.model));
  R.stem = ModelStem(R.path);
  ProbePressure(&R);
  struct Teardown {
    OsPagingEnv* e;
    ~Teardown() { OsPagingTeardown(e); }
  } teardown{&R.ose};
  g_env = &R.ose;
  signal(SIGINT, OnPeersSignal);
  signal(SIGTERM, OnPeersSignal);
  PeersHeader(&R);
  for (int n : a.ctxs) MZ_RETURN_IF_ERROR(RunPeersCell(&R, n));
  R.md += "\nmzcache / peer < 1: mzcache is faster. Memory pressure on llama.cpp: " +
          (R.os_reason.empty() ? R.doc["memory_pressure"].get<std::string>() : "not measured: " + R.os_reason) + ".\n";
  R.doc["contexts"] = R.jctx;
  WriteReport(a.out, "bench-peers", R.md, R.doc);
  std::fputs(R.md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/bench-peers.{md,json} and plots\n", a.out.c_str());
  return Status::Ok();
}

}  // namespace

void AddPeersBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<PeersArgs>();
  auto* c = bench->add_subcommand(
      "peers", "TTFT vs what people use today, same GGUF/threads/context/query: llama.cpp state save/load in a new "
               "process, cold re-prefill, llama.cpp mmap under memory-cgroup pressure, mzcache restore_generate and "
               "session restart");
  c->add_option("-m,--model", a->model, "model shape (make-model --list) or GGUF path");
  c->add_option("--type", a->type, "weight type for a synthesized shape");
  c->add_option("--ctx", a->ctxs, "context lengths in tokens (default 8192; --quick: 2048)");
  c->add_option("--levels", a->levels, "remaining-memory levels in percent (100 = no pressure)");
  c->add_option("-r,--reps", a->reps, "repetitions (default 3; --quick: 1)");
  c->add_option("-q,--query", a->query, "query tokens");
  c->add_option("-t,--threads", a->threads, "compute threads of every engine");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_option("--swap-dir", a->swap_dir, "folder for swap and scratch files (storage under test)");
  c->add_flag("--quick", a->quick, "2048-token context, 1 rep (unless --ctx / -r are given)");
  c->add_flag("--no-cold", a->no_cold, "skip the cold re-prefill runs (long at 8k+)");
  c->add_option("--llama-fa", a->llama_fa, "llama.cpp flash attention: auto (its default), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  c->add_flag("--no-pressure", a->no_pressure, "skip llama.cpp under memory-cgroup pressure (needs root, cgroup v1, swap)");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    if (a->quick) {
      if (c->count("--ctx") == 0) a->ctxs = {2048};
      if (c->count("--reps") == 0) a->reps = 1;
    }
    Status st = RunPeers(*a);
    return st.ok() ? 0 : Fail(st);
  });

  auto w = std::make_shared<PeersWorkerArgs>();
  auto* wc = bench->add_subcommand("peers-worker", "internal: one new-process measurement of bench peers");
  wc->group("");  // hidden
  wc->add_option("--mode", w->mode)->required();
  wc->add_option("--model", w->model)->required();
  wc->add_option("--tokens", w->tokens)->required();
  wc->add_option("--file", w->file);
  wc->add_option("--cgroup", w->cgroup);
  wc->add_option("--logits-out", w->logits_out);
  wc->add_option("--llama-fa", w->llama_fa);
  wc->add_option("-n", w->n)->required();
  wc->add_option("-q", w->q);
  wc->add_option("-t", w->threads);
  wc->add_option("--n-ctx", w->n_ctx)->required();
  wc->add_option("--kv-bytes-per-token", w->kv_bytes_per_token);
  runners.push_back([wc, w]() -> int {
    if (!wc->parsed()) return -1;
    return RunWorker(*w);
  });
}

}  // namespace mz::cli
