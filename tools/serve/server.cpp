// The server's admission, turns, pool report, start and stop (tools/serve/server.h).
#include "tools/serve/server.h"

#include <signal.h>
#include <unistd.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <random>
#include <thread>

#include "tools/cli/c_api_text.h"
#include "tools/common.h"
#include "tools/bench/os_memory.h"
#include "tools/serve/text_stream.h"
#include "tools/weights_option.h"

namespace mz::cli::serve_app {

using nlohmann::json;
using serve::ApiError;
using serve::ChatRequest;

bool IsLoopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Constant-time comparison of the presented key with the configured one.
bool KeyMatches(const std::string& got, const std::string& want) {
  unsigned diff = unsigned(got.size() ^ want.size());
  for (size_t i = 0; i < want.size(); ++i) diff |= unsigned(uint8_t(want[i]) ^ uint8_t(i < got.size() ? got[i] : 0));
  return diff == 0;
}

std::string RandomId(const char* prefix) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lk(mu);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, (unsigned long long)rng());
  return buf;
}

// The ids the server gives conversations it found no match for ("c-" and 16 hex digits): the only
// ones requests are routed to by their history. A client's own names are reached by name only.
bool ImplicitId(const std::string& id) {
  if (id.size() != 18 || id.compare(0, 2, "c-") != 0) return false;
  for (size_t i = 2; i < id.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(id[i]))) return false;
  return true;
}

int64_t UnixNow() { return int64_t(std::time(nullptr)); }


struct Server::Job {
  Server* s = nullptr;
  serve::ServedModel* m = nullptr;  // the model whose pool holds the conversation
  ChatRequest req;
  std::vector<mz_token> prompt;
  serve::Router::Claim claim;
  mz_conversation* conv = nullptr;
  int slot = -1;  // its place in slots_ (-1: none)
  bool finished = false, was_empty = false;
  int shared_before = 0;
  // When the handler got the request, parsed it, had its model (checked), its prompt's text
  // (template), its prompt's tokens and its claim; when the
  // stream's provider started and had written the role chunk (streamed only): the phases_ms of the
  // response's "mzcache" object.
  using Clock = std::chrono::steady_clock;
  Clock::time_point t_in, t_parsed, t_model, t_rendered, t_prompt, t_claimed, t_provider, t_role;
  ~Job() {
    if (conv) mz_conversation_release(conv);
    if (!finished && !claim.id.empty()) m->router.Abandon(claim.id, false);
    if (slot >= 0) {
      s->processing_--;
      s->slots_.Release(slot);
    }
  }
  // Moves the job onto a fresh claim (a new, empty conversation) after its own was found damaged.
  // The old claim must have been ended already (FinishJob with damaged = true); its handle is
  // released here. Returns mz_pool_open's status; on failure the job holds no handle, and its
  // destructor abandons the fresh claim.
  int Rebind(serve::Router::Claim fresh) {
    if (conv) mz_conversation_release(conv);
    conv = nullptr;
    claim = std::move(fresh);
    claim.keep = 0;
    finished = false;
    was_empty = true;
    return mz_pool_open(m->pool, claim.id.c_str(), &conv);
  }
};

bool Server::Authorized(const httplib::Request& req, httplib::Response& res) {
  if (a_.api_key.empty()) return true;
  const std::string h = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (h.size() > prefix.size() && h.compare(0, prefix.size(), prefix) == 0 && KeyMatches(h.substr(prefix.size()), a_.api_key))
    return true;
  ApiError e;
  e.http = 401;
  e.message = h.empty() ? "missing API key (Authorization: Bearer KEY)" : "incorrect API key";
  e.code = "invalid_api_key";
  Error(res, e);
  return false;
}

void Server::Error(httplib::Response& res, const ApiError& e) {
  res.status = e.http;
  if (e.http == 503) res.set_header("Retry-After", "1");  // the queue is full or a conversation is busy: soon
  res.set_content(serve::ErrorBody(e), "application/json");
}

serve::ServedModel* Server::ModelFor(const ChatRequest& r, ApiError* err) {
  serve::ServedModel* m = models_.Resolve(r.model);
  if (!m) {
    err->http = 400;
    err->param = "model";
    err->code = "model_not_found";
    err->message = "model '" + serve::SanitizeUtf8(r.model.substr(0, 200)) + "' is not served here; the models are: " +
                   models_.Names();
    return nullptr;
  }
  if (!r.conversation.empty() && models_.size() > 1) {
    // A conversation keeps its model for life: another model cannot continue it (its KV means
    // nothing to another model's layers), and silently answering from the conversation's own
    // model would answer as a model the client did not ask for.
    serve::ServedModel* owner = models_.OwnerOf(r.conversation);
    if (owner && owner != m) {
      err->http = 400;
      err->param = "conversation";
      err->message = "conversation '" + r.conversation + "' belongs to model '" + owner->name + "', not '" + m->name +
                     "': continue it with \"model\": \"" + owner->name + "\", or start a new one";
      return nullptr;
    }
  }
  // The file the model's weights are read back from must be the one loaded: a weight unit given
  // back is read again from it, and a changed file would mix old and new layers.
  if (int rc = mz_model_verify_file(m->model); rc != MZ_OK) {
    err->http = 409;
    err->type = "server_error";
    err->code = rc == MZ_ERR_MODEL_CHANGED ? "model_changed" : "model_unavailable";
    err->param = "model";
    err->message = "model '" + m->name + "': its file " + m->path +
                   (rc == MZ_ERR_MODEL_CHANGED ? " changed on disk since the server loaded it" : " cannot be checked") +
                   " (" + mz_last_error() + "); nothing is served from it until the server restarts";
    return nullptr;
  }
  return m;
}

bool Server::Prompt(serve::ServedModel& m, const ChatRequest& r, std::vector<mz_token>* out, ApiError* err,
                    std::chrono::steady_clock::time_point* rendered) {
  mz_model* const model_ = m.model;
  std::string text;
  if (!r.chat) {
    text = r.prompt;
  } else if (r.jinja) {
    // Tool calling goes through the model's own Jinja template (mz_chat_render), which carries the
    // tool syntax; plain chats keep mz_chat_apply_template (llama.cpp's built-in template
    // heuristics), the text every stored conversation of earlier versions was computed from, so
    // their prefixes keep matching. The two agree for plain chats of Qwen3 and Llama 3.2
    // (tests/test_chat_render.cpp), except Llama 3.x's Jinja system header ("Cutting Knowledge
    // Date ... Today Date ..."), which changes with the date and would break the prefix match of
    // every returning conversation each day.
    const char* tmpl = chat_template_.empty() ? nullptr : chat_template_.c_str();
    const char* tools = r.tools_json.empty() ? nullptr : r.tools_json.c_str();
    int32_t n = mz_chat_render(model_, tmpl, r.messages_json.c_str(), tools, true, nullptr, 0);
    if (n >= 0) {
      text.resize(size_t(n) + 1);
      n = mz_chat_render(model_, tmpl, r.messages_json.c_str(), tools, true, text.data(), int32_t(text.size()));
      text.resize(n >= 0 ? size_t(n) : 0);
    }
    if (n < 0) {
      err->http = 400;
      err->param = "messages";
      err->message = std::string("the model's chat template cannot render this request: ") + mz_last_error();
      return false;
    }
  } else if (ApplyChatTemplate(model_, r.messages, true, &text) != MZ_OK) {
    err->http = 400;
    err->message = std::string("the model's chat template cannot be applied: ") + mz_last_error();
    return false;
  }
  *rendered = std::chrono::steady_clock::now();
  // A chat's text (special tokens parsed) through the model's prompt cache: a resent history
  // reuses its previous turn's tokens (exactly the full tokenization's; tools/serve/prompt_tokens.h).
  const int rc = r.chat ? m.prompt_tokens.Tokenize(model_, text, out) : TokenizeText(model_, text, true, false, out);
  if (rc != MZ_OK) {
    err->http = 400;
    err->message = std::string("the prompt cannot be tokenized: ") + CError(rc);
    return false;
  }
  if (out->empty()) {
    err->http = 400;
    err->message = "the prompt tokenizes to nothing";
    return false;
  }
  const int32_t n = int32_t(out->size());
  if (n >= a_.n_ctx) {
    err->http = 400;
    err->message = "the prompt has " + std::to_string(n) + " tokens; this server's context holds " +
                   std::to_string(a_.n_ctx) + " (prompt and reply)";
    err->code = "context_length_exceeded";
    err->param = r.chat ? "messages" : "prompt";
    return false;
  }
  return true;
}

std::shared_ptr<Server::Job> Server::Claim(serve::ServedModel& m, const ChatRequest& r, std::vector<mz_token> prompt,
                                           ApiError* err) {
  auto job = std::make_shared<Job>();
  job->s = this;
  job->m = &m;
  serve::Router& router_ = m.router;
  mz_pool* const pool_ = m.pool;
  job->req = r;
  job->prompt = std::move(prompt);
  deferred_++;
  const int slot = slots_.Acquire();
  deferred_--;
  if (slot < 0) {
    err->http = 503;
    err->type = "server_error";
    err->message = "too many requests waiting; retry later";
    return nullptr;
  }
  processing_++;
  job->slot = slot;
  if (!r.conversation.empty()) {
    std::string why;
    if (!router_.AcquireId(r.conversation, job->prompt, &job->claim, &why)) {
      err->http = 409;
      err->message = why;
      err->param = "conversation";
      return nullptr;
    }
  } else {
    // A client that dropped a stream and resends its history at once waits for the turn being
    // cancelled (serve::Router::Wait) rather than fork it: up to 300 ms for a turn that has not
    // yet written since its client left (it learns it at its next write or the one after), then up
    // to 2 s more once it has (its turn stops after the token it is computing, then commits).
    serve::Router::Wait wait;
    wait.busy = std::chrono::milliseconds(300);
    wait.releasing = std::chrono::milliseconds(2000);
    job->claim = router_.Acquire(job->prompt, RandomId("c-"), wait);
  }
  if (mz_pool_open(pool_, job->claim.id.c_str(), &job->conv) != MZ_OK) {
    err->http = 500;
    err->type = "server_error";
    err->message = "opening conversation " + job->claim.id + ": " + mz_last_error();
    router_.Abandon(job->claim.id, true);
    job->claim.id.clear();
    return nullptr;
  }
  // What the pool really holds decides what is kept. A conversation whose history is not the one
  // the router matched (it changed behind the router: the disk budget deleted it, a failed call)
  // is not cut: the request forks into a new conversation instead. An empty one (deleted) is
  // simply filled again.
  std::vector<mz_token> history;
  int st = History(m, job->claim.id, &history);
  if (st == MZ_OK && !job->claim.is_new && r.conversation.empty() && !history.empty() && history != job->claim.expected) {
    std::fprintf(stderr, "[serve] conversation %s changed behind the router (%zu tokens, %zu expected): forking\n",
                 job->claim.id.c_str(), history.size(), job->claim.expected.size());
    router_.Abandon(job->claim.id, false);
    mz_conversation_release(job->conv);
    job->conv = nullptr;
    job->claim = router_.Acquire(job->prompt, RandomId("c-"));
    if (mz_pool_open(pool_, job->claim.id.c_str(), &job->conv) != MZ_OK) st = MZ_ERR_INTERNAL;
    else st = History(m, job->claim.id, &history);
  }
  if (st != MZ_OK) {
    err->http = 503;
    err->type = "server_error";
    err->message = "conversation " + job->claim.id + " cannot be read now: " + mz_last_error();
    return nullptr;
  }
  job->claim.keep = int(std::min(serve::CommonPrefix(history, job->prompt), job->prompt.size() - 1));
  job->was_empty = history.empty();
  return job;
}

// The pool's history of conversation id (serve::ReadConversation, without its turn mark).
int Server::History(serve::ServedModel& m, const std::string& id, std::vector<mz_token>* out) {
  return serve::ReadConversation(m.pool, id, out, nullptr);
}

serve::TurnResult Server::Turn(Job& job, const serve::EmitFn& emit) {
  serve::TurnParams tp;
  tp.sampler.temperature = job.req.temperature;
  tp.sampler.top_p = job.req.top_p;
  tp.sampler.top_k = job.req.top_k;
  tp.sampler.seed = job.req.seed ? *job.req.seed : uint32_t(std::random_device{}());
  tp.max_tokens = std::min(job.req.max_tokens > 0 ? job.req.max_tokens : a_.max_tokens, a_.max_tokens);
  tp.n_ctx = a_.n_ctx;
  tp.stop = job.req.stop;
  tp.top_logprobs = job.req.top_logprobs;
  serve::SlotTask task;  // what GET /slots shows of this turn
  task.conversation = job.claim.id;
  task.model = job.m->id;
  task.n_prompt_tokens = int(job.prompt.size());
  task.n_prompt_tokens_cache = job.claim.keep;
  task.n_predict = tp.max_tokens;
  task.temperature = tp.sampler.temperature;
  task.top_p = tp.sampler.top_p;
  task.top_k = tp.sampler.top_k;
  task.seed = tp.sampler.seed;
  task.stream = job.req.stream;
  slots_.Start(job.slot, std::move(task));
  tp.decoded = slots_.Decoded(job.slot);
  const std::optional<std::string> script = scripted_.Next();  // TEST HOOK (none unless configured)
  if (script) tp.scripted = &*script;
  // tool_choice "required" or a named function: the reply is constrained to one call
  // (tools/serve/tool_constraint.h); tools_json holds the tools offered (only the named one).
  std::optional<serve::ToolCallConstraint> constraint;
  if (job.req.parse_tool_calls && (job.req.tool_choice == "required" || job.req.tool_choice == "function")) {
    constraint.emplace(job.m->tool_syntax, nlohmann::ordered_json::parse(job.req.tools_json, nullptr, false),
                       job.req.tool_choice_name);
    tp.constraint = &*constraint;
  }
  bool emitted = false;
  auto counting = [&](const std::string& s, const std::vector<serve::TokenLogprob>& lps) {
    emitted = true;
    return emit(s, lps);
  };
  serve::TurnResult r = serve::RunTurn(job.m->model, job.conv, job.prompt, job.claim.keep, tp, counting);
  const bool storage_fault = r.status == MZ_ERR_CORRUPT || r.status == MZ_ERR_IO;
  if (storage_fault && !emitted) {
    // The conversation's stored or swapped data failed its checksum or could not be read: it is
    // never used again (kept in the pool for the operator), and this turn is computed from the
    // request's own history in a new conversation. Nothing wrong is ever answered from it.
    std::fprintf(stderr, "[serve] conversation %s is damaged (%s): recomputing the request in a new one\n",
                 job.claim.id.c_str(), r.error.c_str());
    recovered_++;
    metrics_.Add("mzcache_recomputed_tokens_total",
                 "Prompt tokens computed again because their conversation's stored or swapped data was damaged",
                 double(job.prompt.size()));
    FinishJob(job, /*damaged=*/true, {});
    if (job.Rebind(job.m->router.Acquire(job.prompt, RandomId("c-"))) != MZ_OK) {
      r.status = MZ_ERR_INTERNAL;
      r.error = mz_last_error();
      return r;
    }
    r = serve::RunTurn(job.m->model, job.conv, job.prompt, 0, tp, counting);
  }
  return r;
}

// Ends the job's claim: the router learns the conversation's history after the turn (the turn's
// own account of it: what it kept, computed and decoded), or that it is damaged.
void Server::FinishJob(Job& job, bool damaged, const std::vector<mz_token>& history) {
  if (job.finished || job.claim.id.empty()) return;
  job.finished = true;
  if (damaged) {
    job.m->router.Abandon(job.claim.id, true);
    return;
  }
  job.m->router.Release(job.claim.id);
}

void Server::Completions(const httplib::Request& req, httplib::Response& res, bool chat) {
  const Job::Clock::time_point t_in = Job::Clock::now();
  requests_++;
  ChatRequest r;
  ApiError err;
  std::vector<mz_token> prompt;
  serve::ServedModel* m = nullptr;
  if (!serve::ParseRequest(req.body, chat, limits_, &r, &err)) {
    failures_++;
    return Error(res, err);
  }
  // A fleet's clients send back the X-Mz-Conversation of the last reply (its load balancer routes
  // by it): the conversation to continue, as the body's "conversation" (which wins).
  if (r.conversation.empty() && req.has_header("X-Mz-Conversation")) {
    const std::string id = req.get_header_value("X-Mz-Conversation");
    if (!serve::ValidConversationId(id)) {
      failures_++;
      ApiError e;
      e.http = 400;
      e.message = "X-Mz-Conversation must be 1-128 of [A-Za-z0-9._-], not starting with '.'";
      e.param = "conversation";
      return Error(res, e);
    }
    r.conversation = id;
  }
  const Job::Clock::time_point t_parsed = Job::Clock::now();
  Job::Clock::time_point t_model = t_parsed, t_rendered = t_parsed;
  if (!(m = ModelFor(r, &err)) || ((t_model = Job::Clock::now()), !Prompt(*m, r, &prompt, &err, &t_rendered))) {
    failures_++;
    if (err.code == "model_changed") res.set_header("x-should-retry", "false");  // the openai client retries a 409 otherwise
    return Error(res, err);
  }
  const Job::Clock::time_point t_prompt = Job::Clock::now();
  std::shared_ptr<Job> job = Claim(*m, r, std::move(prompt), &err);
  if (!job) {
    failures_++;
    return Error(res, err);
  }
  job->t_in = t_in;
  job->t_parsed = t_parsed;
  job->t_model = t_model;
  job->t_rendered = t_rendered;
  job->t_prompt = t_prompt;
  job->t_claimed = Job::Clock::now();
  const std::string id = RandomId(chat ? "chatcmpl-" : "cmpl-");
  const int64_t created = UnixNow();
  const std::string model_id_ = m->id;
  auto usage = [this](const Job& j, const serve::TurnResult& t, serve::Usage* u, serve::TurnInfo* info) {
    u->prompt_tokens = int(j.prompt.size());
    u->completion_tokens = t.completion_tokens;
    mz_conversation_report cr;
    int shared = 0;
    if (mz_pool_conversation_report(j.m->pool, j.claim.id.c_str(), &cr) == MZ_OK) shared = cr.shared_chunks;
    u->cached_tokens = j.was_empty ? std::min(int(j.prompt.size()) - 1, shared * j.m->chunk_tokens) : j.claim.keep;
    info->conversation = j.claim.id;
    info->new_conversation = j.was_empty;
    info->ttft_s = t.restore.ttft_s;
    info->reload_s = t.restore.reload_s;
    info->wait_s = t.restore.wait_s;
    info->bytes_from_storage = t.restore.bytes_from_storage;
    info->units_restored = t.restore.units_restored;
    info->bytes_decoded = t.restore.bytes_decoded;
    info->bytes_read_compressed = t.restore.bytes_read_compressed;
    info->alloc_s = t.restore.alloc_s;
    info->restore_cpu_s = t.restore.cpu_s;
    auto ms = [](Job::Clock::time_point a, Job::Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    info->phases_ms = {{"parse", ms(j.t_in, j.t_parsed)}, {"model", ms(j.t_parsed, j.t_model)},
                       {"template", ms(j.t_model, j.t_rendered)},
                       {"tokenize", ms(j.t_rendered, j.t_prompt)},
                       {"claim", ms(j.t_prompt, j.t_claimed)}};
    if (j.req.stream)
      info->phases_ms.insert(info->phases_ms.end(), {{"to_stream", ms(j.t_claimed, j.t_provider)},
                                                     {"role_chunk", ms(j.t_provider, j.t_role)}});
    info->phases_ms.insert(info->phases_ms.end(),
                           {{"truncate", t.truncate_s * 1e3}, {"restore_generate", t.prompt_s * 1e3},
                            {"turn_mark", t.mark_s * 1e3}, {"first_sample", t.first_sample_s * 1e3},
                            {"first_text", t.first_text_s * 1e3}});
    RecordTurn(t, u->prompt_tokens - u->cached_tokens, u->cached_tokens, &info->timings);  // once per turn
  };
  auto record = [this](const serve::Usage& u, const serve::TurnInfo& info) {
    serve::TurnRecord rec;
    rec.conversation = info.conversation;
    rec.new_conversation = info.new_conversation;
    rec.prompt_tokens = u.prompt_tokens;
    rec.cached_tokens = u.cached_tokens;
    rec.completion_tokens = u.completion_tokens;
    rec.ttft_s = info.ttft_s;
    rec.reload_s = info.reload_s;
    rec.bytes_from_storage = info.bytes_from_storage;
    rec.units_restored = info.units_restored;
    activity_.AddTurn(std::move(rec));
  };
  if (!r.stream) {
    serve::TurnResult t = Turn(*job, [](const std::string&, const std::vector<serve::TokenLogprob>&) { return true; });
    FinishJob(*job, false, t.history);
    if (t.status != MZ_OK) {
      failures_++;
      ApiError e;
      e.http = 500;
      e.type = "server_error";
      e.message = std::string(mz_status_str(t.status)) + ": " + t.error;
      return Error(res, e);
    }
    serve::Usage u;
    serve::TurnInfo info;
    usage(*job, t, &u, &info);
    record(u, info);
    res.set_header("X-Mz-Conversation", job->claim.id);
    json body = serve::CompletionBody(r, id, model_id_, created, t.text, t.finish_reason, u, info, t.logprobs);
    if (r.parse_tool_calls) {  // the reply read for tool calls (tools/serve/tool_calls.h)
      serve::ToolCallStream tcs(m->tool_syntax, [] { return RandomId("call_"); });
      std::vector<serve::ToolEvent> ev;
      tcs.Push(t.text, &ev);
      tcs.Finish(&ev);
      if (!tcs.calls().empty()) {
        json& choice = body["choices"][0];
        choice["message"]["content"] = tcs.content().empty() ? json(nullptr) : json(tcs.content());
        choice["message"]["tool_calls"] = serve::ToolCallsJson(tcs.calls());
        if (t.finish_reason == "stop") choice["finish_reason"] = "tool_calls";
      }
    }
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Mz-Conversation", job->claim.id);
  res.set_chunked_content_provider("text/event-stream", [this, job, id, created, usage, record, model_id_](size_t, httplib::DataSink& sink) {
    const ChatRequest& r = job->req;
    auto send = [&](const json& j) {
      const std::string ev = serve::SseEvent(j);
      if (sink.write(ev.data(), ev.size())) return true;
      job->m->router.Releasing(job->claim.id);  // the client is gone: the turn stops; its history may come back at once
      return false;
    };
    bool alive = true;
    job->t_provider = Job::Clock::now();
    if (r.chat) alive = send(serve::ChunkBody(r, id, model_id_, created, nullptr, nullptr, /*role_only=*/true));
    job->t_role = Job::Clock::now();
    serve::TurnResult t;
    size_t offset = 0;  // completions' text_offset of the next chunk's first token: bytes sent so far
    auto advance = [&offset](const std::vector<serve::TokenLogprob>& lps) {
      const size_t at = offset;
      for (const serve::TokenLogprob& l : lps) offset += l.piece.size();
      return at;
    };
    // With tools, the text goes through the tool-call reader first: content streams as it comes,
    // each call as one tool_calls delta once complete (tools/serve/tool_calls.h).
    std::optional<serve::ToolCallStream> tcs;
    if (r.parse_tool_calls) tcs.emplace(job->m->tool_syntax, [] { return RandomId("call_"); });
    auto send_events = [&](const std::vector<serve::ToolEvent>& ev, const std::vector<serve::TokenLogprob>& lps,
                           size_t at) {
      bool ok = true, lps_sent = false;
      for (const serve::ToolEvent& e : ev) {
        const std::vector<serve::TokenLogprob> none;
        const std::vector<serve::TokenLogprob>* l = lps_sent ? &none : &lps;
        lps_sent = true;
        if (!e.is_call) {
          ok = ok && send(serve::ChunkBody(r, id, model_id_, created, &e.content, nullptr, false, l, at));
        } else {
          json c = serve::ChunkBody(r, id, model_id_, created, nullptr, nullptr, false, l, at);
          c["choices"][0]["delta"]["tool_calls"] = serve::ToolCallDeltaJson(e.index, e.call);
          ok = ok && send(c);
        }
      }
      if (!lps_sent && !lps.empty()) ok = send(serve::ChunkBody(r, id, model_id_, created, nullptr, nullptr, false, &lps, at));
      return ok;
    };
    if (alive) {
      t = Turn(*job, [&](const std::string& text, const std::vector<serve::TokenLogprob>& lps) {
        const size_t at = advance(lps);
        if (tcs) {
          std::vector<serve::ToolEvent> ev;
          tcs->Push(text, &ev);
          return send_events(ev, lps, at);
        }
        return send(serve::ChunkBody(r, id, model_id_, created, &text, nullptr, false, &lps, at));
      });
      FinishJob(*job, false, t.history);
    } else {
      t.finish_reason = "cancelled";  // the turn never ran: the job's destructor abandons the claim
    }
    if (t.status != MZ_OK) {
      failures_++;
      ApiError e;
      e.type = "server_error";
      e.message = std::string(mz_status_str(t.status)) + ": " + t.error;
      const std::string ev = "data: " + serve::ErrorBody(e) + "\n\n";
      sink.write(ev.data(), ev.size());
    } else if (t.finish_reason != "cancelled") {
      // The last chunk carries the logprobs of tokens whose text never went out (held back, or
      // after a stop string).
      const std::vector<serve::TokenLogprob> rest(t.logprobs.begin() + std::ptrdiff_t(t.logprobs_emitted),
                                                  t.logprobs.end());
      const size_t at = advance(rest);
      if (tcs) {
        std::vector<serve::ToolEvent> ev;
        tcs->Finish(&ev);
        send_events(ev, {}, at);
        if (!tcs->calls().empty() && t.finish_reason == "stop") t.finish_reason = "tool_calls";
      }
      serve::Usage u;
      serve::TurnInfo info;
      usage(*job, t, &u, &info);
      record(u, info);
      json last = serve::ChunkBody(r, id, model_id_, created, nullptr, &t.finish_reason, false, &rest, at);
      last["timings"] = serve::TimingsJson(info.timings);  // as llama-server's last chunk
      send(last);
      if (r.include_usage) send(serve::UsageChunkBody(r, id, model_id_, created, u, info));
    }
    if (t.finish_reason != "cancelled") {
      static const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
    }
    sink.done();
    return true;
  });
}

// The pool report (GET /v1/mzcache/pool): with several models, "pool" sums every model's pool
// (memory_budget: the shared one) and "models" gives each model's share; with one, "pool" is its
// pool's, as before several models existed.
json Server::PoolJson() {
  json j = json::object();
  const mz_pool_report p = models_.SumReport();
  j["pool"] = {{"conversations", p.n_conversations}, {"open", p.n_open}, {"damaged", p.n_damaged},
               {"weights_total", p.weights_total}, {"weights_resident", p.weights_resident},
               {"kv_resident", p.kv_resident}, {"kv_mem_compressed", p.kv_mem_compressed},
               {"kv_storage", p.kv_storage}, {"in_memory", p.in_memory}, {"stored_bytes", p.stored_bytes},
               {"memory_budget", p.memory_budget}, {"disk_budget", p.disk_budget},
               {"conversations_lost", p.conversations_lost}, {"persists", p.persists},
               {"persist_failures", p.persist_failures}, {"prefix_chunks_reused", p.prefix_chunks_reused},
               {"evictions", p.evictions}, {"bytes_evicted", p.bytes_evicted}};
  activity_.NoteEvicted(p.bytes_evicted);
  json list = json::array(), dmg = json::array();
  mz_pool_batch_report bt{};
  bool any_batch = false;
  for (size_t k = 0; k < models_.size(); ++k) {
    serve::ServedModel& m = models_.at(k);
    std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(m.pool, nullptr, 0))));
    const int32_t n = mz_pool_list(m.pool, all.data(), int32_t(all.size()));
    for (int32_t i = 0; i < std::min<int32_t>(n, int32_t(all.size())); ++i) {
      const auto& r = all[size_t(i)];
      list.push_back({{"id", r.id}, {"model", m.name}, {"tokens", r.n_tokens}, {"open", r.open}, {"busy", r.busy},
                      {"kv_resident", r.kv_resident}, {"kv_mem_compressed", r.kv_mem_compressed},
                      {"kv_storage", r.kv_storage}, {"stored_bytes", r.stored_bytes}, {"stored_tokens", r.stored_tokens},
                      {"last_use_unix_ms", r.last_use_unix_ms}, {"shared_chunks", r.shared_chunks}});
    }
    char buf[1024];
    for (int32_t i = 0; mz_pool_damaged(m.pool, i, buf, sizeof buf) >= 0; ++i) dmg.push_back(buf);
    // The pools' forward passes (continuous batching, since 0.13): what they have computed so far.
    if (mz_pool_batch_report b{}; mz_pool_get_batch_report(m.pool, &b) == MZ_OK) {
      any_batch = true;
      bt.batching = b.batching;
      bt.steps += b.steps;
      bt.seq_slots += b.seq_slots;
      bt.max_batch = std::max(bt.max_batch, b.max_batch);
      bt.tokens += b.tokens;
      bt.prefill_tokens += b.prefill_tokens;
      bt.cancelled += b.cancelled;
      bt.compute_buffer_bytes += b.compute_buffer_bytes;
      bt.in_use += b.in_use;
      bt.budget_spared_in_use += b.budget_spared_in_use;
    }
  }
  j["conversations"] = list;
  j["damaged_files"] = dmg;
  j["server"] = {{"requests", requests_.load()}, {"failures", failures_.load()}, {"recovered", recovered_.load()}};
  if (any_batch)
    j["batch"] = {{"batching", bt.batching}, {"steps", bt.steps},
                  {"mean_batch", bt.steps ? double(bt.seq_slots) / double(bt.steps) : 0.0}, {"max_batch", bt.max_batch},
                  {"tokens", bt.tokens}, {"prefill_tokens", bt.prefill_tokens}, {"cancelled", bt.cancelled},
                  {"compute_buffer_bytes", bt.compute_buffer_bytes}, {"in_use", bt.in_use},
                  {"budget_spared_in_use", bt.budget_spared_in_use}};
  const json models = ModelsJson();
  j["models"] = models["models"];
  if (models.contains("budget")) j["budget"] = models["budget"];
  uint64_t rss = 0, swap = 0;
  ProcMemory(int(getpid()), &rss, &swap);
  j["rss"] = rss;  // the whole process (0: unknown)
  j["events"] = activity_.EventsJson();
  j["turns"] = activity_.TurnsJson();
  return j;
}

json Server::ModelsJson() {
  json list = json::array();
  for (size_t k = 0; k < models_.size(); ++k) {
    serve::ServedModel& m = models_.at(k);
    mz_pool_weights_report w{};
    mz_pool_report p{};
    mz_pool_get_weights_report(m.pool, &w);
    mz_pool_get_report(m.pool, &p);
    list.push_back({{"name", m.name}, {"id", m.id}, {"path", m.path}, {"dir", m.dir},
                    {"weights", {{"total", w.total}, {"resident", w.resident}, {"dropped", w.dropped},
                                 {"dropped_cached", w.dropped_cached}, {"evicted", w.dropped - std::min(w.dropped, w.dropped_cached)},
                                 {"units", w.units}, {"units_resident", w.units_resident}}},
                    {"in_use", w.in_use}, {"last_use_unix_ms", w.last_use_unix_ms},
                    {"conversations", p.n_conversations}, {"kv_resident", p.kv_resident},
                    {"kv_mem_compressed", p.kv_mem_compressed}, {"in_memory", p.in_memory}});
  }
  json out = {{"models", list}};
  if (mz_budget_report b{}; models_.shared() && mz_budget_get_report(models_.budget(), &b) == MZ_OK)
    out["budget"] = {{"memory_budget", b.memory_budget}, {"in_memory", b.in_memory}, {"pools", b.n_pools},
                     {"passes", b.passes}, {"bytes_evicted", b.bytes_evicted},
                     {"idle_model_kv_bytes", b.idle_model_kv_bytes}, {"idle_model_weight_bytes", b.idle_model_weight_bytes},
                     {"active_model_bytes", b.active_model_bytes}, {"pressure_events", b.pressure_events},
                     {"pressure_bytes", b.pressure_bytes}, {"evict_calls", b.evict_calls}, {"evict_bytes", b.evict_bytes}};
  return out;
}

void Server::PressureAction(const mz_pressure_action* a, void* self) {
  auto* s = static_cast<Server*>(self);
  const std::string source = a->source ? a->source : "";
  if (a->status != MZ_OK) {
    s->activity_.AddEvent("error", 0, source + ": " + (a->error ? a->error : ""));
  } else if (a->restored || source == "restore-ahead") {
    // A restore-ahead slice; one still waiting for free memory is not an event.
    if (a->restored && a->restored_bytes > 0) s->activity_.AddEvent("restore", a->restored_bytes, source);
  } else {
    std::string detail = source + ": " + (a->level_name ? a->level_name : "");
    if (a->note && *a->note) detail += std::string(" (") + a->note + ")";
    s->activity_.AddEvent("pressure", a->freed, detail);
  }
}

int Server::Start() {
  if (!IsLoopback(a_.host) && a_.api_key.empty()) {
    std::fprintf(stderr, "error: --host %s is not loopback: set an API key first (--api-key or MZ_API_KEY)\n", a_.host.c_str());
    return 2;
  }
  if (a_.dir.empty()) a_.dir = CacheDir() + "/server";
  {
    std::string why;
    if (!serve::ListModels(a_.models, a_.models_dir, &specs_, &why)) {
      std::fprintf(stderr, "error: %s\n", why.c_str());
      return 2;
    }
    if (specs_.size() > 1 && !a_.alias.empty()) {
      std::fprintf(stderr, "error: --alias names the one model served; with several, each is named by its file's stem\n");
      return 2;
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(a_.dir + "/serve", ec);
  if (ec) {
    std::fprintf(stderr, "error: cannot create %s/serve: %s\n", a_.dir.c_str(), ec.message().c_str());
    return 1;
  }
  if (!a_.chat_template_file.empty()) {  // the Jinja template of tool calling (as llama-server's option)
    std::ifstream f(a_.chat_template_file, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f || ss.str().empty()) {
      std::fprintf(stderr, "error: --chat-template-file %s: cannot read it, or it is empty\n", a_.chat_template_file.c_str());
      return 2;
    }
    chat_template_ = ss.str();
  }
  if (!a_.test_scripted_replies.empty()) {  // TEST HOOK: loopback only (tools/serve/scripted_replies.h)
    if (!IsLoopback(a_.host)) {
      std::fprintf(stderr, "error: --test-scripted-replies is a test hook: only on a loopback --host\n");
      return 2;
    }
    std::string e;
    if (!scripted_.Load(a_.test_scripted_replies, &e)) {
      std::fprintf(stderr, "error: --test-scripted-replies: %s\n", e.c_str());
      return 2;
    }
    std::fprintf(stderr, "[serve] TEST HOOK: replies scripted from %s\n", a_.test_scripted_replies.c_str());
  }
  return Bind();
}

int Server::Load() {
  // Tests see the loading state for this long (tests/serve_obs.py): a test hook, off by default.
  if (const char* d = std::getenv("MZ_SERVE_TEST_LOAD_DELAY_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(d)));
  if (specs_.empty()) {  // no -m, no --models-dir: the synthesized Qwen3-0.6B
    serve::ModelSpec d;
    Status st = EnsureDefaultModel(&d.path);
    if (!st.ok()) return Fail(st);
    d.name = std::filesystem::path(d.path).stem().string();
    specs_.push_back(d);
  }
  const bool several = specs_.size() > 1;
  models_.set_model_params(ModelParamsFor(a_.weights));
  if (several) {  // one budget for every model's pool (tools/serve/models.h)
    if (int rc = models_.ShareBudget(a_.memory_budget_mib << 20)) return CFail("creating the shared memory budget", rc);
  }
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a_.n_ctx);
  cp.n_threads = a_.threads;
  cp.kv_codec = a_.kv_codec.c_str();
  cp.kv_type = a_.kv_type == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16;
  mz_pool_params pp = mz_pool_default_params();
  pp.context = &cp;
  pp.memory_budget = a_.memory_budget_mib << 20;
  pp.disk_budget = a_.disk_budget_mib << 20;
  pp.persist_codec = a_.persist_codec.c_str();
  pp.write_behind = !a_.sync_persist;
  pp.batch = a_.batch;
  pp.batch_prefill_slice = a_.prefill_slice;
  pp.batch_itl_factor = float(a_.itl_factor);
  if (!a_.remote.empty()) {  // every model's pool in the same Redis (its keys carry the model's fingerprint)
    pp.remote_url = a_.remote.c_str();
    pp.remote_password_file = a_.remote_password_file.empty() ? nullptr : a_.remote_password_file.c_str();
    pp.remote_timeout_ms = uint32_t(a_.remote_timeout_ms);
    auto file = [](const std::string& f) { return f.empty() ? nullptr : f.c_str(); };
    pp.remote_ca_file = file(a_.remote_ca_file);
    pp.remote_cert_file = file(a_.remote_cert_file);
    pp.remote_key_file = file(a_.remote_key_file);
    pp.remote_prefix_whole = a_.remote_prefix_whole;
  }
  size_t n_conversations = 0;
  for (const serve::ModelSpec& spec : specs_) {
    // One model: its pool is the pool folder itself (the layout before several models); several:
    // each in <dir>/<name>/.
    const std::string dir = several ? a_.dir + "/" + spec.name : a_.dir;
    std::error_code ec;
    std::filesystem::create_directories(dir + "/serve", ec);
    if (ec) {
      std::fprintf(stderr, "error: cannot create %s/serve: %s\n", dir.c_str(), ec.message().c_str());
      return 1;
    }
    serve::ServedModel* m = nullptr;
    std::string what;
    if (int rc = models_.Add(spec, dir, pp, &ImplicitId, &m, &what)) return CFail(what, rc);
    if (!several && !a_.alias.empty()) m->id = a_.alias;
    char buf[1024];
    for (int32_t i = 0; mz_pool_damaged(m->pool, i, buf, sizeof buf) >= 0; ++i)
      std::fprintf(stderr, "[serve] warning: damaged, skipped: %s\n", buf);
    // The router learns every stored conversation's id: their histories and turn marks stay the
    // pool's (read when a request is matched). Servers before 0.17 kept turn marks in
    // <dir>/serve/<id>.turn: such a conversation has no mark in the pool until its next turn (only
    // a request extending its whole history continues it meanwhile: stricter, never wrong), and
    // the old file is removed.
    std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(m->pool, nullptr, 0))));
    const int32_t n = mz_pool_list(m->pool, all.data(), int32_t(all.size()));
    for (int32_t i = 0; i < std::min<int32_t>(n, int32_t(all.size())); ++i) {
      const std::string id = all[size_t(i)].id;
      std::error_code ec;
      std::filesystem::remove(m->dir + "/serve/" + id + ".turn", ec);
      m->router.Put(id);
    }
    n_conversations += m->router.size();
  }
  if (a_.watch_pressure) {
    mz_pressure_params pr = mz_pressure_default_params();
    pr.source = a_.pressure_source.c_str();
    pr.cgroup_dir = a_.pressure_cgroup.empty() ? nullptr : a_.pressure_cgroup.c_str();
    pr.restore_in_background = a_.restore_ahead;
    pr.on_action = &Server::PressureAction;
    pr.user = this;
    // One watch: with several models the library applies a pool's pressure across the shared
    // budget, in its order (idle models first).
    if (mz_pool_pressure_watch_start(models_.front().pool, &pr) != MZ_OK)
      std::fprintf(stderr, "[serve] warning: no memory-pressure watch (%s): memory is given back only by the budget and /v1/mzcache/trim\n",
                   mz_last_error());
  }
  ready_ = true;
  std::fprintf(stderr, "[serve] %s: %zu conversations in %s; listening on http://%s:%d%s\n",
               several ? models_.Names().c_str() : models_.front().id.c_str(), n_conversations, a_.dir.c_str(), a_.host.c_str(), a_.port, a_.api_key.empty() ? "" : " (API key required)");
  if (!a_.port_file.empty()) {
    std::ofstream f(a_.port_file + ".tmp");
    f << a_.port << "\n";
    f.close();
    std::rename((a_.port_file + ".tmp").c_str(), a_.port_file.c_str());
  }
  return 0;
}

int Server::Bind() {
  Routes();
  ResourceRoutes();
  http_.set_payload_max_length(size_t(a_.max_body_kib) << 10);
  http_.set_read_timeout(a_.read_timeout_s, 0);
  http_.set_write_timeout(a_.read_timeout_s, 0);
  // One request per connection: httplib loses pipelined requests (tools/serve/http_framing.h).
  http_.set_keep_alive_max_count(1);
  const int http_threads = a_.http_threads;
  http_.new_task_queue = [http_threads] { return new httplib::ThreadPool(size_t(http_threads)); };
  // Debian's httplib is a compiled library that listens with a backlog of 5: a burst of more than
  // 6 connections (clients arriving at once, or one that opens and drops connections faster than
  // the accept thread hands them on) overflows it, the kernel drops the SYN and the client waits
  // for its 1 s retransmit. Measured here with a tight connect/close loop: 1 connection in 10
  // waited 1 s (94 ms each on average). The socket-options hook sees the listening socket before
  // bind (SO_REUSEADDR for restarts, not httplib's SO_REUSEPORT, which would let another process of
  // this user bind the same port); after bind, listen() again widens the backlog (Linux allows
  // that on a listening socket; the kernel caps it at net.core.somaxconn).
  http_.set_socket_options([this](int fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });
  int port = a_.port;
  if (port == 0) {
    port = http_.bind_to_any_port(a_.host);
  } else if (!http_.bind_to_port(a_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    std::fprintf(stderr, "error: cannot listen on %s:%d\n", a_.host.c_str(), a_.port);
    return 1;
  }
  if (listen_fd_ >= 0 && listen(listen_fd_, kListenBacklog) != 0)
    std::fprintf(stderr, "[serve] warning: could not widen the listen backlog (%s): bursts of connections may wait 1 s\n",
                 std::strerror(errno));
  a_.port = port;
  // Scripts find the port here while the model loads (the port file is written once it is loaded).
  std::fprintf(stderr, "[serve] bound to http://%s:%d; loading the model\n", a_.host.c_str(), port);
  return 0;
}

int Server::Run() {
  // SIGINT/SIGTERM end the server cleanly: the listener stops, turns in flight finish, the pool
  // persists every changed conversation (its destructor).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  std::thread waiter([this, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (sig != 0) std::fprintf(stderr, "[serve] signal %d: stopping\n", sig);
    http_.stop();
  });
  // The model loads while the server listens: /health answers 503 until it is ready. A load that
  // fails stops the listener (once it runs: stop() before it would be lost) with its exit code.
  std::atomic<int> load_rc{0};
  std::atomic<bool> listened{false};
  std::thread loader([this, &load_rc, &listened] {
    const int rc = Load();
    if (rc == 0) return;
    load_rc = rc;
    while (!http_.is_running() && !listened) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    http_.stop();
  });
  http_.listen_after_bind();
  listened = true;
  // listen_after_bind returns after stop(): wake the waiter if it is still waiting (stop by error).
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  loader.join();  // a stop during the load waits for it to end (then the pool is persisted and freed)
  if (load_rc != 0) return load_rc;
  std::fprintf(stderr, "[serve] persisting conversations\n");
  for (size_t k = 0; k < models_.size(); ++k)
    if (mz_pool_flush(models_.at(k).pool) != MZ_OK) std::fprintf(stderr, "[serve] warning: %s\n", mz_last_error());
  return 0;
}

int RunServe(ServeArgs a) {
  if (!a.api_key_file.empty()) {
    std::string why;
    if (!a.api_key.empty()) {
      std::fprintf(stderr, "error: give --api-key or --api-key-file, not both\n");
      return 2;
    }
    if (!ReadKeyFile(a.api_key_file, &a.api_key, &why)) {
      std::fprintf(stderr, "error: --api-key-file %s: %s\n", a.api_key_file.c_str(), why.c_str());
      return 2;
    }
  }
  if (a.api_key.empty())
    if (const char* k = std::getenv("MZ_API_KEY")) a.api_key = k;
  // Block the stop signals in every thread (the pool's and httplib's inherit the mask); one thread
  // waits for them (Server::Run). SIGPIPE: a client gone is an error of its write, not a signal.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  Server s(a);
  if (int rc = s.Start()) return rc;
  return s.Run();
}

}  // namespace mz::cli::serve_app
