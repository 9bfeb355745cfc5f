// `run` / `chat` --sustained: the options of sustained mode (src/runtime/sustained.h) and the line
// chat prints when the controller steps the threads.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/context.h"
#include "runtime/sustained.h"

namespace mz::cli {

struct SustainedArgs {
  bool on = false;
  int max_threads = 0;   // 0: --threads
  int min_threads = 1;
  double duty = 1.0;
  double high_c = 0;     // 0: each zone's passive trip minus the margin
  double margin_c = 5;
  double band_c = 5;
  double hold_up_s = 30;
  double min_interval_s = 10;
  double drift = 0.25;
  double probe_up_s = 120;
  std::string thermal_root = "/sys/class/thermal";
  std::string zone;      // zone type filter
};

void AddSustainedOptions(CLI::App* c, SustainedArgs& a);
// Enables sustained mode on ctx per a (a.on), printing the sensors it found and the caps; *out
// null when off. Errors: SustainedMode::Init's.
Status StartSustained(const SustainedArgs& a, Context* ctx, std::unique_ptr<SustainedMode>* out);
// After a generation step of n tokens over [t0, t1) (Env::Default()->NowNs()): paces and steps
// (SustainedMode::AfterStep) and prints a line to stderr when the threads changed or a change was
// refused. No-op when m is null.
void SustainedAfterStep(SustainedMode* m, int n, uint64_t t0, uint64_t t1);

}  // namespace mz::cli
