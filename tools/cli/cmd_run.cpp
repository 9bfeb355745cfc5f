// run, chat
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "env/cpu_topology.h"
#include "model/model.h"
#include "pressure/monitor.h"
#include "pressure/wiring.h"
#include "runtime/context.h"
#include "runtime/memory_plan.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "tools/cli/sustained_cli.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/cli/residency_text.h"

namespace mz::cli {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct GenArgs {
  std::string model;
  std::string prompt = "Once upon a time";
  int n_predict = 32;
  int threads = 2;
  int n_ctx = 8192;
  int chunk = 256;
  float temp = 0.0f;
  int top_k = 40;
  float top_p = 0.95f;
  uint32_t seed = 42;
  bool raw = false;
  std::string session;
  std::string session_codec = "q8";
  std::string kv_codec = "q8";
  std::string kv_type = "f16";  // resident KV format: f16 or q8_0
  std::string swap_path;
  std::string cpus;  // kernel CPU list to pin compute threads to ("" = default)
  std::string ctx_text = "8192";  // --ctx: tokens, or "auto" (n_ctx resolved once the model is loaded)
  bool no_memory_check = false;
  std::string residency_json;  // run: the residency report written there after generating
  SustainedArgs sus;  // --sustained and its caps (tools/cli/sustained_cli.h)
};

// --ctx: a token count into a.n_ctx, or "auto" (a.n_ctx = 0: the largest that fits, chosen in Open).
Status ParseCtx(GenArgs& a) {
  if (a.ctx_text == "auto") {
    a.n_ctx = 0;
    return Status::Ok();
  }
  try {
    size_t pos = 0;
    const long v = std::stol(a.ctx_text, &pos);
    if (pos == a.ctx_text.size() && v >= 16 && v <= (1 << 24)) {
      a.n_ctx = int(v);
      return Status::Ok();
    }
  } catch (...) {
  }
  return Status::InvalidArgument("--ctx must be a token count in [16, 16777216] or auto, not '" + a.ctx_text + "'");
}

void AddGenOptions(CLI::App* c, GenArgs& a) {
  c->add_option("-m,--model", a.model, "GGUF path (default: the synthesized Qwen3-0.6B q8_0, made if missing)");
  c->add_option("-t,--threads", a.threads,
                "compute threads (on a big.LITTLE CPU at most the fastest cluster's cores, pinned to them, "
                "unless --cpus is given)")
      ->check(CLI::Range(1, 256));
  c->add_option("--cpus", a.cpus, "pin the compute threads to these CPUs (kernel list, e.g. 4-7 or 0,2)");
  c->add_option("-c,--ctx", a.ctx_text,
                "maximum context tokens, or auto: the largest that fits in memory with a 10% margin (see `mzcache plan`)");
  c->add_flag("--no-memory-check", a.no_memory_check,
              "create the context even if its estimated peak memory exceeds the cgroup limit / MemAvailable");
  c->add_option("--chunk-tokens", a.chunk, "tokens per KV chunk")->check(CLI::Range(1, 65536));
  c->add_option("--temp", a.temp, "temperature (0 = greedy)");
  c->add_option("--top-k", a.top_k, "top-k");
  c->add_option("--top-p", a.top_p, "top-p");
  c->add_option("--seed", a.seed, "sampling seed");
  c->add_option("--session", a.session, "session file: loaded if it exists (no recompute), saved after generating");
  c->add_option("--session-codec", a.session_codec, "KV codec in the session file (none = lossless)");
  c->add_option("--kv-codec", a.kv_codec, "codec for compressed KV when evicting (q8, q4, cachegen, none, lz4, zstd)");
  c->add_option("--swap", a.swap_path, "storage swap file path (default in $TMPDIR or /var/tmp)");
  AddSustainedOptions(c, a.sus);
  c->add_option("--kv-type", a.kv_type, "resident KV format: f16, or q8_0 (q8 rows written live, about half the KV memory)")
      ->check(CLI::IsMember({"f16", "q8_0"}));
}

// "2 threads" or "2 threads on CPUs 6,7": what the context computes on now.
std::string ThreadsText(const Context& c) {
  std::string t = std::to_string(c.n_threads()) + (c.n_threads() == 1 ? " thread" : " threads");
  if (!c.compute_cpus().empty()) {
    t += " on CPU" + std::string(c.compute_cpus().size() > 1 ? "s " : " ");
    for (size_t i = 0; i < c.compute_cpus().size(); ++i) t += (i ? "," : "") + std::to_string(c.compute_cpus()[i]);
  }
  return t;
}

std::string Mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / 1048576.0);
  return buf;
}

void PrintReport(const MemoryReport& r) {
  std::fprintf(stderr,
               "  remaining in memory: %.1f%% (%s of %s)\n"
               "  weights: %s resident, %s dropped (%d/%d units resident)\n"
               "  KV: %s resident | %s raw compressed to %s in RAM (stack %s) | %s raw on storage | %s raw compressed "
               "to %s on storage | %d chunks lost\n",
               100.0 * r.remaining(), Mib(r.in_memory()).c_str(), Mib(r.footprint()).c_str(),
               Mib(r.weights_resident).c_str(), Mib(r.weights_dropped).c_str(), r.n_weight_units[0],
               r.n_weight_units[0] + r.n_weight_units[4], Mib(r.kv_resident).c_str(),
               Mib(r.kv_mem_compressed_raw).c_str(), Mib(r.kv_mem_compressed).c_str(), Mib(r.stack_mapped).c_str(),
               Mib(r.kv_storage_raw).c_str(), Mib(r.kv_storage_compressed_raw).c_str(),
               Mib(r.kv_storage_compressed).c_str(), r.n_kv_lost);
}

// "40%" of the footprint or "300MiB"/"1GiB"/bytes.
bool ParseAmount(const std::string& s, uint64_t footprint, uint64_t* out) {
  try {
    size_t pos = 0;
    double v = std::stod(s, &pos);
    std::string unit = s.substr(pos);
    if (unit == "%") *out = uint64_t(v / 100.0 * double(footprint));
    else if (unit == "MiB" || unit == "M") *out = uint64_t(v * 1048576.0);
    else if (unit == "GiB" || unit == "G") *out = uint64_t(v * 1073741824.0);
    else if (unit.empty()) *out = uint64_t(v);
    else return false;
    return v >= 0;
  } catch (...) {
    return false;
  }
}

// --ctx auto: the largest context (whole chunks, at most the model's training context) whose
// estimated peak stays within 90% of what the process may use (runtime/memory_plan.h).
Status AutoContext(const Model& m, GenArgs& a) {
  PlanShape shape = ShapeOfModel(m);
  PlanRequest req;
  req.chunk_tokens = a.chunk;
  if (!ParseKvType(a.kv_type, &req.kv_type)) return Status::InvalidArgument("--kv-type must be f16 or q8_0");
  uint64_t weights = 0;
  for (int u = 0; u < m.n_units(); ++u)
    if (m.unit(u).resident()) weights += m.unit(u).region_bytes;
  SelfMemory self;
  if (ReadSelfMemory(Env::Default(), &self)) req.overhead = self.rss > weights ? self.rss - weights : 0;
  const MemoryLimits lim = ReadMemoryLimits(Env::Default(), 0);
  const int cap = int(std::min<uint32_t>(m.hparams().n_ctx_train, 1u << 24));
  a.n_ctx = LargestContext(shape, req, lim.effective(), 0.1, cap);
  if (a.n_ctx < 16)
    return Status::NoMemory("--ctx auto: not even one KV chunk fits in the " + std::string(lim.binding()) + " (" +
                            Mib(lim.effective()) + ")");
  req.n_ctx = a.n_ctx;
  std::fprintf(stderr, "--ctx auto: %d tokens (peak %s of the %s, %s)\n", a.n_ctx,
               Mib(EstimatePeak(shape, req).peak()).c_str(), lim.effective() ? lim.binding() : "no known limit",
               Mib(lim.effective()).c_str());
  return Status::Ok();
}

struct Session {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Context> ctx;
  std::unique_ptr<SustainedMode> sustained;  // --sustained (after ctx: destroyed first)
  double load_s = 0;
};

Status Open(GenArgs& a, Session* s) {
  if (a.model.empty()) MZ_RETURN_IF_ERROR(EnsureDefaultModel(&a.model));
  double t0 = Now();
  MZ_RETURN_IF_ERROR(Model::Load(Env::Default(), a.model, ModelOptions(), &s->model));
  MZ_RETURN_IF_ERROR(Tokenizer::Load(a.model, &s->tok));
  MZ_RETURN_IF_ERROR(ParseCtx(a));
  if (a.n_ctx == 0) MZ_RETURN_IF_ERROR(AutoContext(*s->model, a));
  ContextOptions co;
  co.n_ctx = a.n_ctx;
  co.memory_check = !a.no_memory_check;
  co.kv_chunk_tokens = a.chunk;
  co.n_threads = a.threads;
  co.kv_codec = a.kv_codec;
  if (!ParseKvType(a.kv_type, &co.kv_type)) return Status::InvalidArgument("--kv-type must be f16 or q8_0");
  co.swap_path = a.swap_path;
  s->ctx = std::make_unique<Context>(s->model.get(), co);
  MZ_RETURN_IF_ERROR(s->ctx->Init());
  if (!a.cpus.empty()) {
    std::vector<int> cpus;
    MZ_RETURN_IF_ERROR(ParseCpuList(a.cpus, &cpus).With("--cpus"));
    MZ_RETURN_IF_ERROR(s->ctx->SetThreads(a.threads, cpus).With("--cpus"));
  }
  MZ_RETURN_IF_ERROR(StartSustained(a.sus, s->ctx.get(), &s->sustained));
  s->load_s = Now() - t0;
  if (!a.session.empty()) {
    FileInfo fi;
    if (Env::Default()->StatPath(a.session, &fi).ok()) {
      double t1 = Now();
      SessionInfo si;
      MZ_RETURN_IF_ERROR(LoadSession(*s->ctx, a.session, &si));
      std::fprintf(stderr, "[session %s: %d tokens restored in %.3f s (%s), no recompute]\n", a.session.c_str(),
                   si.n_tokens, Now() - t1, si.codec.c_str());
    }
  }
  return Status::Ok();
}

// Prefills `toks`, then samples up to n tokens, streaming text to stdout. Reports TTFT and speeds.
Status Generate(Session& s, Sampler& sampler, const std::vector<int32_t>& toks, int n, bool verbose,
                std::string* reply, bool pressure_watched = false) {
  const int32_t nv = int32_t(s.model->hparams().n_vocab);
  double t0 = Now();
  // With a pressure monitor evicting from its own thread, the state may change under an unlocked
  // AllResident(): always prefill through restore_generate (a no-op restore when all is resident).
  const uint64_t p0 = Env::Default()->NowNs();
  if (!pressure_watched && s.ctx->units().AllResident()) {
    MZ_RETURN_IF_ERROR(s.ctx->Decode(toks.data(), int(toks.size()), false));
  } else {
    RestoreGenerateStats st;
    MZ_RETURN_IF_ERROR(s.ctx->RestoreGenerate(toks.data(), int(toks.size()), PipelineOptions(), &st));
    if (verbose && (!pressure_watched || st.pipeline.units > 0))
      std::fprintf(stderr, "[restore_generate: %d units restored (%.1f MiB from storage, %.1f MiB decompressed) "
                   "overlapped with prefill; compute waited %.3f s]\n",
                   st.pipeline.units, st.pipeline.bytes_from_storage / 1048576.0,
                   st.pipeline.bytes_decoded / 1048576.0, st.wait_s);
  }
  const uint64_t p1 = Env::Default()->NowNs();
  int32_t tok = sampler.Sample(s.ctx->logits(0), nv);
  double ttft = Now() - t0;
  SustainedAfterStep(s.sustained.get(), int(toks.size()), p0, p1);  // after TTFT: its pacing is not in it
  int produced = 0;
  double t1 = Now();
  while (true) {
    ++produced;
    if (s.tok->IsEog(tok)) break;
    std::string piece = s.tok->Piece(tok);
    if (reply) *reply += piece;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (produced >= n) break;
    const uint64_t d0 = Env::Default()->NowNs();
    MZ_RETURN_IF_ERROR(s.ctx->Decode(&tok, 1, false));
    SustainedAfterStep(s.sustained.get(), 1, d0, Env::Default()->NowNs());
    tok = sampler.Sample(s.ctx->logits(0), nv);
  }
  double gen_s = Now() - t1;
  std::printf("\n");
  if (verbose)
    std::fprintf(stderr, "[prompt %zu tokens | TTFT %.3f s (%.1f t/s prefill) | %d tokens in %.3f s (%.2f t/s) | context %zu]\n",
                 toks.size(), ttft, double(toks.size()) / ttft, produced, gen_s,
                 produced > 1 ? double(produced - 1) / gen_s : 0.0, s.ctx->history().size());
  return Status::Ok();
}


// ---- chat --watch-pressure (daemon mode) ----
struct PressureArgs {
  std::string kind;          // auto | psi | cgroup-v1 | watermark
  std::string cgroup;
  double step = 25;          // points of LLM memory per event
  double floor = 0;          // points never given back
  std::string restore_ahead = "request";
  double calm_s = 10;
  CLI::Option* watch = nullptr;
};

void AddPressureOptions(CLI::App* c, PressureArgs& p) {
  p.watch = c->add_option("--watch-pressure", p.kind,
                          "react to memory pressure while idle: auto (default), psi, cgroup-v1, watermark")
                ->expected(0, 1)
                ->default_str("auto")
                ->check(CLI::IsMember({"auto", "psi", "cgroup-v1", "watermark"}));
  c->add_option("--pressure-step", p.step, "points of LLM memory given back per pressure event (paper: 15-25)")
      ->check(CLI::Range(0.1, 100.0));
  c->add_option("--pressure-floor", p.floor, "points of LLM memory never given back")->check(CLI::Range(0.0, 99.0));
  c->add_option("--restore-ahead", p.restore_ahead,
                "when pressure is gone: request (restore with the next prompt) or background (after --calm)")
      ->check(CLI::IsMember({"request", "background"}));
  c->add_option("--calm", p.calm_s, "seconds without pressure before a background restore")->check(CLI::Range(0.0, 3600.0));
  c->add_option("--cgroup", p.cgroup, "cgroup directory to watch (v1 memory cgroup, or v2) instead of the whole system");
}

void PrintPressureAction(const PressureAction& a) {
  const double rem = 100.0 * a.remaining;
  if (a.restored) {
    std::fprintf(stderr, "\n[pressure gone: restored %s ahead in the background%s (remaining %.0f%%)]\n",
                 Mib(a.restored_bytes).c_str(), a.status.ok() ? "" : (": " + a.status.ToString()).c_str(), rem);
  } else if (a.event.source == "restore-ahead") {
    if (a.repeats > 0) return;
    std::fprintf(stderr, "\n[restore-ahead: waiting until memory is free (remaining %.0f%%)]\n", rem);
  } else if (!a.status.ok() && a.freed == 0) {
    std::fprintf(stderr, "\n[pressure %s from %s: %s]\n", PressureLevelName(a.event.level), a.event.source.c_str(),
                 a.status.ToString().c_str());
  } else if (a.requested == 0) {
    if (a.repeats > 0) return;  // the same as the line printed before
    std::fprintf(stderr, "\n[pressure %s from %s: nothing given back (%s; remaining %.0f%%; repeats not shown)]\n",
                 PressureLevelName(a.event.level), a.event.source.c_str(), a.note.c_str(), rem);
  } else {
    std::fprintf(stderr, "\n[pressure from %s: gave back %s of %s asked (%s, remaining %.0f%%)%s in %.3f s%s]\n",
                 a.event.source.c_str(), Mib(a.freed).c_str(), Mib(a.requested).c_str(), PressureLevelName(a.event.level), rem,
                 a.deferred ? " after the reply" : "", double(a.applied_ns - std::min(a.applied_ns, a.event.time_ns)) * 1e-9,
                 a.status.ok() ? "" : (": " + a.status.ToString()).c_str());
  }
}

// Starts the monitor per the options; prints which source is active and why.
Status StartPressureWatch(const PressureArgs& p, Context* ctx, std::unique_ptr<PressureMonitor>* out) {
  PressureWatchOptions w;
  w.source.kind = p.kind.empty() ? "auto" : p.kind;
  w.source.cgroup_dir = p.cgroup;
  w.amount.step_points = p.step / 100.0;
  w.amount.floor_points = p.floor / 100.0;
  w.amount.restore_ahead = p.restore_ahead == "background" ? AmountOptions::RestoreAhead::kBackground
                                                           : AmountOptions::RestoreAhead::kOnRequest;
  w.amount.calm_ns = uint64_t(p.calm_s * 1e9);
  w.on_action = PrintPressureAction;
  std::unique_ptr<PressureMonitor> mon;
  std::string why;
  MZ_RETURN_IF_ERROR(StartPressureMonitor(Env::Default(), ctx, w, &mon, &why));
  std::fprintf(stderr, "[pressure: watching %s\n  (%s)\n  step %.0f points of LLM memory, floor %.0f, restore %s]\n",
               mon->source().name().c_str(), why.c_str(), p.step, p.floor,
               p.restore_ahead == "background" ? ("in the background after " + std::to_string(int(p.calm_s)) + " s calm").c_str()
                                               : "with the next prompt (restore_generate)");
  *out = std::move(mon);
  return Status::Ok();
}

// `run`: opens the model, prefills the prompt (through the chat template unless --raw), generates
// n_predict tokens and saves the session when asked. Exit code 0, or Fail's.
int RunOnce(GenArgs& ra) {  // Open resolves ra.model in place
  Session s;
  Status st = Open(ra, &s);
  if (!st.ok()) return Fail(st);
  std::string text = ra.prompt;
  if (!ra.raw) {
    st = s.tok->ApplyChat({{"user", ra.prompt}}, true, &text);
    if (!st.ok()) return Fail(st);
  }
  std::vector<int32_t> toks;
  st = s.tok->Tokenize(text, s.ctx->history().empty(), true, &toks);
  if (!st.ok()) return Fail(st);
  std::fprintf(stderr, "[model %s | %s | loaded in %.2f s | %s]\n", ra.model.c_str(),
               s.model->hparams().name.c_str(), s.load_s, ThreadsText(*s.ctx).c_str());
  Sampler sampler({ra.temp, ra.top_k, ra.top_p, ra.seed});
  st = Generate(s, sampler, toks, ra.n_predict, true, nullptr);
  if (st.ok() && !ra.residency_json.empty()) {
    ResidencyReport rr;
    st = s.ctx->MeasureResidency(/*with_smaps=*/true, &rr);
    if (st.ok()) {
      std::fprintf(stderr, "%s", ResidencySummaryText(rr).c_str());
      st = Env::Default()->WriteSmallFile(ra.residency_json, ResidencyJson(rr).dump(1) + "\n", /*create=*/true);
    }
  }
  if (st.ok() && !ra.session.empty()) {
    SessionInfo si;
    st = SaveSession(*s.ctx, ra.session, ra.session_codec, &si);
    if (st.ok())
      std::fprintf(stderr, "[session saved: %s, %d tokens, %s]\n", ra.session.c_str(), si.n_tokens,
                   Mib(si.file_bytes).c_str());
  }
  return st.ok() ? 0 : Fail(st);
}

// /evict AMOUNT or /remaining AMOUNT (a percentage of the footprint or a size).
void ChatEvict(Session& s, const std::string& verb, const std::string& arg, const MemoryReport& r) {
  uint64_t amount = 0;
  if (!ParseAmount(arg, r.footprint(), &amount)) {
    std::fprintf(stderr, "usage: %s 40%% | 300MiB\n", verb.c_str());
    return;
  }
  if (verb == "/remaining") amount = r.in_memory() > amount ? r.in_memory() - amount : 0;
  uint64_t freed = 0;
  double t0 = Now();
  Status est = s.ctx->EvictBytes(amount, &freed);
  std::fprintf(stderr, "  released %s in %.3f s%s%s\n", Mib(freed).c_str(), Now() - t0, est.ok() ? "" : ": ",
               est.ok() ? "" : est.ToString().c_str());
  PrintReport(s.ctx->Report());
}

// /pressure LEVEL: submits a pressure event to the monitor (which prints the action it takes).
void ChatPressure(PressureMonitor* mon, const std::string& arg) {
  PressureEvent ev;
  if (arg == "low") ev.level = PressureLevel::kLow;
  else if (arg == "medium") ev.level = PressureLevel::kMedium;
  else if (arg == "critical") ev.level = PressureLevel::kCritical;
  else if (arg != "none") {
    std::fprintf(stderr, "usage: /pressure low|medium|critical|none\n");
    return;
  }
  ev.time_ns = Env::Default()->NowNs();
  ev.source = "/pressure";
  mon->Submit(ev);  // the action is printed by the monitor's callback
}

// /threads [N [CPUS]]: shows the compute threads and the CPU clusters, or changes them (the
// conversation stays; CPUS is a kernel list such as 4-7, omitted: not pinned).
void ChatThreads(Session& s, const std::string& n_arg, const std::string& cpus_arg) {
  if (n_arg.empty()) {
    CpuTopology topo;
    Status st = ReadCpuTopology(Env::Default(), &topo);
    std::fprintf(stderr, "  computing on %s\n", ThreadsText(*s.ctx).c_str());
    if (!st.ok()) {
      std::fprintf(stderr, "  CPU topology unknown: %s\n", st.ToString().c_str());
      return;
    }
    for (const CpuCluster& cl : topo.clusters) {
      std::string ids;
      for (int c : cl.cpus) ids += (ids.empty() ? "" : ",") + std::to_string(c);
      std::fprintf(stderr, "  cluster CPUs %s: capacity %u, max %.2f GHz\n", ids.c_str(), cl.capacity,
                   double(cl.max_freq_khz) * 1e-6);
    }
    return;
  }
  int n = 0;
  try {
    n = std::stoi(n_arg);
  } catch (...) {
    std::fprintf(stderr, "usage: /threads [N [CPUS]]  (e.g. /threads 2, /threads 2 6-7)\n");
    return;
  }
  std::vector<int> cpus;
  Status st = ParseCpuList(cpus_arg, &cpus);
  if (st.ok()) st = s.ctx->SetThreads(n, cpus);
  std::fprintf(stderr, "  %s\n", st.ok() ? ("computing on " + ThreadsText(*s.ctx)).c_str() : st.ToString().c_str());
}

// One chat line that starts with '/' (other than /quit and /exit). Errors are printed, never fatal.
void ChatCommand(Session& s, const GenArgs& ca, PressureMonitor* mon, const std::string& line) {
  std::istringstream cmd(line);
  std::string verb, arg, arg2;
  cmd >> verb >> arg >> arg2;
  MemoryReport r = s.ctx->Report();
  if (verb == "/memory") {
    PrintReport(r);
    // The kernel's view (memory/residency_report.h); "/memory units": every unit, one per line.
    ResidencyReport rr;
    Status rst = s.ctx->MeasureResidency(/*with_smaps=*/true, &rr);
    if (!rst.ok()) std::fprintf(stderr, "  kernel view unavailable: %s\n", rst.ToString().c_str());
    else std::fprintf(stderr, "%s%s", ResidencySummaryText(rr).c_str(), arg == "units" ? ResidencyTableText(rr).c_str() : "");
  } else if (verb == "/evict" || verb == "/remaining") {
    ChatEvict(s, verb, arg, r);
  } else if (verb == "/restore") {
    double t0 = Now();
    Status rst = s.ctx->Restore();
    std::fprintf(stderr, "  restore %s in %.3f s\n", rst.ok() ? "done" : rst.ToString().c_str(), Now() - t0);
    PrintReport(s.ctx->Report());
  } else if (verb == "/pressure" && mon) {
    ChatPressure(mon, arg);
  } else if (verb == "/threads") {
    ChatThreads(s, arg, arg2);
  } else if (verb == "/save") {
    SessionInfo si;
    Status sst = SaveSession(*s.ctx, arg.empty() ? ca.session : arg, ca.session_codec, &si);
    std::fprintf(stderr, "  %s\n", sst.ok() ? ("saved " + std::to_string(si.n_tokens) + " tokens").c_str()
                                             : sst.ToString().c_str());
  } else {
    std::fprintf(stderr, "unknown command %s\n", verb.c_str());
  }
}

// The conversation so far: its messages and the templated text the KV cache holds.
struct ChatState {
  std::vector<std::pair<std::string, std::string>> msgs;
  std::string prev_text;
};

// A reply is one generation: non-critical pressure during it is applied when it ends.
struct GenerationPhase {
  PressureMonitor* m;
  explicit GenerationPhase(PressureMonitor* mm) : m(mm) {
    if (m) m->BeginGeneration();
  }
  ~GenerationPhase() {
    if (m) m->EndGeneration();
  }
};

// One user turn: prefills only the new suffix of the templated conversation, generates the reply,
// then feeds the template's end-of-turn tokens so the cache matches the text. A failed generation is
// printed and the turn dropped (Ok, conversation kept up to the previous turn); a failing template,
// tokenizer or end-of-turn decode is returned (the caller exits).
Status ChatTurn(Session& s, Sampler& sampler, const GenArgs& ca, PressureMonitor* mon, const std::string& line,
                ChatState* cs) {
  cs->msgs.push_back({"user", line});
  std::string full;
  MZ_RETURN_IF_ERROR(s.tok->ApplyChat(cs->msgs, true, &full));
  // Only the new suffix is prefilled: the KV cache holds everything before it.
  std::string delta = full.substr(std::min(cs->prev_text.size(), full.size()));
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(s.tok->Tokenize(delta, s.ctx->history().empty(), true, &toks));
  std::string reply;
  GenerationPhase phase(mon);  // until the turn (and its session save) is done
  const MemoryReport before = s.ctx->Report();
  Status st = Generate(s, sampler, toks, ca.n_predict, true, &reply, mon != nullptr);
  const uint64_t given_back = before.footprint() - (before.weights_resident + before.kv_resident);
  if (mon && st.ok() && given_back > 0)
    std::fprintf(stderr, "[this turn restored the %s given back under pressure (see TTFT above)]\n",
                 Mib(given_back).c_str());
  if (!st.ok()) {
    std::fprintf(stderr, "error: %s (conversation kept up to the previous turn)\n", st.ToString().c_str());
    cs->msgs.pop_back();
    return Status::Ok();
  }
  cs->msgs.push_back({"assistant", reply});
  std::string closed;
  MZ_RETURN_IF_ERROR(s.tok->ApplyChat(cs->msgs, false, &closed));
  // Feed the end-of-turn tokens the template adds after the reply so the cache matches the text.
  std::string tail = closed.substr(std::min(full.size() + reply.size(), closed.size()));
  std::vector<int32_t> tail_toks;
  if (!tail.empty() && s.tok->Tokenize(tail, false, true, &tail_toks).ok() && !tail_toks.empty())
    MZ_RETURN_IF_ERROR(s.ctx->Decode(tail_toks.data(), int(tail_toks.size()), false));
  cs->prev_text = closed;
  if (!ca.session.empty()) {
    Status sst = SaveSession(*s.ctx, ca.session, ca.session_codec);
    if (!sst.ok()) std::fprintf(stderr, "warning: session not saved: %s\n", sst.ToString().c_str());
  }
  return Status::Ok();
}

// `chat`: the interactive loop over stdin until EOF, /quit or /exit. Exit code 0, or Fail's.
int RunChat(GenArgs& ca, const PressureArgs& pa) {  // Open resolves ca.model in place
  Session s;
  Status st = Open(ca, &s);
  if (!st.ok()) return Fail(st);
  std::unique_ptr<PressureMonitor> mon;  // declared after s: stopped before the context goes
  if (pa.watch->count() > 0) {
    st = StartPressureWatch(pa, s.ctx.get(), &mon);
    if (!st.ok()) return Fail(st);
  }
  std::fprintf(stderr,
               "[model %s loaded in %.2f s; type a message. Commands: /memory [units], /evict 40%% | 300MiB, "
               "/remaining 50%%, /restore, /save FILE, /threads [N [CPUS]], %s/quit]\n",
               ca.model.c_str(), s.load_s, mon ? "/pressure low|medium|critical|none, " : "");
  Sampler sampler({ca.temp, ca.top_k, ca.top_p, ca.seed});
  ChatState cs;
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line[0] == '/') {
      ChatCommand(s, ca, mon.get(), line);
      continue;
    }
    st = ChatTurn(s, sampler, ca, mon.get(), line, &cs);
    if (!st.ok()) return Fail(st);
  }
  return 0;
}

}  // namespace

void AddRunCommands(CLI::App& app, Runners& runners) {
  auto ra = std::make_shared<GenArgs>();
  auto* run = app.add_subcommand("run", "prompt in, tokens out; prints TTFT and tokens/s");
  AddGenOptions(run, *ra);
  run->add_option("-p,--prompt", ra->prompt, "prompt text");
  run->add_option("-n,--n-predict", ra->n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  run->add_flag("--raw", ra->raw, "do not apply the chat template");
  run->add_option("--residency-json", ra->residency_json,
                  "after generating, write the residency report (every unit as mzcache counts it and as the kernel "
                  "sees it: mincore, page cache, smaps) to this JSON file and print its summary");
  runners.push_back([run, ra]() -> int {
    if (!run->parsed()) return -1;
    return RunOnce(*ra);
  });

  auto ca = std::make_shared<GenArgs>();
  auto* chat = app.add_subcommand("chat", "interactive multi-turn chat; the KV cache is kept between turns");
  AddGenOptions(chat, *ca);
  chat->footer(
      "Commands in the chat: /memory (with the kernel's view: mincore, smaps, and a warning when mapped\n"
      "weights fell out of the page cache), /memory units (every unit), /evict 40% | 300MiB, /remaining 50%, /restore, /save FILE,\n"
      "/threads (show the compute threads and CPU clusters), /threads N [CPUS] (change them between\n"
      "turns, pinned to CPUS, e.g. /threads 2 6-7, or not pinned; the conversation stays),\n"
      "/pressure low|medium|critical|none (with --watch-pressure), /quit.");
  ca->n_predict = 128;
  chat->add_option("-n,--n-predict", ca->n_predict, "maximum tokens per reply");
  auto pa = std::make_shared<PressureArgs>();
  AddPressureOptions(chat, *pa);
  struct ConvArgs {
    std::string name, dir;
    uint64_t budget_mib = 0;
  };
  auto cv = std::make_shared<ConvArgs>();
  chat->add_option("--conversation", cv->name,
                   "resume or start this named conversation of the pool (kept across runs and crashes; see "
                   "`mzcache conversations`)");
  chat->add_option("--pool-dir", cv->dir, "the pool's folder for --conversation (default: <cache>/conversations)");
  chat->add_option("--memory-budget", cv->budget_mib, "with --conversation: the pool's RAM budget in MiB (0: none)");
  runners.push_back([chat, ca, pa, cv]() -> int {
    if (!chat->parsed()) return -1;
    if (!cv->name.empty()) {
      Status st = ParseCtx(*ca);
      if (st.ok() && ca->n_ctx == 0) st = Status::InvalidArgument("--ctx auto is not supported with --conversation");
      if (!st.ok()) return Fail(st);
    }
    if (!cv->name.empty())
      return RunConversationChat(ca->model, cv->dir, cv->name, ca->threads, ca->n_ctx, ca->n_predict, cv->budget_mib,
                                 ca->temp, ca->top_k, ca->top_p, ca->seed);
    return RunChat(*ca, *pa);
  });
}

}  // namespace mz::cli
