// RestorePipeline: the restore executor's overlapped mode (restore/executor.h holds the others:
// everything, up to N bytes, for this compute). It restores evicted units in forward order (base
// unit, then layer 0, 1, ...) on worker threads while prefill consumes them: each layer has a readiness signal, and compute of
// layer l starts as soon as weight unit l and every KV chunk of layer l are resident (paper §4.4,
// Fig. 8b). Two paths run in parallel: storage reads (weights, KV on storage; through the page
// cache where the unit is a file mapping, else direct I/O) and
// in-memory decompression (compressed KV from the stack); a worker whose path is empty helps the
// other, so the paths finish together.
//
// Overlap variants (paper Fig. 11a):
//   kNone          allocate everything, then reload everything, then prefill (mz_NO)
//   kAllocReload   allocation and reload pipelined per unit, prefill after all (mz_AR)
//   kReloadPrefill allocate everything first, then reload overlapped with prefill (mz_RP)
//   kFull          allocation, reload and prefill all overlapped (mzCache)
//   kAuto          Context::RestoreGenerate chooses kFull or kNone, the workers and compute's
//                  threads from policy/restore_mode.h; a pipeline given kAuto runs as kFull
// `sequential` is the Partial Offload baseline's restore: one thread, forward order, everything
// before prefill. `parallel_paths = false` runs the in-memory path to completion before the
// storage path (Fig. 12's sequential bars).
//
// Threads come from the Env (StartThread); one the OS refuses is not fatal: the threads that did
// start, or the calling thread, restore its share (PipelineStats::threads_refused).
// Thread-safety: Start, Wait and Finish are called from the compute thread; workers touch only
// distinct units through UnitTable::AllocateFor/RestoreInto. The destructor joins the workers.
// Failure: a unit that fails to restore marks its layer failed; Wait on that layer returns the
// error (compute stops); other layers finish restoring.
#pragma once
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "memory/unit_table.h"
#include "restore/executor.h"

namespace mz {

enum class Overlap { kNone, kAllocReload, kReloadPrefill, kFull, kAuto };
const char* OverlapName(Overlap o);
bool ParseOverlap(const std::string& s, Overlap* o);

struct PipelineOptions {
  Overlap overlap = Overlap::kFull;
  int io_threads = 2;          // storage-path workers (mostly blocked in reads)
  int decode_threads = 1;      // in-memory path workers (CPU bound)
  bool parallel_paths = true;
  bool sequential = false;     // Partial Offload baseline
  // While compute waits for a layer (kFull, kReloadPrefill), the waiting thread restores pending
  // units itself (in-memory path first, in forward order) instead of idling: on few cores the
  // compute thread's core would otherwise sit idle while the workers restore.
  bool compute_helps = true;
  // Allocation ahead (kFull, kAllocReload): one anonymous mapping for every unit to restore,
  // carved into page-aligned slices, populated by an allocation thread in forward order ahead of
  // the workers, so storage workers mostly just read (a worker that reaches a slice not yet
  // populated populates it itself). One mapping also keeps mmap's write lock out of concurrent
  // page population. false: each worker maps and populates its unit right before restoring it.
  // The variants that allocate everything first (kNone, kReloadPrefill) populate the one mapping
  // on all workers' threads. If the one mapping fails, units are mapped one by one.
  bool alloc_ahead = true;
  // restore_generate: compute runs on n_threads - 1 threads while restoration needs CPU (the
  // workers take the other core) and on all n_threads once it is done; with this set, already
  // once only direct-I/O storage reads remain (cpu_work_done()), whose workers mostly wait for the
  // disk. Reads through the page cache (file-backed weights, KV chunks mapped from the swap) are
  // CPU work: the kernel allocates, charges and maps every page in the reading thread (same run,
  // Qwen3-0.6B 8k from 0/25/50/75%, medians of 5: 1.035/0.838/0.585/0.483 s counting them as CPU
  // work vs 1.256/1.044/0.705/0.551 s not; Llama-3.2-1B 1.178/1.063/0.751/0.629 vs
  // 1.518/1.050/0.879/0.685 s).
  // On by default since q8 chunks are read in place (the in-memory path is then mostly empty, so
  // the CPU work ends early): Qwen3-0.6B 8k, same run, 0.323 vs 0.423 s at 50% remaining, 0.272 vs
  // 0.303 s at 75%; Llama-3.2-1B 8k 0.327 vs 0.399 s at 75%. Without reading in place it was no
  // better (0.513 vs 0.489 s at 50%). bench ttft measures it off (mznoft, Fig. 11a).
  bool full_threads_for_io = true;
  // > 0: compute keeps this many threads (at most its own) from the start of an overlapped
  // restore, whatever the restore-mode plan or full_threads_for_io say (an ablation since 0.19,
  // mz_restore_params.compute_threads_while_restoring; bench models' mzcache-overlap-all). 0: as
  // they decide.
  int compute_threads_while_restoring = 0;
  // Restoration threads' priority, as a nice value relative to the calling thread's (<= 0; 0 or
  // a positive value leaves it alone). When the OS grants it (a lower nice needs CAP_SYS_NICE or RLIMIT_NICE;
  // probed at Start), every restoration thread (storage and in-memory workers, the allocation
  // thread) preempts compute whenever it needs a core, and compute runs on all n_threads from the
  // start instead of n_threads - 1: restoration's CPU work is done first, and compute takes every
  // cycle it leaves, including those of workers blocked on the disk. Refused: n_threads - 1 as
  // without it (PipelineStats::restore_priority_raised tells which).
  int restore_nice = 0;
  // restore_generate: compute reads compressed chunks in place (sets attend_compressed_below to
  // the first chunk the call writes). false: the paper's mzCache, which restores every unit first.
  bool attend_compressed = true;
  // KV chunks below this index that are held compressed in memory in a form the attention kernel
  // reads in place (UnitTable::readable_compressed: the q8 codec) are not restored: compute
  // reads them compressed, bit-identical to decoding them first; those compressed on storage are
  // read into the in-memory swap as they are (UnitTable::LoadCompressed: half the RAM, no
  // decode) and read in place too. Written chunks must be resident,
  // so this is at most the first chunk the call writes. 0: restore everything. Such chunks stay
  // compressed afterwards (restore-ahead or mz_restore bring them back).
  int attend_compressed_below = 0;
  // With attend_compressed_below: chunks compressed on storage are loaded into the in-memory swap
  // as they are (true) or restored (decoded) like any other unit (false).
  bool load_compressed = true;
  // Loads of one layer's chunks compressed on storage whose extents lie back to back in the swap
  // file (eviction writes a layer's chunks one after another) are read as one request of up to
  // this many bytes (preadv into their separate rooms in the in-memory swap) instead of one
  // request per chunk: a q8 chunk is 0.27-0.53 MiB (Llama-3.2-1B, Qwen3-0.6B), below the request
  // size where the profile's direct reads saturate (the chunk-size rule of the paper's §4.3).
  // 0: one request per chunk.
  size_t coalesce_bytes = size_t(kLoadRunBytes);
};

struct PipelineStats {
  double alloc_s = 0;          // wall time of the allocation phase (kNone, kReloadPrefill)
  double reload_s = 0;         // wall time from start of reload to the last unit restored
  double mem_path_busy_s = 0;  // summed worker time on the in-memory path
  double sto_path_busy_s = 0;  // summed worker time on the storage path
  int units_by_compute = 0;    // units the waiting compute thread restored (compute_helps)
  // Wall time from the start of reload until each path's last unit was restored: the paths are
  // balanced when these are close (the policy's goal); 0 for an empty path.
  double mem_path_done_s = 0;
  double sto_path_done_s = 0;
  uint64_t bytes_from_storage = 0;
  uint64_t bytes_decoded = 0;  // raw bytes produced by decompression
  uint64_t bytes_read_compressed = 0;  // raw bytes of the chunks compute read compressed (not restored)
  uint64_t bytes_restored = 0;         // RAM the restored units occupy (what was allocated and filled)
  int units = 0;
  int storage_runs = 0;      // coalesced reads (coalesce_bytes) of two or more chunks that succeeded
  int chunks_in_runs = 0;    // chunks those reads were for
  bool restore_priority_raised = false;  // restore_nice was asked for and granted
  // Restoration threads (workers, the allocation thread, allocation-phase helpers) the OS refused
  // to start (Env::StartThread): the restoration went on with fewer, and with none on the calling
  // thread (Start then returns with everything restored).
  int threads_refused = 0;
};

class RestorePipeline {
 public:
  RestorePipeline(UnitTable* e, int n_layer, const PipelineOptions& opts);
  ~RestorePipeline();
  RestorePipeline(const RestorePipeline&) = delete;
  RestorePipeline& operator=(const RestorePipeline&) = delete;

  // Plans the tasks from the current states and starts. Returns once the variant allows prefill to
  // begin (immediately for kReloadPrefill/kFull, after everything for kNone/kAllocReload/sequential).
  Status Start();
  // Blocks until weight unit `unit` (a layer, or n_layer for the base unit) and that layer's KV
  // chunks are resident. Returns the restoration error of that layer, if any. With compute_helps
  // the caller restores queued units itself while it waits.
  Status Wait(int unit);
  // Joins the workers; returns the first error.
  Status Finish();
  bool done() const { return remaining_.load() == 0; }
  // Some unit failed to restore (its layer's Wait returns the error). Thread-safe.
  bool failed() {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Status& e : errors_)
      if (!e.ok()) return true;
    return false;
  }
  // The CPU-bound part of the restoration is over: every in-memory (decompression) unit and every
  // unit read through the page cache is restored, and the allocation thread, if any, has populated
  // everything. What may remain are direct-I/O reads, whose workers mostly wait for the disk:
  // compute can take every core again.
  bool cpu_work_done() const {
    return cpu_done_.load() == n_cpu_tasks_ && (!allocator_started_ || alloc_finished_.load());
  }
  const PipelineStats& stats() const { return stats_; }
  // restore_nice was granted: restoration threads run ahead of compute (fixed at Start).
  bool restore_priority_raised() const { return stats_.restore_priority_raised; }

 private:
  struct Task {
    UnitRef u;
    int key;            // readiness slot: layer, or n_layer for the base unit
    bool mem_path;      // decompression from the in-memory stack
    bool to_stack = false;  // compressed on storage: loaded into the in-memory swap as it is (no slice)
    // No slice of the one mapping: loads into the in-memory swap (to_stack), weights mapped from
    // the model file (Model::file_backed) and KV chunks mapped from the swap file
    // (UnitTable::RestoresByMapping) need no anonymous memory populated ahead.
    bool no_slice = false;
    // Restoring it is CPU work (cpu_work_done): decompression, or a read through the page cache.
    bool cpu = false;
    UnitTable::LoadSlot slot;  // to_stack: its room in the in-memory swap, reserved at Start
    // coalesce_bytes: the leader of a run of loads read as one request holds every task of the run
    // (itself included) in file order; the others are `merged` (in no queue: the leader's worker
    // restores them). Fixed at Start.
    std::vector<size_t> run;
    bool merged = false;
    void* mem = nullptr;
    size_t bytes = 0;
  };
  void RunQueue(std::vector<size_t>& q, std::atomic<size_t>& next, bool mem_path);
  void Worker(bool mem_path);
  void Process(size_t i);
  void AllocateAll();
  // Groups the loads of each layer into runs of back-to-back extents (coalesce_bytes).
  void CoalesceLoads();
  // alloc_ahead: makes task i's slice populated (claims it, or waits for whoever did); without
  // the one mapping, maps the unit itself. Returns with tasks_[i].mem ready (nullptr if mapping
  // failed: RestoreInto then allocates itself and reports the error).
  void EnsureAllocated(size_t i);
  bool ClaimAndPopulate(size_t i);  // true if this thread populated slice i
  void AllocatorThread();
  // On a restoration thread, first thing: takes the raised priority (restore_nice) if granted.
  void RaisePriority();
  int64_t ClockNs() const;  // the Env's clock

  UnitTable* e_;
  int n_layer_;
  PipelineOptions opts_;
  std::vector<Task> tasks_;
  std::vector<size_t> mem_q_, sto_q_;
  std::atomic<size_t> mem_next_{0}, sto_next_{0};
  std::atomic<int> remaining_{0};
  std::vector<int> pending_;      // per key
  std::vector<Status> errors_;    // per key
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;
  PipelineStats stats_;
  std::atomic<uint64_t> mem_busy_ns_{0}, sto_busy_ns_{0};
  std::atomic<int> by_compute_{0};
  std::atomic<int> runs_ok_{0}, chunks_in_runs_ok_{0};  // storage_runs / chunks_in_runs
  std::atomic<int> threads_refused_{0};                  // threads_refused
  double t_reload0_ = 0;
  std::atomic<int64_t> t_last_done_ns_{0};
  std::atomic<int64_t> mem_last_done_ns_{0}, sto_last_done_ns_{0};
  bool allocated_ = false;
  // alloc_ahead: the one mapping (owned piecewise by the units once handed to RestoreInto) and
  // each slice's state: 0 not populated, 1 being populated, 2 populated.
  char* region_ = nullptr;
  std::unique_ptr<std::atomic<uint8_t>[]> alloc_state_;
  std::thread allocator_;
  std::atomic<bool> stop_alloc_{false};
  bool allocator_started_ = false;
  std::atomic<bool> alloc_finished_{false};
  int base_nice_ = 0;                 // the calling thread's nice at Start
  size_t n_cpu_tasks_ = 0;            // tasks with Task::cpu, fixed before any worker starts
  std::atomic<size_t> cpu_done_{0};   // of those, restored (or failed)
};

}  // namespace mz
