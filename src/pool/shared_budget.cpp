#include "pool/shared_budget.h"

#include <algorithm>

#include "core/sync_point.h"
#include "env/env.h"
#include "pool/pool.h"

namespace mz {

SharedBudget::SharedBudget(uint64_t memory_budget, const AmountOptions& amount, bool pass_after_return)
    : memory_budget_(memory_budget), pass_after_return_(pass_after_return), amount_(amount) {
  stats_.memory_budget = memory_budget;
}

SharedBudget::~SharedBudget() {
  {
    std::lock_guard<std::mutex> lk(def_mu_);
    def_stop_ = true;
  }
  def_cv_.notify_all();
  if (def_thread_.joinable()) def_thread_.join();
}

void SharedBudget::PassThread() {
  std::unique_lock<std::mutex> lk(def_mu_);
  for (;;) {
    def_cv_.wait(lk, [&] { return def_queued_ || room_queued_ > 0 || def_stop_; });
    if (room_queued_ > 0) {
      // A room pass behind a restore first: the call under way brings back what it makes room
      // for; the budget pass after a call is not urgent.
      room_running_ = room_queued_;
      room_queued_ = 0;
      const uint64_t bytes = room_running_;
      lk.unlock();
      MZ_SYNC_POINT("shared_budget:room_behind", 0);  // tests: handed over, nothing given back yet
      uint64_t freed = 0;
      Status st;
      {
        std::lock_guard<std::mutex> pass(pass_mu_);
        st = RoomLocked(bytes, &freed);
      }
      {
        std::lock_guard<std::mutex> slk(mu_);
        stats_.room_passes_behind++;
        if (!st.ok()) {
          if (stats_.deferred_pass_errors++ == 0) stats_.last_deferred_pass_error = st.ToString();
        }
      }
      lk.lock();
      room_running_ = 0;
      def_done_cv_.notify_all();
      continue;
    }
    if (!def_queued_) return;  // stopping, nothing queued
    def_queued_ = false;
    def_running_ = true;
    lk.unlock();
    const uint64_t t0 = def_env_->NowNs();
    Status st = Enforce();
    const double s = double(def_env_->NowNs() - t0) * 1e-9;
    {
      std::lock_guard<std::mutex> slk(mu_);
      stats_.deferred_passes++;
      stats_.pass_s += s;
      if (!st.ok()) {
        if (stats_.deferred_pass_errors++ == 0) stats_.last_deferred_pass_error = st.ToString();
      }
    }
    lk.lock();
    def_running_ = false;
    def_done_cv_.notify_all();
  }
}

Status SharedBudget::EnforceAfterCall(Env* env, double* ran_here_s) {
  if (ran_here_s) *ran_here_s = 0;
  if (memory_budget_ == 0) return Status::Ok();
  if (pass_after_return_) {
    std::unique_lock<std::mutex> lk(def_mu_);
    if (StartPassThreadLocked(env)) {
      def_queued_ = true;
      lk.unlock();
      def_cv_.notify_all();
      return Status::Ok();
    }
    // The OS refused the thread: the pass runs here, as without pass_after_return.
  }
  const uint64_t t0 = env->NowNs();
  Status st = Enforce();
  const double s = double(env->NowNs() - t0) * 1e-9;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.pass_s += s;
  }
  if (ran_here_s) *ran_here_s = s;
  return st;
}

bool SharedBudget::StartPassThreadLocked(Env* env) {
  if (!def_started_ && !def_stop_ && env) {
    def_env_ = env;
    def_started_ = env->StartThread([this] { PassThread(); }, &def_thread_).ok();
  }
  return def_started_;
}

void SharedBudget::Settle() {
  std::unique_lock<std::mutex> lk(def_mu_);
  def_done_cv_.wait(lk, [&] {
    return !def_started_ || (!def_queued_ && !def_running_ && room_queued_ == 0 && room_running_ == 0);
  });
}

void SharedBudget::Add(Pool* p) {
  std::lock_guard<std::mutex> lk(mu_);
  pools_.push_back(p);
}

void SharedBudget::Remove(Pool* p) {
  std::lock_guard<std::mutex> pass(pass_mu_);  // no pass holds p past this point
  std::lock_guard<std::mutex> lk(mu_);
  pools_.erase(std::remove(pools_.begin(), pools_.end(), p), pools_.end());
}

std::vector<Pool*> SharedBudget::Pools() {
  std::lock_guard<std::mutex> lk(mu_);
  return pools_;
}

void SharedBudget::SetAmount(const AmountOptions& o) {
  std::lock_guard<std::mutex> lk(mu_);
  amount_ = AmountPolicy(o);
}

uint64_t SharedBudget::InMemory() {
  // Under mu_: a pool cannot leave (Remove takes mu_) while its figures are read. Pools never call
  // back into the budget while holding their own locks, so mu_ before a pool's locks is the order.
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t total = 0;
  for (Pool* p : pools_) total += p->InMemoryForBudget();
  stats_.in_memory = total;
  return total;
}

uint64_t SharedBudget::Headroom() {
  const uint64_t m = InMemory();
  return memory_budget_ > m ? memory_budget_ - m : 0;
}

Status SharedBudget::Enforce() {
  if (memory_budget_ == 0) return Status::Ok();
  const uint64_t m = InMemory();
  if (m <= memory_budget_) return Status::Ok();
  std::unique_lock<std::mutex> pass(pass_mu_, std::try_to_lock);
  if (!pass.owns_lock()) return Status::Ok();  // a pass is under way: it gives back what is needed
  uint64_t freed = 0;
  Status st = EvictAcross(m - memory_budget_, /*pressure=*/false, &freed);
  if (freed > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.passes++;
    stats_.bytes_evicted += freed;
  }
  return st;
}

Status SharedBudget::MakeRoom(uint64_t incoming, uint64_t* freed_out, Env* env, uint64_t* handed) {
  if (freed_out) *freed_out = 0;
  if (handed) *handed = 0;
  if (memory_budget_ == 0 || incoming == 0) return Status::Ok();
  std::lock_guard<std::mutex> pass(pass_mu_);  // measured after a pass under way has given back
  // Less what room passes handed over before still have to give back (they will).
  uint64_t pending = 0;
  {
    std::lock_guard<std::mutex> lk(def_mu_);
    pending = room_queued_ + room_running_;
  }
  const uint64_t now = InMemory();
  const uint64_t want = (now > pending ? now - pending : 0) + incoming;
  if (want <= memory_budget_) return Status::Ok();
  const uint64_t over = want - memory_budget_;
  if (room_behind() && env) {
    std::unique_lock<std::mutex> lk(def_mu_);
    if (StartPassThreadLocked(env)) {
      room_queued_ += over;
      lk.unlock();
      def_cv_.notify_all();
      if (handed) *handed = over;
      return Status::Ok();
    }
    // The OS refused the thread: the room pass runs here.
  }
  uint64_t freed = 0;
  Status st = RoomLocked(over, &freed);
  if (freed_out) *freed_out = freed;
  return st;
}

Status SharedBudget::RoomLocked(uint64_t bytes, uint64_t* freed_out) {
  uint64_t freed = 0;
  Status st = EvictAcross(bytes, /*pressure=*/false, &freed, /*idle_models_only=*/true);
  if (freed > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.passes++;
    stats_.bytes_evicted += freed;
    stats_.room_passes++;
    stats_.room_bytes += freed;
  }
  *freed_out = freed;
  return st;
}

Status SharedBudget::Evict(uint64_t bytes, uint64_t* freed) {
  std::lock_guard<std::mutex> pass(pass_mu_);
  uint64_t f = 0;
  Status st = EvictAcross(bytes, /*pressure=*/true, &f);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evict_calls++;
    stats_.evict_bytes += f;
    stats_.bytes_evicted += f;
  }
  if (freed) *freed = f;
  return st;
}

Status SharedBudget::OnPressure(const PressureEvent& ev, uint64_t* freed) {
  if (freed) *freed = 0;
  std::lock_guard<std::mutex> pass(pass_mu_);
  uint64_t llm = 0, resident = 0;
  AmountDecision d;
  bool all = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (Pool* p : pools_) {
      uint64_t l = 0, r = 0;
      p->LlmBytes(&l, &r);
      llm += l;
      resident += r;
    }
    d = amount_.OnEvent(ev, llm, resident);
    // Critical, with no floor: everything (as a single pool: a byte count would stop a unit short).
    all = ev.level == PressureLevel::kCritical && amount_.options().critical_to_floor &&
          amount_.options().floor_points <= 0;
    stats_.pressure_events++;
  }
  if (d.evict_bytes == 0) return Status::Ok();
  uint64_t f = 0;
  Status st = EvictAcross(all ? ~uint64_t(0) : d.evict_bytes, /*pressure=*/true, &f);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.pressure_bytes += f;
    stats_.bytes_evicted += f;
  }
  if (freed) *freed = f;
  return st;
}

Status SharedBudget::EvictAcross(uint64_t bytes, bool pressure, uint64_t* freed, bool idle_models_only) {
  *freed = 0;
  struct Member {
    Pool* pool;
    bool in_use;
    uint64_t last_use;
  };
  std::vector<Member> order;
  {
    std::lock_guard<std::mutex> lk(mu_);  // pass_mu_ is held: none of them leaves meanwhile
    for (Pool* p : pools_) order.push_back({p, p->ModelInUse(), p->LastUseNs()});
  }
  // Idle models before models in use; least recently used first within each.
  std::stable_sort(order.begin(), order.end(), [](const Member& a, const Member& b) {
    return a.in_use != b.in_use ? b.in_use : a.last_use < b.last_use;
  });
  Status first_err;
  uint64_t total = 0, kv_idle = 0, w_idle = 0, active = 0;
  auto note = [&](const Status& st) {
    if (!st.ok() && first_err.ok()) first_err = st;
  };
  // 1. Idle models' conversations, each out whole.
  for (const Member& m : order) {
    if (total >= bytes || m.in_use) break;
    uint64_t f = 0;
    note(m.pool->EvictIdleModel(bytes - total, &f));
    total += f;
    kv_idle += f;
  }
  // 2. Idle models' weights, back to front: each model whole (least recently used first), or
  // spread by depth: one layer at a time from the idle model keeping the largest share of its
  // layers (the first in the order above among equals), until none gives anything.
  if (!spread_idle_weights_.load()) {
    for (const Member& m : order) {
      if (total >= bytes || m.in_use) break;
      uint64_t f = 0;
      note(m.pool->EvictWeightsOnly(bytes - total, &f));
      total += f;
      w_idle += f;
    }
  } else {
    std::vector<Pool*> idle;
    for (const Member& m : order)
      if (!m.in_use) idle.push_back(m.pool);
    while (total < bytes && !idle.empty()) {
      size_t pick = 0;
      double best = -1;
      for (size_t k = 0; k < idle.size(); ++k) {
        const double share = idle[k]->ResidentLayerShare();
        if (share > best) best = share, pick = k;
      }
      uint64_t f = 0;
      note(idle[pick]->EvictWeightsOnly(1, &f));  // its rearmost resident unit
      if (f == 0) {
        idle.erase(idle.begin() + std::ptrdiff_t(pick));  // nothing left, or computing: not this pass
        continue;
      }
      total += f;
      w_idle += f;
    }
  }
  // 3. Models in use, each in its own pool's order (idle models with nothing left give nothing).
  for (const Member& m : order) {
    if (total >= bytes || idle_models_only) break;
    if (!m.in_use) continue;
    uint64_t f = 0;
    note(m.pool->EvictOwn(bytes - total, pressure, &f));
    total += f;
    active += f;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.idle_model_kv_bytes += kv_idle;
    stats_.idle_model_weight_bytes += w_idle;
    stats_.active_model_bytes += active;
  }
  *freed = total;
  return first_err;
}

SharedBudgetStats SharedBudget::Stats() {
  InMemory();
  std::lock_guard<std::mutex> lk(mu_);
  SharedBudgetStats s = stats_;
  s.n_pools = int(pools_.size());
  {
    std::lock_guard<std::mutex> dl(def_mu_);
    s.room_pending_bytes = room_queued_ + room_running_;
  }
  return s;
}

}  // namespace mz
