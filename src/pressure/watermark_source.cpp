#include "pressure/watermark_source.h"

#include <algorithm>
#include <chrono>

#include "env/env.h"
#include "pressure/sysfs.h"

namespace mz {

double WatermarkLevels::Mark(PressureLevel l) const {
  switch (l) {
    case PressureLevel::kLow: return o_.low_headroom;
    case PressureLevel::kMedium: return o_.medium_headroom;
    case PressureLevel::kCritical: return o_.critical_headroom;
    default: return 1.0;
  }
}

bool WatermarkLevels::Update(double headroom, uint64_t now_ns, PressureLevel* level) {
  PressureLevel raw = PressureLevel::kNone;
  for (PressureLevel l : {PressureLevel::kLow, PressureLevel::kMedium, PressureLevel::kCritical})
    if (headroom < Mark(l)) raw = l;
  PressureLevel next = raw;
  if (raw < cur_) {
    // Going down: stay at each level until headroom clears its mark by the hysteresis margin.
    next = raw;
    for (int l = int(cur_); l > int(raw); --l)
      if (headroom < Mark(PressureLevel(l)) + o_.headroom_hysteresis) {
        next = PressureLevel(l);
        break;
      }
  }
  bool emit = next != cur_ && (any_ || next != PressureLevel::kNone);
  if (!emit && next >= PressureLevel::kLow && o_.repeat_ms > 0 &&
      now_ns - last_emit_ns_ >= uint64_t(o_.repeat_ms) * 1000000ull)
    emit = true;
  cur_ = next;
  if (emit) {
    any_ = true;
    last_emit_ns_ = now_ns;
    *level = next;
  }
  return emit;
}

WatermarkSource::Sampler WatermarkSource::DefaultSampler(Env* env, const std::string& cgroup_dir, std::string* what,
                                                         bool credit_inactive) {
  if (!env) env = Env::Default();
  auto meminfo = [env](uint64_t* avail, uint64_t* lim) -> Status {
    return sysfs::ReadFields(env, "/proc/meminfo", "MemTotal", lim, "MemAvailable", avail);
  };
  uint64_t mem_total = 0;
  std::string mi;
  if (env->ReadSmallFile("/proc/meminfo", &mi).ok()) sysfs::ParseField(mi, "MemTotal", &mem_total);
  uint64_t limit = 0;
  if (!cgroup_dir.empty() && sysfs::ReadU64(env, cgroup_dir + "/memory.max", &limit) &&  // v2 ("max" does not parse)
      (mem_total == 0 || limit < mem_total)) {
    *what = cgroup_dir;
    return [env, cgroup_dir, meminfo, credit_inactive](uint64_t* avail, uint64_t* lim) -> Status {
      uint64_t cur = 0, l = 0, inactive = 0;
      // Limit lifted ("max"): the system's headroom.
      if (!sysfs::ReadU64(env, cgroup_dir + "/memory.max", &l)) return meminfo(avail, lim);
      if (!sysfs::ReadU64(env, cgroup_dir + "/memory.current", &cur))
        return Status::IOError("cannot read memory.current of " + cgroup_dir);
      std::string stat;
      if (credit_inactive && env->ReadSmallFile(cgroup_dir + "/memory.stat", &stat).ok())
        sysfs::ParseField(stat, "inactive_file", &inactive);
      const uint64_t used = cur > inactive ? cur - inactive : 0;
      *lim = l;
      *avail = l > used ? l - used : 0;
      return Status::Ok();
    };
  }
  if (!cgroup_dir.empty() && sysfs::ReadU64(env, cgroup_dir + "/memory.limit_in_bytes", &limit) &&
      (mem_total == 0 || limit < mem_total)) {
    *what = cgroup_dir;
    return [env, cgroup_dir, credit_inactive](uint64_t* avail, uint64_t* lim) -> Status {
      uint64_t usage = 0, l = 0, inactive = 0;
      if (!sysfs::ReadU64(env, cgroup_dir + "/memory.limit_in_bytes", &l) ||
          !sysfs::ReadU64(env, cgroup_dir + "/memory.usage_in_bytes", &usage))
        return Status::IOError("cannot read memory.usage_in_bytes / memory.limit_in_bytes of " + cgroup_dir);
      std::string stat;
      if (credit_inactive && env->ReadSmallFile(cgroup_dir + "/memory.stat", &stat).ok() &&
          !sysfs::ParseField(stat, "total_inactive_file", &inactive))
        sysfs::ParseField(stat, "inactive_file", &inactive);
      const uint64_t used = usage > inactive ? usage - inactive : 0;
      *lim = l;
      *avail = l > used ? l - used : 0;
      return Status::Ok();
    };
  }
  *what = cgroup_dir.empty() ? "/proc/meminfo" : "/proc/meminfo (" + cgroup_dir + " has no limit)";
  return meminfo;
}

WatermarkSource::WatermarkSource(Env* env, const PressureSourceOptions& opts)
    : env_(env ? env : Env::Default()), o_(opts), levels_(opts) {
  sampler_ = DefaultSampler(env_, opts.cgroup_dir, &what_);
  std::string what;
  strict_ = DefaultSampler(env_, opts.cgroup_dir, &what, /*credit_inactive=*/false);
}

WatermarkSource::WatermarkSource(Env* env, const PressureSourceOptions& opts, Sampler sampler, std::string what)
    : env_(env ? env : Env::Default()), o_(opts), sampler_(std::move(sampler)), what_(std::move(what)), levels_(opts) {}

Status WatermarkSource::Start() {
  if (!(o_.critical_headroom <= o_.medium_headroom && o_.medium_headroom <= o_.low_headroom && o_.low_headroom < 1 &&
        o_.critical_headroom >= 0 && o_.headroom_hysteresis >= 0))
    return Status::InvalidArgument("watermark marks must satisfy 0 <= critical <= medium <= low < 1");
  if (o_.poll_ms <= 0) return Status::InvalidArgument("poll_ms must be positive");
  uint64_t a = 0, l = 0;
  MZ_RETURN_IF_ERROR(sampler_(&a, &l));
  if (l == 0) return Status::IOError("watermark: limit reads as 0 (" + what_ + ")");
  std::lock_guard<std::mutex> lk(mu_);
  if (stopped_) return Status::Cancelled("watermark source was stopped");
  return Status::Ok();
}

Status WatermarkSource::Wait(int timeout_ms, PressureEvent* ev) {
  const uint64_t start = env_->NowNs();
  // Real time slept so far: bounds the wait if the Env clock is a frozen fake. (A sleep the
  // condition variable ends early, spuriously, still counts whole: the wait can end that early.)
  uint64_t slept_ms = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopped_) return Status::Cancelled("pressure source stopped");
    }
    uint64_t a = 0, l = 0;
    MZ_RETURN_IF_ERROR(sampler_(&a, &l));
    const double headroom = l ? double(std::min(a, l)) / double(l) : 0.0;
    const uint64_t now = env_->NowNs();
    PressureLevel lvl;
    bool emit = levels_.Update(headroom, now, &lvl);
    {
      std::lock_guard<std::mutex> lk(mu_);
      last_headroom_ = headroom;
    }
    if (emit) {
      ev->level = lvl;
      ev->time_ns = now;
      ev->bytes_hint = 0;
      ev->source = name();
      return Status::Ok();
    }
    const uint64_t elapsed_ms = std::max<uint64_t>((now - start) / 1000000ull, slept_ms);
    if (timeout_ms >= 0 && elapsed_ms >= uint64_t(timeout_ms)) return Status::Timeout("no pressure event");
    int64_t sleep_ms = o_.poll_ms;
    if (timeout_ms >= 0) sleep_ms = std::min<int64_t>(sleep_ms, int64_t(timeout_ms) - int64_t(elapsed_ms));
    sleep_ms = std::max<int64_t>(1, sleep_ms);
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(sleep_ms), [&] { return stopped_; });
    slept_ms += uint64_t(sleep_ms);
  }
}

void WatermarkSource::Stop() {
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  cv_.notify_all();
}

double WatermarkSource::last_headroom() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_headroom_;
}

}  // namespace mz
