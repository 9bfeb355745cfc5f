#include "pressure/monitor.h"

#include <algorithm>
#include <cmath>

#include "core/sync_point.h"
#include "env/env.h"
#include "model/model.h"
#include "runtime/context.h"

namespace mz {

namespace {
// LLM memory (footprint above the base unit) and how much of it is in RAM.
void LlmBytes(const MemoryReport& r, uint64_t* llm, uint64_t* resident) {
  *llm = r.footprint() > r.base_total ? r.footprint() - r.base_total : 0;
  const uint64_t in = r.in_memory();
  *resident = in > r.base_resident ? in - r.base_resident : 0;
}
double Frac(uint64_t a, uint64_t b) { return b ? double(a) / double(b) : 0.0; }
}  // namespace

PressureMonitor::PressureMonitor(Context* ctx, std::unique_ptr<PressureSource> src, const AmountOptions& amount,
                                 Env* env)
    : ctx_(ctx), src_(std::move(src)), policy_(amount), env_(env ? env : Env::Default()) {
  if (!ctx_) return;
  // The largest unit an eviction may move past the requested amount (units move whole).
  const Model* m = ctx_->model();
  for (int l = 0; l < int(m->hparams().n_layer); ++l) granule_ = std::max(granule_, m->unit(l).region_bytes);
  granule_ = std::max<uint64_t>(granule_, ctx_->kv().geometry().chunk_bytes());
  ctx_->SetSafePointHook([this] { OnSafePoint(); });
}

uint64_t PressureMonitor::FloorCap(uint64_t llm, uint64_t resident) const {
  const double floor_b = std::clamp(policy_.options().floor_points, 0.0, 1.0) * double(llm);
  const uint64_t room = double(resident) > floor_b ? resident - uint64_t(std::ceil(floor_b)) : 0;
  if (policy_.options().floor_points <= 0) return room;  // no floor: everything may go
  return room > granule_ ? room - granule_ : 0;
}

PressureMonitor::~PressureMonitor() {
  Stop();
  if (ctx_) ctx_->SetSafePointHook(nullptr);  // waits for a running OnSafePoint
}

Status PressureMonitor::Start() {
  if (!ctx_) return Status::InvalidArgument("pressure monitor without a context");
  if (!src_) return Status::InvalidArgument("pressure monitor without a source");
  if (th_.joinable()) return Status::InvalidArgument("pressure monitor already started");
  MZ_RETURN_IF_ERROR(src_->Start().With("starting " + src_->name()));
  stop_ = false;
  Status st = env_->StartThread([this] { Loop(); }, &th_);
  if (!st.ok()) {
    src_->Stop();  // not watching: the source is let go (and, as after any Stop, not restarted)
    return st.With("starting the pressure monitor's thread");
  }
  return Status::Ok();
}

void PressureMonitor::Stop() {
  stop_ = true;
  if (src_) src_->Stop();
  if (th_.joinable()) th_.join();
}

void PressureMonitor::Loop() {
  while (!stop_.load()) {
    PressureEvent ev;
    MZ_SYNC_POINT("pressure:wait", 0);
    // Right after a restore-ahead slice the next one follows at once (no tick's sleep in between).
    Status st = src_->Wait(restoring_ ? 0 : tick_ms_, &ev);
    Notes notes;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (st.ok()) {
        HandleLocked(ev, &notes);
      } else if (st.code() != Status::kTimeout && st.code() != Status::kCancelled) {
        PressureAction a;
        a.event.source = src_->name();
        a.event.time_ns = a.applied_ns = env_->NowNs();
        a.status = st;
        a.note = "pressure source failed; monitor thread ends";
        RecordLocked(a, &notes);
      }
      if (st.ok() || st.code() == Status::kTimeout) TickLocked(&notes);
    }
    Notify(notes);
    if (st.code() == Status::kCancelled || (!st.ok() && st.code() != Status::kTimeout)) break;
  }
}

PressureAction PressureMonitor::Submit(const PressureEvent& ev) {
  Notes notes;
  PressureAction a;
  {
    Context::ForegroundIntent intent(ctx_);  // pressure now: a restore-ahead slice must not go on
    std::lock_guard<std::mutex> g(mu_);
    a = HandleLocked(ev, &notes);
  }
  Notify(notes);
  return a;
}

void PressureMonitor::OnSafePoint() {
  MZ_SYNC_POINT("pressure:safe_point", 0);
  Notes notes;
  {
    Context::ForegroundIntent intent(ctx_);
    std::lock_guard<std::mutex> g(mu_);
    ApplyPendingLocked(&notes);
  }
  Notify(notes);
}

void PressureMonitor::BeginGeneration() {
  Context::ForegroundIntent intent(ctx_);  // a restore-ahead slice holding mu_ stops early
  std::lock_guard<std::mutex> g(mu_);
  in_generation_ = true;
}

void PressureMonitor::EndGeneration() {
  MZ_SYNC_POINT("pressure:safe_point", 0);
  Notes notes;
  {
    Context::ForegroundIntent intent(ctx_);
    std::lock_guard<std::mutex> g(mu_);
    in_generation_ = false;
    // Under the same lock: the monitor's thread cannot take the queued event in between, so it is
    // applied (and reported) on this thread, as BeginGeneration's contract says.
    ApplyPendingLocked(&notes);
  }
  Notify(notes);
}

bool PressureMonitor::pending() const {
  std::lock_guard<std::mutex> g(mu_);
  return has_pending_;
}

std::vector<PressureAction> PressureMonitor::actions() const {
  std::lock_guard<std::mutex> g(mu_);
  return actions_;
}

void PressureMonitor::RecordLocked(const PressureAction& a, Notes* out) {
  if (!actions_.empty() && a.requested == 0 && !a.restored && a.status.ok()) {
    PressureAction& last = actions_.back();
    if (last.requested == 0 && !last.restored && last.status.ok() && last.event.level == a.event.level &&
        last.note == a.note && last.event.source == a.event.source) {
      last.repeats++;
      out->push_back(last);
      return;
    }
  }
  if (actions_.size() >= kMaxActions) actions_.erase(actions_.begin(), actions_.begin() + kMaxActions / 4);
  actions_.push_back(a);
  out->push_back(a);
}

void PressureMonitor::Notify(const Notes& n) {
  if (n.empty()) return;
  std::lock_guard<std::mutex> g(cb_mu_);
  if (!on_action_) return;
  for (const PressureAction& a : n) on_action_(a);
}

void PressureMonitor::QueueLocked(const PressureEvent& ev, uint64_t decided_bytes) {
  if (!has_pending_ || ev.level > pending_ev_.level) {
    const uint64_t hint = has_pending_ ? std::max(pending_ev_.bytes_hint, ev.bytes_hint) : ev.bytes_hint;
    pending_ev_ = ev;
    pending_ev_.bytes_hint = hint;
  } else {
    pending_ev_.bytes_hint = std::max(pending_ev_.bytes_hint, ev.bytes_hint);
  }
  if (decided_bytes > 0) pending_bytes_ = std::max(pending_bytes_, decided_bytes);
  else pending_undecided_ = true;
  has_pending_ = true;
  MZ_SYNC_POINT("pressure:queued", int(ev.level));
}

bool PressureMonitor::MayApplyPendingLocked() const {
  if (!has_pending_) return false;
  if (!in_generation_) return true;
  return pending_ev_.level >= pause_level_ || pending_ev_.bytes_hint > 0;
}

bool PressureMonitor::EvictLocked(uint64_t bytes, uint64_t llm, uint64_t resident, PressureAction* a) {
  uint64_t freed = 0;
  Status st = ctx_->EvictBytes(bytes, &freed);
  if (st.code() == Status::kBusy && freed == 0) return false;
  a->requested = bytes;
  a->freed = freed;
  a->status = st;
  a->llm_bytes = llm;
  a->applied_ns = env_->NowNs();
  MemoryReport r;
  if (ctx_->TryReport(&r)) {
    uint64_t l2, res2;
    LlmBytes(r, &l2, &res2);
    a->remaining = Frac(res2, l2);
  } else {
    a->remaining = Frac(resident > freed ? resident - freed : 0, llm);
  }
  if (!st.ok()) a->note = st.ToString();
  return true;
}

PressureAction PressureMonitor::HandleLocked(const PressureEvent& ev, Notes* out) {
  PressureAction a;
  a.event = ev;
  const bool wait_for_end = in_generation_ && ev.level < pause_level_ && ev.bytes_hint == 0 &&
                            ev.level != PressureLevel::kNone;
  MemoryReport r;
  if (wait_for_end || !ctx_->TryReport(&r)) {
    if (ev.level == PressureLevel::kNone && ev.bytes_hint == 0) {
      // Nothing to give back; the policy still needs to hear that pressure is gone.
      policy_.OnEvent(ev, 0, 0);
      a.note = "pressure gone";
      a.applied_ns = env_->NowNs();
      RecordLocked(a, out);
      return a;
    }
    QueueLocked(ev, 0);
    a.deferred = true;
    a.status = Status::Busy(wait_for_end ? "queued until the generation ends" : "queued: a generation holds the context");
    return a;
  }
  uint64_t llm, resident;
  LlmBytes(r, &llm, &resident);
  AmountDecision d = policy_.OnEvent(ev, llm, resident);
  a.step_points = d.step_points;
  a.llm_bytes = llm;
  a.applied_ns = env_->NowNs();
  a.remaining = Frac(resident, llm);
  const uint64_t cap = FloorCap(llm, resident);
  const uint64_t bytes = std::min(d.evict_bytes, cap);
  if (bytes == 0) {
    a.note = ev.level == PressureLevel::kNone && ev.bytes_hint == 0 ? "pressure gone"
             : cap == 0                                              ? "at floor"
                                                                     : "merged (hysteresis)";
    RecordLocked(a, out);
    return a;
  }
  if (!EvictLocked(bytes, llm, resident, &a)) {
    QueueLocked(ev, bytes);  // a generation started in between
    a.deferred = true;
    a.status = Status::Busy("queued: a generation holds the context");
    return a;
  }
  RecordLocked(a, out);
  return a;
}

void PressureMonitor::ApplyPendingLocked(Notes* out) {
  if (!MayApplyPendingLocked()) return;
  MemoryReport r;
  if (!ctx_->TryReport(&r)) return;  // still busy: stays queued for the next safe point
  uint64_t llm, resident;
  LlmBytes(r, &llm, &resident);
  PressureAction a;
  a.event = pending_ev_;
  a.deferred = true;
  uint64_t bytes = pending_bytes_;
  if (pending_undecided_) {
    AmountDecision d = policy_.OnEvent(pending_ev_, llm, resident);
    bytes = std::max(bytes, d.evict_bytes);
    a.step_points = d.step_points;
  }
  const uint64_t room = FloorCap(llm, resident);
  bytes = std::min(bytes, room);
  a.llm_bytes = llm;
  a.applied_ns = env_->NowNs();
  a.remaining = Frac(resident, llm);
  if (bytes == 0) {
    has_pending_ = pending_undecided_ = false;
    pending_bytes_ = 0;
    a.note = room == 0 ? "at floor" : "merged (hysteresis)";
    RecordLocked(a, out);
    return;
  }
  if (!EvictLocked(bytes, llm, resident, &a)) {
    pending_bytes_ = bytes;  // decided now; keep it for the next safe point
    pending_undecided_ = false;
    return;
  }
  has_pending_ = pending_undecided_ = false;
  pending_bytes_ = 0;
  RecordLocked(a, out);
}

void PressureMonitor::TickLocked(Notes* out) {
  restoring_ = false;
  ApplyPendingLocked(out);
  if (has_pending_) return;
  MemoryReport r;
  if (!ctx_->TryReport(&r)) return;
  uint64_t llm, resident;
  LlmBytes(r, &llm, &resident);
  const uint64_t now = env_->NowNs();
  AmountDecision d = policy_.Tick(now, llm, resident);
  if (!d.restore_now) {
    headroom_.Reset();  // the next restore-ahead starts a new stability window
    return;
  }
  const AmountOptions& o = policy_.options();
  uint64_t budget = 0;
  PressureAction a;
  a.event.time_ns = now;
  a.event.source = "restore-ahead";
  a.llm_bytes = llm;
  a.remaining = Frac(resident, llm);
  switch (headroom_.Sample(src_.get(), now, o, &budget)) {
    case HeadroomWindow::Verdict::kWaitCalm:
      a.note = "restore-ahead waits until free memory stops shrinking";  // coalesced while it lasts
      RecordLocked(a, out);
      return;
    case HeadroomWindow::Verdict::kSourceFailed:
      return;  // never restore blind; next tick tries again
    case HeadroomWindow::Verdict::kRestore:
      break;
  }
  uint64_t got = 0;
  a.status = budget > 0 ? ctx_->TryRestoreUpTo(budget, &got, o.restore_yields) : Status::Ok();
  a.applied_ns = env_->NowNs();
  if (a.status.code() == Status::kBusy) return;  // a generation holds the context: it restores itself
  // What this slice took is ours, not another app's: the next sample must not count it as shrinking.
  headroom_.Took(got);
  if (a.status.ok() && got == 0) {
    a.note = "restore-ahead waits for headroom";  // coalesced while it lasts (requested 0, not restored)
    RecordLocked(a, out);
    return;
  }
  a.restored = true;
  a.restored_bytes = got;
  restoring_ = a.status.ok();  // more may follow at once (cleared when nothing is left or fits)
  if (!a.status.ok()) policy_.RestoreGaveUp();
  MemoryReport r2;
  if (ctx_->TryReport(&r2)) {
    uint64_t l2, res2;
    LlmBytes(r2, &l2, &res2);
    a.remaining = Frac(res2, l2);
  }
  if (!a.status.ok()) a.note = a.status.ToString();
  RecordLocked(a, out);
}

}  // namespace mz
