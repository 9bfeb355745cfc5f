// SharedBudget: several models, one memory budget. Each model has its own Pool (its
// conversations, its folder, its forward pass); the pools that name one SharedBudget
// (PoolOptions::shared_budget) share its memory_budget, and its eviction order runs across them.
//
// Why a pool of pools and not one pool holding several models: a Pool's every mechanism (the
// prefix index, shared chunks and chunk files, session files, the batcher, the weights lock) is
// per model: chunk hashes and KV shapes only mean something within one model, and a conversation
// keeps its model for life (its stored file names the model's fingerprint). What spans models is
// only the memory, so only the budget is shared: the pools stay as they are, and this class
// measures them together and decides which pool gives back what.
//
// Order, whenever the pools together hold more than the budget (after a generation call on any of
// them: the budget pass; before a call's restore, counting what it will bring back: the room pass,
// steps 1 and 2 only; or for pressure, onTrimMemory and Evict: the bytes they ask for):
//   1. idle models' conversations, least recently used model first, each conversation out whole
//      (an idle model: no conversation of it in use or computing: Conversation::InUse), then,
//      with batching off, their compute buffers (counted in the budget; allocated again by their
//      next call);
//   2. idle models' weights, least recently used model first, each back to front (later layers
//      first, the base unit last), and only while none of its conversations computes; with
//      spread_idle_weights (since 0.19, an ablation: off by default), one layer at a time from the
//      idle model that keeps the largest share of its layers (least recently used first among
//      equals), so every idle model keeps the same front share instead of the least recently used
//      one emptying first;
//   3. then each model in use, least recently used first, in its own pool's order (its idle
//      conversations, its most recent conversation's KV, its weights), as a single pool does.
// A model whose weights were given back comes back as today's single pool does: its next
// generation restores them front layers first, overlapped with that request's prefill. Restore-
// ahead (a pool's pressure watch, calm again) never brings a pool past the shared budget.
//
// Pools in a SharedBudget have no load arena (PoolOptions::load_arena_bytes is forced to 0): an
// arena is a pool's own reserve inside its own budget.
//
// Pressure: a pool's OnPressure (its pressure watch, mz_pool_on_trim_memory) is applied to the
// whole budget: the amount policy's share is of every pool's LLM memory together, given back in
// the order above. A pool's own Evict (mz_pool_evict) stays within that pool; Evict here spans all.
//
// The budget pass after a call (since 0.19, pass_after_return, the default) leaves the caller's
// critical path: the call hands it to the budget's own thread (EnforceAfterCall) and returns its
// logits at once. What the budget then guarantees: every restore starts with the pools' counted
// bytes plus what it will bring back within the budget (the room pass, inside the call, before the
// restore; it waits for a deferred pass under way, one pass at a time); between a call's return and
// the end of its deferred pass the pools may hold more than the budget by what the call grew and
// the room pass could not cover (the KV its prefill added, compute buffers allocated again, units
// of a model in use the room pass never takes); Settle() waits for that pass. pass_after_return
// false runs the pass inside the call, as before 0.19.
//
// The room pass behind the restore (since 0.19, room_behind: an ablation, off by default; with
// pass_after_return only; session 39's loaded A/B did not show it helps on 2 cores, results.md):
// the call measures (the pools' RAM now plus what it will bring back, after a pass under way has
// ended) and hands what is over the budget to the budget's thread, which gives
// it back from idle models (steps 1 and 2, as the room pass inside the call does) while the call's
// restore starts. What the budget then guarantees instead of "every restore starts within the
// budget": every restore starts with the pools' counted bytes plus what it will bring back within
// the budget plus the room still being given back (handed to the budget's thread, queued or under
// way: Stats().room_pending_bytes, lowered only once that pass has ended, so the bound holds
// whenever it is read before the counted bytes). The idle models give back as the room pass
// inside the call would (the same steps and order, for the bytes measured in the call), only not
// before the restore starts. Its error is counted as a deferred pass's; Settle() waits for it too. When the thread
// cannot start, the room pass runs inside the call, as without room_behind.
//
// Thread-safety: every method may be called from any thread. Pools add themselves at Pool::Open
// and remove themselves in ~Pool; the SharedBudget must outlive none of them (they hold it by
// shared_ptr). One pass (Enforce or Evict) runs at a time; a budget pass that finds one under way
// returns at once (that pass gives back what is needed). The pass thread (started by the first
// EnforceAfterCall, through that caller's Env, which must outlive the SharedBudget: the thread
// reads its clock) is joined by ~SharedBudget.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "pressure/amount_policy.h"
#include "pressure/pressure_source.h"

namespace mz {

class Env;
class Pool;

struct SharedBudgetStats {
  uint64_t memory_budget = 0;
  uint64_t in_memory = 0;  // every pool's in_memory together (last known figures)
  int n_pools = 0;
  // Budget passes that gave back something, and their bytes; by step of the order above.
  uint64_t passes = 0, bytes_evicted = 0;
  uint64_t idle_model_kv_bytes = 0, idle_model_weight_bytes = 0, active_model_bytes = 0;
  // Room passes (MakeRoom, before a call's restore) that gave back something, and their bytes
  // (counted in passes and bytes_evicted too).
  uint64_t room_passes = 0, room_bytes = 0;
  // Of them, room passes run on the budget's thread behind the restore (room_behind; counted
  // whether or not they gave back), and the bytes handed to that thread whose pass has not ended
  // (the transient excess over the budget it allows; 0 once settled).
  uint64_t room_passes_behind = 0, room_pending_bytes = 0;
  // Pressure events and onTrimMemory calls applied across the pools, and what they gave back.
  uint64_t pressure_events = 0, pressure_bytes = 0;
  uint64_t evict_calls = 0, evict_bytes = 0;  // Evict (mz_budget_evict)
  // Budget passes run after a call returned (EnforceAfterCall, on the pass thread), and those
  // that failed (the first error's text: a deferred pass has no caller to return it to).
  uint64_t deferred_passes = 0, deferred_pass_errors = 0;
  std::string last_deferred_pass_error;
  // Seconds spent in budget passes after calls (inside them or deferred), for reports.
  double pass_s = 0;
};

class SharedBudget {
 public:
  // pass_after_return: the budget pass after a call runs on the budget's own thread once the call
  // returned (above); false: inside the call.
  explicit SharedBudget(uint64_t memory_budget, const AmountOptions& amount = AmountOptions(),
                        bool pass_after_return = true);
  ~SharedBudget();
  SharedBudget(const SharedBudget&) = delete;
  SharedBudget& operator=(const SharedBudget&) = delete;

  uint64_t memory_budget() const { return memory_budget_; }
  bool pass_after_return() const { return pass_after_return_; }
  // Step 2's order across idle models (above): false (default) least recently used model first,
  // each whole back to front; true spread by depth. Any thread; passes from now on.
  void set_spread_idle_weights(bool on) { spread_idle_weights_ = on; }
  bool spread_idle_weights() const { return spread_idle_weights_.load(); }
  // The room pass behind the restore (above): true hands it to the budget's thread when
  // pass_after_return is on; false (default) runs it inside the call before the restore. Any
  // thread; room passes from now on.
  void set_room_behind(bool on) { room_behind_ = on; }
  bool room_behind() const { return room_behind_.load() && pass_after_return_; }
  // The pools' RAM together now (each pool's fresh figures, or its last known while it is busy).
  uint64_t InMemory();
  // Budget bytes not held by any pool now (0 when over).
  uint64_t Headroom();
  // The budget pass after a generation call: gives back what the pools hold above the budget, in
  // the order above, sparing what a budget pass spares in a single pool (a conversation mid-turn
  // when two or more are, the weights while any conversation of that model computes).
  Status Enforce();
  // The budget pass after a call on one of the pools: with pass_after_return, queued for the pass
  // thread (started now through env if it is not running; refused: run here) and Ok at once, the
  // pass's error counted in Stats (deferred_pass_errors); several calls before it runs make one
  // pass. Otherwise Enforce() here. *ran_here_s (optional): seconds spent in this thread.
  Status EnforceAfterCall(Env* env, double* ran_here_s = nullptr);
  // Waits until no deferred pass is queued or running (the budget pass after every call that
  // returned before this one has run). Returns at once without pass_after_return.
  void Settle();
  // The room pass, before a call restores: incoming is what the call will bring back (its model's
  // evicted weight units and its conversation's evicted KV). Gives back what the pools' RAM now
  // plus incoming would hold above the budget, from idle models only (steps 1 and 2 of the order
  // above): never a model in use, so never the calling model's units nor a conversation in use.
  // What it cannot free there stays over until the budget pass after the call. Waits for a pass
  // under way (a pass never waits for a call, so the caller may hold its conversation).
  // *freed (optional): what it gave back here. With room_behind() and env (the thread is started
  // through it if it is not running) the giving back is handed to the budget's thread instead
  // (above): *freed is 0 and *handed (optional) is what it handed over. The pools' RAM now is
  // counted less the room still pending (handed over before, not yet given back).
  Status MakeRoom(uint64_t incoming, uint64_t* freed = nullptr, Env* env = nullptr, uint64_t* handed = nullptr);
  // Gives back at least bytes (or all it can) across the pools in the order above, taking what
  // a pressure eviction takes (conversations in use too, but never what is computing). *freed
  // (optional). Counted as evict_calls.
  Status Evict(uint64_t bytes, uint64_t* freed);
  // A pressure event or onTrimMemory for every pool together: the amount policy's share of their
  // LLM memory together, given back in the order above. *freed (optional).
  Status OnPressure(const PressureEvent& ev, uint64_t* freed);
  SharedBudgetStats Stats();
  // The pools, for reports (each valid while its owner keeps it open).
  std::vector<Pool*> Pools();
  // The amount policy applied to pressure events from now on (a pool's WatchPressure sets it).
  void SetAmount(const AmountOptions& o);

 private:
  friend class Pool;
  void Add(Pool* p);
  void Remove(Pool* p);
  // The pass itself: pressure false spares what a budget pass spares. REQUIRES pass_mu_.
  // idle_models_only: steps 1 and 2 only (the room pass).
  Status EvictAcross(uint64_t bytes, bool pressure, uint64_t* freed, bool idle_models_only = false);
  void PassThread();
  // Starts the pass thread through env if it is not running. REQUIRES def_mu_. False: refused.
  bool StartPassThreadLocked(Env* env);
  // The room pass for bytes over the budget, idle models only. REQUIRES pass_mu_.
  Status RoomLocked(uint64_t bytes, uint64_t* freed);

  const uint64_t memory_budget_;
  const bool pass_after_return_;
  std::atomic<bool> spread_idle_weights_{false};
  std::atomic<bool> room_behind_{false};
  std::mutex mu_;  // guards pools_, stats_ and amount_
  std::vector<Pool*> pools_;
  SharedBudgetStats stats_;
  AmountPolicy amount_;
  std::mutex pass_mu_;  // one pass at a time (taken before any pool's locks)
  // The deferred pass (pass_after_return): queued_ / running_ / stop_ under def_mu_.
  std::mutex def_mu_;
  std::condition_variable def_cv_, def_done_cv_;
  bool def_queued_ = false, def_running_ = false, def_stop_ = false, def_started_ = false;
  uint64_t room_queued_ = 0;   // bytes handed by room passes behind, not yet taken by the thread
  uint64_t room_running_ = 0;  // bytes of the room pass the thread runs now
  Env* def_env_ = nullptr;  // the Env the pass thread was started through (its clock)
  std::thread def_thread_;
};

}  // namespace mz
