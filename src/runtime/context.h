// Context: one conversation. Owns the chunked KV cache, the forward pass, the elastic memory state
// and the token history; borrows the model (which must outlive it).
// Thread-safety: Decode, Truncate, Restore and Report serialize on an internal mutex. Evict and
// SetThreads may be called from another thread (a memory-pressure handler, a UI thread): while a
// Decode runs they return kBusy at once rather than tearing state or waiting.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/sync_point.h"
#include "env/cpu_topology.h"
#include "memory/residency_report.h"
#include "memory/unit_table.h"
#include "memory/kv_cache.h"
#include "policy/device_profile.h"
#include "policy/restore_mode.h"
#include "restore/restore_pipeline.h"
#include "policy/hybrid_swap.h"
#include "model/model.h"
#include "runtime/batcher.h"
#include "runtime/forward.h"
#include "runtime/session_file.h"

namespace mz {

struct RestoreGenerateStats {
  PipelineStats pipeline;
  double ttft_s = 0;      // request to logits of the last input token
  double wait_s = 0;      // compute stalled waiting for units
  double cpu_s = 0;       // process CPU time spent
  int compute_threads_during_restore = 0;
  double remaining_at_start = 1;  // LLM memory resident (base excluded) when the call got the
                                  // context, once the table agreed with the kernel (Reconcile)
  // Residency as the kernel saw it when the call got the context (before Reconcile): bytes mzcache
  // counted resident and, of them, bytes not in RAM (reclaimed by the kernel). Measured only when
  // ContextOptions::reconcile_min_missing is set (else 0).
  uint64_t counted_resident_at_start = 0, kernel_missing_at_start = 0;
  ReconcileStats reconciled;  // what Reconcile moved to evicted before the pipeline planned
  // The overlap the call ran (PipelineOptions::overlap, or what kAuto chose) and, for kAuto, the
  // plan (policy/restore_mode.h) with its inputs.
  Overlap overlap = Overlap::kFull;
  bool auto_mode = false;
  RestoreCosts mode_costs;
  RestoreModePlan mode_plan;
};

struct ContextOptions {
  int n_ctx = 8192;
  int kv_chunk_tokens = 256;
  int n_threads = 2;
  // On a heterogeneous machine (big.LITTLE; env/cpu_topology.h) compute only on the fastest
  // cluster by default: min(n_threads, its cores) threads pinned to it, chosen at Init from
  // cpu_root (sysfs, read through the model's Env). Homogeneous or unreadable: n_threads, unpinned.
  bool fastest_cluster_only = true;
  std::string cpu_root = kSysCpuRoot;
  int n_ubatch = 512;
  std::string kv_codec = "q8";   // codec for compressed KV placements
  // Resident KV chunk format (since 0.9): kF16, or kQ8 (q8_0: rows written as q8 blocks as tokens
  // are produced, about half the memory; store/q8_kv.h).
  KvType kv_type = KvType::kF16;
  std::string swap_path;         // storage swap file (default: $TMPDIR or /var/tmp)
  bool direct_io = true;
  // KV chunks come back from the storage swap as mappings of it (UnitTableOptions::map_swap).
  bool map_swap = true;
  int restore_threads = 2;
  // A returning conversation whose units must come back while others generate through the shared
  // pass (batcher active) restores them on one thread at this nice increment (1..19), below the
  // compute threads, so their steps keep the cores (mz_context_params.restore_nice_beside_batch).
  // 0: restore_threads threads at the caller's priority.
  int restore_nice_beside_batch = 10;
  std::string profile_path;      // device profile (default: <cache>/profile.json if present)
  EvictOrder evict_order = EvictOrder::kBackwardOut;
  uint64_t evict_seed = 1;       // random-out
  bool hybrid = true;            // false: a single storage path (ablation)
  bool partial_offload = false;  // the Partial Offload baseline's eviction instead of hybrid swap
  // Compute reads KV chunks held compressed in memory (q8) in place instead of restoring them
  // first (Decode; RestoreGenerate when PipelineOptions::attend_compressed too). false: the paper's
  // behaviour, every unit is restored before compute reads it.
  bool attend_compressed = true;
  // The policy's unit times follow this engine's restore paths (RestorePaths: KV mapped from the
  // swap, q8 chunks read in place, weights through the page cache). false: the paper's costs,
  // every unit read by direct I/O into fresh memory and compressed chunks decoded (ablation).
  // In-place reads are assumed when attend_compressed is on: a restore_generate that turns them
  // off per call (PipelineOptions / mz_restore_params.attend_compressed = 0) restores a placement
  // planned for them (still correct, possibly slower).
  bool cost_restore_paths = true;
  // "Resident" must mean resident: before every RestoreGenerate, restore-ahead slice
  // (TryRestoreUpTo) and policy eviction (EvictBytes), the unit table is made to agree with the
  // kernel (UnitTable::Reconcile): a resident unit of which at least this many bytes were
  // reclaimed by the kernel (clean page-cache pages, under a memory cgroup at its limit) counts as
  // evicted, so the pipeline restores it front layers first, overlapped with compute, instead of
  // compute faulting it back a page at a time; and an eviction frees memory that is really there.
  // 0: off (the table's own count is trusted; the kernel is not asked).
  uint64_t reconcile_min_missing = 256 << 10;
  // Restored units are read once from user space by the thread that restored them
  // (UnitTableOptions::touch_restored, core/touch.h). false: the ablation.
  bool touch_restored = true;
  // The in-memory swap's load arena (UnitTableOptions::segment_cache): a pool gives every
  // conversation's context its own one. nullptr: none.
  std::shared_ptr<SegmentCache> segment_cache;
  // The model's weight units are shared with other contexts (a pool's conversations, src/pool):
  // this context never moves them on its own. EvictBytes plans KV chunks only (EvictScope::kDefault)
  // and Reconcile checks KV chunks only; weights are evicted by the owner of the sharing, which
  // calls EvictBytes(..., EvictScope::kAll) while no other context computes. A generation still
  // restores dropped weights it needs: the owner must serialize such a generation with the other
  // contexts' compute (the pool does, src/pool/pool.h).
  bool shared_weights = false;
  // Fail at start, not later (runtime/memory_plan.h): Init estimates the peak memory of this
  // context filled to n_ctx (weights, KV, compute buffers, the process's overhead) and refuses with
  // kNoMemory, naming what would fit (the largest context, q8_0 KV, a smaller quant), when it
  // exceeds the smallest of the memory cgroup limit, MemAvailable + the process's anonymous RSS and
  // memory_budget (read through the model's Env). false (the default here; the C API's default is
  // on): no check.
  bool memory_check = false;
  uint64_t memory_budget = 0;  // bytes the context may use in all (0: none); with memory_check
  // Compute through a shared batcher (runtime/batcher.h: a pool's one forward pass) instead of
  // this context's own Forward: Decode and RestoreGenerate join the batcher's steps with every
  // other context computing at that moment. RestoreGenerate restores front layers first
  // overlapped with its own prefill when nothing else computes; while others do, it restores
  // first (the restore executor, on its workers) and then joins the batch, so the others' steps
  // never wait for its units. SetThreads then changes only this context's own Forward (made for it,
  // unused); without SetThreads none is made (Context::forward).
  std::shared_ptr<Batcher> batcher;
};

// What an EvictBytes call may move.
enum class EvictScope {
  kDefault,  // KV chunks and weights, or KV chunks only with ContextOptions::shared_weights
  kKvOnly,   // KV chunks only
  kAll,      // KV chunks and weights (REQUIRES for shared weights: no other context computes)
};

class Context {
 public:
  Context(Model* model, const ContextOptions& opts);
  // Validates options; call once after construction.
  Status Init();

  // See Forward::Decode. Tokens are appended to history() on success only.
  Status Decode(const int32_t* tokens, int n, bool all_logits);
  // Stops the Decode / RestoreGenerate running on this context at its next batch step
  // (ContextOptions::batcher; without one the call runs to its end): it returns kCancelled with
  // the context as before it. Other contexts in the batch are not disturbed. A call that starts
  // after Cancel is not affected. Lock-free; any thread.
  void Cancel() { cancel_.store(true); }
  const float* logits(int row) const;  // nullptr if out of range
  int n_logit_rows() const;
  // Keeps the first n_keep tokens. A borrowed (shared) chunk kept in part is copied first
  // (copy-on-write: the store's unit is never written); if that copy fails (no memory, the
  // store's copy unreadable) the chunk is dropped whole: history() then ends at its start.
  void Truncate(int n_keep);

  // Changes the compute threads (n) and their CPUs (the first n of cpus; empty: not pinned) between
  // calls; the conversation (KV, history, logits) is untouched, and the next Decode /
  // RestoreGenerate computes on the new threads (RestoreGenerate lends one of them to restoration
  // as before). Never waits: kBusy at once while any call holds the context (a generation on
  // another thread, also a restore or a report), changing nothing. kInvalidArgument /
  // kNoMemory as Forward::SetThreads. On any failure the threads and CPUs are as before.
  // Overrides the fastest-cluster default of Init. Thread-safe.
  Status SetThreads(int n, const std::vector<int>& cpus);
  // The compute threads and pinned CPUs now (what Init's default or SetThreads chose). Not
  // synchronized with a concurrent SetThreads (read it from the thread that sets).
  int n_threads() const { return opts_.n_threads; }
  // The CPUs the compute threads are pinned to (empty: not pinned; always empty before the own
  // Forward is made, by SetThreads or a first own compute).
  const std::vector<int>& compute_cpus() const;

  // Moves units per plan until `bytes` are released (0: whole plan). kBusy during a Decode.
  Status Evict(const Plan& plan, uint64_t bytes, uint64_t* freed);
  // Policy-driven eviction (hybrid swap, Algorithm 1): releases at least `bytes` of RAM, or all
  // it can (reported in *freed), from whatever state previous calls left. kBusy during a Decode.
  // scope: what may move (EvictScope).
  Status EvictBytes(uint64_t bytes, uint64_t* freed, PolicyOutput* last_plan = nullptr,
                    EvictScope scope = EvictScope::kDefault);
  // The policy's input for the current state (pure data; for tests and tools).
  PolicyInput MakePolicyInput(uint64_t bytes);
  // What restoring the evicted units now and computing n tokens would cost (policy/restore_mode.h):
  // restoration estimated from the units' states and the device profile, compute from this
  // context's measured prefill rate (0 until a prompt of two or more tokens was computed with every
  // unit resident), the cores from the calling thread's affinity (Env; 1 if unreadable). po gives
  // the workers asked for. REQUIRES: mu_ held (RestoreModeCostsLocked) / not held.
  RestoreCosts RestoreModeCosts(int n, const PipelineOptions& po);
  // Bytes of this context's own compute buffers as of the end of its last call (0 with a batcher:
  // the buffers are the batcher's). Lock-free.
  uint64_t compute_buffer_bytes() const { return compute_buffer_bytes_.load(); }
  // Frees this context's own compute buffers (an idle model's: Pool::EvictIdleModel); its next call
  // allocates them again. *freed: the bytes. kBusy (nothing freed) while a call holds the context;
  // with a batcher, nothing to free.
  Status TryReleaseComputeBuffers(uint64_t* freed);
  // The measured seconds per prompt token (0: none yet); for reports and tests.
  double compute_s_per_token() const { return compute_s_per_token_.load(); }
  const DeviceProfile& profile() const { return profile_; }
  // Switches the eviction policy for later EvictBytes calls (benchmarks compare policies on one
  // context). REQUIRES: no concurrent EvictBytes.
  void SetEvictionPolicy(bool partial_offload, EvictOrder order, bool hybrid) {
    opts_.partial_offload = partial_offload;
    opts_.evict_order = order;
    opts_.hybrid = hybrid;
  }
  void set_profile(const DeviceProfile& p) { profile_ = p; }
  // Ablation switches (REQUIRES: no concurrent EvictBytes / Decode): see ContextOptions.
  void set_attend_compressed(bool on) { opts_.attend_compressed = on; }
  void set_cost_restore_paths(bool on) { opts_.cost_restore_paths = on; }
  void set_reconcile_min_missing(uint64_t bytes) { opts_.reconcile_min_missing = bytes; }
  void set_touch_restored(bool on);
  // A foreground call (Decode, RestoreGenerate, a session save or load, a chunk read for another
  // conversation) waits for this context's lock now. Lock-free; any thread.
  bool foreground_waiting() const { return fg_waiting_.load() > 0; }
  // restore_generate: appends tokens and computes the last token's logits while evicted units are
  // restored in forward order (layer l's compute starts when layer l is resident). Compute uses
  // n_threads - 1 threads while restoration runs (the restore workers take the other core) and all
  // n_threads once it is done (or, with po.full_threads_for_io, once only storage reads remain).
  // po.overlap == Overlap::kAuto: the overlap, the restoration workers and compute's threads while
  // restoring come from PlanRestoreMode (policy/restore_mode.h) over RestoreModeCosts; this is the
  // one place that plan is applied.
  // On failure the context is as before the call (units restored so far
  // stay restored).
  Status RestoreGenerate(const int32_t* tokens, int n, const PipelineOptions& po, RestoreGenerateStats* stats);
  // Brings every unit back (multi-threaded).
  Status Restore();
  MemoryReport Report();
  // Replaces the conversation with n_tokens tokens whose KV is written by fill(layer, chunk, dst)
  // (dst: chunk_bytes() of fp16 K then V, head-major; q8_0 KV: the resident q8 layout,
  // store/q8_kv.h) instead of computed: benches and tests that
  // need a large filled context fast. history() becomes n_tokens copies of token 0 (the KV stands
  // for no real tokens). Chunks are filled before the context is touched: kContextFull past n_ctx
  // and kNoMemory for a chunk that cannot be mapped change nothing; a failure once the old
  // conversation is gone (KvCache::Reserve) leaves it empty. Serialized with every other call.
  // tokens (optional, n_tokens of them): the history to record instead of copies of token 0, for KV
  // that is the real KV of those tokens (a pool's shared prefix, copied from another conversation).
  Status ImportKv(int n_tokens, const std::function<void(int layer, int chunk, uint16_t* dst)>& fill,
                  const std::vector<int32_t>* tokens = nullptr);
  // Copies the raw KV (chunk_bytes(): fp16 K then V) of chunk (layer, chunk) into dst whatever its
  // state (a compressed or stored copy is decoded; states unchanged), only if the history starts
  // with the n_expect tokens of expect and the chunk lies within them: else kInvalidArgument (the
  // conversation changed since it was looked up). Errors: UnitTable::ReadChunk's (kCorruption for
  // a lost chunk, kIOError). Serialized with every other call (a foreground call).
  Status ReadKvChunk(const int32_t* expect, int n_expect, int layer, int chunk, uint16_t* dst);
  // ---- chunks shared with other contexts (a pool's deduplicated prefixes, memory/shared_chunks.h) ----
  // The first n_chunks chunks (every layer) become units borrowed from store: refs[l * n_chunks +
  // c], references taken in every case (released on error). An empty context becomes those
  // n_chunks * T tokens (history: expect's first n_chunks * T), its chunks detached: the next call
  // attaches them as it restores evicted chunks. A non-empty one must start with those tokens (else
  // kInvalidArgument, nothing changed); each chunk's own copy (any tier) is freed, and a chunk
  // that was resident is attached at once. A chunk whose attach fails keeps its own copy (its
  // reference released); the first such error is returned and the other chunks are shared.
  // Serialized with every other call (a foreground call).
  Status BorrowShared(const int32_t* expect, int n_chunks, const std::shared_ptr<SharedChunkStore>& store,
                      const std::vector<SharedChunkStore::Ref>& refs);
  // How many leading full chunks are borrowed from a shared store in every layer (a pool's shared
  // prefix: what its stored file may name instead of holding). Serialized with every other call.
  int SharedPrefixChunks();
  // Detaches every attached borrowed chunk (unpinned: the store may evict it once no borrower has
  // it attached; the next call attaches it again). Never waits: kBusy at once while any call holds
  // the context. *n (optional): how many were detached.
  Status DetachShared(int* n);
  // Restored KV chunks map their swap extents (UnitTableOptions::map_swap; ablation switch).
  void set_map_swap(bool on);

  // ---- memory pressure (src/pressure) ----
  // Like Report(), but returns false at once instead of waiting while a generation (or any other
  // call) holds the context: for a pressure monitor's thread.
  bool TryReport(MemoryReport* out);
  // Restores at most max_bytes of RAM, or returns kBusy at once while a generation (or any other
  // call) holds the context: the forward-order prefix of the evicted units that fits
  // (restore/executor.h, RestoreMode::kUpTo); *restored (optional) receives what it restored. For
  // restore-ahead in slices that fit the memory the system has free. Yields to foreground calls:
  // if one starts waiting for the context, no further unit is started and the call returns what
  // it restored so far (kBusy if that is nothing).
  // yield = false: the slice runs to its end whoever waits (the ablation).
  Status TryRestoreUpTo(uint64_t max_bytes, uint64_t* restored, bool yield = true);
  // A foreground caller about to need something a restore-ahead slice holds up (a pressure
  // monitor's entry points called on the generating thread): while one is alive, slices yield as
  // they do for a call waiting for the context. Thread-safe.
  struct ForegroundIntent {
    explicit ForegroundIntent(Context* c) : c_(c) {
      if (c_) c_->fg_waiting_.fetch_add(1);
    }
    ~ForegroundIntent() {
      if (c_) c_->fg_waiting_.fetch_sub(1);
    }
    ForegroundIntent(const ForegroundIntent&) = delete;
    ForegroundIntent& operator=(const ForegroundIntent&) = delete;
    Context* c_;
  };
  // Safe-point hook: called on the calling thread after every Decode and RestoreGenerate has
  // released the context (whether it succeeded or not), i.e. between generation steps, where a
  // queued eviction can run without tearing state (PressureMonitor::OnSafePoint). One hook per
  // context; nullptr removes it. Setting waits for a running hook call to finish, so after
  // SetSafePointHook(nullptr) returns the old hook is never called again. The hook must not throw
  // (exceptions are swallowed) and must not call SetSafePointHook itself.
  void SetSafePointHook(std::function<void()> hook);
  // The kernel's view of what the table counts resident (UnitTable::MeasureInRam), serialized with
  // every other call; a foreground call (a restore-ahead slice yields to it). For tools and tests.
  Status MeasureInRam(KernelResidency* out);
  // Every unit as the table counts it and as the kernel sees it (memory/residency_report.h:
  // mincore, the page cache, smaps unless with_smaps is false), serialized with every other call;
  // a foreground call (a restore-ahead slice yields to it). Errors: BuildResidencyReport's.
  Status MeasureResidency(bool with_smaps, ResidencyReport* out);

  Model* model() const { return model_; }
  // Read-only views of the unit state. Every change goes through this class's operations (which
  // take its lock) and, below them, the UnitTable: the sole mutator of unit state.
  const KvCache& kv() const { return *kv_; }
  const UnitTable& units() const { return *units_; }
  // This context's own Forward (its ggml backend, graph metadata and compute buffers), made at its
  // first own compute (a Decode or RestoreGenerate without a batcher, SetThreads) or here: a
  // context that computes through a batcher (a pool's) never makes one. Takes the context's lock:
  // not during one of its calls.
  const Forward& forward();
  // Whether the own Forward was made (any thread).
  bool has_own_forward() const { return own_forward_made_.load(); }
  const std::vector<int32_t>& history() const { return history_; }
  // The turn mark: where the last turn's prompt ended in history() (an app's mark: a chat server
  // tells a client's resent history that continues the conversation from one that edits its last
  // reply), or -1: none. Saved and loaded with the session (SaveSession / LoadSession /
  // OpenSessionAsStorage), so it survives a restart and travels with a pool's stored files. Any
  // cut of the history before it (Truncate, ImportKv, a fresh BorrowShared) clears it. Any thread.
  int turn_mark() const { return turn_mark_.load(); }
  // Sets the turn mark. kInvalidArgument unless 0 <= n <= history().size(). Takes the context's
  // lock (not during one of its calls).
  Status SetTurnMark(int n);
  const ContextOptions& options() const { return opts_; }

 private:
  friend Status SaveSession(Context&, const std::string&, const std::string&, struct SessionInfo*, int,
                            const std::function<void()>&);
  friend Status LoadSession(Context&, const std::string&, struct SessionInfo*, const ExternalChunkResolver&);
  friend Status OpenSessionAsStorage(Context&, const std::string&, struct SessionInfo*, const ExternalChunkResolver&);
  friend struct ContextTestPeer;
  // Reconcile (when opts_.reconcile_min_missing is set). REQUIRES: mu_ held. *st (optional)
  // receives what was measured and moved.
  Status ReconcileLocked(RestoreGenerateStats* st = nullptr, bool weights = true);  // tests that drive the unit table or the pipeline directly
  Model* model_;
  ContextOptions opts_;
  std::unique_ptr<KvCache> kv_;
  // Made on first use (OwnForwardLocked), under mu_; nullptr until then.
  std::unique_ptr<Forward> fwd_;
  std::atomic<bool> own_forward_made_{false};
  // REQUIRES mu_. The own Forward, made now if it was not yet (options: opts_'s threads, ubatch).
  Forward* OwnForwardLocked();
  std::unique_ptr<UnitTable> units_;
  DeviceProfile profile_;
  std::mutex mu_;
  // Foreground calls (Decode, RestoreGenerate, Restore, session save/load) waiting for mu_: while
  // any waits, a restore-ahead slice holding mu_ stops after its units in flight and lets them in
  // (a query must not wait for background work; it restores what it needs itself, overlapped).
  // Report and Truncate take mu_ plainly: a caller polling the memory report must not starve
  // restore-ahead (each poll would stop the slice under way).
  std::atomic<int> fg_waiting_{0};
  struct ForegroundLock {
    explicit ForegroundLock(Context* c) : c_(c) {
      c_->fg_waiting_.fetch_add(1);
      MZ_SYNC_POINT("context:foreground_waiting", 0);
      c_->mu_.lock();
      c_->fg_waiting_.fetch_sub(1);
    }
    ~ForegroundLock() { c_->mu_.unlock(); }
    Context* c_;
  };
  std::vector<int32_t> history_;
  std::atomic<int> turn_mark_{-1};  // written under mu_ (see turn_mark())
  std::vector<float> logits_;
  std::atomic<bool> cancel_{false};
  uint64_t decoding_since_ns_ = 1;
  // Prefill seconds per token, measured on prompts (n >= 2) computed with nothing to restore:
  // a moving average (the newest call weighs a half). 0: not measured yet.
  std::atomic<double> compute_s_per_token_{0.0};
  std::atomic<uint64_t> compute_buffer_bytes_{0};  // fwd_'s, after each call (compute_buffer_bytes)
  void NoteComputeLocked(int n, uint64_t ns);
  RestoreCosts RestoreModeCostsLocked(int n, const PipelineOptions& po);  // when the last prompt (a call of more than one token) was computed
  // The compute of a call (REQUIRES mu_): appends tokens to the KV cache and fills logits_, through
  // the batcher when there is one (wait/restoring: the restore pipeline's hooks, see
  // Batcher::Request), else this context's Forward. *wait_s (optional): time compute waited for units.
  Status ComputeLocked(const int32_t* tokens, int n, bool all_logits, const std::function<Status(int)>& wait = nullptr,
                       const std::function<bool()>& restoring = nullptr, int threads_while_restoring = 0,
                       double* wait_s = nullptr);
  void RunSafePoint();
  struct SafePointOnExit {  // declared before the lock guard: runs the hook after the unlock
    Context* c;
    ~SafePointOnExit() { c->RunSafePoint(); }
  };
  std::mutex hook_mu_;
  std::function<void()> safe_point_hook_;
};

}  // namespace mz
