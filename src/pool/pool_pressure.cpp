// Memory pressure on the pool: the amount policy's inputs (LlmBytes), OnPressure, restore-ahead and the
// pressure watch thread.
#include "pool/pool.h"

#include <algorithm>
#include <chrono>

#include "pool/shared_budget.h"

#include "pool/pool_internal.h"

namespace mz {

bool Pool::LlmBytes(uint64_t* llm, uint64_t* resident) {
  uint64_t layers = 0;  // region sizes are fixed at load: no lock needed
  for (int u = 0; u < model_->n_units(); ++u)
    if (u != model_->base_unit()) layers += model_->unit(u).region_bytes;
  bool fresh = false;
  uint64_t weights_ram = 0, base = 0, kv_total = 0, kv_ram = 0;
  {
    // Reports read the shared weight units' state: not while a generation moves them.
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    MemoryReport wr;
    if (wl.owns_lock() && weights_ctx_->TryReport(&wr)) {
      fresh = true;
      weights_ram = wr.weights_resident;
      const WeightUnit& b = model_->unit(model_->base_unit());
      base = b.resident() ? b.region_bytes : 0;
    } else {
      weights_ram = layers;  // unknown now: assume resident (the KV figures still count)
    }
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_) {
      Conversation& c = *kv.second;
      if (!c.ctx_) continue;
      if (!(fresh && c.ctx_->TryReport(&c.last_report_))) fresh = false;  // busy: the last known figures
      kv_total += c.last_report_.kv_total;
      kv_ram += pool_internal::RamOf(c.last_report_);
    }
  }
  if (shared_) {  // shared chunks, once
    const SharedChunkReport sr = shared_->Report();
    kv_total += uint64_t(sr.units) * shared_->geometry().chunk_bytes();
    kv_ram += sr.resident_bytes;
  }
  *llm = layers + kv_total;
  const uint64_t in_mem = weights_ram + kv_ram;
  *resident = std::min(in_mem > base ? in_mem - base : 0, *llm);
  return fresh;
}

Status Pool::OnPressure(const PressureEvent& ev, uint64_t* freed) {
  if (freed) *freed = 0;
  const bool trim = ev.source == "onTrimMemory";  // mz_pool_on_trim_memory's events
  {
    std::lock_guard<std::mutex> lk(mu_);
    (trim ? stats_.trim_events : stats_.pressure_events)++;
  }
  if (group_ && in_group_) {  // every model together, in the shared budget's order
    uint64_t f = 0;
    Status st = group_->OnPressure(ev, &f);
    if (freed) *freed = f;
    std::lock_guard<std::mutex> lk(mu_);
    if (f > 0) (trim ? stats_.evict_trim : stats_.evict_pressure)++;
    (trim ? stats_.evict_trim_bytes : stats_.evict_pressure_bytes) += f;
    return st;
  }
  uint64_t llm = 0, resident = 0;
  LlmBytes(&llm, &resident);
  AmountDecision d;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    ++pressure_gen_;  // odd: an eviction is on its way (restore-ahead ticks skip)
    d = amount_.OnEvent(ev, llm, resident);
  }
  Status st;
  if (d.evict_bytes > 0) {
    // Critical, with no floor: everything (units move whole, and compression frees less than a
    // unit's size: a byte count would stop one unit short).
    const bool all = ev.level == PressureLevel::kCritical && amount_.options().critical_to_floor &&
                     amount_.options().floor_points <= 0;
    uint64_t f = 0;
    st = EvictUncounted(all ? ~uint64_t(0) : d.evict_bytes, &f);
    if (freed) *freed = f;
    std::lock_guard<std::mutex> lk(mu_);
    (trim ? stats_.evict_trim : stats_.evict_pressure)++;
    (trim ? stats_.evict_trim_bytes : stats_.evict_pressure_bytes) += f;
  }
  std::lock_guard<std::mutex> lk(pressure_mu_);
  ++pressure_gen_;
  return st;
}

bool Pool::RestoreAheadTick(PressureSource* src, HeadroomWindow* window, PoolPressureAction* act) {
  Env* env = model_->env();
  uint64_t gen0 = 0;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    gen0 = pressure_gen_;
  }
  if (gen0 & 1) return false;  // an eviction runs: its figures are not settled
  uint64_t llm = 0, resident = 0;
  // Stale figures (a conversation busy generating, the weights moving) could say "all resident"
  // for a conversation whose KV was evicted since, and the policy would stop asking: skip the tick.
  if (!LlmBytes(&llm, &resident)) return false;
  const uint64_t now = env->NowNs();
  AmountDecision d;
  AmountOptions o;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    // Figures read before an eviction that ran meanwhile would say "resident" and stop the policy
    // asking for good: skip this tick.
    if (pressure_gen_ != gen0) return false;
    d = amount_.Tick(now, llm, resident);
    o = amount_.options();
  }
  if (!d.restore_now) {
    window->Reset();  // the next restore-ahead starts a new stability window
    return false;
  }
  uint64_t budget = 0;
  if (window->Sample(src, now, o, &budget) != HeadroomWindow::Verdict::kRestore) return false;
  if (opts_.memory_budget > 0) {
    const uint64_t in_mem = Stats().in_memory;
    budget = std::min(budget, opts_.memory_budget > in_mem ? opts_.memory_budget - in_mem : 0);
  }
  if (group_) budget = std::min(budget, group_->Headroom());  // never past the shared budget
  if (budget == 0) return false;
  *act = PoolPressureAction();
  act->event.time_ns = now;
  act->event.source = "restore-ahead";
  Status st;
  uint64_t got_all = 0;
  // 1. Weights: they move only under the exclusive weights lock, never waited for (their state is
  // read under the lock too: a generation may be restoring them).
  bool weights_all = false;
  {
    std::shared_lock<std::shared_mutex> sl(weights_mu_, std::try_to_lock);
    if (!sl.owns_lock()) return false;  // a generation restores them: it restores what it needs
    weights_all = AllWeightsResident();
  }
  if (!weights_all) {
    std::unique_lock<std::shared_mutex> xl(weights_mu_, std::try_to_lock);
    if (!xl.owns_lock()) return false;  // a generation runs: it restores what it needs
    uint64_t got = 0;
    st = weights_ctx_->TryRestoreUpTo(budget, &got, o.restore_yields);
    if (st.code() == Status::kBusy) st = Status::Ok();
    got_all += got;
    budget -= std::min(budget, got);
    if (!AllWeightsResident()) budget = 0;  // the KV waits for the front weights
  }
  // 2. The open conversations' KV, most recently used first. All weights are resident and stay
  // so under the shared lock, so a conversation's restore moves only its own KV.
  if (st.ok() && budget > 0) {
    std::shared_lock<std::shared_mutex> sl(weights_mu_, std::try_to_lock);
    if (sl.owns_lock() && AllWeightsResident()) {
      std::vector<std::pair<uint64_t, std::shared_ptr<Context>>> mru;
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& kv : convs_) {
          Conversation& c = *kv.second;
          const MemoryReport& m = c.last_report_;
          if (c.ctx_ && (m.kv_total > m.kv_resident || m.kv_shared > m.kv_shared_attached))
            mru.emplace_back(c.last_use_ns_.load(), c.ctx_);
        }
      }
      std::sort(mru.begin(), mru.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      // The shared_ptr keeps a context that is closed meanwhile alive until its slice ends (its
      // memory then goes with it); a call arriving on it makes the slice stop early (yield).
      for (auto& e : mru) {
        if (budget == 0) break;
        uint64_t got = 0;
        Status s2 = e.second->TryRestoreUpTo(budget, &got, o.restore_yields);
        if (s2.code() == Status::kBusy) s2 = Status::Ok();  // generating: it restores itself
        got_all += got;
        budget -= std::min(budget, got);
        if (!s2.ok()) {
          st = s2;
          break;
        }
      }
    }
  }
  window->Took(got_all);
  act->restored = got_all;
  act->status = st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.restored_ahead += got_all;
    for (auto& kv : convs_)  // the figures Stats and the budget read
      if (kv.second->ctx_) TryReportShared(*kv.second->ctx_, &kv.second->last_report_);
  }
  if (!st.ok()) {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    amount_.RestoreGaveUp();
  }
  act->in_memory = Stats().in_memory;
  return got_all > 0 || !st.ok();
}

Status Pool::WatchPressure(const PoolPressureOptions& opts, std::string* why) {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (watch_src_ && watch_ended_.load()) {  // the last watch ended on its source's error: replaced
    watch_src_->Stop();
    if (watch_thread_.joinable()) watch_thread_.join();
    watch_src_.reset();
  }
  if (watch_src_) return Status::Busy("the pool already watches pressure (stop it first)");
  watch_ended_ = false;
  Env* env = model_->env();
  std::unique_ptr<PressureSource> src;
  MZ_RETURN_IF_ERROR(CreatePressureSource(env, opts.source, &src, why));
  if (opts.wrap_source) src = opts.wrap_source(std::move(src));
  if (!src) return Status::InvalidArgument("wrap_source returned no source");
  MZ_RETURN_IF_ERROR(src->Start());
  {
    std::lock_guard<std::mutex> pl(pressure_mu_);
    amount_ = AmountPolicy(opts.amount);
    if (group_) group_->SetAmount(opts.amount);
  }
  PressureSource* raw = src.get();
  auto on_action = opts.on_action;
  const bool ahead = opts.amount.restore_ahead == AmountOptions::RestoreAhead::kBackground;
  const int wait_ms = ahead ? std::clamp(opts.tick_ms, 1, 1000) : 1000;
  Status st = env->StartThread(
      [this, raw, on_action, ahead, wait_ms] {
        HeadroomWindow window;  // this thread's alone
        bool restoring = false;  // the last tick restored: check again at once
        for (;;) {
          PressureEvent ev;
          Status w = raw->Wait(restoring ? 0 : wait_ms, &ev);
          if (w.code() == Status::kTimeout) {
            restoring = false;
            PoolPressureAction act;
            if (ahead && RestoreAheadTick(raw, &window, &act)) {
              restoring = act.status.ok();
              if (on_action) on_action(act);
            }
            continue;
          }
          window.Reset();  // an event: free memory is not calm
          PoolPressureAction act;
          if (!w.ok()) {
            if (w.code() == Status::kCancelled) return;  // StopWatchingPressure
            act.status = w;                              // e.g. the watched cgroup was removed
            watch_ended_ = true;                         // a new WatchPressure may replace it
            if (on_action) on_action(act);
            return;
          }
          act.event = ev;
          act.status = OnPressure(ev, &act.freed);
          act.in_memory = Stats().in_memory;
          if (on_action) on_action(act);
        }
      },
      &watch_thread_);
  if (!st.ok()) {
    src->Stop();
    return st.With("starting the pool's pressure watch");
  }
  watch_src_ = std::move(src);
  return Status::Ok();
}

void Pool::StopWatchingPressure() {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (!watch_src_) return;
  watch_src_->Stop();
  if (watch_thread_.joinable()) watch_thread_.join();
  watch_src_.reset();
}

}  // namespace mz
