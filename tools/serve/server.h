// The server of `mzcache serve` (docs/server.md): its arguments, the turns' admission (Slots) and
// the Server itself: the pool it serves, the router, the HTTP listener. Built on the public C API
// only (include/mzcache.h).
//
// One concern per file: server.cpp (admission, turns, the pool report, start and stop),
// routes.cpp (the HTTP endpoints), resources.cpp (metrics, tokenize, props, conversations as
// resources, CORS and the readiness gate), models.{h,cpp} (the models served: a pool each, one shared
// budget), cmd_serve.cpp (the command line). Thread-safety: the handlers
// run on httplib's worker threads; the Server's members are either set before answering (a_,
// models_: filled by Load before ready_) or synchronized themselves (each model's router, slots_,
// the counters).
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/serve/activity_log.h"
#include "tools/serve/metrics.h"
#include "tools/serve/models.h"
#include "tools/serve/openai_api.h"
#include "tools/serve/router.h"
#include "tools/serve/scripted_replies.h"
#include "tools/serve/slot_table.h"
#include "tools/serve/tool_calls.h"
#include "tools/serve/turn.h"

namespace mz::cli::serve_app {

// Connections the kernel queues for the accept thread (see Server::Start).
constexpr int kListenBacklog = 512;

struct ServeArgs {
  // The models (-m, repeatable, and every GGUF of --models-dir): several share one memory budget
  // (tools/serve/models.h). None: the synthesized Qwen3-0.6B.
  std::vector<std::string> models;
  std::string models_dir;
  std::string host = "127.0.0.1", api_key, dir, alias, persist_codec = "q8", kv_codec = "q8", kv_type = "f16";
  int port = 8080, threads = 2, n_ctx = 8192, parallel = 8, queue = 64, max_tokens = 1024, http_threads = 32;
  uint64_t memory_budget_mib = 0, disk_budget_mib = 8192, max_body_kib = 1024;
  int read_timeout_s = 10;
  bool watch_pressure = true, restore_ahead = true, sync_persist = false, batch = true;
  int prefill_slice = 512;
  double itl_factor = 2.0;
  std::string pressure_source = "auto", pressure_cgroup;
  std::string port_file;
  std::string chat_template_file;      // Jinja template for tool calling (default: the GGUF's own)
  std::string test_scripted_replies;  // TEST HOOK: tools/serve/scripted_replies.h (loopback only)
  // Observability and access (tools/serve/resources.cpp): GET /metrics on (--no-metrics: off), the
  // API key read from a file (--api-key-file), CORS for one origin (--cors; "" = off).
  bool metrics = true;
  bool slots = true;  // GET /slots (--no-slots: off, as llama-server's)
  std::string api_key_file, cors;
  std::string weights = "page-cache";  // --weights: how every model holds its weights (tools/weights_option.h)
  // A fleet's remote tier (docs/fleet.md): redis://[user@]host:port; its password from a file.
  std::string remote, remote_password_file;
  std::string remote_ca_file, remote_cert_file, remote_key_file;  // rediss:// only (TLS)
  int remote_timeout_ms = 2000;
  bool remote_prefix_whole = false;  // mz_pool_params.remote_prefix_whole
};


// Whether host is a loopback address (binding elsewhere needs an API key).
bool IsLoopback(const std::string& host);
// Constant-time comparison of the presented key with the configured one.
bool KeyMatches(const std::string& got, const std::string& want);
// prefix and 16 random hex digits.
std::string RandomId(const char* prefix);
// The ids the server gives conversations it found no match for ("c-" and 16 hex digits).
bool ImplicitId(const std::string& id);
int64_t UnixNow();
// The API key in file path (--api-key-file): its content without the trailing newline (\n or
// \r\n). false with *why when it cannot be read, is empty, or holds another line break or a NUL.
bool ReadKeyFile(const std::string& path, std::string* key, std::string* why);

class Server {
 public:
  explicit Server(const ServeArgs& a) : a_(a), slots_(a.parallel, a.queue) {}
  // Start: checks the arguments and binds (the port file is written once the model is loaded);
  // Run: loads the model and the pool in the background while listening (every endpoint but
  // /health answers 503 until then; a load failure stops the server with its exit code).
  int Start();
  int Run();

 private:
  struct Job;  // one turn in flight: its claim, slot and conversation handle (released in its destructor)
  bool Authorized(const httplib::Request& req, httplib::Response& res);
  void Error(httplib::Response& res, const serve::ApiError& e);
  void Routes();
  void Completions(const httplib::Request& req, httplib::Response& res, bool chat);
  // The model a request goes to (its "model" field, its conversation's owner) and whether its file
  // is still the one loaded: nullptr with *err (400 unknown model or another model's conversation,
  // 409 model_changed) otherwise.
  serve::ServedModel* ModelFor(const serve::ChatRequest& r, serve::ApiError* err);
  // The request's prompt tokens; *rendered: when the chat template was done (tokenizing followed).
  bool Prompt(serve::ServedModel& m, const serve::ChatRequest& r, std::vector<mz_token>* out, serve::ApiError* err,
              std::chrono::steady_clock::time_point* rendered);
  std::shared_ptr<Job> Claim(serve::ServedModel& m, const serve::ChatRequest& r, std::vector<mz_token> prompt,
                             serve::ApiError* err);
  serve::TurnResult Turn(Job& job, const serve::EmitFn& emit);
  void FinishJob(Job& job, bool damaged, const std::vector<mz_token>& history);
  int History(serve::ServedModel& m, const std::string& id, std::vector<mz_token>* out);
  nlohmann::json PoolJson();
  nlohmann::json ModelsJson();  // each model's weights by tier, in use, conversations; the shared budget
  // The pressure watcher's on_action (mz_pressure_params): records the action in activity_.
  static void PressureAction(const mz_pressure_action* a, void* self);
  // tools/serve/resources.cpp: /metrics, /tokenize, /detokenize, /props, /v1/conversations, the
  // readiness gate and CORS.
  int Bind();  // the routes and the listening socket: 0 or the exit code
  int Load();  // the model, the pool, the router's histories, the pressure watch: 0 or the exit code
  void ResourceRoutes();
  std::string MetricsText();
  nlohmann::json ConversationJson(const mz_conversation_report& r, const std::string& model);
  // Forgets conversation id of m: the pool's memory, swap and stored file (mz_pool_delete), the
  // router's history and the turn mark. The pool's status (MZ_ERR_INVALID_ARG: unknown, MZ_ERR_BUSY:
  // a turn runs on it); nothing is changed unless the pool deleted it.
  int Forget(serve::ServedModel* m, const std::string& id);
  // After a turn: the metrics and the response's timings (llama-server's "timings" object).
  void RecordTurn(const serve::TurnResult& t, int prompt_n, int cache_n, serve::Timings* timings);

  ServeArgs a_;
  std::vector<serve::ModelSpec> specs_;  // what Load loads (Start lists them)
  serve::Limits limits_;
  serve::SlotTable slots_;  // --parallel turns at once, and what each does (GET /slots)
  httplib::Server http_;
  int listen_fd_ = -1;  // the listening socket (httplib owns and closes it); -1 before Start()
  std::atomic<uint64_t> requests_{0}, failures_{0}, recovered_{0};
  serve::ActivityLog activity_;  // recent memory events and turns, for the pool report (the web page)
  std::string chat_template_;                                    // --chat-template-file ("" = the model's)
  serve::ScriptedReplies scripted_;                              // TEST HOOK, empty unless given
  serve::MetricsRegistry metrics_;
  std::atomic<bool> ready_{false};          // the model and pool are loaded
  std::atomic<int> processing_{0};          // turns generating (llamacpp:requests_processing)
  std::atomic<int> deferred_{0};            // requests waiting for a slot (llamacpp:requests_deferred)
  // Last: destroyed first, so the pools persist and close before anything above goes.
  serve::ModelSet models_;
};

// Runs the server until SIGINT/SIGTERM: the exit code.
int RunServe(ServeArgs a);

}  // namespace mz::cli::serve_app
