// run, chat
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "swap/session_file.h"
#include "tools/commands.h"
#include "tools/common.h"

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
  std::string swap_path;
};

void AddGenOptions(CLI::App* c, GenArgs& a) {
  c->add_option("-m,--model", a.model, "GGUF path (default: the synthesized Qwen3-0.6B q8_0, made if missing)");
  c->add_option("-t,--threads", a.threads, "compute threads")->check(CLI::Range(1, 256));
  c->add_option("-c,--ctx", a.n_ctx, "maximum context tokens")->check(CLI::Range(16, 1 << 24));
  c->add_option("--chunk-tokens", a.chunk, "tokens per KV chunk")->check(CLI::Range(1, 65536));
  c->add_option("--temp", a.temp, "temperature (0 = greedy)");
  c->add_option("--top-k", a.top_k, "top-k");
  c->add_option("--top-p", a.top_p, "top-p");
  c->add_option("--seed", a.seed, "sampling seed");
  c->add_option("--session", a.session, "session file: loaded if it exists (no recompute), saved after generating");
  c->add_option("--session-codec", a.session_codec, "KV codec in the session file (none = lossless)");
  c->add_option("--kv-codec", a.kv_codec, "codec for compressed KV when evicting (q8, q4, cachegen, none, lz4, zstd)");
  c->add_option("--swap", a.swap_path, "storage swap file path (default in $TMPDIR or /var/tmp)");
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

struct Session {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Context> ctx;
  double load_s = 0;
};

Status Open(GenArgs& a, Session* s) {
  if (a.model.empty()) MZ_RETURN_IF_ERROR(EnsureDefaultModel(&a.model));
  double t0 = Now();
  MZ_RETURN_IF_ERROR(Model::Load(Env::Default(), a.model, ModelOptions(), &s->model));
  MZ_RETURN_IF_ERROR(Tokenizer::Load(a.model, &s->tok));
  ContextOptions co;
  co.n_ctx = a.n_ctx;
  co.kv_chunk_tokens = a.chunk;
  co.n_threads = a.threads;
  co.kv_codec = a.kv_codec;
  co.swap_path = a.swap_path;
  s->ctx = std::make_unique<Context>(s->model.get(), co);
  MZ_RETURN_IF_ERROR(s->ctx->Init());
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
                std::string* reply) {
  const int32_t nv = int32_t(s.model->hparams().n_vocab);
  double t0 = Now();
  if (s.ctx->elastic().AllResident()) {
    MZ_RETURN_IF_ERROR(s.ctx->Decode(toks.data(), int(toks.size()), false));
  } else {
    RestoreGenerateStats st;
    MZ_RETURN_IF_ERROR(s.ctx->RestoreGenerate(toks.data(), int(toks.size()), PipelineOptions(), &st));
    if (verbose)
      std::fprintf(stderr, "[restore_generate: %d units restored (%.1f MiB from storage, %.1f MiB decompressed) "
                   "overlapped with prefill; compute waited %.3f s]\n",
                   st.pipeline.units, st.pipeline.bytes_from_storage / 1048576.0,
                   st.pipeline.bytes_decoded / 1048576.0, st.wait_s);
  }
  int32_t tok = sampler.Sample(s.ctx->logits(0), nv);
  double ttft = Now() - t0;
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
    MZ_RETURN_IF_ERROR(s.ctx->Decode(&tok, 1, false));
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

}  // namespace

void AddRunCommands(CLI::App& app, Runners& runners) {
  auto ra = std::make_shared<GenArgs>();
  auto* run = app.add_subcommand("run", "prompt in, tokens out; prints TTFT and tokens/s");
  AddGenOptions(run, *ra);
  run->add_option("-p,--prompt", ra->prompt, "prompt text");
  run->add_option("-n,--n-predict", ra->n_predict, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  run->add_flag("--raw", ra->raw, "do not apply the chat template");
  runners.push_back([run, ra]() -> int {
    if (!run->parsed()) return -1;
    Session s;
    Status st = Open(*ra, &s);
    if (!st.ok()) return Fail(st);
    std::string text = ra->prompt;
    if (!ra->raw) {
      st = s.tok->ApplyChat({{"user", ra->prompt}}, true, &text);
      if (!st.ok()) return Fail(st);
    }
    std::vector<int32_t> toks;
    st = s.tok->Tokenize(text, s.ctx->history().empty(), true, &toks);
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr, "[model %s | %s | loaded in %.2f s | %d threads]\n", ra->model.c_str(),
                 s.model->hparams().name.c_str(), s.load_s, ra->threads);
    Sampler sampler({ra->temp, ra->top_k, ra->top_p, ra->seed});
    st = Generate(s, sampler, toks, ra->n_predict, true, nullptr);
    if (st.ok() && !ra->session.empty()) {
      SessionInfo si;
      st = SaveSession(*s.ctx, ra->session, ra->session_codec, &si);
      if (st.ok())
        std::fprintf(stderr, "[session saved: %s, %d tokens, %s]\n", ra->session.c_str(), si.n_tokens,
                     Mib(si.file_bytes).c_str());
    }
    return st.ok() ? 0 : Fail(st);
  });

  auto ca = std::make_shared<GenArgs>();
  auto* chat = app.add_subcommand("chat", "interactive multi-turn chat; the KV cache is kept between turns");
  AddGenOptions(chat, *ca);
  ca->n_predict = 128;
  chat->add_option("-n,--n-predict", ca->n_predict, "maximum tokens per reply");
  runners.push_back([chat, ca]() -> int {
    if (!chat->parsed()) return -1;
    Session s;
    Status st = Open(*ca, &s);
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr,
                 "[model %s loaded in %.2f s; type a message. Commands: /memory, /evict 40%% | 300MiB, "
                 "/remaining 50%%, /restore, /save FILE, /quit]\n",
                 ca->model.c_str(), s.load_s);
    Sampler sampler({ca->temp, ca->top_k, ca->top_p, ca->seed});
    std::vector<std::pair<std::string, std::string>> msgs;
    std::string prev_text;
    std::string line;
    while (true) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line)) break;
      if (line == "/quit" || line == "/exit") break;
      if (line.empty()) continue;
      if (line[0] == '/') {
        std::istringstream cmd(line);
        std::string verb, arg;
        cmd >> verb >> arg;
        MemoryReport r = s.ctx->Report();
        if (verb == "/memory") {
          PrintReport(r);
        } else if (verb == "/evict" || verb == "/remaining") {
          uint64_t amount = 0;
          if (!ParseAmount(arg, r.footprint(), &amount)) {
            std::fprintf(stderr, "usage: %s 40%% | 300MiB\n", verb.c_str());
            continue;
          }
          if (verb == "/remaining") amount = r.in_memory() > amount ? r.in_memory() - amount : 0;
          uint64_t freed = 0;
          double t0 = Now();
          Status est = s.ctx->EvictBytes(amount, &freed);
          std::fprintf(stderr, "  released %s in %.3f s%s%s\n", Mib(freed).c_str(), Now() - t0,
                       est.ok() ? "" : ": ", est.ok() ? "" : est.ToString().c_str());
          PrintReport(s.ctx->Report());
        } else if (verb == "/restore") {
          double t0 = Now();
          Status rst = s.ctx->Restore();
          std::fprintf(stderr, "  restore %s in %.3f s\n", rst.ok() ? "done" : rst.ToString().c_str(), Now() - t0);
          PrintReport(s.ctx->Report());
        } else if (verb == "/save") {
          SessionInfo si;
          Status sst = SaveSession(*s.ctx, arg.empty() ? ca->session : arg, ca->session_codec, &si);
          std::fprintf(stderr, "  %s\n", sst.ok() ? ("saved " + std::to_string(si.n_tokens) + " tokens").c_str()
                                                   : sst.ToString().c_str());
        } else {
          std::fprintf(stderr, "unknown command %s\n", verb.c_str());
        }
        continue;
      }
      msgs.push_back({"user", line});
      std::string full;
      st = s.tok->ApplyChat(msgs, true, &full);
      if (!st.ok()) return Fail(st);
      // Only the new suffix is prefilled: the KV cache holds everything before it.
      std::string delta = full.substr(std::min(prev_text.size(), full.size()));
      std::vector<int32_t> toks;
      st = s.tok->Tokenize(delta, s.ctx->history().empty(), true, &toks);
      if (!st.ok()) return Fail(st);
      std::string reply;
      st = Generate(s, sampler, toks, ca->n_predict, true, &reply);
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s (conversation kept up to the previous turn)\n", st.ToString().c_str());
        msgs.pop_back();
        continue;
      }
      msgs.push_back({"assistant", reply});
      std::string closed;
      st = s.tok->ApplyChat(msgs, false, &closed);
      if (!st.ok()) return Fail(st);
      // Feed the end-of-turn tokens the template adds after the reply so the cache matches the text.
      std::string tail = closed.substr(std::min(full.size() + reply.size(), closed.size()));
      std::vector<int32_t> tail_toks;
      if (!tail.empty() && s.tok->Tokenize(tail, false, true, &tail_toks).ok() && !tail_toks.empty()) {
        st = s.ctx->Decode(tail_toks.data(), int(tail_toks.size()), false);
        if (!st.ok()) return Fail(st);
      }
      prev_text = closed;
      if (!ca->session.empty()) {
        Status sst = SaveSession(*s.ctx, ca->session, ca->session_codec);
        if (!sst.ok()) std::fprintf(stderr, "warning: session not saved: %s\n", sst.ToString().c_str());
      }
    }
    return 0;
  });
}

}  // namespace mz::cli
