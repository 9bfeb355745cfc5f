// `run` / `chat` --sustained: the options of sustained mode (mz_context_set_sustained in
// include/mzcache.h) and the line run and chat print when the controller steps the threads.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "mzcache.h"

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
// Enables sustained mode on ctx per a (nothing when !a.on), printing the sensors it found and the
// caps to stderr. From then on mz_decode / mz_restore_generate pace and step the threads, and a line
// is printed to stderr each time the threads change or a change is refused. Returns MZ_OK or
// mz_context_set_sustained's error (mz_last_error says why; sustained mode is then off).
int StartSustained(const SustainedArgs& a, mz_context* ctx);

}  // namespace mz::cli
