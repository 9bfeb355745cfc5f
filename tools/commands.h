// Registration of CLI subcommands. Each Add* adds its subcommands to app and pushes a runner that
// returns the exit code when its subcommand was selected (else an empty function is skipped).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mz::cli {
using Runners = std::vector<std::function<int()>>;
void AddModelCommands(CLI::App& app, Runners& runners);  // make-model, info
void AddRunCommands(CLI::App& app, Runners& runners);    // run, chat
void AddConversationCommands(CLI::App& app, Runners& runners);  // conversations [rm NAME]
// chat --conversation NAME: a named conversation of the pool in dir (tools/cli/cmd_conversations.cpp).
int RunConversationChat(const std::string& model, const std::string& dir, const std::string& id, int threads, int n_ctx,
                        int n_predict, uint64_t memory_budget_mib, float temp, int top_k, float top_p, uint32_t seed,
                        const std::string& weights = "page-cache");
// chat -m A -m B: several models sharing one memory budget, /model NAME between turns, conversation
// id ("" = "chat") in each model's pool, <dir>/<name>/ (tools/cli/cmd_conversations.cpp).
int RunModelsChat(const std::vector<std::string>& models, const std::string& dir, const std::string& id, int threads,
                  int n_ctx, int n_predict, uint64_t memory_budget_mib, float temp, int top_k, float top_p,
                  uint32_t seed, const std::string& weights = "page-cache");  // weights: --weights (tools/weights_option.h)
void AddBenchCommands(CLI::App& app, Runners& runners);  // bench speed, bench ttft
void AddProfileCommands(CLI::App& app, Runners& runners);  // profile
void AddPlanCommands(CLI::App& app, Runners& runners);     // plan [--recommend] (tools/cli/cmd_plan.cpp)
void AddServeCommands(CLI::App& app, Runners& runners);    // serve (tools/serve/cmd_serve.cpp)
void AddDemoCommands(CLI::App& app, Runners& runners);     // demo (tools/cli/cmd_demo.cpp): the main job's story
void AddTtftBench(CLI::App* bench, Runners& runners);       // bench ttft
void AddEvictBench(CLI::App* bench, Runners& runners);      // bench evict
void AddPeersBench(CLI::App* bench, Runners& runners);      // bench peers, bench peers-worker (hidden)
void AddAccuracyBench(CLI::App* bench, Runners& runners);   // bench accuracy
void AddKvTypeBench(CLI::App* bench, Runners& runners);     // bench kv-type (q8_0 vs f16 KV)
void AddFootprintBench(CLI::App* bench, Runners& runners);  // bench footprint
void AddPoolBench(CLI::App* bench, Runners& runners);       // bench pool
void AddModelsBench(CLI::App* bench, Runners& runners);     // bench models
void AddFieldNotesBench(CLI::App* bench, Runners& runners); // bench field-notes (tools/bench/cmd_bench_field_notes.cpp)
void AddBatchBench(CLI::App* bench, Runners& runners);      // bench batch (tools/bench/cmd_bench_batch.cpp)
void AddPaperBench(CLI::App* bench, Runners& runners);      // bench paper (runs the parts above)
void AddSustainedBench(CLI::App* bench, Runners& runners);  // bench sustained (tools/bench/cmd_bench_sustained.cpp)
void AddOsPagingWorker(CLI::App& app, Runners& runners);    // ospaging-worker (hidden)
// bench multitask (added under `bench`: call after AddBenchCommands) + hidden multitask-worker/-app
void AddMultitaskCommands(CLI::App& app, Runners& runners);
// reliability kill, reliability soak (issue 25), and their hidden child workers.
void AddReliabilityCommands(CLI::App& app, Runners& runners);
void AddKillCommand(CLI::App* reliability, CLI::App& app, Runners& runners);  // tools/reliability/cmd_kill.cpp
void AddSoakCommand(CLI::App* reliability, Runners& runners);                 // tools/reliability/cmd_soak.cpp
}  // namespace mz::cli
