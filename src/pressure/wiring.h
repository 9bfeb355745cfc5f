// The pressure wiring an app (or `mzcache chat --watch-pressure`, or bench multitask's worker)
// needs in one call: choose the source (CreatePressureSource), build the monitor over a context with
// an amount policy, hook the action callback, and start it.
//
// Ownership: the returned monitor borrows ctx (which must outlive it) and owns the source.
// Failure: the source's creation error (kUnsupported for a kind this machine lacks, kInvalidArgument
// for an unknown kind) or the monitor's Start error; *out is then empty and nothing keeps running
// (the context's safe-point hook is removed again).
// Thread-safety: as PressureMonitor (call from the thread that owns the context).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "pressure/amount_policy.h"
#include "pressure/monitor.h"
#include "pressure/pressure_source.h"

namespace mz {

class Context;
class Env;

struct PressureWatchOptions {
  PressureSourceOptions source;  // which source (kind "auto": the best this machine supports)
  AmountOptions amount;          // how much to give back per event, restore-ahead
  // Optional: wraps the chosen source before the monitor takes it (e.g. to report every event it
  // sees); returns the source the monitor uses.
  std::function<std::unique_ptr<PressureSource>(std::unique_ptr<PressureSource>)> wrap_source;
  // Optional: PressureMonitor::set_on_action, installed before the monitor starts.
  std::function<void(const PressureAction&)> on_action;
};

// Creates the source through env (nullptr: Env::Default(); also the monitor's clock) and the
// monitor on ctx, installs on_action and starts it; *out receives the running monitor and, if why is
// given, *why says which source was chosen and why the others were not.
Status StartPressureMonitor(Env* env, Context* ctx, const PressureWatchOptions& opts,
                            std::unique_ptr<PressureMonitor>* out, std::string* why);

}  // namespace mz
