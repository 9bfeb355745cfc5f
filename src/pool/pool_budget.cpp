// The memory budget applied (pool/eviction_order.h plans the order; ApplyEviction below is the one
// place that moves memory for the budget, Evict and pressure), what the budget measures, and
// EvictConversation / RestoreConversation.
#include "pool/pool.h"

#include <algorithm>

#include "pool/eviction_order.h"
#include "pool/shared_budget.h"

#include "pool/pool_internal.h"

namespace mz {
namespace pool_budget {
constexpr EvictionMode kBudgetPass{/*budget=*/true, /*idle_only=*/false, /*whole=*/false};
}  // namespace pool_budget

bool Pool::TryReportShared(Context& ctx, MemoryReport* out) {
  std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  return wl.owns_lock() && ctx.TryReport(out);
}

bool Pool::AllWeightsResident() const {
  for (int u = 0; u < model_->n_units(); ++u)
    if (!model_->unit(u).resident()) return false;
  return true;
}

bool Pool::MeasureInMemory(uint64_t* in_memory_out, uint64_t* idle_swap_out) {
  uint64_t in_memory = 0;
  uint64_t idle_swap = 0;  // in-memory swap segments of the idle conversations (what can refill the arena)
  {
    // Reports read the shared weight units: not while a generation restores them.
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    if (!wl.owns_lock()) return false;
    MemoryReport wr;
    if (!weights_ctx_->TryReport(&wr)) return false;
    in_memory = wr.weights_resident;
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t newest = 0, newest_swap = 0;
    for (auto& kv : convs_) {
      Conversation& c = *kv.second;
      if (!c.ctx_) continue;
      c.ctx_->TryReport(&c.last_report_);  // busy: the last known figures (weights lock held)
      in_memory += pool_internal::RamOf(c.last_report_);
      // In a shared budget its compute buffers count too (an idle model gives them back).
      if (group_) in_memory += c.ctx_->compute_buffer_bytes();
      idle_swap += c.last_report_.stack_mapped;
      if (c.last_use_ns_.load() >= newest) {
        newest = c.last_use_ns_.load();
        newest_swap = c.last_report_.stack_mapped;
      }
    }
    idle_swap -= std::min(idle_swap, newest_swap);  // the conversation in use is not evicted for the arena
  }
  if (shared_) in_memory += shared_->Report().resident_bytes;  // shared chunks, once
  if (batcher_) in_memory += batcher_->compute_buffer_bytes();  // the one set of compute buffers
  last_in_memory_ = in_memory + (arena_ ? arena_->bytes() : 0);
  *in_memory_out = in_memory;
  if (idle_swap_out) *idle_swap_out = idle_swap;
  return true;
}

uint64_t Pool::InMemoryForBudget() {
  uint64_t m = 0;
  if (!MeasureInMemory(&m, nullptr)) return last_in_memory_.load();
  return last_in_memory_.load();
}

bool Pool::ModelInUse() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& kv : convs_)
    if (kv.second->running_.load() || kv.second->InUse()) return true;
  return false;
}

Status Pool::EvictIdleModel(uint64_t bytes, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  Status st = ApplyEviction(bytes, EvictionMode{/*budget=*/true, /*idle_only=*/true, /*whole=*/true}, freed);
  if (*freed >= bytes) return st;
  // Then the idle conversations' compute buffers (their next call allocates them again).
  std::vector<std::shared_ptr<Context>> idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_)
      if (kv.second->ctx_ && !kv.second->InUse()) idle.push_back(kv.second->ctx_);
  }
  uint64_t released = 0;
  for (auto& c : idle) {
    if (*freed + released >= bytes) break;
    uint64_t f = 0;
    if (c->TryReleaseComputeBuffers(&f).ok()) released += f;  // busy: a call came meanwhile
  }
  *freed += released;
  std::lock_guard<std::mutex> lk(mu_);
  stats_.bytes_evicted += released;
  return st;
}

Status Pool::EvictWeightsOnly(uint64_t bytes, uint64_t* freed) {
  *freed = 0;
  std::lock_guard<std::mutex> ev(evict_mu_);
  // Only while no conversation computes: a generation holds the weights lock shared.
  std::unique_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  if (!wl.owns_lock()) return Status::Ok();
  Status st = weights_ctx_->EvictBytes(bytes, freed, nullptr, EvictScope::kAll);
  if (st.code() == Status::kBusy) st = Status::Ok();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.bytes_evicted += *freed;
  return st;
}

double Pool::ResidentLayerShare() {
  std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  if (!wl.owns_lock()) return 0;  // being restored: its eviction would be skipped anyway
  const int L = model_->base_unit();
  if (L <= 0) return 0;
  int resident = 0;
  for (int l = 0; l < L; ++l) resident += model_->unit(l).resident() ? 1 : 0;
  return double(resident) / double(L);
}

Status Pool::EvictOwn(uint64_t bytes, bool pressure, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  return ApplyEviction(bytes, EvictionMode{/*budget=*/!pressure, false, false}, freed);
}

Status Pool::MakeRoomForCall(Conversation& c, uint64_t* freed) {
  if (freed) *freed = 0;
  if (!group_ || !in_group_ || !c.ctx_) return Status::Ok();
  uint64_t incoming = 0;
  {
    // Weight units move under the weights lock held exclusively (EvictWeightsOnly, restores):
    // read their states under it shared (TSan found the unlocked read).
    std::shared_lock<std::shared_mutex> wl(weights_mu_);
    for (int u = 0; u < model_->n_units(); ++u)
      if (!model_->unit(u).resident()) incoming += model_->unit(u).region_bytes;
  }
  MemoryReport r;
  {
    std::lock_guard<std::mutex> lk(mu_);  // last_report_ is written under mu_ (MeasureInMemory)
    r = c.last_report_;
  }
  (void)TryReportShared(*c.ctx_, &r);  // busy: the last known figures
  if (r.kv_total > r.kv_resident) incoming += r.kv_total - r.kv_resident;
  uint64_t handed = 0;
  Status st = group_->MakeRoom(incoming, freed, model_->env(), &handed);
  if (freed && handed > 0) *freed = handed;  // given back on the budget's thread (room_behind)
  return st;
}

Status Pool::EnforceAfterCall(double* ran_here_s) {
  if (group_ && in_group_) return group_->EnforceAfterCall(model_->env(), ran_here_s);
  const uint64_t t0 = model_->env()->NowNs();
  Status st = EnforceBudget();
  *ran_here_s = double(model_->env()->NowNs() - t0) * 1e-9;
  return st;
}

Status Pool::EnforceBudget() {
  if (group_) return in_group_ ? group_->Enforce() : Status::Ok();
  if (opts_.memory_budget == 0) return Status::Ok();
  if (arena_ && arena_resume_ns_.load() != 0) {
    // The arena off since an Evict (pressure) comes back kArenaPauseNs after the last one (under
    // evict_mu_, as Evict turns it off).
    std::unique_lock<std::mutex> ev(evict_mu_, std::try_to_lock);
    const uint64_t resume = arena_resume_ns_.load();
    if (ev.owns_lock() && resume != 0 && model_->env()->NowNs() >= resume) {
      arena_resume_ns_ = 0;
      arena_->SetCap(arena_cap_);
    }
  }
  uint64_t in_memory = 0;
  uint64_t idle_swap = 0;
  if (!MeasureInMemory(&in_memory, &idle_swap)) return Status::Ok();  // that generation's own call enforces afterwards
  const uint64_t arena = arena_ ? arena_->bytes() : 0;
  if (in_memory + arena <= opts_.memory_budget) return Status::Ok();
  std::unique_lock<std::mutex> ev(evict_mu_, std::try_to_lock);
  if (!ev.owns_lock()) return Status::Ok();  // a pass is under way
  const uint64_t over = in_memory + arena - opts_.memory_budget;
  uint64_t freed = 0;
  // Counted as a budget eviction when it gave back anything (PoolStats::evict_budget).
  auto count = [this](uint64_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evict_budget++;
    stats_.evict_budget_bytes += bytes;
  };
  if (!arena_) {
    Status st = ApplyEviction(over, pool_budget::kBudgetPass, &freed);
    count(freed);
    return st;
  }
  // 1. Idle conversations, least recently used first, also for room to keep a full load arena
  // (the swap segments they free go into it). 2. The arena keeps what fits beside what is still
  // held. 3. Still over with the arena empty: the usual pass (the conversation in use, then the
  // weights), and the arena again keeps only what fits.
  // Only in-memory swap segments refill it: resident KV an eviction frees goes to the OS, so no
  // idle conversation goes to storage for room the arena would not get.
  const uint64_t refill = std::min(arena_->cap() > arena ? arena_->cap() - arena : 0, idle_swap);
  Status st = ApplyEviction(over + refill, EvictionMode{/*budget=*/true, /*idle_only=*/true, false}, &freed);
  uint64_t held = in_memory > freed ? in_memory - freed : 0;
  arena_->TrimTo(opts_.memory_budget > held ? opts_.memory_budget - held : 0);
  if (held <= opts_.memory_budget) {
    count(freed);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evictions++;  // one pass (the idle-only step does not count itself)
    return st;
  }
  uint64_t more = 0;
  Status s2 = ApplyEviction(held - opts_.memory_budget, pool_budget::kBudgetPass, &more);
  count(freed + more);
  held = held > more ? held - more : 0;
  arena_->TrimTo(opts_.memory_budget > held ? opts_.memory_budget - held : 0);
  return st.ok() ? s2 : st;
}

Status Pool::Evict(uint64_t bytes, uint64_t* freed) {
  uint64_t f = 0;
  Status st = EvictUncounted(bytes, &f);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evict_manual++;
    stats_.evict_manual_bytes += f;
  }
  if (freed) *freed = f;
  return st;
}

Status Pool::EvictConversation(const std::string& id, uint64_t* freed) {
  *freed = 0;
  std::shared_ptr<Conversation> c;
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
    ctx = c->ctx_;
  }
  if (!ctx) return Status::Ok();  // stored only: nothing in RAM
  std::lock_guard<std::mutex> ev(evict_mu_);
  uint64_t f = 0;
  Status st;
  {
    // The planner reads the weight units' states: not while a generation moves them (waited for;
    // a generation on this very conversation makes EvictBytes return kBusy instead).
    std::shared_lock<std::shared_mutex> wl(weights_mu_);
    st = ctx->EvictBytes(~uint64_t(0), &f, nullptr, EvictScope::kKvOnly);
    if (st.ok() || st.code() == Status::kBusy) {
      Status d = ctx->DetachShared(nullptr);
      if (st.ok() && d.code() == Status::kBusy) st = d;
    }
    TryReportShared(*ctx, &c->last_report_);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.evict_conversation++;
  stats_.evict_conversation_bytes += f;
  stats_.bytes_evicted += f;
  *freed = f;
  return st.With("evicting conversation '" + id + "'");
}

Status Pool::RestoreConversation(const std::string& id, uint64_t* restored) {
  *restored = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!convs_.count(id)) return Status::InvalidArgument("no conversation '" + id + "'");
  }
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it != convs_.end() && it->second->ctx_) c = it->second;
  }
  // A stored-only one is opened (its file becomes its storage tier); an open one is not (opening
  // would wait for a call running on it).
  if (!c) MZ_RETURN_IF_ERROR(OpenConversation(id, &c));
  uint64_t got = 0;
  Status st;
  bool weights_all = false;
  {
    std::shared_lock<std::shared_mutex> sl(weights_mu_);
    weights_all = AllWeightsResident();
  }
  if (!weights_all) {
    // The weights given back come first; they move only under the exclusive lock, which a
    // generation holds shared: not waited for (kBusy: that generation restores what it needs).
    std::unique_lock<std::shared_mutex> xl(weights_mu_, std::try_to_lock);
    if (!xl.owns_lock()) return Status::Busy("restoring conversation '" + id + "': a generation holds the weights");
    uint64_t w = 0;
    st = weights_ctx_->TryRestoreUpTo(~uint64_t(0), &w, /*yield=*/false);
    got += w;
  }
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ctx = c->ctx_;
  }
  if (st.ok() && ctx) {
    std::shared_lock<std::shared_mutex> sl(weights_mu_);
    uint64_t k = 0;
    st = ctx->TryRestoreUpTo(~uint64_t(0), &k, /*yield=*/false);
    got += k;
    TryReportShared(*ctx, &c->last_report_);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (got > 0) stats_.conversation_restores++;
    stats_.conversation_restored_bytes += got;
  }
  *restored = got;
  return st.With("restoring conversation '" + id + "'");
}

Status Pool::EvictUncounted(uint64_t bytes, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  uint64_t f = 0;
  Status st;
  if (arena_) {
    // The load arena first: memory given back at once, nothing of any conversation moves. While
    // this pass runs, segments the conversations free go to the OS, not into the arena.
    const uint64_t a = arena_->bytes();
    f = arena_->TrimTo(a > bytes ? a - bytes : 0);
    if (f < bytes) {
      // The arena stays off (segments freed go to the OS, also those a running call frees) until
      // a budget pass kArenaPauseNs after the last such eviction: not refilled under pressure.
      arena_->SetCap(0);
      arena_resume_ns_ = model_->env()->NowNs() + kArenaPauseNs;
      uint64_t g = 0;
      st = ApplyEviction(bytes - f, EvictionMode{}, &g);
      f += g;
    }
  } else {
    st = ApplyEviction(bytes, EvictionMode{}, &f);
  }
  if (freed) *freed = f;
  return st;
}

Status Pool::ApplyEviction(uint64_t bytes, const EvictionMode& mode, uint64_t* freed) {
  *freed = 0;
  std::vector<EvictCandidate> cands;
  std::vector<std::shared_ptr<Context>> ctxs;  // held: a Close meanwhile does not free one under us
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_)
      if (kv.second->ctx_) {
        cands.push_back({kv.second->InUse(), kv.second->last_use_ns_.load()});
        ctxs.push_back(kv.second->ctx_);
      }
  }
  const std::vector<EvictStep> plan = PlanEviction(cands, mode);
  Status first_err;
  uint64_t total = 0;
  bool deferred = false, spared_in_use = false;
  auto note = [&](const Status& st) {
    if (!st.ok() && st.code() != Status::kBusy && first_err.ok()) first_err = st;
  };
  size_t i = 0;
  {
    // Every step but the weights reads the weight units' states (the KV planner): not while a
    // generation moves them (then those steps are skipped, never waited for).
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    bool idle_busy = false;  // an idle conversation was busy (being persisted, computing)
    for (; i < plan.size() && plan[i].kind != EvictStep::kWeights; ++i) {
      if (!wl.owns_lock() || total >= bytes) continue;
      const EvictStep& s = plan[i];
      Context* ctx = s.conv >= 0 ? ctxs[size_t(s.conv)].get() : nullptr;
      uint64_t f = 0;
      switch (s.kind) {
        case EvictStep::kStopSparedInUse:
          spared_in_use = true;
          break;
        case EvictStep::kStopIfIdleBusy:
          deferred = idle_busy;  // not the conversation in use: the busy one goes once it is free
          break;
        case EvictStep::kSharedChunks:
          if (shared_) {
            Status st = shared_->Evict(bytes - total, &f);
            total += f;
            if (!st.ok() && first_err.ok()) first_err = st;
          }
          break;
        case EvictStep::kConversationWhole: {
          // Out whole (its in-memory swap too), and its borrowed shared chunks detached (its next
          // call attaches them again).
          Status st = ctx->EvictBytes(~uint64_t(0), &f, nullptr, EvictScope::kKvOnly);
          total += f;
          if (st.code() == Status::kBusy) {
            idle_busy = true;
            busy_finds_.fetch_add(1);  // a write of it paused for generations goes on
            WakeYielders();
          }
          note(st);
          if (ctx->DetachShared(nullptr).code() == Status::kBusy) idle_busy = true;
          break;
        }
        case EvictStep::kConversationPart:
          note(ctx->EvictBytes(bytes - total, &f, nullptr, EvictScope::kKvOnly));
          total += f;
          break;
        case EvictStep::kDetachShared:
          (void)ctx->DetachShared(nullptr);
          break;
        case EvictStep::kWeights:
          break;
      }
      if (spared_in_use || deferred) break;
    }
  }
  if (spared_in_use || deferred) {
    if (deferred) budget_retry_ = true;  // the next persist runs the budget pass again
    std::lock_guard<std::mutex> lk(mu_);
    (spared_in_use ? stats_.budget_spared_in_use : stats_.budget_deferred)++;
    stats_.bytes_evicted += total;
    *freed = total;
    return first_err;
  }
  // The weights, only while no conversation computes (a generation holds their lock shared).
  if (i < plan.size() && total < bytes) {
    std::unique_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    if (wl.owns_lock()) {
      uint64_t f = 0;
      Status st = weights_ctx_->EvictBytes(bytes - total, &f, nullptr, EvictScope::kAll);
      total += f;
      note(st);
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!mode.idle_only) stats_.evictions++;
    stats_.bytes_evicted += total;
  }
  *freed = total;
  return first_err;
}

}  // namespace mz
