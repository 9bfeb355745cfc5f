// run, chat
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
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
  s->ctx = std::make_unique<Context>(s->model.get(), co);
  s->load_s = Now() - t0;
  return Status::Ok();
}

// Prefills `toks`, then samples up to n tokens, streaming text to stdout. Reports TTFT and speeds.
Status Generate(Session& s, Sampler& sampler, const std::vector<int32_t>& toks, int n, bool verbose,
                std::string* reply) {
  const int32_t nv = int32_t(s.model->hparams().n_vocab);
  double t0 = Now();
  MZ_RETURN_IF_ERROR(s.ctx->Decode(toks.data(), int(toks.size()), false));
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
    st = s.tok->Tokenize(text, true, true, &toks);
    if (!st.ok()) return Fail(st);
    std::fprintf(stderr, "[model %s | %s | loaded in %.2f s | %d threads]\n", ra->model.c_str(),
                 s.model->hparams().name.c_str(), s.load_s, ra->threads);
    Sampler sampler({ra->temp, ra->top_k, ra->top_p, ra->seed});
    st = Generate(s, sampler, toks, ra->n_predict, true, nullptr);
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
    std::fprintf(stderr, "[model %s loaded in %.2f s; type a message, /quit to leave]\n", ca->model.c_str(), s.load_s);
    Sampler sampler({ca->temp, ca->top_k, ca->top_p, ca->seed});
    std::vector<std::pair<std::string, std::string>> msgs;
    std::string prev_text;
    std::string line;
    while (true) {
      std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line)) break;
      if (line == "/quit" || line == "/exit") break;
      if (line.empty()) continue;
      msgs.push_back({"user", line});
      std::string full;
      st = s.tok->ApplyChat(msgs, true, &full);
      if (!st.ok()) return Fail(st);
      // Only the new suffix is prefilled: the KV cache holds everything before it.
      std::string delta = full.substr(std::min(prev_text.size(), full.size()));
      std::vector<int32_t> toks;
      st = s.tok->Tokenize(delta, prev_text.empty(), true, &toks);
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
    }
    return 0;
  });
}

}  // namespace mz::cli
