#include "pool/shared_budget.h"

#include <algorithm>

#include "pool/pool.h"

namespace mz {

SharedBudget::SharedBudget(uint64_t memory_budget, const AmountOptions& amount)
    : memory_budget_(memory_budget), amount_(amount) {
  stats_.memory_budget = memory_budget;
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

Status SharedBudget::MakeRoom(uint64_t incoming) {
  if (memory_budget_ == 0 || incoming == 0) return Status::Ok();
  std::lock_guard<std::mutex> pass(pass_mu_);  // measured after a pass under way has given back
  const uint64_t want = InMemory() + incoming;
  if (want <= memory_budget_) return Status::Ok();
  uint64_t freed = 0;
  Status st = EvictAcross(want - memory_budget_, /*pressure=*/false, &freed, /*idle_models_only=*/true);
  if (freed > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.passes++;
    stats_.bytes_evicted += freed;
    stats_.room_passes++;
    stats_.room_bytes += freed;
  }
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
  // 2. Idle models' weights, back to front.
  for (const Member& m : order) {
    if (total >= bytes || m.in_use) break;
    uint64_t f = 0;
    note(m.pool->EvictWeightsOnly(bytes - total, &f));
    total += f;
    w_idle += f;
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
  return s;
}

}  // namespace mz
