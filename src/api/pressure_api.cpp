// The C boundary of a context's memory pressure (mz_on_trim_memory, mz_pressure_*).
#include "mzcache.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <vector>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "env/cpu_topology.h"
#include "model/model.h"
#include "policy/profiler.h"
#include "pressure/manual_source.h"
#include "pressure/monitor.h"
#include "runtime/chat_render.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "api/api_internal.h"

using namespace mz_api;
namespace mz_api {

mz::Status ToPressureOptions(const mz_pressure_params& p, mz::PressureSourceOptions* so, mz::AmountOptions* ao) {
  if (!(p.step_points > 0 && p.step_points <= 1)) return mz::Status::InvalidArgument("step_points must be in (0, 1]");
  if (!(p.escalation >= 1 && p.escalation <= 16)) return mz::Status::InvalidArgument("escalation must be in [1, 16]");
  if (!(p.max_step_points >= p.step_points && p.max_step_points <= 1))
    return mz::Status::InvalidArgument("max_step_points must be in [step_points, 1]");
  if (!(p.floor_points >= 0 && p.floor_points < 1)) return mz::Status::InvalidArgument("floor_points must be in [0, 1)");
  if (p.poll_ms == 0) return mz::Status::InvalidArgument("poll_ms must be positive");
  if (!(p.restore_margin >= 0 && p.restore_margin < 1)) return mz::Status::InvalidArgument("restore_margin must be in [0, 1)");
  so->kind = p.source ? p.source : "auto";
  so->cgroup_dir = p.cgroup_dir ? p.cgroup_dir : "";
  so->psi_stall_us = p.psi_stall_us;
  so->psi_window_us = p.psi_window_us;
  so->poll_ms = int(p.poll_ms);
  ao->step_points = p.step_points;
  ao->escalation = p.escalation;
  ao->max_step_points = p.max_step_points;
  ao->floor_points = p.floor_points;
  ao->escalation_window_ns = uint64_t(p.escalation_window_ms) * 1000000ull;
  ao->hysteresis_ns = uint64_t(p.hysteresis_ms) * 1000000ull;
  ao->restore_ahead = p.restore_in_background ? mz::AmountOptions::RestoreAhead::kBackground
                                              : mz::AmountOptions::RestoreAhead::kOnRequest;
  ao->calm_ns = uint64_t(p.calm_ms) * 1000000ull;
  ao->restore_margin = p.restore_margin;
  return mz::Status::Ok();
}

}  // namespace mz_api

namespace pressure_api {
using mz_api::ToPressureOptions;

void SetActionHandler(mz_context* ctx, void (*on_action)(const mz_pressure_action*, void*), void* user);

// Makes ctx->pressure a monitor over `src`, counting its actions into ctx->stats and passing each to
// on_action (mz_pressure_params.on_action; NULL: none) with user. pressure_mu held.
void InstallMonitor(mz_context* ctx, std::unique_ptr<mz::PressureSource> src, const mz::AmountOptions& ao,
                    void (*on_action)(const mz_pressure_action*, void*) = nullptr, void* user = nullptr) {
  ctx->pressure.reset();  // first: the old monitor's destructor removes the safe-point hook
  ctx->pressure = std::make_unique<mz::PressureMonitor>(ctx->ctx.get(), std::move(src), ao);
  if (ctx->generating) ctx->pressure->BeginGeneration();
  SetActionHandler(ctx, on_action, user);
}

// The monitor's action handler: counts each action into ctx->stats and passes it to on_action
// (NULL: none) with user. pressure_mu held, ctx->pressure set.
void SetActionHandler(mz_context* ctx, void (*on_action)(const mz_pressure_action*, void*), void* user) {
  ctx->pressure->set_on_action([ctx, on_action, user](const mz::PressureAction& a) {
    {
      std::lock_guard<std::mutex> lk(ctx->stats_mu);
      mz_pressure_stats& s = ctx->stats;
      if (a.restored) {
        if (a.status.ok()) s.restores++;
        s.bytes_restored += a.restored_bytes;
      } else if (a.event.source == "restore-ahead") {
        // waiting for headroom: not a pressure event
      } else {
        s.events++;
        s.last_level = int32_t(a.event.level);
        s.last_freed = a.freed;
        if (a.freed > 0) {
          s.evictions++;
          s.deferred += a.deferred ? 1 : 0;
          s.bytes_freed += a.freed;
        }
      }
      s.last_remaining = a.remaining;
    }  // stats_mu released: on_action may read the statistics
    if (!on_action) return;
    const mz_pressure_action x{a.event.source.c_str(),
                               int32_t(a.event.level),
                               mz::PressureLevelName(a.event.level),
                               a.requested,
                               a.freed,
                               a.deferred,
                               a.restored,
                               a.restored_bytes,
                               a.remaining,
                               double(a.applied_ns - std::min(a.applied_ns, a.event.time_ns)) * 1e-9,
                               a.repeats,
                               int32_t(a.status.code()),
                               a.status.message().c_str(),
                               a.note.c_str()};
    on_action(&x, user);
  });
}

// Handles ev as the context's watcher would (without one: a manual monitor with the default
// mz_pressure_params, kept for later events); the status of its action.
mz::Status SubmitEvent(mz_context* ctx, const mz::PressureEvent& ev) {
  std::lock_guard<std::mutex> lk(ctx->pressure_mu);
  if (!ctx->pressure) {
    mz::PressureSourceOptions so;
    mz::AmountOptions ao;
    MZ_RETURN_IF_ERROR(ToPressureOptions(mz_pressure_default_params(), &so, &ao));
    InstallMonitor(ctx, std::make_unique<mz::ManualSource>(), ao);
  }
  return ctx->pressure->Submit(ev).status;
}


}  // namespace pressure_api
using namespace pressure_api;

extern "C" {

mz_pressure_params mz_pressure_default_params(void) {
  mz_pressure_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.source = "auto";
  p.cgroup_dir = nullptr;
  p.step_points = 0.25f;
  p.escalation = 1.5f;
  p.max_step_points = 1.0f;
  p.floor_points = 0.0f;
  p.escalation_window_ms = 5000;
  p.hysteresis_ms = 1000;
  p.restore_in_background = false;
  p.calm_ms = 10000;
  p.restore_margin = 0.2f;
  p.psi_stall_us = 150000;
  p.psi_window_us = 1000000;
  p.poll_ms = 100;
  p.on_action = nullptr;
  p.user = nullptr;
  return p;
}

int mz_on_trim_memory(mz_context* ctx, int32_t level) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (level < 0) return mz::Status::InvalidArgument("negative trim level " + std::to_string(level));
    mz::PressureEvent ev;
    if (!TrimLevel(level, &ev.level)) return mz::Status::Ok();
    ev.time_ns = mz::Env::Default()->NowNs();
    ev.source = "onTrimMemory(" + std::to_string(level) + ")";
    return SubmitEvent(ctx, ev);
  });
}

int mz_pressure_submit(mz_context* ctx, int32_t level, const char* source) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (level < 0 || level > 3) return mz::Status::InvalidArgument("pressure level " + std::to_string(level) + " is not 0..3");
    mz::PressureEvent ev;
    ev.level = mz::PressureLevel(level);
    ev.time_ns = mz::Env::Default()->NowNs();
    ev.source = source ? source : "manual";
    return SubmitEvent(ctx, ev);
  });
}

int mz_pressure_set_generating(mz_context* ctx, bool generating) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (generating == ctx->generating) return mz::Status::Ok();
    ctx->generating = generating;
    if (ctx->pressure) {
      if (generating) ctx->pressure->BeginGeneration();
      else ctx->pressure->EndGeneration();
    }
    return mz::Status::Ok();
  });
}

int32_t mz_pressure_watch_reason(mz_context* ctx, char* buf, int32_t cap) {
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (cap < 0 || (!buf && cap > 0)) return mz::Status::InvalidArgument("buf must hold cap >= 0 bytes");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    const std::string why = ctx->watching ? ctx->watch_why : "";
    n = int32_t(why.size());
    if (cap > 0) CopyText(why, buf, size_t(cap));
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : int32_t(rc);
}

int mz_pressure_watch_start(mz_context* ctx, const mz_pressure_params* params) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    mz_pressure_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_pressure_default_params(), kPressureParamsSizes, "mz_pressure_params", &p));
    mz::PressureSourceOptions so;
    mz::AmountOptions ao;
    MZ_RETURN_IF_ERROR(ToPressureOptions(p, &so, &ao));
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (ctx->watching) return mz::Status::Busy("a pressure watcher already runs on this context");
    std::unique_ptr<mz::PressureSource> src;
    std::string why;
    MZ_RETURN_IF_ERROR(mz::CreatePressureSource(mz::Env::Default(), so, &src, &why));
    InstallMonitor(ctx, std::move(src), ao, p.on_action, p.user);
    mz::Status st = ctx->pressure->Start();
    if (!st.ok()) {
      ctx->pressure.reset();
      return st;
    }
    ctx->watching = true;
    ctx->watch_why = why;
    return mz::Status::Ok();
  });
}

int mz_pressure_watch_stop(mz_context* ctx) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (ctx->pressure) {
      ctx->pressure->Stop();  // the monitor stays for mz_on_trim_memory and mz_pressure_submit,
      // without the stopped watcher's on_action: its user data may be freed once this returns (the
      // monitor calls its callback under a lock that SetActionHandler takes, so none is running then)
      SetActionHandler(ctx, nullptr, nullptr);
    }
    ctx->watching = false;
    return mz::Status::Ok();
  });
}

int mz_pressure_get_stats(mz_context* ctx, mz_pressure_stats* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !out) return mz::Status::InvalidArgument("null argument");
    std::string name;
    bool pending = false, watching = false;
    {
      std::lock_guard<std::mutex> lk(ctx->pressure_mu);
      watching = ctx->watching;
      if (ctx->pressure) {
        pending = ctx->pressure->pending();
        if (watching) name = ctx->pressure->source().name();
      }
    }
    {
      std::lock_guard<std::mutex> lk(ctx->stats_mu);
      *out = ctx->stats;
    }
    out->watching = watching;
    out->pending = pending ? 1 : 0;
    std::snprintf(out->source, sizeof out->source, "%s", name.c_str());
    return mz::Status::Ok();
  });
}

}  // extern "C"