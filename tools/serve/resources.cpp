// The server's observability and resource endpoints (docs/server.md): GET /metrics (Prometheus),
// POST /tokenize and /detokenize, GET /props (llama-server's names), conversations as resources
// (/v1/conversations), the readiness gate (/health 503 while the model loads) and CORS (--cors).
// Every handler checks the key (Authorized), validates its input (a 400 naming the field) and
// reaches the library through the public C API only.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/cli/c_api_text.h"
#include "tools/serve/http_framing.h"
#include "tools/serve/server.h"
#include "tools/serve/text_stream.h"

namespace mz::cli::serve_app {

using nlohmann::json;
using serve::ApiError;
using serve::MetricLabels;
using Type = serve::MetricsRegistry::Type;

namespace {

// Seconds: TTFT and restores, from a cached turn's few ms to a cold 8k-token prompt.
const std::vector<double> kSecondsBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

void JsonBody(httplib::Response& res, const json& j) {
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

bool ReadKeyFile(const std::string& path, std::string* key, std::string* why) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *why = std::string("cannot be read: ") + std::strerror(errno);
    return false;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) {
    *why = "cannot be read";
    return false;
  }
  std::string k = ss.str();
  if (!k.empty() && k.back() == '\n') k.pop_back();
  if (!k.empty() && k.back() == '\r') k.pop_back();
  if (k.empty()) {
    *why = "is empty (it must hold the key)";
    return false;
  }
  if (k.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) {
    *why = "holds more than one line (the key alone, one trailing newline allowed)";
    return false;
  }
  *key = k;
  return true;
}

json Server::ConversationJson(const mz_conversation_report& r, const std::string& model) {
  return {{"id", r.id},
          {"object", "conversation"},
          {"model", model},
          {"tokens", r.n_tokens},
          {"bytes", {{"resident", r.kv_resident}, {"compressed_memory", r.kv_mem_compressed}, {"storage", r.kv_storage}}},
          {"stored_bytes", r.stored_bytes},
          {"stored_tokens", r.stored_tokens},
          {"open", r.open},
          {"busy", r.busy},
          {"shared_chunks", r.shared_chunks},
          {"last_use_unix_ms", r.last_use_unix_ms}};
}

void Server::RecordTurn(const serve::TurnResult& t, int prompt_n, int cache_n, serve::Timings* out) {
  out->set = true;
  out->prompt_n = prompt_n;
  out->cache_n = cache_n;
  out->prompt_ms = t.prompt_s * 1e3;
  out->predicted_n = t.completion_tokens;
  out->predicted_ms = t.predicted_s * 1e3;
  out->ttft_ms = t.restore.ttft_s * 1e3;
  out->restore_ms = t.restore.reload_s * 1e3;
  out->restore_bytes_from_storage = t.restore.bytes_from_storage;
  // llama-server's counters (tools/server/server-task.cpp: prompt tokens exclude cached ones).
  metrics_.Add("llamacpp:prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", prompt_n);
  metrics_.Add("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", cache_n);
  metrics_.Add("llamacpp:prompt_seconds_total", "Total time spent processing prompts", t.prompt_s);
  metrics_.Add("llamacpp:tokens_predicted_total", "Number of generation tokens processed", t.completion_tokens);
  metrics_.Add("llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens", t.predicted_s);
  // mzcache's own.
  metrics_.Add("mzcache_turns_total", "Turns computed (chat and completions)", 1);
  // Where a reply's time went on its caller's thread: a batched step's cycle is the step plus the
  // slowest caller's sampling and emit before it comes back.
  const char* reply_help = "Time of replies by part: one-token decode calls (waiting for and computing batched steps), sampling, handing text to the stream";
  metrics_.Add("mzcache_reply_seconds_total", reply_help, t.decode_s, {{"part", "decode"}});
  metrics_.Add("mzcache_reply_seconds_total", reply_help, t.sample_s, {{"part", "sample"}});
  metrics_.Add("mzcache_reply_seconds_total", reply_help, t.emit_s, {{"part", "emit"}});
  metrics_.Add("mzcache_prefix_hit_tokens_total",
               "Prompt tokens not computed: kept from the conversation or copied from a shared prefix", cache_n);
  metrics_.Observe("mzcache_ttft_seconds", "Time to first token of a turn (restore and prefill)", kSecondsBuckets,
                   t.restore.ttft_s);
  const bool restored = t.restore.units_restored > 0 || t.restore.bytes_from_storage > 0 || t.restore.bytes_decoded > 0;
  if (restored) {
    metrics_.Add("mzcache_restores_total", "Turns that brought memory back (weights or KV) before their first token", 1);
    metrics_.Observe("mzcache_restore_seconds", "Reload phase of a turn's restore (front layers first)",
                     kSecondsBuckets, t.restore.reload_s);
    metrics_.Add("mzcache_restored_bytes_total", "Bytes brought back by turns, by the tier they came from",
                 double(t.restore.bytes_from_storage), {{"tier", "storage"}});
    metrics_.Add("mzcache_restored_bytes_total", "Bytes brought back by turns, by the tier they came from",
                 double(t.restore.bytes_decoded), {{"tier", "compressed_memory"}});
  }
  if (t.restore.bytes_read_compressed > 0)
    metrics_.Add("mzcache_attended_compressed_bytes_total",
                 "KV bytes attention read in place while compressed in memory (not restored)",
                 double(t.restore.bytes_read_compressed));
}

std::string Server::MetricsText() {
  auto gauge = [this](const char* name, const char* help, double v, const MetricLabels& l = {}) {
    metrics_.Set(name, help, v, l, Type::kGauge);
  };
  auto counter = [this](const char* name, const char* help, double v, const MetricLabels& l = {}) {
    metrics_.Set(name, help, v, l, Type::kCounter);
  };
  gauge("llamacpp:requests_processing", "Number of requests processing", processing_.load());
  gauge("llamacpp:requests_deferred", "Number of requests deferred", deferred_.load());
  {
    const double pt = metrics_.Value("llamacpp:prompt_tokens_total"), ps = metrics_.Value("llamacpp:prompt_seconds_total");
    const double gt = metrics_.Value("llamacpp:tokens_predicted_total"),
                 gs = metrics_.Value("llamacpp:tokens_predicted_seconds_total");
    gauge("llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s", ps > 0 ? pt / ps : 0);
    gauge("llamacpp:predicted_tokens_seconds", "Average generation throughput in tokens/s", gs > 0 ? gt / gs : 0);
  }
  counter("mzcache_requests_total", "Chat and completion requests received", double(requests_.load()));
  counter("mzcache_request_failures_total", "Chat and completion requests refused or failed", double(failures_.load()));
  counter("mzcache_conversations_recovered_total",
          "Turns recomputed in a new conversation because theirs was found damaged", double(recovered_.load()));
  // Families whose samples appear at a first event are declared, so that scrapers see them at once.
  metrics_.Declare("mzcache_ttft_seconds", "Time to first token of a turn (restore and prefill)", Type::kHistogram,
                   kSecondsBuckets);
  metrics_.Declare("mzcache_restore_seconds", "Reload phase of a turn's restore (front layers first)",
                   Type::kHistogram, kSecondsBuckets);
  for (const char* tier : {"storage", "compressed_memory"})
    metrics_.Add("mzcache_restored_bytes_total", "Bytes brought back by turns, by the tier they came from", 0,
                 {{"tier", tier}});
  metrics_.Add("llamacpp:prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", 0);
  metrics_.Add("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", 0);
  metrics_.Add("llamacpp:prompt_seconds_total", "Total time spent processing prompts", 0);
  metrics_.Add("llamacpp:tokens_predicted_total", "Number of generation tokens processed", 0);
  metrics_.Add("llamacpp:tokens_predicted_seconds_total", "Total time spent generating tokens", 0);
  // Every model's pool summed (one model: its pool's figures, as before several models).
  {
    const mz_pool_report p = models_.SumReport();
    const char* kv_help = "Bytes of conversations' KV in each tier (shared prefix chunks not included)";
    gauge("mzcache_kv_bytes", kv_help, double(p.kv_resident), {{"tier", "resident"}});
    gauge("mzcache_kv_bytes", kv_help, double(p.kv_mem_compressed), {{"tier", "compressed_memory"}});
    gauge("mzcache_kv_bytes", kv_help, double(p.kv_storage), {{"tier", "storage"}});
    gauge("mzcache_weights_bytes", "Bytes of the model's weights: all of them, and those in RAM", double(p.weights_total),
          {{"state", "total"}});
    gauge("mzcache_weights_bytes", "Bytes of the model's weights: all of them, and those in RAM",
          double(p.weights_resident), {{"state", "resident"}});
    gauge("mzcache_memory_bytes", "The pool's RAM: resident weights, KV and in-memory swap", double(p.in_memory));
    gauge("mzcache_memory_budget_bytes", "The pool's memory budget, shared by every model (0: none)",
          double(p.memory_budget));
    gauge("mzcache_stored_bytes", "Bytes of stored conversations on storage", double(p.stored_bytes));
    gauge("mzcache_pool_conversations", "Conversations the pool holds (any tier, stored included)",
          double(p.n_conversations));
    counter("mzcache_conversations_lost_total", "Conversations deleted by the disk budget", double(p.conversations_lost));
    counter("mzcache_persists_total", "Conversations written to storage", double(p.persists));
    counter("mzcache_persist_failures_total", "Conversation writes that failed", double(p.persist_failures));
    counter("mzcache_prefix_chunks_reused_total", "KV chunks (per layer) copied from a shared prefix instead of computed",
            double(p.prefix_chunks_reused));
  }
  // The remote tier, every model's pool summed (degraded when any is).
  mz_pool_remote_report rr{};
  mz_pool_remote_fetch_report rf{};
  for (size_t k = 0; k < models_.size(); ++k) {
    mz_pool_remote_report x{};
    if (mz_pool_get_remote_report(models_.at(k).pool, &x) != MZ_OK || !x.enabled) continue;
    mz_pool_remote_fetch_report f{};
    if (mz_pool_get_remote_fetch_report(models_.at(k).pool, &f) == MZ_OK) {
      rf.fetches_skipped_slower += f.fetches_skipped_slower;
      rf.chunks_skipped_slower += f.chunks_skipped_slower;
      rf.streaming += f.streaming;
    }
    rr.enabled = true;
    rr.degraded = rr.degraded || x.degraded;
    rr.pending += x.pending;
    rr.manifests_written += x.manifests_written;
    rr.chunks_written += x.chunks_written;
    rr.chunks_present += x.chunks_present;
    rr.bytes_written += x.bytes_written;
    rr.write_failures += x.write_failures;
    rr.manifest_hits += x.manifest_hits;
    rr.manifest_misses += x.manifest_misses;
    rr.chunks_fetched += x.chunks_fetched;
    rr.bytes_fetched += x.bytes_fetched;
    rr.damaged += x.damaged;
    rr.prefix_chunks += x.prefix_chunks;
  }
  if (rr.enabled) {
    gauge("mzcache_remote_degraded", "1 while the remote tier (Redis) cannot be reached: local tiers only", rr.degraded);
    gauge("mzcache_remote_pending", "Conversations whose latest stored state is not in the remote tier yet", rr.pending);
    counter("mzcache_remote_manifests_written_total", "Conversation manifests written to the remote tier",
            double(rr.manifests_written));
    const char* ch = "Full chunks written to the remote tier, or found there already (written once for the fleet)";
    counter("mzcache_remote_chunks_total", ch, double(rr.chunks_written), {{"result", "written"}});
    counter("mzcache_remote_chunks_total", ch, double(rr.chunks_present), {{"result", "present"}});
    counter("mzcache_remote_bytes_total", "Bytes written to and fetched from the remote tier", double(rr.bytes_written),
            {{"direction", "written"}});
    counter("mzcache_remote_bytes_total", "Bytes written to and fetched from the remote tier", double(rr.bytes_fetched),
            {{"direction", "fetched"}});
    counter("mzcache_remote_write_failures_total", "Remote writes that failed (retried)", double(rr.write_failures));
    const char* mh = "Conversations looked up in the remote tier, by result";
    counter("mzcache_remote_lookups_total", mh, double(rr.manifest_hits), {{"result", "hit"}});
    counter("mzcache_remote_lookups_total", mh, double(rr.manifest_misses), {{"result", "miss"}});
    counter("mzcache_remote_chunks_fetched_total", "Chunks fetched from the remote tier", double(rr.chunks_fetched));
    counter("mzcache_remote_damaged_total", "Remote values that failed verification or were gone (computed again)",
            double(rr.damaged));
    counter("mzcache_remote_prefix_chunks_total", "Chunks found in the remote tier by chain hash for new conversations",
            double(rr.prefix_chunks));
    counter("mzcache_remote_prefix_skipped_slower_total",
            "Prefixes found in the remote tier by chain hash and not fetched: computing them was expected faster",
            double(rf.fetches_skipped_slower));
    counter("mzcache_remote_prefix_chunks_skipped_slower_total", "The chunks of those prefixes",
            double(rf.chunks_skipped_slower));
    gauge("mzcache_remote_streaming", "Chunks being streamed in from the remote tier now", rf.streaming);
  }
  // Each model's weights by tier (issue 45): resident, given back but still in the page cache (a
  // restore reads no storage), and given back and gone from it (evicted: a restore reads storage).
  // Conversations by the tiers their KV is in (one may count in several: part resident, part stored).
  double resident = 0, compressed = 0, storage = 0, stored_only = 0;
  for (size_t k = 0; k < models_.size(); ++k) {
    serve::ServedModel& m = models_.at(k);
    if (mz_pool_weights_report w{}; mz_pool_get_weights_report(m.pool, &w) == MZ_OK) {
      const char* wh = "Bytes of each model's weights: in RAM (resident), given back but in the page cache "
                       "(page_cache), given back and gone from it (evicted)";
      const uint64_t cached = std::min(w.dropped, w.dropped_cached);
      gauge("mzcache_model_weights_bytes", wh, double(w.resident), {{"model", m.name}, {"tier", "resident"}});
      gauge("mzcache_model_weights_bytes", wh, double(cached), {{"model", m.name}, {"tier", "page_cache"}});
      gauge("mzcache_model_weights_bytes", wh, double(w.dropped - cached), {{"model", m.name}, {"tier", "evicted"}});
      gauge("mzcache_model_in_use", "Whether a conversation of the model is mid-turn or computing (1) or not (0)",
            w.in_use ? 1 : 0, {{"model", m.name}});
    }
    if (mz_pool_report p{}; mz_pool_get_report(m.pool, &p) == MZ_OK) {
      gauge("mzcache_model_memory_bytes", "Each model's RAM: resident weights, KV and in-memory swap",
            double(p.in_memory), {{"model", m.name}});
      gauge("mzcache_model_conversations", "Conversations each model's pool holds (any tier, stored included)",
            double(p.n_conversations), {{"model", m.name}});
    }
    std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(m.pool, nullptr, 0))));
    const int32_t n = mz_pool_list(m.pool, all.data(), int32_t(all.size()));
    for (int32_t i = 0; i < std::min<int32_t>(n, int32_t(all.size())); ++i) {
      const auto& r = all[size_t(i)];
      resident += r.kv_resident > 0;
      compressed += r.kv_mem_compressed > 0;
      storage += r.kv_storage > 0 || !r.open;
      stored_only += !r.open;
    }
  }
  const char* conv_help = "Conversations with KV in each tier (stored-only ones count in storage)";
  gauge("mzcache_conversations", conv_help, resident, {{"tier", "resident"}});
  gauge("mzcache_conversations", conv_help, compressed, {{"tier", "compressed_memory"}});
  gauge("mzcache_conversations", conv_help, storage, {{"tier", "storage"}});
  gauge("mzcache_conversations_stored_only", "Conversations with nothing in memory (found again on their next turn)",
        stored_only);
  {
    const mz_pool_event_report e = models_.SumEvents();
    const char* eh = "Evictions (passes that gave memory back), by what asked for them";
    const char* bh = "Bytes of RAM given back, by what asked for it";
    const std::pair<const char*, std::pair<uint64_t, uint64_t>> by[] = {
        {"budget", {e.evict_budget, e.evict_budget_bytes}},
        {"pressure", {e.evict_pressure, e.evict_pressure_bytes}},
        {"trim", {e.evict_trim, e.evict_trim_bytes}},
        {"manual", {e.evict_manual, e.evict_manual_bytes}},
        {"conversation", {e.evict_conversation, e.evict_conversation_bytes}}};
    for (const auto& [reason, v] : by) {
      counter("mzcache_evictions_total", eh, double(v.first), {{"reason", reason}});
      counter("mzcache_evicted_bytes_total", bh, double(v.second), {{"reason", reason}});
    }
    const char* ph = "Memory-pressure events received: the system's (watch) and onTrimMemory requests (trim)";
    counter("mzcache_pressure_events_total", ph, double(e.pressure_events), {{"source", "watch"}});
    counter("mzcache_pressure_events_total", ph, double(e.trim_events), {{"source", "trim"}});
    counter("mzcache_restored_ahead_bytes_total", "Bytes brought back by restore-ahead once pressure was over",
            double(e.restored_ahead_bytes));
    counter("mzcache_conversation_restores_total", "Conversations brought back on request (POST .../restore)",
            double(e.conversation_restores));
    counter("mzcache_conversations_recomputed_total",
            "Conversations computed again because a stored copy failed verification", double(e.recomputed));
  }
  metrics_.Add("mzcache_prefix_hit_tokens_total",
               "Prompt tokens not computed: kept from the conversation or copied from a shared prefix", 0);
  metrics_.Add("mzcache_recomputed_tokens_total",
               "Prompt tokens computed again because their conversation's stored or swapped data was damaged", 0);
  return metrics_.Render();
}

void Server::ResourceRoutes() {
  // Before routing: CORS (only for --cors's origin; preflight answered here, without a key, as
  // browsers send none), then the readiness gate.
  // httplib has one pre-routing handler: it also refuses framing the library would get wrong
  // (tools/serve/http_framing.h), first, before any body is read.
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (const std::string bad = BadFraming(req); !bad.empty()) {
      serve::ApiError e;
      e.message = bad;
      Error(res, e);  // and the connection closes after it (one request per connection: Bind)
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!a_.cors.empty()) {
      const std::string origin = req.get_header_value("Origin");
      const bool allowed = origin == a_.cors || a_.cors == "*";
      if (allowed) {
        res.set_header("Access-Control-Allow-Origin", a_.cors == "*" ? "*" : origin);
        res.set_header("Vary", "Origin");
        res.set_header("Access-Control-Expose-Headers", "X-Mz-Conversation");
      }
      if (req.method == "OPTIONS") {
        if (allowed) {
          res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
          res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
          res.set_header("Access-Control-Max-Age", "600");
        }
        res.status = 204;
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!ready_.load()) {
      if (req.path == "/health") {
        res.status = 503;
        res.set_header("Retry-After", "1");
        JsonBody(res, {{"status", "loading model"}});
      } else {
        ApiError e;
        e.http = 503;
        e.type = "unavailable_error";
        e.message = "Loading model";
        Error(res, e);
      }
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  if (a_.metrics) {
    http_.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      if (!Authorized(req, res)) return;
      res.set_content(MetricsText(), serve::MetricsRegistry::kContentType);
    });
  }
  // /tokenize and /detokenize take an optional "model" (several models: the first without it; an
  // unknown one is a 400 naming it), as the completions do.
  const auto body_model = [this](const std::string& body, httplib::Response& res) -> serve::ServedModel* {
    std::string name;
    if (models_.size() > 1) {
      const json j = json::parse(body, nullptr, false);
      if (j.is_object() && j.contains("model") && j["model"].is_string()) name = j["model"].get<std::string>();
    }
    serve::ServedModel* m = models_.Resolve(name);
    if (m) return m;
    ApiError e;
    e.param = "model";
    e.code = "model_not_found";
    e.message = "model '" + serve::SanitizeUtf8(name.substr(0, 200)) + "' is not served here; the models are: " +
                models_.Names();
    Error(res, e);
    return nullptr;
  };
  http_.Post("/tokenize", [this, body_model](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    serve::TokenizeRequest r;
    ApiError e;
    if (!serve::ParseTokenize(req.body, limits_, &r, &e)) return Error(res, e);
    serve::ServedModel* m = body_model(req.body, res);
    if (!m) return;
    mz_model* const model_ = m->model;
    mz_model_info info;
    if (mz_model_get_info(model_, &info) != MZ_OK) {
      e.http = 500;
      e.type = "server_error";
      e.message = mz_last_error();
      return Error(res, e);
    }
    // As llama-server's tokenize_mixed: add_special for the first element only when it is a string.
    std::vector<mz_token> toks;
    for (size_t i = 0; i < r.content.size(); ++i) {
      const serve::TokenizePart& part = r.content[i];
      const std::string where = r.content.size() == 1 && !part.is_id ? "content" : "content[" + std::to_string(i) + "]";
      if (part.is_id) {
        if (part.id >= info.n_vocab) {
          e.message = "a token id must be within [0, " + std::to_string(info.n_vocab) + ")";
          e.param = where;
          return Error(res, e);
        }
        toks.push_back(mz_token(part.id));
        continue;
      }
      std::vector<mz_token> piece;
      if (int rc = TokenizeText(model_, part.text, r.add_special && i == 0, r.parse_special, &piece); rc != MZ_OK) {
        e.message = "'" + where + "' cannot be tokenized: " + mz_last_error();
        e.param = where;
        return Error(res, e);
      }
      toks.insert(toks.end(), piece.begin(), piece.end());
    }
    json out = json::array();
    for (mz_token t : toks) {
      if (r.with_pieces) out.push_back({{"id", t}, {"piece", serve::PieceJson(TokenPiece(model_, t))}});
      else out.push_back(t);
    }
    JsonBody(res, {{"tokens", out}});
  });
  // GET /slots: llama-server's per-slot fields (its server_slot::to_json with metrics), mzcache's
  // own under "mzcache" (the slot's conversation and model); ?fail_on_no_slot=1: 503 when every slot
  // is busy. --no-slots: 501, as llama-server's.
  const auto slots_off = [this](httplib::Response& res) {  // --no-slots: 501, as llama-server's
    if (a_.slots) return false;
    ApiError e;
    e.http = 501;
    e.type = "not_supported_error";
    e.message = "This server does not support slots endpoint. Start it without --no-slots";
    Error(res, e);
    return true;
  };
  http_.Get("/slots", [this, slots_off](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    ApiError e;
    if (slots_off(res)) return;
    if (req.has_param("fail_on_no_slot") && !req.get_param_value("fail_on_no_slot").empty() &&
        slots_.n_free() == 0) {
      e.http = 503;
      e.type = "unavailable_error";
      e.message = "no slot available";
      return Error(res, e);
    }
    json out = json::array();
    for (const serve::SlotView& v : slots_.Snapshot()) {
      json s = {{"id", v.id}, {"n_ctx", a_.n_ctx}, {"speculative", false}, {"is_processing", v.is_processing}};
      const serve::SlotTask& t = v.task;
      if (t.id_task >= 0) {
        s["id_task"] = t.id_task;
        s["n_prompt_tokens"] = t.n_prompt_tokens;
        s["n_prompt_tokens_processed"] = t.n_prompt_tokens - t.n_prompt_tokens_cache;
        s["n_prompt_tokens_cache"] = t.n_prompt_tokens_cache;
        s["params"] = {{"n_predict", t.n_predict}, {"seed", t.seed},       {"temperature", t.temperature},
                       {"top_k", t.top_k},         {"top_p", t.top_p},     {"max_tokens", t.n_predict},
                       {"stream", t.stream}};
        s["next_token"] = json::array({{{"has_next_token", v.is_processing},
                                        {"n_remain", std::max(0, t.n_predict - v.n_decoded)},
                                        {"n_decoded", v.n_decoded}}});
        s["mzcache"] = {{"conversation", t.conversation}, {"model", t.model}};
      }
      out.push_back(std::move(s));
    }
    JsonBody(res, out);
  });
  http_.Post("/detokenize", [this, body_model](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    serve::ServedModel* m = body_model(req.body, res);
    if (!m) return;
    mz_model* const model_ = m->model;
    mz_model_info info;
    ApiError e;
    if (mz_model_get_info(model_, &info) != MZ_OK) {
      e.http = 500;
      e.type = "server_error";
      e.message = mz_last_error();
      return Error(res, e);
    }
    std::vector<int32_t> toks;
    if (!serve::ParseDetokenize(req.body, limits_, info.n_vocab, &toks, &e)) return Error(res, e);
    std::string text;
    for (int32_t t : toks) text += TokenPiece(model_, t);
    JsonBody(res, {{"content", serve::SanitizeUtf8(text)}});
  });
  http_.Get("/props", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const int n_predict = a_.max_tokens;
    json names = json::array();
    for (size_t k = 0; k < models_.size(); ++k) names.push_back(models_.at(k).id);
    // llama-server's fields describe the default model (the first); "models" lists them all.
    const auto text = [this](int32_t what) {
      const mz_model* model = models_.front().model;
      const int32_t n = mz_model_get_text(model, what, nullptr, 0);
      if (n <= 0) return std::string();
      std::string s(size_t(n) + 1, '\0');
      mz_model_get_text(model, what, s.data(), n + 1);
      s.resize(size_t(n));
      return s;
    };
    // --chat-template-file replaces the model's own template for every request: /props says which.
    const std::string tmpl = chat_template_.empty() ? text(MZ_MODEL_TEXT_CHAT_TEMPLATE) : chat_template_;
    JsonBody(res, {{"chat_template", tmpl},
                   {"bos_token", text(MZ_MODEL_TEXT_BOS)},
                   {"eos_token", text(MZ_MODEL_TEXT_EOS)},
                   {"default_generation_settings",
                    {{"n_ctx", a_.n_ctx},
                     {"params", {{"n_predict", n_predict}, {"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}}}}},
                   {"total_slots", a_.parallel},
                   {"model_alias", models_.front().id},
                   {"model_path", models_.front().path},
                   {"models", names},
                   {"modalities", {{"vision", false}, {"video", false}, {"audio", false}}},
                   {"endpoint_slots", a_.slots},
                   {"endpoint_props", true},
                   {"endpoint_metrics", a_.metrics},
                   {"build_info", std::string("mzcache ") + mz_version()},
                   {"is_sleeping", false}});
  });
  http_.Get("/v1/conversations", [this](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    json data = json::array();
    for (size_t k = 0; k < models_.size(); ++k) {
      serve::ServedModel& m = models_.at(k);
      std::vector<mz_conversation_report> all(size_t(std::max(0, mz_pool_list(m.pool, nullptr, 0))));
      const int32_t n = mz_pool_list(m.pool, all.data(), int32_t(all.size()));
      for (int32_t i = 0; i < std::min<int32_t>(n, int32_t(all.size())); ++i)
        data.push_back(ConversationJson(all[size_t(i)], m.id));
    }
    JsonBody(res, {{"object", "list"}, {"data", data}});
  });
  // The id is matched loosely ([^/]*) so that a bad one gets a 400 naming it, not a 404.
  const auto bad_id = [this](const std::string& id, httplib::Response& res) {
    if (serve::ValidConversationId(id)) return false;
    ApiError e;
    e.message = "'" + serve::SanitizeUtf8(id.substr(0, 200)) +
                "' is not a conversation id (1-128 of [A-Za-z0-9._-], not starting with '.')";
    e.param = "id";
    Error(res, e);
    return true;
  };
  const auto pool_error = [this](int st, const std::string& id, httplib::Response& res) {
    ApiError e;
    e.http = st == MZ_ERR_INVALID_ARG ? 404 : st == MZ_ERR_BUSY ? 409 : 500;
    e.message = st == MZ_ERR_INVALID_ARG ? "no conversation '" + id + "'" : std::string(mz_last_error());
    if (e.http == 404) e.code = "not_found";
    if (e.http == 500) e.type = "server_error";
    Error(res, e);
  };
  http_.Get(R"(/v1/conversations/([^/]*))", [this, bad_id, pool_error](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (bad_id(id, res)) return;
    serve::ServedModel* m = models_.OwnerOf(id);
    mz_conversation_report r;
    if (int st = m ? mz_pool_conversation_report(m->pool, id.c_str(), &r) : MZ_ERR_INVALID_ARG; st != MZ_OK)
      return pool_error(st, id, res);
    JsonBody(res, ConversationJson(r, m->id));
  });
  http_.Delete(R"(/v1/conversations/([^/]*))", [this, bad_id, pool_error](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (bad_id(id, res)) return;
    serve::ServedModel* m = models_.OwnerOf(id);
    if (int st = m ? Forget(m, id) : MZ_ERR_INVALID_ARG; st != MZ_OK) return pool_error(st, id, res);
    JsonBody(res, {{"id", id}, {"object", "conversation"}, {"deleted", true}});
  });
  http_.Post(R"(/v1/conversations/([^/]*)/(evict|restore))",
             [this, bad_id, pool_error](const httplib::Request& req, httplib::Response& res) {
               if (!Authorized(req, res)) return;
               const std::string id = req.matches[1];
               const bool evict = req.matches[2] == "evict";
               if (bad_id(id, res)) return;
               serve::ServedModel* m = models_.OwnerOf(id);
               if (!m) return pool_error(MZ_ERR_INVALID_ARG, id, res);
               uint64_t moved = 0;
               const int st = evict ? mz_pool_evict_conversation(m->pool, id.c_str(), &moved)
                                    : mz_pool_restore_conversation(m->pool, id.c_str(), &moved);
               if (st != MZ_OK) return pool_error(st, id, res);
               mz_conversation_report r;
               if (int s2 = mz_pool_conversation_report(m->pool, id.c_str(), &r); s2 != MZ_OK) return pool_error(s2, id, res);
               json out = ConversationJson(r, m->id);
               out[evict ? "freed" : "restored"] = moved;
               JsonBody(res, out);
             });
  // POST /slots/{id}?action=save|restore|erase: llama-server's slot actions on the conversation the
  // slot ran last (docs/server.md "/slots actions"): save persists it now (mz_pool_flush: the pool's
  // own file), restore brings its KV back into RAM ahead of its next turn, erase forgets it (as
  // DELETE /v1/conversations/ID). A busy slot is a 409 (an action never waits for a turn); a slot
  // that never ran a turn has nothing to save or restore (404) and nothing to erase (n_erased 0).
  http_.Post(R"(/slots/([^/]*))", [this, pool_error, slots_off](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    ApiError e;
    if (slots_off(res)) return;
    const std::string sid = req.matches[1];
    int slot = -1;
    if (!sid.empty() && sid.size() <= 9 && sid.find_first_not_of("0123456789") == std::string::npos) slot = std::stoi(sid);
    if (slot < 0 || slot >= slots_.size()) {
      e.message = "'" + serve::SanitizeUtf8(sid.substr(0, 64)) + "' is not a slot id (0 to " +
                  std::to_string(slots_.size() - 1) + ")";
      e.param = "id_slot";
      return Error(res, e);
    }
    serve::SlotAction action;
    if (!serve::ParseSlotAction(req.get_param_value("action"), req.body, limits_, &action, &e)) return Error(res, e);
    const serve::SlotView v = slots_.Snapshot()[size_t(slot)];
    if (v.is_processing) {
      e.http = 409;
      e.message = "slot " + sid + " is processing a turn; try again when it ends";
      return Error(res, e);
    }
    const std::string& id = v.task.conversation;
    serve::ServedModel* m = id.empty() ? nullptr : models_.OwnerOf(id);
    if (action == serve::SlotAction::kErase) {
      mz_conversation_report r{};
      bool forgotten = false;  // false: nothing held (never ran, or already forgotten)
      if (m && mz_pool_conversation_report(m->pool, id.c_str(), &r) == MZ_OK) {
        if (int st = Forget(m, id); st != MZ_OK) return pool_error(st, id, res);
        forgotten = true;
      }
      return JsonBody(res, {{"id_slot", slot}, {"n_erased", forgotten ? r.n_tokens : 0},
                            {"mzcache", {{"conversation", id}, {"forgotten", forgotten}}}});
    }
    if (!m) {
      e.http = 404;
      e.code = "not_found";
      e.message = id.empty() ? "slot " + sid + " has not run a turn: no conversation to " + req.get_param_value("action")
                             : "slot " + sid + "'s conversation '" + id + "' is no longer held (forgotten)";
      return Error(res, e);
    }
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t moved = 0;
    const int st = action == serve::SlotAction::kSave ? mz_pool_flush(m->pool)
                                                      : mz_pool_restore_conversation(m->pool, id.c_str(), &moved);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (st != MZ_OK) return pool_error(st, id, res);
    mz_conversation_report r;
    if (int s2 = mz_pool_conversation_report(m->pool, id.c_str(), &r); s2 != MZ_OK) return pool_error(s2, id, res);
    json out = {{"id_slot", slot}, {"filename", id}};
    if (action == serve::SlotAction::kSave) {
      out["n_saved"] = r.stored_tokens;
      out["n_written"] = r.stored_bytes;
      out["timings"] = {{"save_ms", ms}};
    } else {
      out["n_restored"] = r.n_tokens;
      out["n_read"] = moved;
      out["timings"] = {{"restore_ms", ms}};
    }
    out["mzcache"] = ConversationJson(r, m->id);
    JsonBody(res, out);
  });
}

int Server::Forget(serve::ServedModel* m, const std::string& id) {
  if (int st = mz_pool_delete(m->pool, id.c_str()); st != MZ_OK) return st;
  m->router.Forget(id);
  return MZ_OK;
}

}  // namespace mz::cli::serve_app
