// UnitTable: the state of every memory unit of one context and the one place that moves units
// between states (the "apply" of plan/apply). Policies (src/policy) produce Plans; only this class
// changes memory.
//
// Units: weight unit u (layer u, or the base unit: embeddings + output head), and KV chunk (l, c).
// States:
//   kResident            bytes in RAM where compute uses them. A full KV chunk restored from
//                        kKvStorageRaw may be a private mapping of its swap extent (map_swap): the
//                        pages come from the page cache (no anonymous memory zeroed), the extent
//                        stays allocated while the chunk is mapped, and evicting it to storage again
//                        writes nothing while the stored copy still equals it ("clean").
//   kKvMemCompressed     KV chunk encoded by the codec, held in the in-memory CompressedStack
//   kKvStorageRaw        KV chunk raw in the storage SwapFile
//   kKvStorageCompressed KV chunk encoded, in the SwapFile
//   kWeightsDropped      weight unit released; re-read from the model file on restore
// Valid transitions: resident -> any state of its kind; kKvMemCompressed -> kKvStorageCompressed
// (the paper's CompKV stage); any state -> resident (restore). Anything else is kInvalidArgument.
//
// Failure: every transition is all-or-nothing for its unit. A failed eviction (ENOSPC, EIO,
// allocation) leaves the unit resident and returns the error; a failed restore leaves it evicted.
// A KV chunk whose stored copy fails its checksum is marked lost: the context reports kCorruption
// for it until truncated before it (never silently wrong).
//
// The sole mutator: KvCache's chunk pointers and compressed views and Model's weight units are
// changed by this class alone (their setters are private, this class their friend). Restoring
// many units at once (which, in what order, on which threads) is the restore executor's
// (src/restore/executor.h, restore_pipeline.h): it calls the per-unit transitions below
// (RestoreInto, LoadCompressedRun), each of which commits one unit.
//
// Thread-safety: Apply / Report and every state change must be externally serialized with compute
// (the Context does this); the per-unit transitions of distinct units may run concurrently (the
// executor's workers).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "memory/kv_cache.h"
#include "memory/shared_chunks.h"
#include "model/model.h"
#include "policy/unit_plan.h"
#include "store/kv_codec.h"
#include "store/compressed_stack.h"
#include "store/swap_file.h"

namespace mz {

// UnitState, UnitRef, Placement, Plan: policy/unit_plan.h (the policies' vocabulary).

struct MemoryReport {
  uint64_t weights_total = 0, weights_resident = 0, weights_dropped = 0;  // region bytes
  uint64_t base_total = 0, base_resident = 0;                             // base unit (part of weights_*)
  uint64_t kv_total = 0;            // raw bytes of every allocated chunk
  uint64_t kv_resident = 0;
  uint64_t kv_resident_mapped = 0;  // part of kv_resident that maps its swap extent (page cache)
  uint64_t kv_mem_compressed_raw = 0, kv_mem_compressed = 0;  // raw bytes represented / encoded bytes
  uint64_t kv_storage_raw = 0;
  uint64_t kv_storage_compressed_raw = 0, kv_storage_compressed = 0;
  uint64_t stack_mapped = 0;        // RAM held by the in-memory swap (segments)
  // Chunks borrowed from a store of shared chunks (memory/shared_chunks.h), counted apart: their
  // bytes are the store's, held once for every borrower, and are in none of the figures above
  // (kv_total, kv_resident and in_memory() are this context's own). kv_shared: chunk bytes of
  // every borrowed chunk; kv_shared_attached: of them, installed for compute (pinned in RAM).
  uint64_t kv_shared = 0, kv_shared_attached = 0;
  uint64_t swap_file_used = 0;      // storage held by the swap file
  int n_weight_units[kNumUnitStates] = {};
  int n_kv_chunks[kNumUnitStates] = {};
  int n_kv_lost = 0;
  // What the process holds in RAM for the model: resident weights + resident KV + compressed KV in RAM.
  uint64_t in_memory() const { return weights_resident + kv_resident + stack_mapped; }
  uint64_t footprint() const { return weights_total + kv_total; }
  // The paper's "remaining in memory" (§6.2): in-memory share of the full footprint. Token
  // embeddings are excluded as in the paper when exclude_base is true.
  double remaining(bool exclude_base = false) const;
};

// The kernel's view of the units a UnitTable counts as resident (UnitTable::MeasureInRam).
struct KernelResidency {
  uint64_t weights_counted = 0, weights_in_ram = 0;  // resident weight units' tensor bytes / of them in RAM
  uint64_t kv_counted = 0, kv_in_ram = 0;            // resident KV chunks' bytes / of them in RAM
  uint64_t counted() const { return weights_counted + kv_counted; }
  uint64_t in_ram() const { return weights_in_ram + kv_in_ram; }
  uint64_t missing() const { return counted() - in_ram(); }
};

// What UnitTable::Reconcile changed.
struct ReconcileStats {
  int weight_units = 0, kv_chunks = 0;  // units now counted evicted
  uint64_t bytes = 0;                   // their RAM size (what a restore brings back)
  uint64_t missing = 0;                 // of those bytes, what the kernel had taken
  uint64_t unreconciled_missing = 0;    // taken from units that stay resident (anonymous: swapped
                                        // out; below min_missing; a rewritten mapped chunk)
};

struct UnitTableOptions {
  std::string codec = "q8";
  std::string swap_path;      // file for the storage swap (created on first use)
  bool direct_io = true;
  int restore_threads = 2;
  // Full KV chunks come back from the storage swap (kKvStorageRaw) as private mappings of their
  // extent, populated through the page cache, instead of direct reads into fresh anonymous memory
  // (which the kernel zeroes first: CPU that competes with prefill). Only when the swap file is on
  // a file system with direct I/O (not tmpfs, where the page cache is the file) and pages are 4 KiB.
  bool map_swap = true;
  // Every restored unit's pages are read once from user space by the thread that restored it
  // (core/touch.h: the first-access cost of fresh page-table entries, 2.3 us per page under the
  // shadow paging measured here, is paid there instead of by compute). false: the ablation.
  bool touch_restored = true;
  // The in-memory swap takes its segments from this load arena and gives them back to it
  // (store/segment_cache.h; a pool shares one between its conversations). nullptr: mapped afresh.
  std::shared_ptr<SegmentCache> segment_cache;
};

// Where a KV chunk's bytes are now (UnitTable::LocateKv): a read-only view for reports
// (memory/residency_report.h). Pointers are valid until the chunk's state next changes.
struct KvChunkMemory {
  UnitState state = UnitState::kResident;
  bool lost = false;              // its stored copy failed verification
  bool mapped_from_swap = false;  // resident as a private mapping of its swap extent (map_swap)
  bool clean = false;             // mapped_from_swap and still equal to the stored copy
  const void* addr = nullptr;     // its bytes in RAM: the chunk (fp16 or q8, resident) or its entry in the
  uint64_t bytes = 0;             // in-memory swap (kKvMemCompressed); nullptr / 0 otherwise
  File* stored_file = nullptr;    // the file holding a stored copy (on storage, or the extent a
  uint64_t stored_off = 0;        // mapped chunk maps): the context's swap file or an adopted
  uint64_t stored_len = 0;        // stored file; nullptr if none
  bool shared = false;            // borrowed from a store of shared chunks (state kKvShared, or
                                  // kResident while attached): addr / bytes are not this context's
};

class UnitTable {
 public:
  UnitTable(Model* model, KvCache* kv, const UnitTableOptions& opts);
  ~UnitTable();

  // Validates options (codec name). Call once before use.
  Status Init();

  // Applies placements in order; stops early once at least `bytes` of RAM were released (0: apply
  // all). *freed receives the RAM released (in_memory() before - after). On error, placements
  // already applied stay applied.
  Status Apply(const Plan& plan, uint64_t bytes, uint64_t* freed);
  // One placement (Apply's step): an eviction, or a restore of one unit (target kResident).
  Status Move(const Placement& p);
  // KV chunk (layer, chunk) is held compressed in memory in a form the attention kernel reads in
  // place (the q8 codec): compute does not need it restored. Such chunks stay in state
  // kKvMemCompressed until restored (restore/executor.h: kAll, kUpTo; a kResident placement).
  bool readable_compressed(int layer, int chunk) const {
    return has_chunk(layer, chunk) && !kv_->chunk_resident(layer, chunk) && kv_->chunk_compressed_view(layer, chunk) &&
           !lost(layer, chunk);
  }
  // Dropped weights come back as mappings of the model file (Model::file_backed): restoring them
  // needs no anonymous memory allocated ahead (AllocateFor returns nullptr for them).
  bool weights_file_backed() const { return model_->file_backed(); }
  // Restoring u maps its swap extent (map_swap) instead of filling anonymous memory: no memory
  // needs to be allocated ahead for it (AllocateFor returns nullptr).
  bool RestoresByMapping(const UnitRef& u) const;
  // Full KV chunks evicted to storage raw will come back as mappings of the swap file (for the
  // policy's costs): CanMapSwap() once the swap file exists; before, from the options (a file
  // system that refuses direct I/O is only found when the file is created).
  bool KvStorageMapped() const;
  void set_map_swap(bool on) { opts_.map_swap = on; }
  void set_touch_restored(bool on) { opts_.touch_restored = on; }
  // Bytes of the extents of KV chunks now on storage that the page cache holds (mincore), for
  // checks that a measured restore reads the disk. Errors if the swap file cannot be inspected.
  Status SwapBytesCached(uint64_t* out) const;
  // The rows of chunk `chunk` (every layer) from the current token count on will be written again
  // (the context was truncated inside it): a chunk mapped from its swap extent is no longer clean
  // (its next eviction writes it anew; writes go to private copies of the pages, never the file),
  // and an evicted one is not counted clean when it comes back by mapping.
  void WillRewriteChunk(int chunk);
  // The codec's chunks can be read in place by the attention kernel (q8).
  bool codec_readable_in_place() const { return codec_ && codec_->attention_reads_in_place(); }
  // Brings a KV chunk compressed on storage (kKvStorageCompressed) into the in-memory swap as it is
  // (kKvMemCompressed, readable in place): direct I/O into the stack, checksum verified, no decode,
  // half the RAM of restoring it. REQUIRES codec_readable_in_place(). On an I/O error the chunk
  // stays on storage; on a checksum mismatch (kCorruption) it is marked lost. Distinct chunks may
  // be loaded concurrently (the pipeline's storage workers).
  // Room in the in-memory swap for one LoadCompressed, reserved ahead (the pipeline reserves every
  // load before its workers start, so no mapping happens while they populate and read).
  struct LoadSlot {
    CompressedStack::Handle h = -1;
    uint8_t* p = nullptr;
    size_t cap = 0;  // bytes to read (the extent's aligned length)
  };
  // Reserves a slot for chunk (layer, chunk) (compressed on storage). kNoMemory if the stack
  // cannot grow.
  Status ReserveLoad(int layer, int chunk, LoadSlot* out);
  // Frees a reserved slot that will not be used.
  void CancelLoad(LoadSlot* slot);
  // slot (optional): a reservation from ReserveLoad for this chunk, consumed (freed on failure).
  Status LoadCompressed(int layer, int chunk, LoadSlot* slot = nullptr);
  // Loads n chunks of one layer, all compressed on storage in extents that lie back to back in the
  // swap file in the given order (StoredExtent), with one read request instead of n: what
  // LoadCompressed does for each, with the same per-chunk outcome (an I/O error leaves every
  // chunk of the run on storage; a checksum mismatch marks only that chunk lost). slots[i]: a
  // reservation for chunks[i] (consumed, freed on failure). A chunk that cannot be loaded (lost,
  // say) fails alone and one not stored right after the one before it starts a new request: the
  // others are still loaded. Returns the first error.
  Status LoadCompressedRun(int layer, const int* chunks, LoadSlot* const* slots, int n);
  // Chunks of one layer (compressed on storage) in swap-file order, cut into runs whose extents
  // lie back to back, each of at most max_bytes (a chunk alone may exceed it): what one
  // LoadCompressedRun reads with one request. A chunk with no extent (lost) is a run of its own.
  // The restore executor's kForCompute mode and the pipeline (coalesce_bytes) plan their loads with it.
  std::vector<std::vector<int>> LoadRuns(int layer, const std::vector<int>& chunks, uint64_t max_bytes) const;
  // The swap-file extent of a KV chunk on storage (raw or compressed): false if it has none or
  // is lost (never to be read again).
  bool StoredExtent(int layer, int chunk, uint64_t* off, uint64_t* len) const;
  bool AllResident() const;
  // "Resident" as the kernel sees it (Env::ResidentBytes: mincore) for every unit this table counts
  // resident: weight units (their mapped runs or anonymous region) and KV chunks. The in-memory
  // swap is not included. Costs one mincore per unit (about 1 ms per GiB measured, docs/design.md).
  Status MeasureInRam(KernelResidency* out) const;
  // Makes the table agree with the kernel: a resident unit whose clean file-backed pages the kernel
  // reclaimed (at least min_missing bytes of it not in RAM) is counted evicted, so the restore
  // executor brings it back front layers first (sequential readahead, overlapped with compute by
  // the pipeline) instead of compute faulting it back a page at a time. Weight units of the page
  // cache become kWeightsDropped (unmapped; the pages still cached stay cached and serve the
  // reload); KV chunks mapped from their swap extent and still equal to it (clean) become
  // kKvStorageRaw (the extent is kept, its cached pages too). Nothing is lost: the content of each
  // unit moved is in the model file or the swap file. Anonymous units, weights mapped for OS Paging
  // and rewritten chunks cannot move: what the kernel took of them is counted in
  // unreconciled_missing. On an Env error the units checked so far stay moved and the error is
  // returned. Serialized with compute like Apply.
  // weights = false: KV chunks only (a pool's conversation: the weight units are shared with other
  // contexts, whose compute may be reading them; only their owner moves them).
  Status Reconcile(uint64_t min_missing, ReconcileStats* out, bool weights = true);
  Status VerifyModelIdentity() const { return model_->VerifyIdentity(); }
  // The two phases of one unit's restoration, for the pipeline. AllocateFor maps and prefaults
  // memory for u (nullptr if u is resident, is file-backed weights, or the mapping fails; *bytes
  // receives the size mapped, 0 for nullptr);
  // RestoreInto fills it and installs it (taking ownership of mem, which may be nullptr: then it
  // allocates itself). Distinct units may be restored concurrently.
  //
  // mem (from AllocateFor, a slice of MapSlices, or nullptr) must be memory nothing has written: a
  // KV chunk that comes back from a partial blob (encoded with fewer than chunk_tokens rows) has
  // only its valid rows written (KvCodec::DecodeValid), its other rows read as the mapping's zeros,
  // and only the pages of RestoreRanges are populated and touched (touch_restored).
  void* AllocateFor(const UnitRef& u, size_t* bytes);
  // RAM unit u occupies when resident (what AllocateFor maps for it).
  size_t RestoreBytes(const UnitRef& u) const;
  // The byte ranges of u's restored memory (offsets into RestoreBytes(u)) that restoring it writes
  // and the forward pass after it writes or reads, rounded out to 4096-byte pages, in order, not
  // overlapping: the whole unit, except a KV chunk decoded from a partial blob, of which only the
  // rows below max(its encoded rows, the rows of set_write_until's tokens) of every head: a restore
  // of a partial chunk populates and touches pages in proportion to its tokens, not chunk_tokens.
  std::vector<std::pair<size_t, size_t>> RestoreRanges(const UnitRef& u) const;
  // Prefaults RestoreRanges(u) of mem (what AllocateFor and the executors' slices populate).
  void PrefaultFor(const UnitRef& u, void* mem) const;
  // The next forward pass writes tokens up to this count (Context sets it before a restore for
  // compute and clears it, 0, after): the rows of a partial chunk it will write are populated and
  // touched with the restored ones, off compute's path. Serialized like Apply.
  void set_write_until(int tokens) { write_until_ = tokens; }
  Env* env() const;
  Status RestoreInto(const UnitRef& u, void* mem);
  // Forget chunks >= first_chunk (context truncation): frees their swap copies.
  void ForgetChunksFrom(int first_chunk);
  // Replaces the whole KV cache (session load; benches and tests that fill a context directly):
  // forgets every chunk (evicted copies freed), then installs chunks[l * n + c] (n =
  // n_chunks_for(n_tokens); each an Env mapping of chunk_bytes(), ownership taken in every case) as
  // the resident chunks of n_tokens valid tokens. kInvalidArgument if chunks.size() is not
  // n_layer * n (nothing changed); kContextFull / kNoMemory from KvCache::Reserve (the cache is then
  // empty). Weight units are untouched.
  Status ReplaceKv(int n_tokens, std::vector<uint16_t*> chunks);
  // A chunk of a stored file (AdoptStored): its payload (this table's codec's encoding of
  // enc_tokens rows) at a 4096-aligned offset, and the xxh64 of the payload.
  struct StoredChunk {
    uint64_t off = 0, size = 0, hash = 0;
    int enc_tokens = 0;
  };
  // Makes the KV cache n_tokens valid tokens whose chunks lie in the file at path, WITHOUT reading
  // them: chunks[l * n + c] (n = n_chunks_for(n_tokens)) becomes chunk (l, c) in state
  // kKvStorageCompressed, an extent of that file (opened read-only through the Env and held until
  // no chunk refers to it; renaming over or unlinking the file meanwhile does not disturb it). The
  // chunks then come back as any chunk evicted to storage does: the restore executor and the
  // overlapped pipeline, front layers first. A stored checksum is verified when its chunk is read:
  // a mismatch marks that chunk lost (the context reports kCorruption, never a wrong chunk).
  // Every check comes first: kInvalidArgument for a wrong count, a misaligned offset, rows that do
  // not match the chunk's place, or a payload larger than the codec makes for its shape;
  // kContextFull past n_ctx; the Env's error opening the file. On error nothing changed. On
  // success every chunk held before is forgotten (as ReplaceKv). Weight units are untouched.
  //
  // prefix (a version-2 session: its first prefix.n_chunks chunks live in a store of shared
  // chunks): those chunks' entries of `chunks` are ignored and they become borrowed, detached
  // (kKvShared), from prefix.store: prefix.refs[l * prefix.n_chunks + c], references taken in every
  // case (released on error). They must be full chunks.
  struct SharedPrefix {
    std::shared_ptr<SharedChunkStore> store;
    std::vector<SharedChunkStore::Ref> refs;
    int n_chunks = 0;
  };
  Status AdoptStored(const std::string& path, int n_tokens, const std::vector<StoredChunk>& chunks,
                     const SharedPrefix& prefix);
  Status AdoptStored(const std::string& path, int n_tokens, const std::vector<StoredChunk>& chunks);

  // Copies KV chunk (layer, chunk) in raw form into dst (chunk_bytes()) whatever its state, without
  // changing it (decoding a compressed copy). Used to save sessions. Raw form = the resident form:
  // fp16, or the resident q8 layout for a q8_0 cache (KvGeometry::kv_type).
  Status ReadChunk(int layer, int chunk, uint16_t* dst) const;
  // Valid token rows of chunk c in the current context (the codec shape).
  ChunkShape shape(int layer, int chunk) const;

  UnitState state(const UnitRef& u) const;
  // The state a policy plans from: state(), but kKvShared for every borrowed chunk, attached or
  // not (a policy never moves them: their bytes are the store's; DetachShared lets them go).
  UnitState policy_state(const UnitRef& u) const;

  // ---- chunks borrowed from a store of shared chunks (memory/shared_chunks.h) ----
  // A borrowed chunk's slot holds one reference to the store's unit; attached (state kResident)
  // it also holds a pin and the KvCache points at the store's memory. Only this table changes the
  // slot; only the store changes the unit. One store per table (kInvalidArgument for another).
  //
  // Makes the KV cache n_tokens valid tokens (a multiple of chunk_tokens) whose chunks are all
  // borrowed and detached (kKvShared; the next restore attaches them): refs[l * n + c], references
  // taken in every case (released on error). Checks first (count, n_ctx, the store's geometry):
  // on error nothing changed. On success every chunk held before is forgotten (as ReplaceKv).
  Status AdoptShared(int n_tokens, const std::shared_ptr<SharedChunkStore>& store,
                     const std::vector<SharedChunkStore::Ref>& refs);
  // Chunk (layer, chunk), full, becomes borrowed (ref taken in every case): the context's own copy
  // (any tier) is freed. attach: installed at once (pinned); if the pin fails the reference is
  // released, the own copy stays and the error is returned. A chunk already borrowing that unit
  // keeps it (the extra reference is released).
  Status ShareChunk(int layer, int chunk, const std::shared_ptr<SharedChunkStore>& store, SharedChunkStore::Ref ref,
                    bool attach);
  bool shared(int layer, int chunk) const;
  // Copy-on-write: every borrowed slot of chunk `chunk` becomes the context's own resident copy
  // (the reference released), so its rows may be written (truncation inside it). All or nothing:
  // on kNoMemory or the store's read error nothing changed.
  Status Unshare(int chunk);
  // Detaches every attached borrowed chunk (unpinned; kKvShared): the store may then evict it once
  // no borrower has it attached. Returns how many were detached.
  int DetachShared();
  // Where KV chunk (layer, chunk) is now (REQUIRES has_chunk). Read-only; serialized with state
  // changes like Report.
  KvChunkMemory LocateKv(int layer, int chunk) const;
  // The open file of the context's swap (nullptr before the first eviction to storage).
  const SwapFile* swap_file() const { return swap_.get(); }
  // True if chunk c of layer exists in the context (resident or not).
  int n_layer() const { return kv_->geometry().n_layer; }
  bool has_chunk(int layer, int chunk) const { return chunk >= 0 && chunk < kv_->n_chunks() && layer >= 0 && layer < kv_->geometry().n_layer; }
  bool lost(int layer, int chunk) const;
  MemoryReport Report() const;
  // The swap codec. For a q8_0 cache it is the adapter of store/q8_kv.h (same name, id and blobs;
  // it takes and gives resident q8 chunks): q8 is then the identity (no re-encoding on eviction),
  // none / lz4 / zstd are exact, q4 / cachegen re-quantize the decoded rows.
  const KvCodec& codec() const { return *codec_; }
  const UnitTableOptions& options() const { return opts_; }

 private:
  struct KvSlot {
    UnitState state = UnitState::kResident;
    CompressedStack::Handle h = -1;
    SwapExtent ext;
    uint64_t enc_bytes = 0;
    int enc_tokens = 0;   // valid rows when encoded (the decode shape must match the encode shape)
    bool lost = false;
    // kResident only: the chunk is a private mapping of `ext` (which stays allocated until the
    // chunk is unmapped); clean: the stored copy still equals the chunk.
    bool mapped = false;
    bool clean = false;
    // Evicted while the context was truncated inside the chunk (WillRewriteChunk): rows of the
    // stored copy past the truncation will be written again once it is back, so a restore by
    // mapping must not count it clean (its next eviction writes it anew).
    bool will_rewrite = false;
    // Borrowed from store_ (a reference; attached: also a pin, and the KvCache points at the
    // store's memory). nullptr: the context's own chunk.
    SharedChunkStore::Ref shared = nullptr;
    bool attached = false;
  };
  // Releases a borrowed slot's pin (detaching it from the KvCache) and reference; the slot is
  // then empty of sharing (its state is left to the caller).
  void DropShared(int layer, int chunk, KvSlot& s);
  // Frees the context's own evicted copy of a slot (stack entry, swap extent, a mapping of its
  // extent) or its borrowed unit: ForgetChunksFrom's step and ShareChunk's.
  void ForgetSlot(int layer, int chunk, KvSlot& s);
  // Unmaps a chunk mapped from its extent (data: its memory, already released from the KvCache), drops the extent's pages from the page cache and,
  // free_extent, frees the extent. The slot's state is left to the caller.
  // drop_cached = false keeps the extent's pages in the page cache (Reconcile: they serve the
  // restore).
  void UnmapFromSwap(KvSlot& s, bool free_extent, void* data, bool drop_cached = true);
  // map_swap on, a swap file with direct I/O, 4 KiB pages, chunks a multiple of 4 KiB.
  bool CanMapSwap() const;
  // The same conditions for a swap file whose direct I/O is swap_direct (shared by CanMapSwap and
  // KvStorageMapped, which predicts it before the file exists).
  bool MapsSwapWith(bool swap_direct) const;
  KvSlot& slot(int layer, int chunk);
  const KvSlot* find_slot(int layer, int chunk) const;
  Status EnsureSwap();
  // The file that holds extent e (SwapExtent::file): the own swap file or the adopted one.
  SwapFile* file_for(const SwapExtent& e) const { return e.file ? origin_.get() : swap_.get(); }
  Status EvictKv(int layer, int chunk, UnitState target);
  // LoadCompressed's two halves: checks the chunk and makes *reserved its room (prefaulted);
  // then installs the chunk from the room once read (read_st: the read's outcome; on failure the
  // room is freed and a kCorruption marks the chunk lost).
  Status PrepareLoad(int layer, int chunk, LoadSlot* reserved);
  Status FinishLoad(int layer, int chunk, LoadSlot* reserved, Status read_st);
  Status RestoreKv(int layer, int chunk, void* mem = nullptr);
  int weight_unit(int layer) const { return layer < 0 ? model_->base_unit() : layer; }
  // Model::LoadUnit, then (touch_restored) the first user-space read of its mapped pages.
  Status LoadWeights(int unit, void* mem);

  // Rows of KV chunk (layer, chunk) that RestoreRanges covers (chunk_tokens: all of them).
  int RestoreRows(int layer, int chunk) const;

  Model* model_;
  KvCache* kv_;
  UnitTableOptions opts_;
  int write_until_ = 0;  // set_write_until
  std::unique_ptr<KvCodec> codec_;
  std::unique_ptr<CompressedStack> stack_;
  std::unique_ptr<SwapFile> swap_;
  std::unique_ptr<SwapFile> origin_;  // a stored file adopted as storage (AdoptStored), read-only
  std::vector<std::vector<KvSlot>> slots_;  // [layer][chunk]; missing = resident
  std::shared_ptr<SharedChunkStore> store_;  // the store borrowed chunks come from (kept alive)
};

}  // namespace mz
