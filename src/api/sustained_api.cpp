// C API of sustained mode (mz_context_set_sustained, mz_context_get_sustained_stats and _info): see
// include/mzcache.h and src/runtime/sustained.h.
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>

#include "api/api_internal.h"
#include "runtime/sustained.h"

using namespace mz_api;

namespace {

uint64_t SecondsNs(float s) { return uint64_t(double(s) * 1e9); }

mz::Status ToSustainedOptions(const mz_sustained_params& p, mz::SustainedModeOptions* o) {
  auto finite_nonneg = [](float v) { return std::isfinite(v) && v >= 0; };
  if (!finite_nonneg(p.hold_up_s) || !finite_nonneg(p.min_interval_s) || !finite_nonneg(p.probe_up_s) ||
      p.hold_up_s > 86400 || p.min_interval_s > 86400 || p.probe_up_s > 86400)
    return mz::Status::InvalidArgument("hold_up_s, min_interval_s and probe_up_s must be in [0, 86400] seconds");
  if (!(std::isfinite(p.window_s) && p.window_s > 0 && p.window_s <= 3600))
    return mz::Status::InvalidArgument("window_s must be in (0, 3600] seconds");
  if (p.max_threads < 0) return mz::Status::InvalidArgument("max_threads must be >= 0 (0: the context's threads)");
  mz::SustainedModeOptions m;
  m.control.max_threads = p.max_threads;
  m.control.min_threads = p.min_threads;
  m.control.band_c = p.band_c;
  m.control.hold_up_ns = SecondsNs(p.hold_up_s);
  m.control.min_interval_ns = SecondsNs(p.min_interval_s);
  m.control.drift = p.drift;
  m.control.probe_up_ns = SecondsNs(p.probe_up_s);
  m.duty = p.duty_cycle;
  m.window_ns = SecondsNs(p.window_s);
  m.high_c = p.high_c;
  m.trip_margin_c = p.trip_margin_c;
  if (p.thermal_root) m.thermal_root = p.thermal_root;
  if (p.thermal_zone) m.zone_filter = p.thermal_zone;
  MZ_RETURN_IF_ERROR(mz::ValidateSustainedModeOptions(m));
  *o = m;
  return mz::Status::Ok();
}

// The two read-outs of sustained mode: zeroes *out, then (sustained mode on) sets enabled and lets
// fill copy the controller's statistics into it. Guarded by sustained_mu.
template <class Out, class Fill>
int ReadSustained(const char* fn, mz_context* ctx, Out* out, Fill fill) {
  return Guard(fn, [&]() -> mz::Status {
    if (!ctx || !out) return mz::Status::InvalidArgument("null argument");
    std::memset(out, 0, sizeof *out);
    std::lock_guard<std::mutex> lk(ctx->sustained_mu);
    if (!ctx->sustained) return mz::Status::Ok();
    out->enabled = 1;
    fill(ctx->sustained->stats(), out);
    return mz::Status::Ok();
  });
}
}  // namespace

extern "C" {

mz_sustained_params mz_sustained_default_params(void) {
  mz_sustained_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = uint32_t(sizeof(p));
  const mz::SustainedModeOptions d;
  p.max_threads = 0;
  p.min_threads = d.control.min_threads;
  p.duty_cycle = float(d.duty);
  p.high_c = float(d.high_c);
  p.trip_margin_c = float(d.trip_margin_c);
  p.band_c = float(d.control.band_c);
  p.hold_up_s = float(double(d.control.hold_up_ns) * 1e-9);
  p.min_interval_s = float(double(d.control.min_interval_ns) * 1e-9);
  p.drift = float(d.control.drift);
  p.probe_up_s = float(double(d.control.probe_up_ns) * 1e-9);
  p.window_s = float(double(d.window_ns) * 1e-9);
  p.thermal_root = nullptr;
  p.thermal_zone = nullptr;
  p.on_event = nullptr;
  p.user = nullptr;
  return p;
}

int mz_context_set_sustained(mz_context* ctx, const mz_sustained_params* params) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    mz_sustained_params p;
    mz::SustainedModeOptions o;
    if (params) {
      MZ_RETURN_IF_ERROR(ReadParams(params, mz_sustained_default_params(), kSustainedParamsSizes, "mz_sustained_params", &p));
      MZ_RETURN_IF_ERROR(ToSustainedOptions(p, &o));
    }
    if (ctx->sustained) {
      // Disabling or replacing: the threads the context had before sustained mode come back first.
      MZ_RETURN_IF_ERROR(ctx->ctx->SetThreads(ctx->pre_sustained_threads, ctx->pre_sustained_cpus));
      std::lock_guard<std::mutex> lk(ctx->sustained_mu);
      ctx->sustained.reset();
      ctx->sustained_on_event = nullptr;
      ctx->sustained_user = nullptr;
    }
    if (!params) return mz::Status::Ok();
    ctx->pre_sustained_threads = ctx->ctx->n_threads();
    ctx->pre_sustained_cpus = ctx->ctx->compute_cpus();
    auto m = std::make_unique<mz::SustainedMode>(ctx->ctx->model()->env(), ctx->ctx.get(), o);
    MZ_RETURN_IF_ERROR(m->Init());
    std::lock_guard<std::mutex> lk(ctx->sustained_mu);
    ctx->sustained = std::move(m);
    ctx->sustained_on_event = p.on_event;
    ctx->sustained_user = p.user;
    return mz::Status::Ok();
  });
}


int mz_context_get_sustained_stats(mz_context* ctx, mz_sustained_stats* out) {
  return ReadSustained(__func__, ctx, out, [](const mz::SustainedStats& s, mz_sustained_stats* o) {
    o->threads = s.threads;
    o->steps_down = s.steps_down;
    o->steps_up = s.steps_up;
    o->n_zones = s.n_zones;
    o->has_temp = s.has_temp ? 1 : 0;
    o->temp_c = float(s.temp_c);
    o->high_c = float(s.high_c);
    o->window_tokens_per_s = float(s.window_tokens_per_s);
    o->slept_s = double(s.slept_ns) * 1e-9;
    o->busy_s = double(s.busy_ns) * 1e-9;
  });
}

int mz_context_get_sustained_info(mz_context* ctx, mz_sustained_info* out) {
  return ReadSustained(__func__, ctx, out, [](const mz::SustainedStats& s, mz_sustained_info* o) {
    o->min_threads = s.min_threads;
    o->max_threads = s.max_threads;
    o->threads = s.threads;
    std::snprintf(o->sensors, sizeof o->sensors, "%s", s.sensors.c_str());
  });
}

}  // extern "C"
