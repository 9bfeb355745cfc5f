// `mzcache serve`: an OpenAI-compatible HTTP server over a pool (one model, many conversations, one
// memory budget; or several models, a pool each, sharing one memory budget: tools/serve/models.h),
// built on the public C API only (include/mzcache.h).
//
// What it promises (docs/server.md):
//   - Memory goes back to the system under pressure (the pool's pressure watch: idle
//     conversations' KV first, then the active one's, then weights) and no conversation is ever
//     forgotten for it: each is persisted after every turn (write-behind), and a request that
//     resends a history finds its conversation again in any tier, after a restart or a kill -9.
//   - Secure by default: it binds to loopback; binding anywhere else needs an API key (--api-key
//     or $MZ_API_KEY), and with a key every endpoint but /health needs "Authorization: Bearer KEY".
//     Bodies are limited (--max-body), nesting is limited before parsing, every bad request is a
//     400 with OpenAI's error object, and no request names a file (conversation ids are checked
//     against the pool's rule; a request's model is a name among those loaded, never a path).
//
// Endpoints: GET /health, GET /v1/models, POST /v1/chat/completions, POST /v1/completions (stream
// or not); mzcache's own: GET /v1/mzcache/pool (pool report and conversations), POST
// /v1/mzcache/trim {"level": N} (Android's onTrimMemory levels) and POST /v1/mzcache/evict
// {"bytes": N}, DELETE /v1/mzcache/conversations/ID. Since 0.14 (tools/serve/resources.cpp): GET
// /metrics, GET /slots, POST /tokenize, POST /detokenize, GET /props, /v1/conversations[/ID[/evict|/restore]].
//
// Threads: httplib's worker pool runs the handlers; at most --parallel turns generate at once
// (others wait in a queue of at most --queue, then 503 with Retry-After); the turns generating
// share one forward pass a step at a time (the pool's batcher, mz_pool_params.batch: continuous
// batching, a finished turn's slot taken by the next request at the next step; --no-batch: each
// turn computes alone); the pool's own threads persist and watch pressure. Shutdown (SIGINT/SIGTERM): stop accepting, finish the turns, persist, exit 0.
#include <CLI/CLI.hpp>

#include <memory>

#include "tools/commands.h"
#include "tools/serve/server.h"
#include "tools/weights_option.h"

namespace mz::cli {

using serve_app::ServeArgs;
using serve_app::RunServe;

void AddServeCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<ServeArgs>();
  auto* c = app.add_subcommand("serve",
                               "OpenAI-compatible HTTP server over a pool: gives memory back under pressure and never "
                               "forgets a conversation (docs/server.md)");
  c->add_option("-m,--model", a->models,
                "GGUF to serve; repeat for several models sharing --memory-budget, each named by its file's stem "
                "and picked by a request's \"model\" (default: the synthesized Qwen3-0.6B)");
  c->add_option("--models-dir", a->models_dir, "serve every .gguf file of this folder too (as -m for each)");
  AddWeightsOption(c, &a->weights);
  c->add_option("--host", a->host, "address to bind (default 127.0.0.1; another needs an API key)");
  c->add_option("--port", a->port, "port (default 8080; 0: any free port, printed)");
  c->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' (default: $MZ_API_KEY; none on loopback)");
  c->add_option("--pool-dir", a->dir,
                "folder of the stored conversations (default <cache>/server; with several models, each in <dir>/<name>/)");
  c->add_option("--alias", a->alias, "model id reported to clients, with one model (default: the GGUF file's stem)");
  c->add_option("-t,--threads", a->threads, "compute threads per turn (default 2)")->check(CLI::Range(1, 512));
  c->add_option("-c,--ctx", a->n_ctx, "tokens per conversation, prompt and reply (default 8192)")->check(CLI::Range(64, 1 << 20));
  c->add_option("--parallel", a->parallel, "turns generating at once, batched in one forward pass (default 8; more wait)")
      ->check(CLI::Range(1, 64));
  c->add_flag("!--no-batch", a->batch, "each turn computes on its own forward pass (default: one pass for every turn)");
  c->add_option("--prefill-slice", a->prefill_slice,
                "prompt tokens per step at most while other turns decode (default 512; chunked prefill)")
      ->check(CLI::Range(1, 8192));
  c->add_option("--itl-factor", a->itl_factor,
                "a prompt slice beside decoding turns keeps the step within this many decode steps (default 2; 0: "
                "--prefill-slice fixed)")
      ->check(CLI::Range(0.0, 1000.0));
  c->add_option("--queue", a->queue, "requests waiting for a turn before 503 (default 64)")->check(CLI::Range(0, 100000));
  c->add_option("--max-tokens", a->max_tokens, "most tokens of a reply (default 1024; a request may ask fewer)")->check(CLI::Range(1, 1 << 20));
  c->add_option("--memory-budget", a->memory_budget_mib, "MiB of RAM for weights and every conversation, of every model together (default 0: none; pressure still applies)");
  c->add_option("--disk-budget", a->disk_budget_mib, "MiB of stored conversations; beyond it the least recently used are deleted and counted (default 8192; 0: none)");
  c->add_option("--max-body", a->max_body_kib, "largest request body in KiB (default 1024; larger: 413)")->check(CLI::Range(1, 1 << 20));
  c->add_option("--timeout", a->read_timeout_s, "seconds a client may stay silent while sending or receiving (default 10)")->check(CLI::Range(1, 3600));
  c->add_option("--http-threads", a->http_threads, "connection handler threads (default 32)")->check(CLI::Range(2, 4096));
  c->add_option("--persist-codec", a->persist_codec, "codec of stored conversations: q8 (default), none (lossless), lz4, zstd");
  c->add_option("--kv-type", a->kv_type, "resident KV format: f16 (default) or q8_0 (about half the memory, read in place)")
      ->check(CLI::IsMember({"f16", "q8_0"}));
  c->add_option("--kv-codec", a->kv_codec, "codec of KV evicted under pressure: q8 (default), none, lz4, zstd, q4, cachegen");
  c->add_flag("--sync-persist", a->sync_persist,
              "persist each turn before answering it (default: write-behind, at most one turn behind on a kill -9)");
  c->add_flag("!--no-watch-pressure", a->watch_pressure, "do not watch the system's memory pressure");
  c->add_flag("!--no-restore-ahead", a->restore_ahead, "do not restore in the background once pressure is over");
  c->add_option("--pressure-source", a->pressure_source, "auto (default), psi, cgroup-v1, watermark");
  c->add_option("--pressure-cgroup", a->pressure_cgroup, "memory cgroup folder to watch (default: system-wide)");
  c->add_option("--port-file", a->port_file,
                "write the port listened on to this file once the model is loaded (for scripts)");
  c->add_flag("!--no-metrics", a->metrics, "no GET /metrics (default: Prometheus metrics, behind the API key if set)");
  c->add_flag("!--no-slots", a->slots,
              "no GET /slots (default: each --parallel slot's turn, as llama-server's, behind the API key if set)");
  c->add_option("--api-key-file", a->api_key_file, "read the API key from this file (its first line; not with --api-key)");
  c->add_option("--cors", a->cors,
                "allow browsers on this origin (e.g. http://localhost:3000; * for any) to call the API (default: "
                "no CORS headers)");
  c->add_option("--chat-template-file", a->chat_template_file,
                "Jinja chat template for requests with tools (default: the GGUF's tokenizer.chat_template)");
  c->add_option("--remote", a->remote,
                "redis://[user@]host:port: a fleet's remote tier (docs/fleet.md): conversations and shared chunks "
                "in Redis, so any server of the fleet continues any conversation (rediss://: over TLS, the "
                "server's certificate verified and its name checked against host)");
  c->add_option("--remote-password-file", a->remote_password_file,
                "the Redis password (its first line; the URL's user is the ACL user)");
  c->add_option("--remote-ca-file", a->remote_ca_file,
                "rediss:// only: PEM certificate authorities to trust (default: the system's)");
  c->add_option("--remote-cert-file", a->remote_cert_file,
                "rediss:// only: a PEM client certificate, for a Redis with tls-auth-clients (with --remote-key-file)");
  c->add_option("--remote-key-file", a->remote_key_file,
                "rediss:// only: the client certificate's unencrypted PEM private key (with --remote-cert-file)");
  c->add_option("--remote-timeout", a->remote_timeout_ms, "milliseconds to connect to Redis and for each reply (default 2000)")
      ->check(CLI::Range(1, 600000));
  c->add_flag("--remote-prefix-whole", a->remote_prefix_whole,
              "a request without a conversation id whose history Redis holds by chain hash: fetch those chunks "
              "whole before its prefill (default: streamed in front layers first, overlapped with the prefill, "
              "as a conversation named by id); for comparing the two (bench fleet)");
  // TEST HOOK, hidden from --help (group ""): tools/serve/scripted_replies.h.
  c->add_option("--test-scripted-replies", a->test_scripted_replies,
                "TEST HOOK: each turn's reply is the next string of this JSON array (loopback only)")
      ->group("");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunServe(*a);
  });
}

}  // namespace mz::cli
