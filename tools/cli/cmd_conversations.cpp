// `mzcache chat --conversation NAME` (a named conversation of the pool, resumed across runs and
// crashes) and `mzcache conversations [rm NAME]`: thin commands over the public C API (mzcache.h).
//
// Beside each stored conversation <dir>/<id>.mzs (the pool's), chat keeps <dir>/<id>.chat.json:
// the messages and, for each, the conversation's token count once it was fed. On resume, messages
// past what the stored conversation holds (a turn a kill -9 cut short) are dropped, so the text and
// the KV always agree.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/serve/models.h"
#include "tools/weights_option.h"

namespace mz::cli {
namespace {

struct Message {
  std::string role, content;
  int end_tokens = 0;  // conversation tokens once this message (and its template) was fed
};

std::string DefaultDir() { return CacheDir() + "/conversations"; }

std::string SidecarPath(const std::string& dir, const std::string& id) { return dir + "/" + id + ".chat.json"; }

std::vector<Message> LoadSidecar(const std::string& path) {
  std::vector<Message> out;
  std::ifstream f(path);
  if (!f) return out;
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& x : j.at("messages"))
      out.push_back({x.at("role").get<std::string>(), x.at("content").get<std::string>(), x.at("end_tokens").get<int>()});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: %s unreadable (%s): the conversation continues without its text\n", path.c_str(),
                 e.what());
    out.clear();
  }
  return out;
}

// Written beside the stored conversation, crash-safely (temporary name, then rename).
void SaveSidecar(const std::string& path, const std::vector<Message>& msgs) {
  nlohmann::json j;
  j["messages"] = nlohmann::json::array();
  for (const auto& m : msgs) j["messages"].push_back({{"role", m.role}, {"content", m.content}, {"end_tokens", m.end_tokens}});
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "warning: could not write %s\n", tmp.c_str());
      return;
    }
  }
  std::rename(tmp.c_str(), path.c_str());
}


std::string When(uint64_t unix_ms) {
  if (!unix_ms) return "-";
  std::time_t t = std::time_t(unix_ms / 1000);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", std::localtime(&t));
  return buf;
}

void PrintConversation(const mz_conversation_report& r) {
  std::fprintf(stderr, "  %-24s %6d tokens  RAM %s  compressed %s  swap %s  stored %s (%d tokens)  shared %d  %s\n", r.id,
               int(r.n_tokens), MibText(r.kv_resident).c_str(), MibText(r.kv_mem_compressed).c_str(), MibText(r.kv_storage).c_str(),
               MibText(r.stored_bytes).c_str(), int(r.stored_tokens), int(r.shared_chunks), When(r.last_use_unix_ms).c_str());
}

struct PoolArgs {
  std::string model, dir;
  int threads = 2, n_ctx = 8192, n_predict = 128;
  uint64_t memory_budget_mib = 0;
  std::string persist_codec = "q8";
  std::string weights = "page-cache";  // --weights (tools/weights_option.h)
};

struct Handles {
  mz_model* model = nullptr;
  mz_pool* pool = nullptr;
  ~Handles() {
    mz_pool_free(pool);
    mz_model_free(model);
  }
};

int OpenPool(PoolArgs& a, Handles* h) {
  if (a.model.empty()) {
    Status st = EnsureDefaultModel(&a.model);
    if (!st.ok()) return Fail(st);
  }
  if (a.dir.empty()) a.dir = DefaultDir();
  const mz_model_params mp = ModelParamsFor(a.weights);
  if (int rc = mz_model_load(a.model.c_str(), &mp, &h->model)) return CFail("loading the model", rc);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a.n_ctx);
  cp.n_threads = a.threads;
  mz_pool_params pp = mz_pool_default_params();
  pp.dir = a.dir.c_str();
  pp.context = &cp;
  pp.memory_budget = a.memory_budget_mib << 20;
  pp.persist_codec = a.persist_codec.c_str();
  if (int rc = mz_pool_new(h->model, &pp, &h->pool)) return CFail("opening the pool in " + a.dir, rc);
  char buf[1024];
  for (int32_t i = 0; mz_pool_damaged(h->pool, i, buf, sizeof buf) >= 0; ++i)
    std::fprintf(stderr, "warning: damaged, skipped: %s\n", buf);
  return 0;
}

// One conversation of a pool as the chat holds it: its handle, its messages (the sidecar) and the
// templated text its KV holds.
struct ChatConv {
  mz_model* model = nullptr;
  mz_pool* pool = nullptr;
  std::string id, side;
  mz_conversation* conv = nullptr;
  std::vector<Message> msgs;
  std::string prev;  // the templated text the conversation holds ("" when the template fails)
  ChatConv() = default;
  ChatConv(const ChatConv&) = delete;
  ChatConv& operator=(const ChatConv&) = delete;
  ~ChatConv() {
    if (conv) mz_conversation_release(conv);
  }
  // Opens conversation id of pool (in dir) and its sidecar; cuts the KV back to the last whole
  // message. 0, or the exit code after printing why.
  int Open(mz_model* m, mz_pool* p, const std::string& dir, const std::string& conv_id) {
    model = m;
    pool = p;
    id = conv_id;
    if (int rc = mz_pool_open(pool, id.c_str(), &conv)) return CFail("opening conversation " + id, rc);
    side = SidecarPath(dir, id);
    msgs = LoadSidecar(side);
    // Keep the messages the stored conversation holds; cut the KV back to the last whole message.
    const int held = mz_conversation_n_tokens(conv);
    while (!msgs.empty() && msgs.back().end_tokens > held) msgs.pop_back();
    const int keep = msgs.empty() ? 0 : msgs.back().end_tokens;
    if (held > keep) {
      if (held > 0 && msgs.empty())
        std::fprintf(stderr, "[conversation %s holds %d tokens without their text: starting it again]\n", id.c_str(), held);
      mz_conversation_truncate(conv, keep);
    }
    if (!msgs.empty()) ApplyChatTemplate(model, msgs, false, &prev);
    return 0;
  }
  int tokens() const { return msgs.empty() ? 0 : msgs.back().end_tokens; }
  // One user turn: the reply streamed to stdout, committed (persisted in the background) with its
  // sidecar. A failure is printed and the turn dropped (the conversation stays as it was).
  void Turn(const std::string& line, mz_sampler* sampler, int n_predict) {
    msgs.push_back({"user", line, 0});
    std::string full;
    const bool templated = ApplyChatTemplate(model, msgs, true, &full) == MZ_OK && !full.empty();
    const std::string delta = full.compare(0, prev.size(), prev) == 0 ? full.substr(prev.size()) : full;
    std::vector<mz_token> toks;
    if (!templated || TokenizeText(model, delta, mz_conversation_n_tokens(conv) == 0, true, &toks) != MZ_OK ||
        toks.empty()) {
      std::fprintf(stderr, "error: the chat template or tokenizer failed: %s\n", mz_last_error());
      msgs.pop_back();
      return;
    }
    const int before = mz_conversation_n_tokens(conv);
    mz_restore_stats rs;
    if (mz_conversation_restore_generate(conv, toks.data(), int32_t(toks.size()), nullptr, &rs) != MZ_OK) {
      std::fprintf(stderr, "error: %s (conversation kept up to the previous turn)\n", mz_last_error());
      mz_conversation_truncate(conv, before);
      msgs.pop_back();
      return;
    }
    msgs.back().end_tokens = mz_conversation_n_tokens(conv);
    std::string reply;
    int n_gen = 0;
    bool ok = true;
    for (; n_gen < n_predict; ++n_gen) {
      const mz_token t = mz_conversation_sample(conv, sampler, 0);
      if (t < 0 || mz_token_is_eog(model, t)) break;
      const std::string piece = TokenPiece(model, t);
      if (!piece.empty()) {
        reply += piece;
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
      if (mz_conversation_decode(conv, &t, 1, false) != MZ_OK) {
        std::fprintf(stderr, "\nerror: %s\n", mz_last_error());
        ok = false;
        break;
      }
    }
    std::printf("\n");
    std::fprintf(stderr, "[TTFT %.3f s (restored %d units, %s from storage) | %d tokens]\n", rs.ttft_s,
                 int(rs.units_restored), MibText(rs.bytes_from_storage).c_str(), n_gen);
    if (!ok) {
      mz_conversation_truncate(conv, before);
      msgs.pop_back();
      return;
    }
    msgs.push_back({"assistant", reply, 0});
    std::string closed;  // "" when the template fails: then no tail is fed
    ApplyChatTemplate(model, msgs, false, &closed);
    const std::string tail = closed.size() > full.size() + reply.size() ? closed.substr(full.size() + reply.size()) : "";
    std::vector<mz_token> tail_toks;
    if (!tail.empty() && TokenizeText(model, tail, false, true, &tail_toks) == MZ_OK && !tail_toks.empty())
      mz_conversation_decode(conv, tail_toks.data(), int32_t(tail_toks.size()), false);
    msgs.back().end_tokens = mz_conversation_n_tokens(conv);
    prev = closed;
    if (mz_conversation_commit(conv) != MZ_OK) std::fprintf(stderr, "warning: not persisted: %s\n", mz_last_error());
    SaveSidecar(side, msgs);
  }
};

void PrintPool(mz_pool* pool) {
  mz_pool_report pr;
  if (mz_pool_get_report(pool, &pr) == MZ_OK)
    std::fprintf(stderr, "  pool: %d conversations (%d open), in memory %s (weights %s of %s), stored %s, lost %llu\n",
                 int(pr.n_conversations), int(pr.n_open), MibText(pr.in_memory).c_str(), MibText(pr.weights_resident).c_str(),
                 MibText(pr.weights_total).c_str(), MibText(pr.stored_bytes).c_str(), (unsigned long long)pr.conversations_lost);
}

void PrintList(mz_pool* pool) {
  std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(pool, nullptr, 0))));
  mz_pool_list(pool, all.data(), int32_t(all.size()));
  for (const auto& x : all) PrintConversation(x);
}

std::unique_ptr<mz_sampler, void (*)(mz_sampler*)> NewSampler(float temp, int top_k, float top_p, uint32_t seed) {
  mz_sampler_params sp = mz_sampler_default_params();
  sp.temperature = temp;
  sp.top_k = top_k;
  sp.top_p = top_p;
  sp.seed = seed;
  return {mz_sampler_new(&sp), mz_sampler_free};
}

int RunPoolChat(PoolArgs& a, const std::string& id, float temp, int top_k, float top_p, uint32_t seed) {
  Handles h;
  if (int rc = OpenPool(a, &h)) return rc;
  ChatConv c;
  if (int rc = c.Open(h.model, h.pool, a.dir, id)) return rc;
  std::fprintf(stderr, "[conversation %s in %s: %d tokens, %zu messages; commands: /memory, /list, /quit]\n", id.c_str(),
               a.dir.c_str(), c.tokens(), c.msgs.size());
  auto sampler = NewSampler(temp, top_k, top_p, seed);
  if (!sampler) return CFail("sampler", MZ_ERR_INVALID_ARG);
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/memory" || line == "/list") {
      mz_conversation_report r;
      if (line == "/memory" && mz_pool_conversation_report(h.pool, id.c_str(), &r) == MZ_OK) PrintConversation(r);
      if (line == "/list") PrintList(h.pool);
      PrintPool(h.pool);
      continue;
    }
    c.Turn(line, sampler.get(), a.n_predict);
  }
  return 0;
}

// Several models, one memory budget (issue 45): a pool per model in <dir>/<name>/ sharing one
// mz_budget (tools/serve/models.h), conversation id in each; /model NAME switches between turns,
// each model keeping its conversation (idle models give their memory back first; a model's
// weights come back front layers first with its next turn's prefill).
int ModelsChat(const std::vector<std::string>& paths, PoolArgs& a, const std::string& id, float temp, int top_k,
                  float top_p, uint32_t seed) {
  std::vector<serve::ModelSpec> specs;
  std::string why;
  if (!serve::ListModels(paths, "", &specs, &why)) {
    std::fprintf(stderr, "error: %s\n", why.c_str());
    return 2;
  }
  if (a.dir.empty()) a.dir = DefaultDir();
  serve::ModelSet set;
  set.set_model_params(ModelParamsFor(a.weights));
  if (int rc = set.ShareBudget(a.memory_budget_mib << 20)) return CFail("creating the shared memory budget", rc);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a.n_ctx);
  cp.n_threads = a.threads;
  mz_pool_params pp = mz_pool_default_params();
  pp.context = &cp;
  pp.persist_codec = a.persist_codec.c_str();
  std::vector<std::unique_ptr<ChatConv>> convs;
  for (const serve::ModelSpec& spec : specs) {
    const std::string dir = a.dir + "/" + spec.name;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    serve::ServedModel* m = nullptr;
    std::string what;
    if (int rc = set.Add(spec, dir, pp, nullptr, &m, &what)) return CFail(what, rc);
    char buf[1024];
    for (int32_t i = 0; mz_pool_damaged(m->pool, i, buf, sizeof buf) >= 0; ++i)
      std::fprintf(stderr, "warning: damaged, skipped: %s\n", buf);
    convs.push_back(std::make_unique<ChatConv>());
    if (int rc = convs.back()->Open(m->model, m->pool, dir, id)) return rc;
  }
  size_t cur = 0;
  auto print_models = [&] {
    for (size_t k = 0; k < set.size(); ++k) {
      mz_pool_weights_report w{};
      mz_pool_get_weights_report(set.at(k).pool, &w);
      std::fprintf(stderr, "  %s %-24s %4d tokens  weights %s resident, %s given back (%s of it in the page cache)\n",
                   k == cur ? "*" : " ", set.at(k).name.c_str(), convs[k]->tokens(), MibText(w.resident).c_str(),
                   MibText(w.dropped).c_str(), MibText(w.dropped_cached).c_str());
    }
    mz_budget_report b{};
    if (mz_budget_get_report(set.budget(), &b) == MZ_OK)
      std::fprintf(stderr, "  budget %s, in memory %s; given back %s (idle models' KV %s, their weights %s)\n",
                   b.memory_budget ? MibText(b.memory_budget).c_str() : "none", MibText(b.in_memory).c_str(),
                   MibText(b.bytes_evicted).c_str(), MibText(b.idle_model_kv_bytes).c_str(),
                   MibText(b.idle_model_weight_bytes).c_str());
  };
  std::fprintf(stderr,
               "[%zu models sharing one memory budget, conversation %s in each (%s/<model>); talking to %s. Commands: "
               "/model NAME, /models, /memory, /list, /quit]\n",
               set.size(), id.c_str(), a.dir.c_str(), set.front().name.c_str());
  print_models();
  auto sampler = NewSampler(temp, top_k, top_p, seed);
  if (!sampler) return CFail("sampler", MZ_ERR_INVALID_ARG);
  std::string line;
  while (true) {
    std::fprintf(stderr, "%s> ", set.at(cur).name.c_str());
    if (!std::getline(std::cin, line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/models") {
      print_models();
      continue;
    }
    if (line.rfind("/model", 0) == 0 && (line.size() == 6 || line[6] == ' ')) {
      std::string name = line.size() > 7 ? line.substr(7) : "";
      while (!name.empty() && name.back() == ' ') name.pop_back();
      serve::ServedModel* m = name.empty() ? nullptr : set.Find(name);
      if (!m) {
        std::fprintf(stderr, "usage: /model NAME (one of: %s)\n", set.Names().c_str());
        continue;
      }
      for (size_t k = 0; k < set.size(); ++k)
        if (&set.at(k) == m) cur = k;
      std::fprintf(stderr, "[now %s: conversation %s, %d tokens, %zu messages]\n", m->name.c_str(), id.c_str(),
                   convs[cur]->tokens(), convs[cur]->msgs.size());
      continue;
    }
    mz_pool* pool = set.at(cur).pool;
    if (line == "/memory" || line == "/list") {
      mz_conversation_report r;
      if (line == "/memory" && mz_pool_conversation_report(pool, id.c_str(), &r) == MZ_OK) PrintConversation(r);
      if (line == "/list") PrintList(pool);
      PrintPool(pool);
      continue;
    }
    if (line[0] == '/') {
      std::fprintf(stderr, "unknown command %s (/model NAME, /models, /memory, /list, /quit)\n", line.c_str());
      continue;
    }
    // The model's file must still be the one loaded: its weights given back are read from it again.
    if (mz_model_verify_file(set.at(cur).model) != MZ_OK) {
      std::fprintf(stderr, "error: model %s: %s; restart the chat to use the new file\n", set.at(cur).name.c_str(),
                   mz_last_error());
      continue;
    }
    convs[cur]->Turn(line, sampler.get(), a.n_predict);
  }
  convs.clear();  // the handles go before the pools (set's destructor)
  return 0;
}

int RunList(PoolArgs& a, bool json) {
  Handles h;
  if (int rc = OpenPool(a, &h)) return rc;
  std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(h.pool, nullptr, 0))));
  mz_pool_list(h.pool, all.data(), int32_t(all.size()));
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : all)
      j.push_back({{"id", r.id}, {"tokens", r.stored_tokens}, {"stored_bytes", r.stored_bytes},
                   {"last_use_unix_ms", r.last_use_unix_ms}});
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("| conversation | tokens | stored | last use |\n|---|---|---|---|\n");
  for (const auto& r : all)
    std::printf("| %s | %d | %s | %s |\n", r.id, int(r.stored_tokens), MibText(r.stored_bytes).c_str(),
                When(r.last_use_unix_ms).c_str());
  return 0;
}

int RunRemove(PoolArgs& a, const std::string& id) {
  Handles h;
  if (int rc = OpenPool(a, &h)) return rc;
  if (int rc = mz_pool_delete(h.pool, id.c_str())) return CFail("deleting " + id, rc);
  std::remove(SidecarPath(a.dir, id).c_str());
  std::fprintf(stderr, "deleted %s\n", id.c_str());
  return 0;
}

}  // namespace

void AddConversationCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<PoolArgs>();
  auto* c = app.add_subcommand("conversations", "list the pool's stored conversations (tokens, bytes, last use); rm NAME deletes one");
  c->add_option("--dir", a->dir, "the pool's folder (default: <cache>/conversations)");
  c->add_option("-m,--model", a->model, "GGUF the conversations were made with (default: the synthesized Qwen3-0.6B)");
  auto json = std::make_shared<bool>(false);
  c->add_flag("--json", *json, "JSON instead of a markdown table");
  auto rm_id = std::make_shared<std::string>();
  auto* rm = c->add_subcommand("rm", "delete a conversation (its stored KV and text)");
  rm->add_option("name", *rm_id, "conversation name")->required();
  runners.push_back([c, rm, a, json, rm_id]() -> int {
    if (!c->parsed()) return -1;
    if (rm->parsed()) return RunRemove(*a, *rm_id);
    return RunList(*a, *json);
  });
}

int RunConversationChat(const std::string& model, const std::string& dir, const std::string& id, int threads, int n_ctx,
                        int n_predict, uint64_t memory_budget_mib, float temp, int top_k, float top_p, uint32_t seed,
                        const std::string& weights) {
  PoolArgs a;
  a.weights = weights;
  a.model = model;
  a.dir = dir;
  a.threads = threads;
  a.n_ctx = n_ctx;
  a.n_predict = n_predict;
  a.memory_budget_mib = memory_budget_mib;
  return RunPoolChat(a, id, temp, top_k, top_p, seed);
}

int RunModelsChat(const std::vector<std::string>& models, const std::string& dir, const std::string& id, int threads,
                  int n_ctx, int n_predict, uint64_t memory_budget_mib, float temp, int top_k, float top_p,
                  uint32_t seed, const std::string& weights) {
  PoolArgs a;
  a.weights = weights;
  a.dir = dir;
  a.threads = threads;
  a.n_ctx = n_ctx;
  a.n_predict = n_predict;
  a.memory_budget_mib = memory_budget_mib;
  return ModelsChat(models, a, id.empty() ? "chat" : id, temp, top_k, top_p, seed);
}

}  // namespace mz::cli
