// The HTTP endpoints of `mzcache serve` (docs/server.md lists them). Each handler checks the key
// (Authorized), validates its body (a 400 naming the field) and calls the pool's C API.
#include <cstdio>
#include <string>

#include "tools/serve/server.h"
#include "tools/serve/web_page.h"

namespace mz::cli::serve_app {

using nlohmann::json;
using serve::ApiError;
using serve::ChatRequest;

void Server::Routes() {
  const auto json_body = [](httplib::Response& res, const json& j) {
    res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  };
  // The web page (tools/serve/web_page.h): no key (it holds no data; it asks for the key).
  for (const serve::WebAsset& a : serve::WebAssets())
    http_.Get(a.route, [&a](const httplib::Request&, httplib::Response& res) {
      for (const auto& [k, v] : serve::WebHeaders()) res.set_header(k, v);
      res.set_content(reinterpret_cast<const char*>(a.data), a.size, a.content_type);
    });
  // Degraded (still 200: this server answers, from its local tiers) while its remote tier cannot
  // reach Redis: a load balancer keeps it, an operator sees why.
  http_.Get("/health", [this, json_body](const httplib::Request&, httplib::Response& res) {
    // Handlers run once the models are loaded (the pre-routing handler answers 503 before). Every
    // model's pool has the same remote tier: degraded when any pool's is.
    bool enabled = false, degraded = false;
    json remote;
    for (size_t k = 0; k < models_.size(); ++k) {
      mz_pool_remote_report rr;
      if (mz_pool_get_remote_report(models_.at(k).pool, &rr) != MZ_OK || !rr.enabled) continue;
      if (!enabled || (rr.degraded && !degraded)) {
        remote = {{"address", rr.address}, {"degraded", rr.degraded}, {"pending", rr.pending}};
        if (rr.degraded) remote["error"] = rr.last_error;
      }
      enabled = true;
      degraded = degraded || rr.degraded;
    }
    if (enabled) {
      json_body(res, {{"status", degraded ? "degraded" : "ok"}, {"remote", remote}});
      return;
    }
    json_body(res, {{"status", "ok"}});
  });
  http_.Get("/v1/models", [this, json_body](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    // Every model served, in the order given (-m, then --models-dir's): the first is the default of
    // a request without "model".
    json data = json::array();
    for (size_t k = 0; k < models_.size(); ++k)
      data.push_back({{"id", models_.at(k).id}, {"object", "model"}, {"created", UnixNow()}, {"owned_by", "mzcache"}});
    json_body(res, {{"object", "list"}, {"data", data}});
  });
  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) Completions(req, res, true);
  });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) Completions(req, res, false);
  });
  http_.Get("/v1/mzcache/pool", [this, json_body](const httplib::Request& req, httplib::Response& res) {
    if (Authorized(req, res)) json_body(res, PoolJson());
  });
  // Memory given back on request: as Android's onTrimMemory(level), or a number of bytes.
  http_.Post("/v1/mzcache/(trim|evict)", [this, json_body](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const bool trim = req.matches[1] == "trim";
    const char* key = trim ? "level" : "bytes";
    json j = json::parse(req.body, nullptr, false);
    ApiError e;
    e.param = key;
    if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j[key].is_number_unsigned()) {
      e.message = std::string("the body must be {\"") + key + "\": N} with N a non-negative integer";
      return Error(res, e);
    }
    uint64_t freed = 0;
    const uint64_t v = j[key].get<uint64_t>();
    activity_.BeginAction();
    // With several models the shared budget gives back across them all, idle models first
    // (tools/serve/models.h); with one, its pool as before.
    int st = MZ_ERR_INVALID_ARG;
    if (trim && v > 1000) st = MZ_ERR_INVALID_ARG;
    else if (models_.shared()) st = trim ? mz_budget_on_trim_memory(models_.budget(), int32_t(v), &freed)
                                         : mz_budget_evict(models_.budget(), v, &freed);
    else st = trim ? mz_pool_on_trim_memory(models_.front().pool, int32_t(v), &freed)
                   : mz_pool_evict(models_.front().pool, v, &freed);
    activity_.AddEvent(st != MZ_OK ? "error" : trim ? "trim" : "evict", freed,
                       (trim ? "level " : "asked ") + std::to_string(v) + (st != MZ_OK ? std::string(": ") + mz_last_error() : ""),
                       /*ends_action=*/true);
    if (st != MZ_OK) {
      e.http = st == MZ_ERR_INVALID_ARG ? 400 : 500;
      e.message = mz_last_error();
      return Error(res, e);
    }
    json out = PoolJson();
    out["freed"] = freed;
    json_body(res, out);
  });
  http_.Delete(R"(/v1/mzcache/conversations/([A-Za-z0-9._-]{1,128}))", [this, json_body](const httplib::Request& req, httplib::Response& res) {
    if (!Authorized(req, res)) return;
    const std::string id = req.matches[1];
    ApiError e;
    if (!serve::ValidConversationId(id)) {
      e.message = "not a conversation id";
      return Error(res, e);
    }
    serve::ServedModel* m = models_.OwnerOf(id);
    if (int st = m ? mz_pool_delete(m->pool, id.c_str()) : MZ_ERR_INVALID_ARG; st != MZ_OK) {
      e.http = st == MZ_ERR_INVALID_ARG ? 404 : 500;
      e.message = m ? mz_last_error() : "no conversation '" + id + "'";
      return Error(res, e);
    }
    m->router.Forget(id);
    json_body(res, {{"id", id}, {"deleted", true}});
  });
  http_.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.http = 500;
    e.type = "server_error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      e.message = ex.what();
    } catch (...) {
      e.message = "internal error";
    }
    Error(res, e);
  });
  // httplib's own refusals (413 over --max-body, 404, 400 of a malformed request line) get
  // OpenAI's error body too.
  http_.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.http = res.status;
    e.message = res.status == 413   ? "the body is larger than this server accepts (--max-body)"
                : res.status == 404 ? "no such endpoint"
                                    : "bad request";
    if (res.status >= 500) e.type = "server_error";
    Error(res, e);
  });
}

}  // namespace mz::cli::serve_app
