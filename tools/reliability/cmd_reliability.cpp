// `mzcache reliability`: the figures behind mzcache's promises (issue 25, docs/reliability.md).
//   kill   SIGKILL a process at random points of session saves, evictions to storage and the pool's
//          write-behind; reopen; the state must be the old one or the new one, exactly.
//   soak   seeded random cycles of evict / restore / restore_generate / decode / truncate / session
//          save+load against a never-evicted oracle, with RSS and file-descriptor drift checks.
#include <CLI/CLI.hpp>

#include "tools/commands.h"

namespace mz::cli {

void AddReliabilityCommands(CLI::App& app, Runners& runners) {
  auto* r = app.add_subcommand("reliability", "kill -9 and soak harnesses (docs/reliability.md)");
  r->require_subcommand(1);
  AddKillCommand(r, app, runners);
  AddSoakCommand(r, runners);
}

}  // namespace mz::cli
