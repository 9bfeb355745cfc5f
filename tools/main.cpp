// mzcache: command-line front end. Each subcommand lives in tools/cmd_*.cpp.
#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"mzcache: an on-device LLM runtime that gives memory back under pressure and restores fast"};
  app.require_subcommand(1);
  std::vector<std::function<int()>> runners;
  mz::cli::AddModelCommands(app, runners);
  mz::cli::AddRunCommands(app, runners);
  mz::cli::AddConversationCommands(app, runners);
  mz::cli::AddBenchCommands(app, runners);
  mz::cli::AddProfileCommands(app, runners);
  mz::cli::AddPlanCommands(app, runners);
#ifdef MZ_HAVE_SERVE
  mz::cli::AddServeCommands(app, runners);
  mz::cli::AddDemoCommands(app, runners);
#endif
  mz::cli::AddOsPagingWorker(app, runners);
  mz::cli::AddMultitaskCommands(app, runners);  // after AddBenchCommands: adds `bench multitask`
  mz::cli::AddReliabilityCommands(app, runners);
  CLI11_PARSE(app, argc, argv);
  for (auto& r : runners) {
    int rc = r();  // -1: that subcommand was not selected
    if (rc >= 0) return rc;
  }
  return 0;
}
