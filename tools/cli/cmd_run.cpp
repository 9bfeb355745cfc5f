// `run` and `chat`: thin commands over the public C API (include/mzcache.h). Nothing here reaches
// into the library's internals: what these commands do, an app can do with libmzcache.so.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/cli/c_api_text.h"
#include "tools/cli/residency_text.h"
#include "tools/cli/sustained_cli.h"
#include "tools/cli/trim_cli.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/weights_option.h"

namespace mz::cli {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct GenArgs {
  std::string model;
  std::vector<std::string> models;  // chat: every -m (two or more: several models, /model NAME)
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
  std::string ctx_text = "8192";  // --ctx: tokens, or "auto" (n_ctx resolved once the model is known)
  bool no_memory_check = false;
  std::string weights = "page-cache";  // --weights (tools/weights_option.h)
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

void AddGenOptions(CLI::App* c, GenArgs& a, bool several = false) {
  if (several)
    c->add_option("-m,--model", a.models,
                  "GGUF path (default: the synthesized Qwen3-0.6B q8_0, made if missing); repeat for several models "
                  "sharing --memory-budget, switched with /model NAME between turns");
  else
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
  AddWeightsOption(c, &a.weights);
  c->add_option("--kv-type", a.kv_type, "resident KV format: f16, or q8_0 (q8 rows written live, about half the KV memory)")
      ->check(CLI::IsMember({"f16", "q8_0"}));
}


// "2 threads" or "2 threads on CPUs 6,7": what the context computes on now.
std::string ThreadsText(mz_context* ctx) {
  int32_t n_threads = 0;
  const int32_t n = mz_context_get_threads(ctx, &n_threads, nullptr, 0);
  std::vector<int32_t> cpus(size_t(std::max(n, 0)));
  if (n > 0) mz_context_get_threads(ctx, &n_threads, cpus.data(), n);
  std::string t = std::to_string(n_threads) + (n_threads == 1 ? " thread" : " threads");
  if (!cpus.empty()) {
    t += " on CPU" + std::string(cpus.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < cpus.size(); ++i) t += (i ? "," : "") + std::to_string(cpus[i]);
  }
  return t;
}

// A kernel CPU list ("4-7,9") as ids; false (message printed) if it is not one.
bool ParseCpus(const std::string& list, std::vector<int32_t>* out) {
  out->clear();
  const int32_t n = mz_parse_cpu_list(list.c_str(), nullptr, 0);
  if (n < 0) {
    std::fprintf(stderr, "error: CPU list '%s': %s\n", list.c_str(), CError(n).c_str());
    return false;
  }
  out->resize(size_t(n));
  return n == 0 || mz_parse_cpu_list(list.c_str(), out->data(), n) == n;
}

mz_memory_report Report(mz_context* ctx) {
  mz_memory_report r{};
  mz_get_memory_report(ctx, &r);
  return r;
}

bool AllResident(const mz_memory_report& r) {
  for (int s = 1; s < 5; ++s)
    if (r.n_weight_units[s] || r.n_kv_chunks[s]) return false;
  return true;
}

void PrintReport(const mz_memory_report& r) {
  std::fprintf(stderr,
               "  remaining in memory: %.1f%% (%s of %s)\n"
               "  weights: %s resident, %s dropped (%d/%d units resident)\n"
               "  KV: %s resident | %s raw compressed to %s in RAM (stack %s) | %s raw on storage | %s raw compressed "
               "to %s on storage | %d chunks lost\n",
               100.0 * r.remaining, MibText(r.in_memory).c_str(), MibText(r.footprint).c_str(),
               MibText(r.weights_resident).c_str(), MibText(r.weights_dropped).c_str(), r.n_weight_units[MZ_STATE_RESIDENT],
               r.n_weight_units[MZ_STATE_RESIDENT] + r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED],
               MibText(r.kv_resident).c_str(), MibText(r.kv_mem_compressed_raw).c_str(), MibText(r.kv_mem_compressed).c_str(),
               MibText(r.swap_stack_mapped).c_str(), MibText(r.kv_storage_raw).c_str(), MibText(r.kv_storage_compressed_raw).c_str(),
               MibText(r.kv_storage_compressed).c_str(), r.n_kv_lost);
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

int32_t KvType(const GenArgs& a) { return a.kv_type == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16; }

// --ctx auto: the largest context (whole chunks, at most the model's training context) whose
// estimated peak stays within 90% of what the process may use (mz_plan_estimate with n_ctx 0).
// Planned before the model is loaded: the plan counts the weights itself, and this process's
// resident set as the overhead. Returns MZ_OK or the status (message printed).
int AutoContext(GenArgs& a) {
  mz_plan_params pp = mz_plan_default_params();
  pp.n_ctx = 0;
  pp.kv_chunk_tokens = uint32_t(a.chunk);
  pp.kv_type = KvType(a);
  pp.margin = 0.1f;
  mz_plan_result r{};
  const int rc = mz_plan_estimate(a.model.c_str(), &pp, &r);
  if (rc != MZ_OK) {
    CFail("--ctx auto", rc);
    return rc;
  }
  if (r.n_ctx < 16) {
    std::fprintf(stderr, "error: --ctx auto: not even one KV chunk fits in the %s (%s)\n",
                 r.binding[0] ? r.binding : "memory", MibText(r.limit).c_str());
    return MZ_ERR_NO_MEMORY;
  }
  a.n_ctx = int(r.n_ctx);
  std::fprintf(stderr, "--ctx auto: %d tokens (peak %s of the %s, %s)\n", a.n_ctx, MibText(r.peak).c_str(),
               r.limit ? r.binding : "no known limit", MibText(r.limit).c_str());
  return MZ_OK;
}

// The model, its context and the sampler of one run or chat; freed in reverse order.
struct Session {
  mz_model* model = nullptr;
  mz_context* ctx = nullptr;
  mz_sampler* sampler = nullptr;
  int32_t n_vocab = 0;
  std::string name;
  double load_s = 0;
  Session() = default;
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    mz_sampler_free(sampler);
    mz_context_free(ctx);  // stops a pressure watcher and sustained mode with it
    mz_model_free(model);
  }
};

// Loads the model, creates the context per a (threads, pinning, sustained mode) and the sampler,
// and loads --session when the file exists. Returns 0, or the exit code after printing why.
int Open(GenArgs& a, Session* s) {
  if (a.model.empty()) {
    Status st = EnsureDefaultModel(&a.model);
    if (!st.ok()) return Fail(st);
  }
  Status st = ParseCtx(a);
  if (!st.ok()) return Fail(st);
  if (a.n_ctx == 0 && AutoContext(a) != MZ_OK) return 1;
  const double t0 = Now();
  const mz_model_params mp = ModelParamsFor(a.weights);
  int rc = mz_model_load(a.model.c_str(), &mp, &s->model);
  if (rc != MZ_OK) return CFail("loading " + a.model, rc);
  mz_model_info info{};
  mz_model_get_info(s->model, &info);
  s->n_vocab = info.n_vocab;
  s->name = info.name ? info.name : "";
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a.n_ctx);
  cp.memory_check = !a.no_memory_check;
  cp.kv_chunk_tokens = uint32_t(a.chunk);
  cp.n_threads = a.threads;
  cp.kv_codec = a.kv_codec.c_str();
  cp.kv_type = KvType(a);
  cp.swap_path = a.swap_path.empty() ? nullptr : a.swap_path.c_str();
  rc = mz_context_new(s->model, &cp, &s->ctx);
  if (rc != MZ_OK) return CFail("creating the context", rc);
  if (!a.cpus.empty()) {
    std::vector<int32_t> cpus;
    if (!ParseCpus(a.cpus, &cpus)) return 1;
    rc = mz_context_set_threads(s->ctx, a.threads, cpus.data(), int32_t(cpus.size()));
    if (rc != MZ_OK) return CFail("--cpus", rc);
  }
  rc = StartSustained(a.sus, s->ctx);
  if (rc != MZ_OK) return CFail("--sustained", rc);
  mz_sampler_params sp = mz_sampler_default_params();
  sp.temperature = a.temp;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.seed = a.seed;
  s->sampler = mz_sampler_new(&sp);
  if (!s->sampler) return CFail("sampler", MZ_ERR_INVALID_ARG);
  s->load_s = Now() - t0;
  if (!a.session.empty() && std::ifstream(a.session).good()) {
    const double t1 = Now();
    mz_session_info si{};
    rc = mz_session_get_info(s->ctx, a.session.c_str(), &si);
    if (rc == MZ_OK) rc = mz_session_load(s->ctx, a.session.c_str());
    if (rc != MZ_OK) return CFail("session " + a.session, rc);
    std::fprintf(stderr, "[session %s: %d tokens restored in %.3f s (%s), no recompute]\n", a.session.c_str(),
                 int(si.n_tokens), Now() - t1, si.codec);
  }
  return 0;
}

// Tokens of text for s's context (BOS when it is empty; the chat template's markers are tokens).
// MZ_OK or the status.
int Tokenize(const Session& s, const std::string& text, std::vector<mz_token>* out) {
  return TokenizeText(s.model, text, mz_context_n_tokens(s.ctx) == 0, true, out);
}

// Prefills `toks`, then samples up to n tokens, streaming text to stdout. Reports TTFT and speeds.
// With sustained mode on, its pacing (the duty cycle's sleep) happens inside the calls and so is
// part of the TTFT and tokens/s printed: what the user waits. Returns MZ_OK or the failing call's
// status; on failure the context holds the tokens decoded before it (the caller truncates).
int Generate(Session& s, const std::vector<mz_token>& toks, int n, bool verbose, std::string* reply,
             bool pressure_watched = false) {
  const double t0 = Now();
  // With a pressure monitor evicting from its own thread the state may change after the report:
  // then always prefill through restore_generate (a no-op restore when all is resident).
  int rc = MZ_OK;
  if (!pressure_watched && AllResident(Report(s.ctx))) {
    rc = mz_decode(s.ctx, toks.data(), int32_t(toks.size()), false);
  } else {
    mz_restore_stats st{};
    rc = mz_restore_generate(s.ctx, toks.data(), int32_t(toks.size()), nullptr, &st);
    if (rc == MZ_OK && verbose && (!pressure_watched || st.units_restored > 0))
      std::fprintf(stderr, "[restore_generate: %d units restored (%.1f MiB from storage, %.1f MiB decompressed) "
                   "overlapped with prefill; compute waited %.3f s]\n",
                   st.units_restored, double(st.bytes_from_storage) / 1048576.0,
                   double(st.bytes_decoded) / 1048576.0, st.wait_s);
  }
  if (rc != MZ_OK) return rc;
  mz_token tok = mz_sampler_sample(s.sampler, s.ctx, 0);
  if (tok < 0) return tok;
  const double ttft = Now() - t0;
  int produced = 0;
  const double t1 = Now();
  while (true) {
    ++produced;
    if (mz_token_is_eog(s.model, tok)) break;
    const std::string piece = TokenPiece(s.model, tok);
    if (reply) *reply += piece;
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    if (produced >= n) break;
    rc = mz_decode(s.ctx, &tok, 1, false);
    if (rc != MZ_OK) return rc;
    tok = mz_sampler_sample(s.sampler, s.ctx, 0);
    if (tok < 0) return tok;
  }
  const double gen_s = Now() - t1;
  std::printf("\n");
  if (verbose)
    std::fprintf(stderr, "[prompt %zu tokens | TTFT %.3f s (%.1f t/s prefill) | %d tokens in %.3f s (%.2f t/s) | context %d]\n",
                 toks.size(), ttft, double(toks.size()) / ttft, produced, gen_s,
                 produced > 1 ? double(produced - 1) / gen_s : 0.0, int(mz_context_n_tokens(s.ctx)));
  return MZ_OK;
}

// Saves the session to path with codec and prints its size; MZ_OK or the status.
int SaveSession(Session& s, const std::string& path, const std::string& codec, bool verbose) {
  int rc = mz_session_save(s.ctx, path.c_str(), codec.c_str());
  if (rc != MZ_OK || !verbose) return rc;
  mz_session_info si{};
  rc = mz_session_get_info(s.ctx, path.c_str(), &si);
  if (rc == MZ_OK)
    std::fprintf(stderr, "[session saved: %s, %d tokens, %s]\n", path.c_str(), int(si.n_tokens),
                 MibText(si.file_bytes).c_str());
  return rc;
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

// mz_pressure_params.on_action: one line per action (on the watcher's or the generating thread).
void PrintPressureAction(const mz_pressure_action* a, void*) {
  const double rem = 100.0 * a->remaining;
  const std::string err = a->status == MZ_OK ? "" : std::string(": ") + mz_status_str(a->status) + ": " + a->error;
  if (a->restored) {
    std::fprintf(stderr, "\n[pressure gone: restored %s ahead in the background%s (remaining %.0f%%)]\n",
                 MibText(a->restored_bytes).c_str(), err.c_str(), rem);
  } else if (std::string(a->source) == "restore-ahead") {
    if (a->repeats > 0) return;
    std::fprintf(stderr, "\n[restore-ahead: waiting until memory is free (remaining %.0f%%)]\n", rem);
  } else if (a->status != MZ_OK && a->freed == 0) {
    std::fprintf(stderr, "\n[pressure %s from %s%s]\n", a->level_name, a->source, err.c_str());
  } else if (a->requested == 0) {
    if (a->repeats > 0) return;  // the same as the line printed before
    std::fprintf(stderr, "\n[pressure %s from %s: nothing given back (%s; remaining %.0f%%; repeats not shown)]\n",
                 a->level_name, a->source, a->note, rem);
  } else {
    std::fprintf(stderr, "\n[pressure from %s: gave back %s of %s asked (%s, remaining %.0f%%)%s in %.3f s%s]\n",
                 a->source, MibText(a->freed).c_str(), MibText(a->requested).c_str(), a->level_name, rem,
                 a->deferred ? " after the reply" : "", a->delay_s, err.c_str());
  }
}

// Starts the context's watcher per the options; prints which source is active and why. MZ_OK or
// the status of mz_pressure_watch_start.
int StartPressureWatch(const PressureArgs& p, mz_context* ctx) {
  mz_pressure_params pp = mz_pressure_default_params();
  const std::string kind = p.kind.empty() ? "auto" : p.kind;
  pp.source = kind.c_str();
  pp.cgroup_dir = p.cgroup.empty() ? nullptr : p.cgroup.c_str();
  pp.step_points = float(p.step / 100.0);
  pp.floor_points = float(p.floor / 100.0);
  pp.restore_in_background = p.restore_ahead == "background";
  pp.calm_ms = uint32_t(p.calm_s * 1000.0);
  pp.on_action = PrintPressureAction;
  const int rc = mz_pressure_watch_start(ctx, &pp);  // reads kind / cgroup during the call only
  if (rc != MZ_OK) return rc;
  mz_pressure_stats ps{};
  mz_pressure_get_stats(ctx, &ps);
  std::string why(size_t(std::max(mz_pressure_watch_reason(ctx, nullptr, 0), 0)) + 1, '\0');
  mz_pressure_watch_reason(ctx, why.data(), int32_t(why.size()));
  why.resize(why.size() - 1);
  std::fprintf(stderr, "[pressure: watching %s\n  (%s)\n  step %.0f points of LLM memory, floor %.0f, restore %s]\n",
               ps.source, why.c_str(), p.step, p.floor,
               p.restore_ahead == "background" ? ("in the background after " + std::to_string(int(p.calm_s)) + " s calm").c_str()
                                               : "with the next prompt (restore_generate)");
  return MZ_OK;
}

// `run`: opens the model, prefills the prompt (through the chat template unless --raw), generates
// n_predict tokens and saves the session when asked. Exit code 0, or 1 with the error printed.
int RunOnce(GenArgs& ra) {  // Open resolves ra.model in place
  Session s;
  if (int ec = Open(ra, &s)) return ec;
  std::string text = ra.prompt;
  int rc = MZ_OK;
  const std::vector<mz_chat_message> user{{"user", ra.prompt.c_str()}};
  if (!ra.raw && (rc = ApplyChatTemplate(s.model, user, true, &text)) != MZ_OK) return CFail("chat template", rc);
  std::vector<mz_token> toks;
  if ((rc = Tokenize(s, text, &toks)) != MZ_OK) return CFail("tokenize", rc);
  std::fprintf(stderr, "[model %s | %s | loaded in %.2f s | %s]\n", ra.model.c_str(), s.name.c_str(), s.load_s,
               ThreadsText(s.ctx).c_str());
  if ((rc = Generate(s, toks, ra.n_predict, true, nullptr)) != MZ_OK) return CFail("generate", rc);
  if (!ra.residency_json.empty()) {
    Residency rr;
    if ((rc = MeasureResidency(s.ctx, /*with_smaps=*/true, &rr)) != MZ_OK) return CFail("residency report", rc);
    std::fprintf(stderr, "%s", ResidencySummaryText(rr).c_str());
    std::ofstream f(ra.residency_json, std::ios::trunc);
    f << ResidencyJson(rr).dump(1) << "\n";
    f.close();
    if (!f) return Fail(Status::IOError("could not write " + ra.residency_json));
  }
  if (!ra.session.empty() && (rc = SaveSession(s, ra.session, ra.session_codec, true)) != MZ_OK)
    return CFail("saving session " + ra.session, rc);
  return 0;
}

// /evict AMOUNT or /remaining AMOUNT (a percentage of the footprint or a size).
void ChatEvict(Session& s, const std::string& verb, const std::string& arg, const mz_memory_report& r) {
  uint64_t amount = 0;
  if (!ParseAmount(arg, r.footprint, &amount)) {
    std::fprintf(stderr, "usage: %s 40%% | 300MiB\n", verb.c_str());
    return;
  }
  if (verb == "/remaining") amount = r.in_memory > amount ? r.in_memory - amount : 0;
  uint64_t freed = 0;
  const double t0 = Now();
  const int rc = mz_evict(s.ctx, amount, nullptr, &freed);
  std::fprintf(stderr, "  released %s in %.3f s%s%s\n", MibText(freed).c_str(), Now() - t0, rc == MZ_OK ? "" : ": ",
               rc == MZ_OK ? "" : CError(rc).c_str());
  PrintReport(Report(s.ctx));
}

// /pressure LEVEL: one pressure event handled as the watcher would (the watcher's callback prints
// the action).
void ChatPressure(Session& s, const std::string& arg) {
  int32_t level = -1;
  if (arg == "none") level = 0;
  else if (arg == "low") level = 1;
  else if (arg == "medium") level = 2;
  else if (arg == "critical") level = 3;
  if (level < 0) {
    std::fprintf(stderr, "usage: /pressure low|medium|critical|none\n");
    return;
  }
  const int rc = mz_pressure_submit(s.ctx, level, "/pressure");
  if (rc != MZ_OK && rc != MZ_ERR_BUSY) std::fprintf(stderr, "  /pressure: %s\n", CError(rc).c_str());
}

// /threads [N [CPUS]]: shows the compute threads and the CPU clusters, or changes them (the
// conversation stays; CPUS is a kernel list such as 4-7, omitted: not pinned).
void ChatThreads(Session& s, const std::string& n_arg, const std::string& cpus_arg) {
  if (n_arg.empty()) {
    std::fprintf(stderr, "  computing on %s\n", ThreadsText(s.ctx).c_str());
    const int32_t n = mz_cpu_clusters(nullptr, 0);
    std::vector<mz_cpu_cluster> cl(size_t(std::max(n, 0)));
    const int32_t m = n > 0 ? mz_cpu_clusters(cl.data(), n) : n;
    if (m < 0) {
      std::fprintf(stderr, "  CPU topology unknown: %s\n", CError(m).c_str());
      return;
    }
    cl.resize(size_t(std::min(m, n)));
    for (const mz_cpu_cluster& c : cl) {
      std::string ids;
      for (int id = 0; id < 64 * 64; ++id)
        if (c.cpus[id / 64] >> (id % 64) & 1) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      std::fprintf(stderr, "  cluster CPUs %s: capacity %u, max %.2f GHz\n", ids.c_str(), c.capacity,
                   double(c.max_freq_khz) * 1e-6);
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
  std::vector<int32_t> cpus;
  if (!ParseCpus(cpus_arg, &cpus)) return;
  const int rc = mz_context_set_threads(s.ctx, n, cpus.data(), int32_t(cpus.size()));
  std::fprintf(stderr, "  %s\n", rc == MZ_OK ? ("computing on " + ThreadsText(s.ctx)).c_str() : CError(rc).c_str());
}

// One chat line that starts with '/' (other than /quit and /exit). Errors are printed, never fatal.
void ChatCommand(Session& s, const GenArgs& ca, bool watching, const std::string& line) {
  std::istringstream cmd(line);
  std::string verb, arg, arg2;
  cmd >> verb >> arg >> arg2;
  const mz_memory_report r = Report(s.ctx);
  if (verb == "/memory") {
    PrintReport(r);
    // The kernel's view (mz_residency_report); "/memory units": every unit, one per line.
    Residency rr;
    const int rc = MeasureResidency(s.ctx, /*with_smaps=*/true, &rr);
    if (rc != MZ_OK) std::fprintf(stderr, "  kernel view unavailable: %s\n", CError(rc).c_str());
    else std::fprintf(stderr, "%s%s", ResidencySummaryText(rr).c_str(), arg == "units" ? ResidencyTableText(rr).c_str() : "");
  } else if (verb == "/evict" || verb == "/remaining") {
    ChatEvict(s, verb, arg, r);
  } else if (verb == "/restore") {
    const double t0 = Now();
    const int rc = mz_restore(s.ctx);
    std::fprintf(stderr, "  restore %s in %.3f s\n", rc == MZ_OK ? "done" : CError(rc).c_str(), Now() - t0);
    PrintReport(Report(s.ctx));
  } else if (verb == "/pressure" && watching) {
    ChatPressure(s, arg);
  } else if (verb == "/trim" || verb == "/background") {
    ChatTrimCommand(s.ctx, verb, arg);  // tools/cli/trim_cli.h
  } else if (verb == "/threads") {
    ChatThreads(s, arg, arg2);
  } else if (verb == "/save") {
    const std::string path = arg.empty() ? ca.session : arg;
    const int rc = path.empty() ? MZ_ERR_INVALID_ARG : SaveSession(s, path, ca.session_codec, false);
    std::fprintf(stderr, "  %s\n", rc == MZ_OK ? ("saved " + std::to_string(mz_context_n_tokens(s.ctx)) + " tokens").c_str()
                                   : path.empty() ? "usage: /save FILE (or start with --session FILE)"
                                                  : CError(rc).c_str());
  } else {
    std::fprintf(stderr, "unknown command %s\n", verb.c_str());
  }
}

// The conversation so far: its messages and the templated text the KV cache holds.
struct ChatState {
  struct Message {
    std::string role, content;
  };
  std::vector<Message> msgs;
  std::string prev_text;
};

// A reply is one generation: non-critical pressure during it is applied when it ends
// (mz_pressure_set_generating).
struct GenerationPhase {
  mz_context* ctx;
  explicit GenerationPhase(mz_context* c) : ctx(c) { mz_pressure_set_generating(ctx, true); }
  ~GenerationPhase() { mz_pressure_set_generating(ctx, false); }
};

// One user turn: prefills only the new suffix of the templated conversation, generates the reply,
// then feeds the template's end-of-turn tokens so the cache matches the text. A failed generation is
// printed, the context is cut back to where the turn began and the turn dropped (MZ_OK: the
// conversation continues from the previous turn); a failing template, tokenizer or end-of-turn
// decode is returned (the caller exits).
int ChatTurn(Session& s, const GenArgs& ca, bool watching, const std::string& line, ChatState* cs) {
  cs->msgs.push_back({"user", line});
  std::string full;
  int rc = ApplyChatTemplate(s.model, cs->msgs, true, &full);
  if (rc != MZ_OK) return rc;
  // Only the new suffix is prefilled: the KV cache holds everything before it.
  const std::string delta = full.substr(std::min(cs->prev_text.size(), full.size()));
  std::vector<mz_token> toks;
  if ((rc = Tokenize(s, delta, &toks)) != MZ_OK) return rc;
  const int32_t n_before = mz_context_n_tokens(s.ctx);
  std::string reply;
  GenerationPhase phase(s.ctx);  // until the turn (and its session save) is done
  const mz_memory_report before = Report(s.ctx);
  rc = Generate(s, toks, ca.n_predict, true, &reply, watching);
  const uint64_t given_back = before.footprint - (before.weights_resident + before.kv_resident);
  if (watching && rc == MZ_OK && given_back > 0)
    std::fprintf(stderr, "[this turn restored the %s given back under pressure (see TTFT above)]\n",
                 MibText(given_back).c_str());
  if (rc != MZ_OK) {
    std::fprintf(stderr, "error: %s (conversation kept up to the previous turn)\n", CError(rc).c_str());
    cs->msgs.pop_back();
    // The prompt and the reply's tokens decoded before the failure: the text no longer has them.
    const int trc = mz_context_truncate(s.ctx, n_before);
    return trc == MZ_OK ? MZ_OK : trc;
  }
  cs->msgs.push_back({"assistant", reply});
  std::string closed;
  if ((rc = ApplyChatTemplate(s.model, cs->msgs, false, &closed)) != MZ_OK) return rc;
  // Feed the end-of-turn tokens the template adds after the reply so the cache matches the text.
  const std::string tail = closed.substr(std::min(full.size() + reply.size(), closed.size()));
  std::vector<mz_token> tail_toks;
  if (!tail.empty() && Tokenize(s, tail, &tail_toks) == MZ_OK && !tail_toks.empty() &&
      (rc = mz_decode(s.ctx, tail_toks.data(), int32_t(tail_toks.size()), false)) != MZ_OK)
    return rc;
  cs->prev_text = closed;
  if (!ca.session.empty() && (rc = SaveSession(s, ca.session, ca.session_codec, false)) != MZ_OK)
    std::fprintf(stderr, "warning: session not saved: %s\n", CError(rc).c_str());
  return MZ_OK;
}

// `chat`: the interactive loop over stdin until EOF, /quit or /exit. Exit code 0, or 1 with the
// error printed.
int RunChat(GenArgs& ca, const PressureArgs& pa) {  // Open resolves ca.model in place
  Session s;
  if (int ec = Open(ca, &s)) return ec;
  const bool watching = pa.watch->count() > 0;
  if (watching) {
    const int rc = StartPressureWatch(pa, s.ctx);
    if (rc != MZ_OK) return CFail("--watch-pressure", rc);
  }
  std::fprintf(stderr,
               "[model %s loaded in %.2f s; type a message. Commands: /memory [units], /evict 40%% | 300MiB, "
               "/remaining 50%%, /restore, /save FILE, /threads [N [CPUS]], /trim LEVEL, /background, %s/quit]\n",
               ca.model.c_str(), s.load_s, watching ? "/pressure low|medium|critical|none, " : "");
  ChatState cs;
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line[0] == '/') {
      ChatCommand(s, ca, watching, line);
      continue;
    }
    const int rc = ChatTurn(s, ca, watching, line, &cs);
    if (rc != MZ_OK) return CFail("chat turn", rc);
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
  AddGenOptions(chat, *ca, /*several=*/true);
  chat->footer(
      "With several -m (each named by its file's stem): /model NAME switches model between turns, each model\n"
      "keeping its conversation (--conversation, default 'chat', in <pool-dir>/<name>/), /models shows each\n"
      "model's weights (resident, given back) and the shared budget, /memory, /list, /quit.\n"
      "Commands in the chat: /memory (with the kernel's view: mincore, smaps, and a warning when mapped\n"
      "weights fell out of the page cache), /memory units (every unit), /evict 40% | 300MiB, /remaining 50%, /restore, /save FILE,\n"
      "/threads (show the compute threads and CPU clusters), /threads N [CPUS] (change them between\n"
      "turns, pinned to CPUS, e.g. /threads 2 6-7, or not pinned; the conversation stays),\n"
      "/trim LEVEL (Android's onTrimMemory: 20 ui_hidden, 40 background, 80 complete, ...), /background\n"
      "(what an app leaving the screen receives: UI_HIDDEN, BACKGROUND, COMPLETE; the next turn restores\n"
      "front layers first), /pressure low|medium|critical|none (with --watch-pressure), /quit.");
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
  chat->add_option("--pool-dir", cv->dir,
                   "the pool's folder for --conversation or several -m (default: <cache>/conversations)");
  chat->add_option("--memory-budget", cv->budget_mib,
                   "with --conversation or several -m: the RAM budget in MiB, of every model together (0: none)");
  runners.push_back([chat, ca, pa, cv]() -> int {
    if (!chat->parsed()) return -1;
    if (ca->models.size() > 1) {
      Status st = ParseCtx(*ca);
      if (st.ok() && ca->n_ctx == 0) st = Status::InvalidArgument("--ctx auto is not supported with several -m");
      if (st.ok() && (pa->watch->count() > 0 || !ca->session.empty()))
        st = Status::InvalidArgument("--watch-pressure and --session are for one model (several -m keep each model's "
                                     "conversation in its pool: --pool-dir, --conversation)");
      if (!st.ok()) return Fail(st);
      return RunModelsChat(ca->models, cv->dir, cv->name, ca->threads, ca->n_ctx, ca->n_predict, cv->budget_mib,
                           ca->temp, ca->top_k, ca->top_p, ca->seed, ca->weights);
    }
    if (ca->models.size() == 1) ca->model = ca->models[0];
    if (!cv->name.empty()) {
      Status st = ParseCtx(*ca);
      if (st.ok() && ca->n_ctx == 0) st = Status::InvalidArgument("--ctx auto is not supported with --conversation");
      if (!st.ok()) return Fail(st);
    }
    if (!cv->name.empty())
      return RunConversationChat(ca->model, cv->dir, cv->name, ca->threads, ca->n_ctx, ca->n_predict, cv->budget_mib,
                                 ca->temp, ca->top_k, ca->top_p, ca->seed, ca->weights);
    return RunChat(*ca, *pa);
  });
}

}  // namespace mz::cli
