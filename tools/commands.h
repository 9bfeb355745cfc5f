// Registration of CLI subcommands. Each Add* adds its subcommands to app and pushes a runner that
// returns the exit code when its subcommand was selected (else an empty function is skipped).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace mz::cli {
using Runners = std::vector<std::function<int()>>;
void AddModelCommands(CLI::App& app, Runners& runners);  // make-model, info
void AddRunCommands(CLI::App& app, Runners& runners);    // run, chat
void AddBenchCommands(CLI::App& app, Runners& runners);  // bench speed, bench ttft
void AddProfileCommands(CLI::App& app, Runners& runners);  // profile
void AddTtftBench(CLI::App* bench, Runners& runners);       // bench ttft
void AddEvictBench(CLI::App* bench, Runners& runners);      // bench evict
void AddOsPagingWorker(CLI::App& app, Runners& runners);    // ospaging-worker (hidden)
}  // namespace mz::cli
