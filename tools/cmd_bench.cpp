// bench speed (filled in below)
#include "tools/commands.h"
namespace mz::cli {
void AddBenchCommands(CLI::App& app, Runners& runners) {}
}  // namespace mz::cli
