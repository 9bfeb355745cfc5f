// Internals shared by the C API's translation units (src/api/*.cpp): the handle structs, the
// exception/status boundary and params reading. Not installed; never included outside src/api.
#pragma once
#include "mzcache.h"

#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "model/model.h"
#include "pressure/monitor.h"
#include "restore/restore_pipeline.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/sustained.h"
#include "runtime/tokenizer.h"

struct mz_model {
  std::unique_ptr<mz::Model> model;
  std::unique_ptr<mz::Tokenizer> tok;
};
struct mz_context {
  std::unique_ptr<mz::Context> ctx;
  // Sustained mode (mz_context_set_sustained; src/api/sustained_api.cpp), NULL when off. The
  // pointer is replaced under sustained_mu (the stats getter may run on any thread); mz_decode reads
  // it without the lock (setting is not concurrent with the context's other calls).
  std::mutex sustained_mu;
  std::unique_ptr<mz::SustainedMode> sustained;
  // The compute threads (count, pinned CPUs) before sustained mode was enabled: put back when it is
  // disabled or replaced, so a new setting does not start from what the old one stepped down to.
  int pre_sustained_threads = 0;
  std::vector<int> pre_sustained_cpus;
  // mz_sustained_params.on_event / user of the setting in force (NULL: not reported).
  void (*sustained_on_event)(const mz_sustained_event*, void*) = nullptr;
  void* sustained_user = nullptr;
  // Memory pressure (mz_on_trim_memory, mz_pressure_*). The monitor is declared last: destroyed
  // (thread joined, safe-point hook removed) before everything its callback uses and the context.
  std::mutex stats_mu;
  mz_pressure_stats stats{};
  std::mutex pressure_mu;  // guards pressure, watching, watch_why and generating
  bool watching = false;
  std::string watch_why;   // why the watcher's source was chosen (mz_pressure_watch_reason)
  bool generating = false; // mz_pressure_set_generating: a monitor installed meanwhile begins one too
  std::unique_ptr<mz::PressureMonitor> pressure;
};
struct mz_sampler {
  std::unique_ptr<mz::Sampler> s;
};

namespace mz_api {
inline thread_local std::string t_last_error;

inline int Fail(const mz::Status& st, const char* fn) {
  t_last_error = std::string(fn) + ": " + st.message();
  return int(st.code());
}

template <class F>
int Guard(const char* fn, F&& f) {
  try {
    mz::Status st = f();
    if (!st.ok()) return Fail(st, fn);
    t_last_error.clear();
    return MZ_OK;
  } catch (const std::bad_alloc&) {
    return Fail(mz::Status::NoMemory("allocation failed"), fn);
  } catch (const std::exception& e) {
    return Fail(mz::Status::Internal(e.what()), fn);
  } catch (...) {
    return Fail(mz::Status::Internal("unknown exception"), fn);
  }
}
// The struct_size values a caller can pass. A released header's struct ends after its version's
// last field, tail padding included, and the next version's first field starts at or past that
// size (the header's rule). So a known size lies between the end of one version's last field and
// the start of the next version's first field: a size inside a field (which would copy half of a
// pointer) is never one. Each struct lists its version boundaries; the current sizeof is known too.
struct SizeRange {
  uint32_t lo, hi;  // accepted: lo <= struct_size <= hi
};
#define MZ_FIELD_END(T, f) uint32_t(offsetof(T, f) + sizeof(T::f))
#define MZ_VERSION_END(T, last, next) SizeRange{MZ_FIELD_END(T, last), uint32_t(offsetof(T, next))}
#define MZ_ONLY_VERSION(T, last) SizeRange{MZ_FIELD_END(T, last), uint32_t(sizeof(T))}
inline constexpr SizeRange kModelParamsSizes[] = {MZ_ONLY_VERSION(mz_model_params, weight_memory)};
inline constexpr SizeRange kContextParamsSizes[] = {
    MZ_VERSION_END(mz_context_params, restore_threads, reconcile_min_missing),  // the first with struct_size
    MZ_VERSION_END(mz_context_params, reconcile_min_missing, memory_budget),    // 0.6
    MZ_VERSION_END(mz_context_params, memory_check, kv_type),                   // 0.9 before kv_type
    MZ_VERSION_END(mz_context_params, kv_type, restore_nice_beside_batch),      // 0.9-0.15
};
inline constexpr SizeRange kRestoreParamsSizes[] = {
    MZ_VERSION_END(mz_restore_params, attend_compressed, compute_threads_while_restoring),  // before 0.19
};
inline constexpr SizeRange kSamplerParamsSizes[] = {MZ_ONLY_VERSION(mz_sampler_params, seed)};
inline constexpr SizeRange kPressureParamsSizes[] = {MZ_VERSION_END(mz_pressure_params, restore_margin, on_action)};
inline constexpr SizeRange kProfileParamsSizes[] = {
    MZ_VERSION_END(mz_profile_params, user, remote_url),               // 0.16 and before
    MZ_VERSION_END(mz_profile_params, remote_url, remote_ca_file),     // 0.17-0.18
};
inline constexpr SizeRange kSustainedParamsSizes[] = {MZ_VERSION_END(mz_sustained_params, thermal_root, thermal_zone)};
inline constexpr SizeRange kPlanParamsSizes[] = {MZ_ONLY_VERSION(mz_plan_params, margin)};
inline constexpr SizeRange kBudgetParamsSizes[] = {
    MZ_VERSION_END(mz_budget_params, memory_budget, pass_after_return),  // 0.15-0.18
};
inline constexpr SizeRange kPoolParamsSizes[] = {
    MZ_VERSION_END(mz_pool_params, context, read_stored_whole),         // 0.7
    MZ_VERSION_END(mz_pool_params, read_stored_whole, load_arena_bytes),  // 0.8-0.11
    MZ_VERSION_END(mz_pool_params, write_behind_yield_ms, batch),         // 0.12
    MZ_VERSION_END(mz_pool_params, batch_itl_factor, shared_budget),      // 0.13-0.14
    MZ_VERSION_END(mz_pool_params, remote_ttl_s, remote_ca_file),         // 0.15-0.17
    MZ_VERSION_END(mz_pool_params, remote_key_file, remote_prefix_whole), // 0.18
};
#undef MZ_ONLY_VERSION
#undef MZ_VERSION_END
#undef MZ_FIELD_END

// The caller's params over the defaults: NULL gives the defaults; a known struct_size (the current
// sizeof, or one of the ranges of `sizes`: an older header's) copies that many bytes (an older
// caller's fields and its tail padding) and leaves the rest at their defaults; any other
// struct_size is refused before a byte past it is read.
template <class P, size_t N>
mz::Status ReadParams(const P* in, P defaults, const SizeRange (&sizes)[N], const char* what, P* out) {
  *out = defaults;
  if (!in) return mz::Status::Ok();
  const uint32_t n = in->struct_size;
  bool known = n == sizeof(P);
  for (const SizeRange& r : sizes) known = known || (r.lo <= n && n <= r.hi);
  if (!known) {
    std::string list;  // only for the message: ReadParams runs on every call (restore params per query)
    for (const SizeRange& r : sizes)
      list += (r.lo == r.hi ? std::to_string(r.lo) : std::to_string(r.lo) + ".." + std::to_string(r.hi)) + ", ";
    return mz::Status::InvalidArgument(std::string("struct ") + what + ": struct_size " + std::to_string(n) +
                                       " is not a size this library knows (" + list + std::to_string(sizeof(P)) +
                                       "): start from " + what + "'s default_params()");
  }
  std::memcpy(static_cast<void*>(out), static_cast<const void*>(in), n);
  out->struct_size = uint32_t(sizeof(P));
  return mz::Status::Ok();
}
}  // namespace mz_api


namespace mz_api {
// mz_context_params (already read with ReadParams) to ContextOptions; kInvalidArgument on a value
// out of range.
mz::Status ToContextOptions(const mz_context_params& p, mz::ContextOptions* o);
// mz_restore_params (NULL: defaults) to PipelineOptions, checked.
mz::Status ToPipelineOptions(const mz_restore_params* params, mz::PipelineOptions* po);
void ToRestoreStats(const mz::RestoreGenerateStats& st, mz_restore_stats* out);
// mz_pressure_params (already read with ReadParams) to the source and amount options, checked.
mz::Status ToPressureOptions(const mz_pressure_params& p, mz::PressureSourceOptions* so, mz::AmountOptions* ao);
// Android onTrimMemory level -> pressure level (see mz_on_trim_memory); false: no action.
bool TrimLevel(int32_t level, mz::PressureLevel* out);
// Runs one generation step f (a Decode / RestoreGenerate of n tokens) and, when it succeeded and
// sustained mode is on, lets it pace and step the threads (SustainedMode::AfterStep) and reports a
// change or a refusal to mz_sustained_params.on_event.
template <class F>
mz::Status SustainedStep(mz_context* c, int n, F&& f) {
  if (!c->sustained) return f();
  mz::Env* env = c->ctx->model()->env();
  const uint64_t t0 = env->NowNs();
  mz::Status st = f();
  if (!st.ok()) return st;
  mz::SustainedEvent ev;
  c->sustained->AfterStep(n, t0, env->NowNs(), &ev);
  if (c->sustained_on_event && (ev.changed || ev.refused)) {
    const mz_sustained_event e{ev.from, ev.refused ? ev.from : ev.to, ev.wanted, ev.refused, mz::SustainedReasonName(ev.reason),
                               ev.why.c_str(), int32_t(ev.status.code()), ev.status.message().c_str()};
    c->sustained_on_event(&e, c->sustained_user);
  }
  return st;
}
}  // namespace mz_api
