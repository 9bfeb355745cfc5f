#include "runtime/sustained.h"

#include <algorithm>
#include <limits>

#include "runtime/context.h"

namespace mz {

Status ValidateSustainedModeOptions(const SustainedModeOptions& o) {
  SustainedOptions c = o.control;
  if (c.max_threads == 0) c.max_threads = std::max(1, c.min_threads);  // resolved at Init
  MZ_RETURN_IF_ERROR(ValidateSustainedOptions(c));
  if (!(o.duty > 0 && o.duty <= 1)) return Status::InvalidArgument("duty cycle must be in (0, 1]");
  if (o.window_ns == 0) return Status::InvalidArgument("window must be positive");
  if (!(o.high_c >= 0 && o.high_c < 200)) return Status::InvalidArgument("high mark must be in [0, 200) degrees");
  if (!(o.trip_margin_c >= 0 && o.trip_margin_c < 100))
    return Status::InvalidArgument("trip margin must be in [0, 100) degrees");
  return Status::Ok();
}

SustainedMode::SustainedMode(Env* env, Context* ctx, const SustainedModeOptions& o) : env_(env), ctx_(ctx), o_(o) {}

Status SustainedMode::Init() {
  MZ_RETURN_IF_ERROR(ValidateSustainedModeOptions(o_));
  cpus_ = ctx_->compute_cpus();
  SustainedOptions& c = o_.control;
  if (c.max_threads == 0) c.max_threads = ctx_->n_threads();
  if (!cpus_.empty()) c.max_threads = std::min(c.max_threads, int(cpus_.size()));
  if (c.max_threads < c.min_threads)
    return Status::InvalidArgument("max_threads " + std::to_string(c.max_threads) + " (after the pinned CPUs) < min_threads " +
                                   std::to_string(c.min_threads));
  const int start = std::clamp(ctx_->n_threads(), c.min_threads, c.max_threads);
  if (start != ctx_->n_threads()) {
    std::vector<int> cp;
    if (!cpus_.empty()) cp.assign(cpus_.begin(), cpus_.begin() + start);
    MZ_RETURN_IF_ERROR(ctx_->SetThreads(start, cp).With("sustained mode"));
  }
  const uint64_t now = env_->NowNs();
  ctl_ = std::make_unique<SustainedController>(c, start, now);
  window_start_ns_ = now;
  SustainedSample s;
  ReadSensors(&s);
  std::lock_guard<std::mutex> lk(mu_);
  st_.threads = start;
  st_.min_threads = c.min_threads;
  st_.max_threads = c.max_threads;
  return Status::Ok();
}

void SustainedMode::ReadSensors(SustainedSample* s) {
  ThermalReading r;
  Status st = ReadThermalZones(env_, &r, o_.thermal_root, o_.zone_filter);
  double best_headroom = std::numeric_limits<double>::infinity();
  int with_mark = 0;
  std::string zone;
  for (const ThermalZone& z : r.zones) {
    double mark = o_.high_c;
    if (mark <= 0) {
      double trip = 0;
      if (!z.ThrottleTrip(&trip)) continue;
      mark = trip - o_.trip_margin_c;
    }
    ++with_mark;
    if (mark - z.temp_c < best_headroom) {
      best_headroom = mark - z.temp_c;
      s->has_temp = true;
      s->temp_c = z.temp_c;
      s->high_c = mark;
      zone = z.name + " (" + z.type + ")";
    }
  }
  std::string sensors;
  if (!st.ok()) {
    sensors = "thermal zones unreadable (" + st.message() + "): tokens/s drift only";
  } else if (r.zones.empty()) {
    sensors = "no thermal sensors (no readable thermal_zone under " + o_.thermal_root +
              (o_.zone_filter.empty() ? "" : " of type *" + o_.zone_filter + "*") + "): tokens/s drift only";
  } else if (with_mark == 0) {
    sensors = std::to_string(r.zones.size()) +
              " thermal zones but none with a trip point (give a high mark): tokens/s drift only";
  } else {
    sensors = std::to_string(with_mark) + " of " + std::to_string(r.zones.size()) + " thermal zones watched (" +
              (o_.high_c > 0 ? "high mark " + std::to_string(int(o_.high_c)) + " C" : "throttle trip minus " +
               std::to_string(int(o_.trip_margin_c)) + " C") + ")";
  }
  for (const std::string& n : r.notes) sensors += "; " + n;
  std::lock_guard<std::mutex> lk(mu_);
  st_.n_zones = int(r.zones.size());
  st_.has_temp = s->has_temp;
  st_.temp_c = s->has_temp ? s->temp_c : 0;
  st_.high_c = s->has_temp ? s->high_c : 0;
  st_.zone = zone;
  st_.sensors = sensors;
}

void SustainedMode::AfterStep(int n_tokens, uint64_t start_ns, uint64_t end_ns, SustainedEvent* ev) {
  if (ev) *ev = SustainedEvent();
  if (!ctl_) return;
  end_ns = std::max(end_ns, start_ns);
  const uint64_t busy = end_ns - start_ns;
  // Duty cycle: the wall time since the previous step's pacing ended includes this step's compute
  // and whatever the caller did in between (sampling, a user reading).
  const uint64_t wall = have_prev_ && prev_end_ns_ <= start_ns ? end_ns - prev_end_ns_ : busy;
  const uint64_t sleep = DutySleepNs(busy, wall, o_.duty);
  if (sleep > 0) env_->SleepNs(sleep);
  if (n_tokens == 1) {  // the decode rate: prefills (many tokens per step) would swamp it
    win_tokens_ += 1;
    win_busy_ns_ += busy;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    st_.busy_ns += busy;
    st_.slept_ns += sleep;
    if (n_tokens == 1) ++st_.decode_tokens;
  }
  const uint64_t now = env_->NowNs();
  prev_end_ns_ = now;
  have_prev_ = true;
  if (now - window_start_ns_ < o_.window_ns) return;

  SustainedSample s;
  s.now_ns = now;
  ReadSensors(&s);
  if (win_tokens_ > 0 && win_busy_ns_ > 0) {
    s.has_rate = true;
    s.tokens_per_s = double(win_tokens_) / (double(win_busy_ns_) * 1e-9);
  }
  window_start_ns_ = now;
  win_tokens_ = win_busy_ns_ = 0;
  const int before = ctl_->threads();
  SustainedDecision d = ctl_->Step(s);
  SustainedEvent e;
  e.from = before;
  e.to = d.threads;
  e.wanted = d.threads;
  e.reason = d.reason;
  e.why = d.why;
  if (d.delta != 0) {
    std::vector<int> cp;
    if (!cpus_.empty()) cp.assign(cpus_.begin(), cpus_.begin() + d.threads);
    e.status = ctx_->SetThreads(d.threads, cp);
    if (e.status.ok()) {
      e.changed = true;
    } else {
      e.refused = true;
      e.to = ctx_->n_threads();
      ctl_->Resync(ctx_->n_threads(), now);  // follow what the context really computes with
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    st_.threads = ctl_->threads();
    st_.steps_down = ctl_->steps_down();
    st_.steps_up = ctl_->steps_up();
    if (e.changed) st_.last_reason = d.reason;
    st_.window_tokens_per_s = s.has_rate ? s.tokens_per_s : 0;
  }
  if (ev) *ev = std::move(e);
}

SustainedStats SustainedMode::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return st_;
}

}  // namespace mz
