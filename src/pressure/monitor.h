// PressureMonitor: one thread that waits on a PressureSource, asks the AmountPolicy how much to
// give back and calls Context::EvictBytes. Idle/inference phases (paper Fig. 5): while a
// generation holds the context, EvictBytes returns kBusy; the request is queued and applied at the
// next safe point (Context calls the safe-point hook between decode steps), never tearing state.
//
// Phases in detail:
//   - Idle: an event is applied at once on the monitor's thread (or the Submit() caller's).
//   - A Decode / RestoreGenerate holds the context: the monitor never waits for it (TryReport /
//     EvictBytes refuse with kBusy); the event is queued (several queued events merge: the
//     highest level, the largest bytes_hint) and applied right after that call returns, on the
//     generation's thread, from the context's safe-point hook (OnSafePoint). The generation is
//     thereby paused between two steps; its next step restores what it needs (restore_generate).
//   - Optionally the host declares a generation (BeginGeneration/EndGeneration, e.g. one chat
//     reply): queued events below pause_level then wait for EndGeneration() (a safe point too) so a
//     reply is not slowed by evicting and restoring between its tokens; events at or above
//     pause_level (default kCritical: the process is about to be killed) still pause it at the
//     next step.
// Restore-ahead (AmountOptions::kBackground) runs on the monitor's thread with TryRestoreUpTo:
// never while a generation runs (it restores what it needs itself); each tick restores one slice
// (front layers first) of at most restore_slice_bytes and at most what the source's Headroom()
// says is free beyond restore_margin of the limit (no fit check if the source cannot tell,
// kUnsupported; any other Headroom error skips that tick rather than restore blind). With a fit
// check it also waits until the free memory has stopped shrinking for calm_ns (an app that is
// still allocating has not raised pressure yet; restoring into its way gets the LLM killed, as
// measured in bench multitask), not counting what its own slices took. While it waits, one
// coalesced action says why ("... stops shrinking" or "restore-ahead waits for headroom").
//
// Ownership: borrows the Context (must outlive the monitor) and owns the source. The constructor
// installs the context's safe-point hook (one monitor per context), the destructor removes it.
// Thread-safety: Start/Stop/destructor from the owner thread; Submit, OnSafePoint,
// Begin/EndGeneration, actions(), pending(), set_on_action, set_pause_level are thread-safe;
// set_tick_ms before Start().
// Failure: a source error other than timeout/cancel (e.g. the watched cgroup was removed) is
// recorded as an action with that status and ends the monitor's thread; Submit still works.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pressure/amount_policy.h"
#include "pressure/headroom_window.h"
#include "pressure/pressure_source.h"

namespace mz {

class Context;
class Env;

struct PressureAction {
  PressureEvent event;
  uint64_t requested = 0, freed = 0;
  bool deferred = false;      // arrived during a generation, applied at a safe point
  bool restored = false;      // background restore-ahead
  uint64_t restored_bytes = 0;  // restore-ahead: RAM restored by this slice
  double remaining = 0;       // after the action (fraction of LLM memory resident)
  Status status;
  uint64_t applied_ns = 0;    // Env clock when applied (applied_ns - event.time_ns: reaction delay)
  double step_points = 0;     // the policy's step for this event (after escalation / level)
  uint64_t llm_bytes = 0;     // LLM memory (footprint above the base unit) when applied
  std::string note;           // why nothing was done ("merged", "at floor"), or the error
  uint32_t repeats = 0;       // further identical nothing-done events coalesced into this entry
};

class PressureMonitor {
 public:
  // env: clock for the policy (nullptr: Env::Default()).
  PressureMonitor(Context* ctx, std::unique_ptr<PressureSource> src, const AmountOptions& amount,
                  Env* env = nullptr);
  ~PressureMonitor();  // Stop()s and removes the safe-point hook
  // Starts the source and the thread. Once: after Stop() the source refuses to start again. A
  // thread the OS refuses (Env::StartThread) fails Start with kNoMemory and stops the source.
  Status Start();
  // Stops the source and joins the thread (prompt: the source's Wait is woken). A queued event
  // stays queued and is still applied at the next safe point.
  void Stop();
  // Called by the generation loop between tokens (safe point): applies a queued eviction.
  void OnSafePoint();
  // Handles one event on the caller's thread exactly as the monitor's thread would (the path of
  // mz_on_trim_memory and explicit requests). Returns the action taken; if the context is busy
  // the event is queued and the returned action has status kBusy and deferred = true.
  PressureAction Submit(const PressureEvent& ev);
  void BeginGeneration();
  void EndGeneration();  // a safe point: applies what waited for the generation's end
  bool pending() const;
  // The actions so far (copy): one per handled event (queued events that merged: one, applied
  // later with deferred = true), requested 0 when nothing was to be done (note says why), plus
  // background restores. Consecutive identical nothing-done events (a kernel source under
  // sustained pressure fires many per second) are coalesced into one entry (repeats); only the
  // last kMaxActions entries are kept. on_action, if set, is called for every event (a coalesced
  // one with the updated entry), on the thread that applied it (monitor, generation at a safe
  // point, or Submit's caller), one call at a time, no lock held.
  static constexpr size_t kMaxActions = 4096;
  std::vector<PressureAction> actions() const;
  void set_on_action(std::function<void(const PressureAction&)> f) {
    std::lock_guard<std::mutex> g(cb_mu_);
    on_action_ = std::move(f);
  }
  // Restore-ahead / retry check period of the monitor's thread (default 100 ms). Before Start().
  void set_tick_ms(int ms) { tick_ms_ = ms > 0 ? ms : 1; }
  // See BeginGeneration (default kCritical).
  void set_pause_level(PressureLevel l) {
    std::lock_guard<std::mutex> g(mu_);
    pause_level_ = l;
  }
  const PressureSource& source() const { return *src_; }
  PressureSource& source() { return *src_; }
  const AmountOptions& amount_options() const { return policy_.options(); }

 private:
  using Notes = std::vector<PressureAction>;
  void Loop();
  // mu_ held. Handles ev now or queues it; returns the action (status kBusy when queued).
  PressureAction HandleLocked(const PressureEvent& ev, Notes* out);
  // mu_ held. Queues ev; decided_bytes > 0: the policy already chose the amount.
  void QueueLocked(const PressureEvent& ev, uint64_t decided_bytes);
  bool MayApplyPendingLocked() const;
  // mu_ held. Applies the queued request if the phase allows and the context is free.
  void ApplyPendingLocked(Notes* out);
  // mu_ held. Evicts `bytes` and fills *a; false if the context was busy (nothing changed).
  bool EvictLocked(uint64_t bytes, uint64_t llm, uint64_t resident, PressureAction* a);
  void TickLocked(Notes* out);
  void RecordLocked(const PressureAction& a, Notes* out);
  void Notify(const Notes& n);
  // Most bytes an eviction may be asked for without ending below the floor (units move whole).
  uint64_t FloorCap(uint64_t llm, uint64_t resident) const;

  Context* ctx_;
  std::unique_ptr<PressureSource> src_;
  AmountPolicy policy_;
  Env* env_;
  std::thread th_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<PressureAction> actions_;
  uint64_t pending_bytes_ = 0;     // amount already decided by the policy (EvictBytes was busy)
  PressureEvent pending_ev_;       // representative queued event (highest level)
  bool has_pending_ = false;
  bool pending_undecided_ = false; // a queued event still needs the policy's decision
  bool in_generation_ = false;
  int tick_ms_ = 100;
  PressureLevel pause_level_ = PressureLevel::kCritical;
  uint64_t granule_ = 0;  // largest weight unit or KV chunk
  // Restore-ahead's stability window over the source's free memory (monitor thread, mu_ held).
  HeadroomWindow headroom_;
  bool restoring_ = false;  // the last tick restored a slice: tick again without sleeping
  std::mutex cb_mu_;
  std::function<void(const PressureAction&)> on_action_;
};

}  // namespace mz
