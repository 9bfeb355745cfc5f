// Pool: one model, many conversations, one memory budget, and nothing lost.
//
// Every conversation is a Context (its own chunked KV cache, unit table, in-memory swap and swap
// file) over the one shared Model: its weight units are held once for all of them. A conversation
// is in one of three tiers, per unit: resident; compressed in memory; on storage (its swap file,
// or, once closed or after a restart, its stored session file).
//
// Memory budget: after every generation call, and on Evict(bytes), the pool gives memory back in
// the order of pool/eviction_order.h (PlanEviction plans it, Pool::ApplyEviction in
// pool/pool_budget.cpp applies it): idle conversations least recently used first, each out whole;
// then those in use, the most recently used one only as far as needed; then the weights, only while
// no conversation computes. Eviction never waits for a generation: what computes (or is being
// persisted) is skipped. A budget pass never evicts a conversation mid-reply when two or more are in
// use (budget_spared_in_use); Evict and pressure go on through them.
// With batching (PoolOptions::batch) the budget pass runs once per batcher step, by the first call
// that returns after it, not once per call.
// The budget pass after a call (not Evict or pressure, which take what they must) does not cut the
// conversation in use, nor weights, because an idle one was busy (being persisted, say): it stops,
// counts PoolStats::budget_deferred, and the pass runs again when the next persist ends. RAM may
// then exceed the budget for that long (one conversation's write).
//
// Weights are shared: a conversation's context never moves weight units on its own
// (ContextOptions::shared_weights). A generation takes the pool's weights lock shared when every
// weight unit is resident, and exclusive when some must be restored (the restore pipeline then
// brings them back front layers first, overlapped with that prefill); weight eviction takes it
// exclusive with try_lock. So two conversations generate at once, and weights are never dropped or
// restored under a running compute.
//
// Shared prefixes: full 256-token chunks are named by chained hashes (pool/chunk_hash.h). The
// first call that feeds an empty conversation looks up the longest chain of its tokens among every
// conversation (open in any tier, or stored), confirms it token by token and computes only the
// rest. Those chunks are held once, in the pool's store of shared chunks
// (memory/shared_chunks.h): reference-counted, borrowed by every conversation that uses them (the
// one they came from too: its own copies are freed), copied on write when a conversation truncates
// into one, and freed when the last conversation using them lets go (truncated before them,
// closed, deleted). A stored conversation opened again borrows the chunks the store holds. The
// store owns a shared chunk's state: resident, or evicted to its own swap file by the pool's
// eviction (after the idle conversations, which detach their borrowed chunks first); a chunk
// attached to a conversation (pinned) is never evicted, so no generation waits and none reads a
// moving chunk. Memory figures count a shared chunk once.
//
// Shared chunks are stored once too (PoolOptions::dedup_stored): a persisted conversation whose
// first k chunks are borrowed names them (session format version 2) instead of holding them, and
// each lives in one chunk file, <dir>/chunks/<hash>.mzk (runtime/session_file.h, SaveChunkFile),
// written before the first session file that names it and unlinked when the last one that names it
// is replaced or deleted (counted per file, rebuilt from the stored files at Open, which removes
// the chunk files nobody names: a crash between the two writes; none is removed while a stored file
// cannot be read). One persist writes a given chunk file at a time (others naming it wait). A
// stored conversation opened again borrows those chunks from the store, which reads them from
// their chunk file when first attached (verified). A chunk file missing or damaged, found at open
// or when a generation reads it: the conversation's tokens are computed again and the call goes on
// (reported in Damaged(), counted in PoolStats::recomputed; never a wrong chunk), its prefix is
// shared again from the recomputed context, and the chunk files are written again by its next
// persist. This holds for any stored copy of a conversation that names or borrows shared chunks;
// one with no shared chunk keeps its error for a damaged file of its own (kCorruption).
//
// Nothing lost (with a folder): every conversation is written to <dir>/<id>.mzs as a session file
// (runtime/session_file.h: crash-safe by temporary name, fsync and rename) by a write-behind thread,
// after Commit() (the end of a turn) or once it has been idle for write_behind_idle_ms. At Open the
// pool rebuilds its index from the folder: a damaged file (bad checksum, truncation, another model)
// is reported (Damaged()) and skipped, the others load. A disk budget bounds the stored bytes:
// when exceeded, the least recently used conversations not in use are deleted, each counted in
// PoolStats::conversations_lost; nothing else deletes a stored conversation but Delete().
//
// Thread-safety: every Pool method may be called from any thread. A Conversation's calls are
// serialized on it (one turn at a time; use one thread per conversation for concurrency); distinct
// conversations run concurrently. A Conversation handle stays valid (calls return kInvalidArgument
// once it is closed or deleted) as long as the caller holds it, and the Pool outlives it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "memory/shared_chunks.h"
#include "model/model.h"
#include "pool/conversation.h"
#include "pool/eviction_order.h"
#include "pool/shared_budget.h"
#include "pressure/amount_policy.h"
#include "pressure/headroom_window.h"
#include "pressure/pressure_source.h"
#include "pool/remote_tier.h"
#include "runtime/context.h"
#include "runtime/session_file.h"

namespace mz {

struct PoolOptions {
  // Folder of the stored conversations (created if missing). Empty: nothing is persisted (a pool
  // in memory only; conversations die with it).
  std::string dir;
  uint64_t memory_budget = 0;  // RAM for weights + every conversation's KV and in-memory swap; 0: none
  uint64_t disk_budget = 0;    // bytes of stored session files; 0: none
  // Each conversation's context (shared_weights is forced on; swap_path defaults to
  // <dir>/swap/<id>.swap, or the context's own default without a folder).
  ContextOptions context;
  std::string persist_codec = "q8";  // session codec of stored conversations ("none": lossless)
  bool write_behind = true;          // false: Commit() persists before it returns
  uint32_t write_behind_idle_ms = 2000;  // a changed conversation idle this long is persisted
  // The write-behind yields to generations: between two chunks of a background write it waits
  // while another conversation's call computes its first token (a restore_generate, or a decode of
  // more than one token: restore and prefill, on the cores they need), at most this long in all per
  // write. It goes on at once when a caller waits for the conversation being written (a call, a
  // close, a commit waiting for its previous turn's write), when another write is queued behind it
  // (the writes do not fall behind the turns: durability first), or when an eviction finds it
  // busy. 0: never waits (the write competes with the generation).
  uint32_t write_behind_yield_ms = 2000;
  bool share_prefixes = true;
  // A stored conversation opened again (after a restart, or once closed) keeps its session file
  // as its storage tier (OpenSessionAsStorage): nothing is read at open, and its first
  // restore_generate restores it front layers first, overlapped with prefill. Needs the file's
  // codec to be the context's kv_codec (else, and when false, the file is read whole at open:
  // LoadSession, the ablation).
  bool stored_as_storage = true;
  // Shared prefix chunks are stored once, in chunk files named by stored conversations (above);
  // false: every stored file holds a copy of every chunk (version 1 files, the ablation).
  bool dedup_stored = true;
  // The load arena (store/segment_cache.h): in-memory swap segments that conversations' evictions
  // give back are kept, mapped and touched, up to this many bytes, and a conversation loaded from
  // storage next fills them instead of fresh memory (which costs a page fault per page, twice
  // under a VM's shadow paging). It is inside memory_budget: a budget pass evicts idle
  // conversations to make room for it (never the conversation in use, never weights), and Evict
  // (pressure, mz_pool_evict) gives it back first. kAutoArena: min(256 MiB, memory_budget / 8)
  // with a budget, else 0. 0: none (every segment unmapped when freed).
  static constexpr uint64_t kAutoArena = ~uint64_t(0);
  uint64_t load_arena_bytes = kAutoArena;
  // One forward pass for every conversation that is generating (runtime/batcher.h): calls on
  // distinct conversations from distinct threads are computed together, a step at a time, by the
  // pool's batcher (one backend, one set of compute buffers counted in the budget, context.n_threads
  // compute threads). false: each conversation computes on its own Forward (the ablation).
  bool batch = true;
  int batch_max_seqs = 64;        // sequences per step at most
  int batch_prefill_slice = 512;  // prompt tokens per step at most while other conversations decode
  // A prompt slice beside decoding conversations keeps the step within this many times a step
  // without prompt tokens (their inter-token latency; BatcherOptions::itl_factor). 0: the slice is
  // batch_prefill_slice, fixed.
  double batch_itl_factor = 2.0;
  // Several models under one memory budget (pool/shared_budget.h): this pool's RAM counts in the
  // shared budget with every other pool naming it, and its budget passes and pressure events run
  // across them all (idle models give back first). With it, memory_budget must be 0 (the shared
  // one applies) and the load arena is off. The pool holds it (shared_ptr) for its lifetime.
  std::shared_ptr<SharedBudget> shared_budget;
  // The remote tier (pool/remote_tier.h): conversations and full chunks in a store shared by a
  // fleet (Redis). remote.url empty (and no remote.store): none. Needs dir (the remote tier is
  // written from the stored files, behind the local persist, and fetched into dir). A conversation
  // id this pool does not hold is looked up there when opened (its manifest, then the chunks it
  // names: written into dir as a stored conversation and opened as one, so it is restored front
  // layers first, overlapped with prefill, and any chunk missing or failing verification makes the
  // pool compute its tokens again); an empty conversation's first call looks up the longest run
  // of its full chunks by chain hash there when the pool's own is shorter (streamed in the same
  // way, unless remote.stream_prefix is false: RemotePrefix).
  RemoteTierOptions remote;
};

struct ConversationReport {
  std::string id;
  int n_tokens = 0;
  bool open = false;        // has a context (any tier); false: stored only
  bool busy = false;        // a call runs on it (its figures are the last known ones)
  // RAM / in-memory swap / storage bytes of its KV chunks (in the swap file, or still in the stored
  // file it was opened from: OpenSessionAsStorage)
  uint64_t kv_resident = 0, kv_mem_compressed = 0, kv_storage = 0;
  uint64_t stored_bytes = 0;     // its session file (without the chunk files it names)
  int stored_tokens = 0;         // tokens in the session file (what a kill -9 now would keep)
  int stored_external = 0;       // leading chunks its session file names in chunk files
  uint64_t last_use_unix_ms = 0;
  int shared_chunks = 0;         // full chunks per layer borrowed from the pool's shared store
  uint64_t kv_shared = 0;        // their bytes (the store's, held once for every borrower)
};

struct PoolStats {
  int n_conversations = 0, n_open = 0, n_damaged = 0;
  uint64_t weights_total = 0, weights_resident = 0;
  uint64_t kv_resident = 0, kv_mem_compressed = 0, kv_storage = 0;
  uint64_t in_memory = 0;        // weights_resident + every open conversation's RAM (last known)
  uint64_t stored_bytes = 0;     // session files + chunk files (each once)
  int chunk_files = 0;           // shared chunks stored once (<dir>/chunks)
  uint64_t chunk_file_bytes = 0;
  uint64_t chunk_file_refs = 0;  // stored conversations naming them, summed over the files
  uint64_t chunk_files_damaged = 0;  // chunk files found missing or damaged (written again when next named)
  // Chunk files found marked partial at start (streamed from the remote tier at a crash) and removed.
  uint64_t partial_chunk_files_removed = 0;
  uint64_t recomputed = 0;       // conversations computed again: a stored copy failed verification
  uint64_t memory_budget = 0, disk_budget = 0;
  uint64_t conversations_lost = 0;  // deleted by the disk budget
  uint64_t persists = 0, persist_failures = 0;
  uint64_t prefix_chunks_reused = 0;  // chunks (per layer) reused instead of computed
  uint64_t evictions = 0, bytes_evicted = 0;
  uint64_t restored_ahead = 0;  // bytes brought back by restore-ahead (PoolPressureOptions)
  uint64_t budget_deferred = 0;  // budget passes that spared the conversation in use (an idle one was busy)
  // Budget passes that stopped at the conversations in use (two or more mid-turn: none is evicted
  // by a budget pass; RAM stays above the budget until a turn ends or pressure takes it).
  uint64_t budget_spared_in_use = 0;
  int in_use = 0;  // conversations in use now (a call runs on it, or its turn is open: below)
  BatcherStats batch;  // the shared forward pass (PoolOptions::batch); compute buffers counted in in_memory
  // The load arena (PoolOptions::load_arena_bytes; counted in in_memory): held now, its cap, and
  // bytes of segments reused from it instead of mapped afresh.
  uint64_t arena_bytes = 0, arena_cap = 0, arena_reused = 0;
  double persist_yielded_s = 0;  // time background writes waited for generations (write_behind_yield_ms)
  int unsaved = 0;  // conversations whose last change is not stored yet (dir set)
  // The store of shared chunks (counted once; in_memory includes shared_resident).
  SharedChunkReport shared;
  // Evictions by what asked for them (passes, and the RAM each kind gave back): the memory budget
  // (a pass that evicted anything), pressure events (the watch), onTrimMemory calls, Evict
  // (mz_pool_evict), EvictConversation. pressure_events / trim_events: events received (an event
  // merged by the amount policy still counts).
  uint64_t evict_budget = 0, evict_budget_bytes = 0;
  uint64_t evict_pressure = 0, evict_pressure_bytes = 0;
  uint64_t evict_trim = 0, evict_trim_bytes = 0;
  uint64_t evict_manual = 0, evict_manual_bytes = 0;
  uint64_t evict_conversation = 0, evict_conversation_bytes = 0;
  uint64_t pressure_events = 0, trim_events = 0;
  // RestoreConversation calls that restored something, and their bytes.
  uint64_t conversation_restores = 0, conversation_restored_bytes = 0;
  RemoteTierStats remote;  // the remote tier (PoolOptions::remote); enabled false without one
};

// A pool's weights by tier (Pool::WeightsTiers): bytes of the weight units' regions.
struct WeightsTierReport {
  uint64_t total = 0, resident = 0, dropped = 0;
  uint64_t dropped_cached = 0;  // of dropped: file runs still in the page cache (Model::DroppedBytesCached)
  int units = 0, units_resident = 0;
};

struct DamagedFile {
  std::string path;
  std::string error;
};

// What the pool's pressure watch did with one event (Pool::WatchPressure).
struct PoolPressureAction {
  PressureEvent event;
  uint64_t freed = 0;       // RAM given back
  uint64_t restored = 0;    // restore-ahead (event.source "restore-ahead"): RAM brought back
  uint64_t in_memory = 0;   // the pool's RAM after it (last known figures)
  Status status;            // OnPressure's result, or the source's error that ended the watch
};

struct PoolPressureOptions {
  PressureSourceOptions source;  // which source (kind "auto": the best this machine supports)
  // How much to give back per event, and restore-ahead: with RestoreAhead::kBackground, once no
  // event came for calm_ns, the watch thread brings back what pressure took (Pool::RestoreAheadTick).
  AmountOptions amount;
  int tick_ms = 100;  // restore-ahead's check period between events (kBackground only)
  // Optional: wraps the chosen source before the watch takes it (a test's fake, a reporter).
  std::function<std::unique_ptr<PressureSource>(std::unique_ptr<PressureSource>)> wrap_source;
  // Optional: called on the watch thread after every event, no pool lock held.
  std::function<void(const PoolPressureAction&)> on_action;
};

class Pool {
 public:
  ~Pool();  // stops the write-behind thread after it persisted every changed conversation
  // Creates the pool and rebuilds its index from opts.dir. model must outlive the pool.
  static Status Open(Model* model, const PoolOptions& opts, std::unique_ptr<Pool>* out);

  // Opens conversation id (letters, digits, '-', '_', '.', 1-128 chars, not starting with '.'):
  // the open one, a stored one (loaded: its KV is read from the session file), or a new empty one.
  Status OpenConversation(const std::string& id, std::shared_ptr<Conversation>* out);
  // Persists it (if changed) and frees its memory; it stays stored. Waits for a call running on it.
  Status Close(const std::string& id);
  // Forgets it: memory, swap and stored file. Waits for a call running on it.
  Status Delete(const std::string& id);
  // Gives back at least `bytes` of RAM in the pool's order (see above), or all it can: *freed.
  // Counted as a manual eviction (PoolStats::evict_manual).
  Status Evict(uint64_t bytes, uint64_t* freed);
  // Gives back all of conversation id's KV in RAM (resident and in-memory swap) to the tiers its
  // eviction policy chooses (the swap: compressed in memory or storage; an idle conversation goes
  // out whole), and lets its borrowed shared chunks go. Never waits for a call on it: kBusy while
  // one runs. kInvalidArgument: no such conversation. A stored-only conversation has nothing in
  // RAM: Ok, *freed 0. Counted in PoolStats::evict_conversation.
  Status EvictConversation(const std::string& id, uint64_t* freed);
  // Brings conversation id's KV back into RAM (a stored one is opened first: its file becomes its
  // storage tier), after the weights if some were given back. kBusy at once while a call runs on
  // it, or while weights must come back and a generation holds them; kInvalidArgument: no such
  // conversation (none is created). The memory budget still applies
  // afterwards (a budget pass may take it again). *restored: RAM brought back.
  Status RestoreConversation(const std::string& id, uint64_t* restored);
  // A memory-pressure event for the whole pool (the amount policy of one context, applied to the
  // pool: a share of its LLM memory, escalating on repeated events, merged within the hysteresis
  // window, everything at critical), given back in the pool's order. *freed (optional).
  Status OnPressure(const PressureEvent& ev, uint64_t* freed);
  // Restore-ahead, one slice (the watch thread calls it between events with kBackground; tests may
  // call it directly with a source of theirs). When the amount policy says calm (no event for
  // calm_ns since an eviction it applied) and the source's free memory has stopped shrinking
  // (HeadroomWindow, restore_margin of the limit kept free), it restores at most
  // restore_slice_bytes, and never past the memory budget: the weights first (a generation holding
  // them is not waited for: the tick is skipped, that generation restores what it needs), then
  // the open conversations' evicted KV, most recently used first, front layers first. A
  // conversation's restore yields to a call arriving on it (Context::TryRestoreUpTo); a
  // conversation closed or deleted meanwhile is skipped. *act: what was done (restored bytes;
  // status = the first restore error, which stops restore-ahead until the next eviction).
  // Returns true when it restored something or failed (an action worth reporting).
  bool RestoreAheadTick(PressureSource* src, HeadroomWindow* window, PoolPressureAction* act);
  // Starts a thread that waits on a pressure source (CreatePressureSource through the model's Env)
  // and hands every event to OnPressure, with opts.amount as the pool's amount policy from now on.
  // It never waits for a generation (OnPressure does not). One watch at a time: kBusy
  // if one runs. The source's creation error (kUnsupported, kInvalidArgument) or the thread's
  // (kNoMemory) leaves nothing running. A source error other than a timeout ends the thread after
  // an action carrying it; that watch then no longer counts: the next WatchPressure replaces it
  // (no StopWatchingPressure needed). *why (optional): which source was chosen and why.
  Status WatchPressure(const PoolPressureOptions& opts, std::string* why);
  // Stops the watch (prompt: the source's Wait is woken) and joins its thread. No-op without one.
  // The destructor calls it.
  void StopWatchingPressure();
  // Waits until every changed conversation is persisted (or its persist failed: the first error).
  Status Flush();
  // Flush, then waits until the remote tier has tried to write every conversation waiting for it
  // (the store down: its kIOError; the writes are kept and retried). Ok without a remote tier.
  Status FlushRemote();

  PoolStats Stats();
  std::vector<ConversationReport> List();
  Status Report(const std::string& id, ConversationReport* out);
  // The token history of conversation id: an open one's context history, a stored one's (only its
  // stored file's header and index are read; nothing is loaded). kInvalidArgument: no such
  // conversation (or closed meanwhile); kBusy: a call runs on it (never waited for: ask again
  // after it; while a persist writes it, its history is read without waiting); kCorruption /
  // kIOError: its stored file could not be read (it is not marked damaged here: the next open
  // reports it).
  Status History(const std::string& id, std::vector<int32_t>* out);
  // Conversation id's turn mark (Conversation::SetTurnMark), -1 if none: an open one's, or its
  // stored file's (known since the pool opened or last wrote it: no file is read). Errors as
  // History (kBusy while a call runs on it).
  Status TurnMark(const std::string& id, int* out);
  // History and TurnMark while a Persist writes conversation id (its use lock held, its history
  // fixed meanwhile): its history and turn mark as that write saw them, true; false when no write
  // holds it (or no such conversation). Either pointer may be null.
  bool PersistingSnapshot(const std::string& id, std::vector<int32_t>* history, int* turn_mark);
  // Conversation id with its use lock taken without waiting (History, TurnMark's common part).
  Status ForRead(const std::string& id, std::shared_ptr<Conversation>* out, std::unique_lock<std::mutex>* use);
  std::vector<DamagedFile> Damaged();
  Model* model() const { return model_; }
  const PoolOptions& options() const { return opts_; }
  // The shared forward pass (nullptr without PoolOptions::batch): tests and benchmarks hold it.
  Batcher* batcher() const { return batcher_.get(); }
  // Several models, one budget (PoolOptions::shared_budget; nullptr without).
  SharedBudget* shared_budget() const { return group_.get(); }
  // The newest use of any of its conversations (Env clock; 0: none yet), and whether any is in
  // use or computing now (Conversation::InUse): a model in use, for the shared budget's order.
  uint64_t LastUseNs() const { return last_use_ns_.load(); }
  bool ModelInUse();
  // The weights by tier now; while a generation moves them, the last figures read (never waits).
  // Errors: the page-cache query's (Env).
  Status WeightsTiers(WeightsTierReport* out);

 private:
  friend class Conversation;
  friend class SharedBudget;
  // ---- the shared budget's steps (pool/shared_budget.h), each a pass of its own ----
  // The RAM the budget counts (weights, conversations, shared chunks, compute buffers, arena):
  // fresh when no generation moves the weights, else the last known figure.
  uint64_t InMemoryForBudget();
  // Fresh figures: false (nothing written) while a generation moves the weights or they are busy.
  // *idle_swap (optional): in-memory swap of every conversation but the most recently used one.
  bool MeasureInMemory(uint64_t* in_memory, uint64_t* idle_swap);
  // Step 1: every conversation not in use goes out whole (least recently used first), then, if
  // still short, the compute buffers of those not in use with batching off
  // (Context::TryReleaseComputeBuffers; counted in the shared budget, allocated again by their next
  // call; a batcher's one set stays); never the weights.
  // Step 2: only the weights, back to front, while none of its conversations computes.
  // Step 3: the pool's own order (pressure false: as its budget pass, sparing conversations in
  // use; true: as its Evict). Each counts its bytes in bytes_evicted only.
  Status EvictIdleModel(uint64_t bytes, uint64_t* freed);
  Status EvictWeightsOnly(uint64_t bytes, uint64_t* freed);
  Status EvictOwn(uint64_t bytes, bool pressure, uint64_t* freed);
  // The share of its layers' weight units (the base unit aside) resident now, 0..1 (0 while its
  // weights are being restored: never waits). For the spread order of step 2.
  double ResidentLayerShare();
  Pool(Model* model, const PoolOptions& opts) : model_(model), opts_(opts), group_(opts.shared_budget) {}
  Status Init();
  // A context for conversation id (its swap file named after id; suffix, if any, appended: a second
  // context of the same conversation while the first still exists).
  Status NewContext(const std::string& id, std::shared_ptr<Context>* out, const std::string& suffix = "");
  std::string StoredPath(const std::string& id) const;
  // References to the first chunks of the chain h (hashes of tokens' full chunks) in the shared
  // store, at most depth chunks: refs[l * *got + c]. A chunk the store lacks is filled by
  // fill(layer, chunk, dst) and added when fill is given (its error ends the call: every reference
  // released, the error returned), else the chain stops before it (*got chunks found).
  Status GatherShared(const std::vector<uint64_t>& h, const int32_t* tokens, int depth,
                      const std::function<Status(int, int, uint16_t*)>& fill, std::vector<SharedChunkStore::Ref>* refs,
                      int* got);
  // REQUIRES mu_. c's chunk hashes in the prefix index follow history, whose first keep_tokens
  // tokens are unchanged since the last call: only the full chunks past them are hashed again.
  void ReindexLocked(Conversation& c, const std::vector<int32_t>& history, int keep_tokens);
  Status EnforceBudget();
  // The budget pass after a call on one of its conversations: in a shared budget,
  // SharedBudget::EnforceAfterCall (deferred to the budget's thread with pass_after_return);
  // otherwise EnforceBudget() here. *ran_here_s: seconds it took in the calling thread.
  Status EnforceAfterCall(double* ran_here_s);
  // In a shared budget, before c's call restores (REQUIRES c's use lock, c open): the room pass
  // (SharedBudget::MakeRoom) for what the call will bring back: this model's weight units not
  // resident and c's KV chunks not resident (raw bytes; its last known figures if its report is
  // busy). Without a shared budget: nothing. Errors: the room pass's (the call goes on).
  // *freed (optional): what the room pass gave back, or with SharedBudget::room_behind() what it
  // handed to the budget's thread to give back behind the restore.
  Status MakeRoomForCall(Conversation& c, uint64_t* freed = nullptr);
  // The pool's LLM memory (every weight unit but the base one, plus every open conversation's KV)
  // and how much of it is in RAM: the amount policy's inputs. Never waits: a busy conversation
  // counts with its last known figures, weights being moved as resident. Returns true when every
  // figure is fresh.
  bool LlmBytes(uint64_t* llm, uint64_t* resident);
  // REQUIRES evict_mu_. Gives back `bytes` in the order PlanEviction (pool/eviction_order.h) plans
  // for the open conversations now, in that mode: the one place that applies an eviction plan.
  // A budget pass that stops at the conversations in use counts budget_spared_in_use; one deferred
  // because an idle conversation was busy counts budget_deferred and sets budget_retry_ (the next
  // persist runs the budget pass again). Never waits for a generation: what computes is skipped.
  Status ApplyEviction(uint64_t bytes, const EvictionMode& mode, uint64_t* freed);
  // Evict without counting it as manual (OnPressure counts its own).
  Status EvictUncounted(uint64_t bytes, uint64_t* freed);
  bool AllWeightsResident() const;
  // ctx's report (it reads the shared weight units' state) under the weights lock taken shared,
  // without waiting for either: false (out unchanged: the last known figures) if one is busy.
  bool TryReportShared(Context& ctx, MemoryReport* out);
  void QueuePersist(const std::shared_ptr<Conversation>& c);
  // Saves c if it changed since its last save (waits for a call running on it). Counted in stats_.
  // background: the write-behind thread's write, which yields to generations (YieldToCalls).
  // if_idle: the write-behind's idle scan; once c's lock is held, c is saved only if still idle
  // (IdleForWriteBehind): a call that began and ended meanwhile makes it skip (not an attempt).
  Status Persist(const std::shared_ptr<Conversation>& c, bool background = false, bool if_idle = false);
  // c changed since its last save and no call has run on it for write_behind_idle_ms: no call
  // running now (a call blocked in a long batcher step is not idle) and its last change older.
  bool IdleForWriteBehind(const Conversation& c, uint64_t now_ns) const;
  // The write-behind's pause between two chunks of conversation c's write: waits while a call
  // computes its first token elsewhere, until one waits for c or for a write (Commit), an eviction
  // found a conversation busy since the write began (busy0), or *left_ns runs out (decremented).
  void YieldToCalls(Conversation& c, uint64_t busy0, uint64_t* left_ns);
  void WakeYielders();  // something YieldToCalls waits on changed
  Status EnforceDiskBudget(const std::string& keep);
  void WriteBehindLoop();
  // ---- chunk files (dedup_stored) ----
  std::string ChunkPath(uint64_t hash) const;
  // Makes sure ctx's first k chunks (hashes h[0, k), all borrowed) each have a chunk file, writing
  // the missing ones from ctx (crash-safe; the store is given each file as the unit's durable copy),
  // and takes one file reference for each (kept by the caller's stored file, or dropped with
  // DropChunkFileRefs). On error no reference is kept.
  Status AcquireChunkFiles(Context& ctx, const std::vector<uint64_t>& h, int k);
  // Drops one file reference per hash; a chunk file nobody names any more is unlinked.
  void DropChunkFileRefs(const std::vector<uint64_t>& hashes);
  // The chunk file of hash was found missing or damaged (why): it is removed (a damaged one) and
  // no longer on disk, so the next persist naming it writes it again; counted, reported once.
  // gen: the file found so (ChunkFile::gen when it was read; 0: whichever is there): a finding about
  // a file since replaced at that path is ignored.
  void ChunkFileDamaged(uint64_t hash, const std::string& why, uint64_t gen);
  // The chunk files of these hashes are written again by the next persist naming them (one of them,
  // or more, failed verification; which is not known).
  void RewriteChunkFiles(const std::vector<uint64_t>& hashes);
  // After a kCorruption: the chunk files the shared store found damaged when reading them.
  void TakeDamagedChunkFiles(const Status& st);
  // The resolver of a version-2 stored file's chunks (ExternalChunkResolver): the store's units,
  // or adopted from their chunk files (header, model, geometry and tokens checked). A chunk file
  // missing or failing a check is given to ChunkFileDamaged, and the error returned.
  Status ResolveExternal(const SessionReader& r, std::shared_ptr<SharedChunkStore>* store,
                         std::vector<SharedChunkStore::Ref>* refs);

  // ---- the remote tier (pool_remote.cpp) ----
  // Conversation id, not held here, fetched from the remote tier into dir and registered as a
  // stored conversation (as Init finds one). Nothing found, or the store down: Ok, nothing done
  // (the caller makes a new conversation). Serialized by remote_fetch_mu_.
  Status FetchRemoteConversation(const std::string& id);
  // The longest run of tokens' full chunks (chain hashes h, at most h.size()) the remote tier
  // holds, if longer than local_depth, the run's length returned (0: none longer, a chunk's head
  // failed, or not fetched). Streamed (PoolOptions::remote.stream_prefix, the default): the chunks
  // this pool holds neither in the shared store nor in a chunk file come as a conversation opened
  // by id gets them (StreamRemoteHeads: heads now, layers on the remote tier's stream thread, front
  // layers first), each adopted by the shared store from its file under the file gate; *refs gets
  // one new reference per unit of the run, refs[l * run + c], for Context::BorrowShared, so that the
  // caller's restore_generate restores them front layers first, overlapped with its prefill (a
  // layer that never arrives whole: kCorruption from that call, its units lost). Whole
  // (stream_prefix false): fetched and verified before return, one open reader per chunk (a chunk
  // file's bytes each) into *readers. Fetched only when policy/remote_fetch.h plans it (applied here, the one place):
  // the chunks' bytes (the average fetched chunk's, else est_chunk_bytes) at profile's
  // remote_read_Bps (+ remote_first_byte_s), or, not measured, at the rate learned from
  // RemoteTierStats (bytes_fetched / fetch_s, latency included), against the tokens beyond
  // local_depth at compute_s_per_token (the context's measured prefill rate, else the pool's latest,
  // prefill_s_per_token_). A prefix not fetched
  // as slower is counted (RemoteTierStats::fetches_skipped_slower) and 0 returned.
  int RemotePrefix(const std::vector<uint64_t>& h, const int32_t* tokens, int local_depth, KvType kv_type,
                   const DeviceProfile& profile, double compute_s_per_token, uint64_t est_chunk_bytes,
                   std::vector<std::unique_ptr<SessionReader>>* readers, std::vector<SharedChunkStore::Ref>* refs);
  // RemotePrefix's streamed run of k chunks (see there).
  int StreamRemotePrefix(const std::vector<uint64_t>& h, const int32_t* tokens, int k, int local_depth,
                         std::vector<SharedChunkStore::Ref>* refs);
  // One chunk whose head came from the remote tier (StreamRemoteHeads): its file in dir/swap (the
  // head written, sized to the chunk file's full length) and its stream job (hash, the file open for
  // writing, each layer's place; gen is the caller's to set).
  struct RemoteHead {
    int index = 0;  // the chunk's place in the caller's chain
    std::string path;
    RemoteTier::StreamJob job;
  };
  // The heads of the chunks hashes (chain positions index[i]; chunk c holds tokens[c*T, (c+1)*T))
  // in one pipeline, each checked as a chunk file of exactly its tokens in codec (session header,
  // index checksum, geometry, every layer a full chunk placed after the head) and written to a new
  // file in dir/swap at its full length. A head missing or failing a check is left out (counted as
  // damaged); the store unreachable: none. Sets the shared store's file gate (RemoteTier::AwaitLayer)
  // first. No shared store: none.
  void StreamRemoteHeads(const std::vector<uint64_t>& hashes, const std::vector<int>& index, const int32_t* tokens,
                         const std::string& codec, std::vector<RemoteHead>* out);
  // Chunk c of the chain h over tokens, from the chunk file at path (gen: the pool's name for that
  // file, ChunkFile::gen or a streamed file's): opened, checked (one chunk of exactly its tokens,
  // every layer a full chunk) and adopted by the shared store, one new reference per layer in
  // *row. Errors: the open's, kCorruption for a check; nothing taken then.
  Status AdoptChunkFile(const std::vector<uint64_t>& h, const int32_t* tokens, int c, const std::string& path,
                        uint64_t gen, std::vector<SharedChunkStore::Ref>* row);
  // After a persist of c wrote its stored file: the remote tier's write-behind takes it.
  void QueueRemoteWrite(const std::string& id, const std::string& path);

  Model* model_;
  PoolOptions opts_;
  std::unique_ptr<RemoteTier> remote_;
  // The latest measured prefill seconds per token of any of its conversations' contexts (0: none
  // yet): a new conversation's context has no rate of its own when RemotePrefix plans.
  std::atomic<double> prefill_s_per_token_{0};
  std::mutex remote_fetch_mu_;
  std::mutex mu_;  // guards convs_, index_, damaged_, stats_ and the Conversation fields marked so
  std::map<std::string, std::shared_ptr<Conversation>> convs_;
  std::unordered_multimap<uint64_t, std::string> index_;  // chunk hash -> conversation id
  std::vector<DamagedFile> damaged_;
  PoolStats stats_;
  std::shared_mutex weights_mu_;  // shared: a generation over resident weights; exclusive: weights move
  std::mutex evict_mu_;           // one eviction pass at a time
  std::atomic<bool> budget_retry_{false};  // a budget pass stopped at a busy idle conversation
  std::shared_ptr<Context> weights_ctx_;  // an empty context through which the pool evicts weights
  std::shared_ptr<Batcher> batcher_;      // the shared forward pass (PoolOptions::batch), else nullptr
  std::shared_ptr<SharedBudget> group_;   // PoolOptions::shared_budget (added at Init, removed in ~Pool)
  bool in_group_ = false;                 // added to group_ (Init got that far)
  std::atomic<uint64_t> last_in_memory_{0};  // the last fresh InMemoryForBudget figure
  std::atomic<uint64_t> last_use_ns_{0};     // newest conversation use (Env clock)
  WeightsTierReport last_tiers_;             // under mu_: WeightsTiers' last fresh figures
  std::atomic<uint64_t> budget_step_{0};  // the batcher's step count at the last budget pass
  // Full chunks held once for every conversation using them (share_prefixes); thread-safe itself.
  std::shared_ptr<SharedChunkStore> shared_;
  std::shared_ptr<SegmentCache> arena_;  // the load arena (nullptr: none); every context's in-memory swap uses it
  uint64_t arena_cap_ = 0;  // its configured cap (set at Init)
  // Off (cap 0) after an Evict that reached the conversations; back at the first budget pass from
  // this Env time on (0: not off).
  std::atomic<uint64_t> arena_resume_ns_{0};
  static constexpr uint64_t kArenaPauseNs = 30ull * 1000000000ull;
  std::mutex pressure_mu_;
  AmountPolicy amount_{AmountOptions()};  // under pressure_mu_
  // Odd while an OnPressure runs; bumped at its start and end (under pressure_mu_). A restore-ahead
  // tick whose figures were read across a change skips: they may predate that eviction.
  uint64_t pressure_gen_ = 0;
  // The pressure watch (WatchPressure): its source and thread, under watch_mu_.
  std::mutex watch_mu_;
  std::unique_ptr<PressureSource> watch_src_;
  std::thread watch_thread_;
  std::atomic<bool> watch_ended_{false};  // the watch thread returned on a source error
  // The write-behind's yield (YieldToCalls): calls computing a first token, Commits waiting for a
  // write, evictions that found an idle conversation busy.
  std::mutex yield_mu_;
  std::condition_variable yield_cv_;
  std::atomic<int> urgent_calls_{0};
  std::atomic<int> save_waiters_{0};
  std::atomic<int> wb_pending_{0};  // writes queued (QueuePersist) and not yet started
  std::atomic<uint64_t> busy_finds_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> yielded_ns_{0};
  // Write-behind.
  std::mutex wb_mu_;
  std::condition_variable wb_cv_, wb_done_cv_;
  std::vector<std::weak_ptr<Conversation>> wb_queue_;
  int wb_running_ = 0;
  Status wb_error_;
  bool wb_stop_ = false;
  std::thread wb_thread_;
  // Chunk files: hash -> how many stored files name it, its bytes (0 while being written), under
  // files_mu_ (taken after mu_ when both are held, never before; unlinks happen under it, so a
  // file being written again for a new reference is never removed by an old one's last drop).
  struct ChunkFile {
    int refs = 0;
    uint64_t bytes = 0;
    bool on_disk = false;
    // A persist is writing it (AcquireChunkFiles): one writer per chunk file, others wait on
    // files_cv_ (its temporary name is per path).
    bool writing = false;
    bool rewrite = false;  // written again by the next persist naming it (RewriteChunkFiles)
    uint64_t gen = 0;      // which file is at its path (file_gen_seq_ when found or written)
  };
  uint64_t file_gen_seq_ = 0;  // under files_mu_
  // Under files_mu_: the chunk file references of stored files that Delete or the disk budget could
  // not remove (path -> references), dropped when a persist replaces the file at that path.
  std::unordered_map<std::string, std::vector<uint64_t>> unremoved_refs_;
  std::atomic<uint64_t> swap_seq_{0};  // names the swap files of contexts computed again
  std::mutex files_mu_;
  std::condition_variable files_cv_;  // a chunk file's writing ended
  std::unordered_map<uint64_t, ChunkFile> chunk_files_;
};

}  // namespace mz
