#include "restore/restore_pipeline.h"

#include <algorithm>
#include <functional>
#include <map>

#include "core/sync_point.h"
#include "restore/executor.h"

namespace mz {
namespace {
void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t prev = a.load(); prev < v && !a.compare_exchange_weak(prev, v);) {
  }
}
}  // namespace

const char* OverlapName(Overlap o) {
  switch (o) {
    case Overlap::kNone: return "none";
    case Overlap::kAllocReload: return "alloc-reload";
    case Overlap::kReloadPrefill: return "reload-prefill";
    case Overlap::kFull: return "full";
    case Overlap::kAuto: return "auto";
  }
  return "?";
}

bool ParseOverlap(const std::string& s, Overlap* o) {
  for (Overlap x : {Overlap::kNone, Overlap::kAllocReload, Overlap::kReloadPrefill, Overlap::kFull, Overlap::kAuto})
    if (s == OverlapName(x)) {
      *o = x;
      return true;
    }
  return false;
}

RestorePipeline::RestorePipeline(UnitTable* e, int n_layer, const PipelineOptions& opts)
    : e_(e), n_layer_(n_layer), opts_(opts), pending_(size_t(n_layer + 1), 0), errors_(size_t(n_layer + 1)) {}

RestorePipeline::~RestorePipeline() { Finish(); }

bool RestorePipeline::ClaimAndPopulate(size_t i) {
  // A load into the in-memory swap has no slice (its worker prefaults its reserved entry); its
  // task is not touched here at all, so its worker owns it alone.
  if (tasks_[i].no_slice) return false;  // fixed before any thread starts
  uint8_t s = 0;
  if (!alloc_state_[i].compare_exchange_strong(s, 1, std::memory_order_acq_rel)) return false;
  e_->PrefaultFor(tasks_[i].u, tasks_[i].mem);  // the pages its restore uses (UnitTable::RestoreRanges)
  alloc_state_[i].store(2, std::memory_order_release);
  return true;
}

void RestorePipeline::EnsureAllocated(size_t i) {
  Task& t = tasks_[i];
  if (t.no_slice) return;  // LoadCompressed reserves its own room; file-backed weights map the file
  if (!region_) {
    if (!t.mem) t.mem = e_->AllocateFor(t.u, &t.bytes);
    return;
  }
  if (ClaimAndPopulate(i)) return;
  while (alloc_state_[i].load(std::memory_order_acquire) != 2) std::this_thread::yield();  // being populated
}

int64_t RestorePipeline::ClockNs() const { return int64_t(e_->env()->NowNs()); }

void RestorePipeline::RaisePriority() {
  // A refusal here (granted at Start, so not expected) leaves the thread at the caller's priority:
  // it still restores, only without running ahead of compute.
  if (stats_.restore_priority_raised) (void)e_->env()->SetThreadNice(base_nice_ + opts_.restore_nice);
}

void RestorePipeline::AllocatorThread() {
  RaisePriority();
  for (size_t i = 0; i < tasks_.size() && !stop_alloc_.load(std::memory_order_relaxed); ++i)
    ClaimAndPopulate(i);
  alloc_finished_ = true;
}

void RestorePipeline::Process(size_t i) {
  Task& t = tasks_[i];
  const int64_t t0 = ClockNs();
  MZ_SYNC_POINT("pipeline:before_unit", t.key);
  EnsureAllocated(i);
  Status st;
  int n_units = 1;
  if (t.run.size() > 1) {
    std::vector<int> chunks;
    std::vector<UnitTable::LoadSlot*> slots;
    for (size_t j : t.run) {
      chunks.push_back(tasks_[j].u.chunk);
      slots.push_back(&tasks_[j].slot);
    }
    st = e_->LoadCompressedRun(t.u.layer, chunks.data(), slots.data(), int(chunks.size()));
    n_units = int(t.run.size());
    if (st.ok()) {
      ++runs_ok_;
      chunks_in_runs_ok_ += n_units;
    }
  } else {
    st = t.to_stack ? e_->LoadCompressed(t.u.layer, t.u.chunk, &t.slot) : e_->RestoreInto(t.u, t.mem);
  }
  t.mem = nullptr;  // ownership passed
  MZ_SYNC_POINT("pipeline:after_unit", t.key);
  const int64_t t1 = ClockNs();
  (t.mem_path ? mem_busy_ns_ : sto_busy_ns_) += uint64_t(t1 - t0);
  AtomicMax(t_last_done_ns_, t1);
  AtomicMax(t.mem_path ? mem_last_done_ns_ : sto_last_done_ns_, t1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!st.ok() && errors_[size_t(t.key)].ok()) errors_[size_t(t.key)] = st;
    pending_[size_t(t.key)] -= n_units;  // a run's tasks all belong to the leader's layer
  }
  if (t.cpu) ++cpu_done_;  // loads (the only runs) are not CPU work
  remaining_ -= n_units;
  cv_.notify_all();
}

void RestorePipeline::RunQueue(std::vector<size_t>& q, std::atomic<size_t>& next, bool) {
  for (size_t i; (i = next.fetch_add(1)) < q.size();) Process(q[i]);
}

void RestorePipeline::Worker(bool mem_path) {
  RaisePriority();
  if (mem_path) {
    RunQueue(mem_q_, mem_next_, true);
    if (opts_.parallel_paths) RunQueue(sto_q_, sto_next_, false);
  } else {
    RunQueue(sto_q_, sto_next_, false);
    if (opts_.parallel_paths) RunQueue(mem_q_, mem_next_, true);
  }
}

void RestorePipeline::CoalesceLoads() {
  if (opts_.coalesce_bytes == 0 || opts_.sequential) return;
  // Tasks are in forward order, so a layer's loads are consecutive among its tasks. For each
  // layer: its loads sorted by file offset, cut into runs of back-to-back extents of at most
  // coalesce_bytes; the run's first task in forward order leads it (so it is queued where the
  // earliest of its chunks would have been).
  for (size_t b = 0; b < tasks_.size();) {
    size_t e = b;
    while (e < tasks_.size() && tasks_[e].key == tasks_[b].key) ++e;
    std::vector<int> chunks;
    std::map<int, size_t> task_of;  // chunk -> task index
    for (size_t i = b; i < e; ++i)
      if (tasks_[i].to_stack) chunks.push_back(tasks_[i].u.chunk), task_of[tasks_[i].u.chunk] = i;
    for (const std::vector<int>& r : e_->LoadRuns(tasks_[b].u.layer, chunks, opts_.coalesce_bytes)) {
      if (r.size() < 2) continue;
      size_t lead = task_of[r[0]];
      for (int c : r) lead = std::min(lead, task_of[c]);
      for (int c : r) {
        tasks_[lead].run.push_back(task_of[c]);
        if (task_of[c] != lead) tasks_[task_of[c]].merged = true;
      }
    }
    b = e;
  }
}

void RestorePipeline::AllocateAll() {
  // Allocation phase over all workers' worth of threads (the paper parallelizes it across cores).
  const int nt = std::max(1, opts_.io_threads + opts_.decode_threads);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < tasks_.size();) EnsureAllocated(i);
  };
  const int ran = RunOnThreads(e_->env(), nt, [&](int) { work(); });
  threads_refused_ += nt - ran;
  allocated_ = true;
}

Status RestorePipeline::Start() {
  const MemoryReport r = e_->Report();
  stats_.bytes_from_storage = r.weights_dropped + r.kv_storage_raw + r.kv_storage_compressed;
  stats_.bytes_decoded = r.kv_mem_compressed_raw + r.kv_storage_compressed_raw;
  // Forward order: base, then per layer its weights and KV chunks.
  auto add = [&](const UnitRef& u, int key) {
    UnitState s = e_->state(u);
    if (s == UnitState::kResident) return;
    const bool in_place = u.kind == UnitRef::kKv && u.chunk < opts_.attend_compressed_below;
    if (in_place && e_->readable_compressed(u.layer, u.chunk)) {
      stats_.bytes_read_compressed += e_->RestoreBytes(u);
      return;
    }
    Task t{u, key, s == UnitState::kKvMemCompressed};
    if (in_place && s == UnitState::kKvStorageCompressed && e_->codec_readable_in_place() && !opts_.sequential &&
        opts_.load_compressed) {
      t.to_stack = true;
      stats_.bytes_read_compressed += e_->RestoreBytes(u);
    }
    tasks_.push_back(t);
    ++pending_[size_t(key)];
  };
  for (const UnitRef& u : EvictedInForwardOrder(*e_))
    add(u, u.kind == UnitRef::kWeights && u.layer < 0 ? n_layer_ : u.layer);  // key: the base unit is n_layer
  for (const auto& t : tasks_)
    if (t.u.kind == UnitRef::kWeights) {
      // Dropped weights are re-read from the model file: make sure it is the file that was loaded.
      Status st = e_->VerifyModelIdentity();
      if (!st.ok()) {
        tasks_.clear();
        std::fill(pending_.begin(), pending_.end(), 0);
        remaining_ = 0;
        return st;
      }
      break;
    }
  // Reserve the in-memory swap room of every load now, in task order, before any worker or the
  // allocation thread runs: no mmap (which takes the address-space lock) while they populate and
  // read. Ordinary 8 MiB segments, so they are given back as they empty, as for any eviction. A
  // load that cannot be reserved is restored (decoded) instead.
  for (auto& t : tasks_) {
    if (!t.to_stack) continue;
    if (!e_->ReserveLoad(t.u.layer, t.u.chunk, &t.slot).ok()) {
      t.to_stack = false;
      stats_.bytes_read_compressed -= e_->RestoreBytes(t.u);
    }
  }
  CoalesceLoads();
  for (auto& t : tasks_) {
    const bool page_cache = (t.u.kind == UnitRef::kWeights && e_->weights_file_backed()) || e_->RestoresByMapping(t.u);
    t.no_slice = t.to_stack || page_cache;
    t.cpu = t.mem_path || page_cache;
    n_cpu_tasks_ += t.cpu ? 1 : 0;
  }
  stats_.units = int(tasks_.size());
  for (const auto& t : tasks_)
    if (!t.to_stack) stats_.bytes_restored += e_->RestoreBytes(t.u);
  stats_.bytes_decoded -= std::min(stats_.bytes_decoded, stats_.bytes_read_compressed);
  remaining_ = int(tasks_.size());
  for (size_t i = 0; i < tasks_.size(); ++i)
    if (!tasks_[i].merged) (tasks_[i].mem_path ? mem_q_ : sto_q_).push_back(i);
  if (tasks_.empty()) return Status::Ok();

  if (opts_.sequential) {
    // Partial Offload: allocate everything, then read everything, one thread, forward order.
    const double a0 = double(ClockNs()) * 1e-9;
    for (auto& t : tasks_) t.mem = e_->AllocateFor(t.u, &t.bytes);
    allocated_ = true;
    stats_.alloc_s = double(ClockNs()) * 1e-9 - a0;
    t_reload0_ = double(ClockNs()) * 1e-9;
    for (size_t i = 0; i < tasks_.size(); ++i) Process(i);
    stats_.reload_s = double(t_last_done_ns_.load()) * 1e-9 - t_reload0_;
    return Finish();
  }
  if (opts_.restore_nice < 0) {
    // Probe on this thread: lower its nice and put it back (raising a nice is always allowed).
    Env* env = e_->env();
    base_nice_ = env->ThreadNice();
    // Granted only if the nice really went down (setpriority clamps at -20 and succeeds), and
    // only if this thread's own priority could be put back (raising a nice is always allowed, so
    // that failing means something else is wrong: then no worker is raised either).
    if (env->SetThreadNice(base_nice_ + opts_.restore_nice).ok()) {
      const bool lowered = env->ThreadNice() < base_nice_;
      stats_.restore_priority_raised = env->SetThreadNice(base_nice_).ok() && lowered;
    }
  }
  if (opts_.alloc_ahead) {
    // One mapping, carved into page-aligned slices in task order (forward order).
    std::vector<size_t> bytes(tasks_.size()), off;
    for (size_t i = 0; i < tasks_.size(); ++i)
      bytes[i] = tasks_[i].bytes = tasks_[i].no_slice ? 0 : e_->RestoreBytes(tasks_[i].u);
    size_t total = 0;
    region_ = MapSlices(e_->env(), bytes, &off, &total);
    if (region_) {
      alloc_state_ = std::make_unique<std::atomic<uint8_t>[]>(tasks_.size());
      for (size_t i = 0; i < tasks_.size(); ++i) {
        alloc_state_[i].store(0, std::memory_order_relaxed);
        tasks_[i].mem = tasks_[i].no_slice ? nullptr : region_ + off[i];
      }
    }
  }
  if (opts_.overlap == Overlap::kNone || opts_.overlap == Overlap::kReloadPrefill) {
    const double a0 = double(ClockNs()) * 1e-9;
    AllocateAll();
    stats_.alloc_s = double(ClockNs()) * 1e-9 - a0;
  } else if (region_) {
    // Refused by the OS: no allocation ahead; each worker populates its slice itself, which makes
    // every task with a slice CPU work (cpu_work_done waits for them).
    allocator_started_ = e_->env()->StartThread([this] { AllocatorThread(); }, &allocator_).ok();
    if (!allocator_started_) {
      ++threads_refused_;
      for (auto& t : tasks_)
        if (!t.no_slice && !t.cpu) t.cpu = true, ++n_cpu_tasks_;
    }
  }
  t_reload0_ = double(ClockNs()) * 1e-9;
  // A worker thread the OS refuses is not retried: the workers that started (each drains both
  // queues unless the paths run one after the other) and the waiting compute thread take its units.
  workers_.reserve(size_t(std::max(0, opts_.decode_threads) + std::max(0, opts_.io_threads) + 1));
  auto start = [&](std::function<void()> fn) {
    std::thread th;
    if (e_->env()->StartThread(std::move(fn), &th).ok()) workers_.push_back(std::move(th));
    else ++threads_refused_;
  };
  if (opts_.parallel_paths) {
    for (int i = 0; i < opts_.decode_threads; ++i) start([this] { Worker(true); });
    for (int i = 0; i < opts_.io_threads; ++i) start([this] { Worker(false); });
  } else {
    // In-memory path first, then the storage path (this thread runs one worker of each itself).
    start([this] {
      const int a = RunOnThreads(e_->env(), opts_.decode_threads, [this](int) { Worker(true); });
      const int b = RunOnThreads(e_->env(), opts_.io_threads, [this](int) { Worker(false); });
      threads_refused_ += std::max(0, opts_.decode_threads - a) + std::max(0, opts_.io_threads - b);
    });
  }
  if (workers_.empty()) {
    // Not one worker thread: restore everything on this thread now, in path order (no overlap
    // with compute, but nothing is lost; Wait then finds every layer ready).
    RunQueue(mem_q_, mem_next_, true);
    RunQueue(sto_q_, sto_next_, false);
  }
  if (opts_.overlap == Overlap::kNone || opts_.overlap == Overlap::kAllocReload) return Finish();
  return Status::Ok();
}

Status RestorePipeline::Wait(int unit) {
  if (unit < 0 || unit > n_layer_) return Status::Ok();
  MZ_SYNC_POINT("pipeline:wait", unit);
  if (opts_.compute_helps && !opts_.sequential && !workers_.empty()) {
    auto ready = [&] {
      std::lock_guard<std::mutex> lk(mu_);
      return pending_[size_t(unit)] == 0 || !errors_[size_t(unit)].ok();
    };
    // Take the next queued unit (forward order; the in-memory path first: it is CPU work that
    // would otherwise wait for a core) until this layer is ready or both queues are drained.
    while (!ready()) {
      size_t i = mem_next_.fetch_add(1);
      bool mem = true;
      if (i >= mem_q_.size()) {
        if (!opts_.parallel_paths) break;  // the ablation's path order must not change
        i = sto_next_.fetch_add(1), mem = false;
        if (i >= sto_q_.size()) break;
      }
      Process((mem ? mem_q_ : sto_q_)[i]);
      ++by_compute_;
    }
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_[size_t(unit)] == 0 || !errors_[size_t(unit)].ok(); });
  return errors_[size_t(unit)];
}

Status RestorePipeline::Finish() {
  for (auto& t : workers_) t.join();
  workers_.clear();
  stop_alloc_ = true;  // every task ran or never will: nothing left to populate ahead
  if (allocator_.joinable()) allocator_.join();
  // Free memory allocated ahead for tasks that never ran (only after an early exit).
  for (auto& t : tasks_) {
    if (t.to_stack) e_->CancelLoad(&t.slot);  // a load that never ran (no-op once consumed)
    if (t.mem) {
      size_t n = t.bytes;
      (void)n;
      e_->RestoreInto(t.u, t.mem);  // takes ownership (restores or frees)
      t.mem = nullptr;
    }
  }
  if (t_last_done_ns_.load() > 0 && t_reload0_ > 0)
    stats_.reload_s = std::max(0.0, double(t_last_done_ns_.load()) * 1e-9 - t_reload0_);
  stats_.mem_path_busy_s = double(mem_busy_ns_.load()) * 1e-9;
  stats_.units_by_compute = by_compute_.load();
  stats_.storage_runs = runs_ok_.load();
  stats_.chunks_in_runs = chunks_in_runs_ok_.load();
  if (t_reload0_ > 0) {
    if (mem_last_done_ns_.load() > 0) stats_.mem_path_done_s = std::max(0.0, double(mem_last_done_ns_.load()) * 1e-9 - t_reload0_);
    if (sto_last_done_ns_.load() > 0) stats_.sto_path_done_s = std::max(0.0, double(sto_last_done_ns_.load()) * 1e-9 - t_reload0_);
  }
  stats_.sto_path_busy_s = double(sto_busy_ns_.load()) * 1e-9;
  stats_.threads_refused = threads_refused_.load();
  for (const auto& e : errors_)
    if (!e.ok()) return e;
  return Status::Ok();
}

}  // namespace mz
