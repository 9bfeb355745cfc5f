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
// Thread-safety: Apply / RestoreAll / Report must be externally serialized with compute (the
// Context does this); RestoreAll itself fans out over worker threads.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "memory/kv_cache.h"
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

struct ElasticOptions {
  std::string codec = "q8";
  std::string swap_path;      // file for the storage swap (created on first use)
  bool direct_io = true;
  int restore_threads = 2;
  // Full KV chunks come back from the storage swap (kKvStorageRaw) as private mappings of their
  // extent, populated through the page cache, instead of direct reads into fresh anonymous memory
  // (which the kernel zeroes first: CPU that competes with prefill). Only when the swap file is on
  // a file system with direct I/O (not tmpfs, where the page cache is the file) and pages are 4 KiB.
  bool map_swap = true;
};

class UnitTable {
 public:
  UnitTable(Model* model, KvCache* kv, const ElasticOptions& opts);
  ~UnitTable();

  // Validates options (codec name). Call once before use.
  Status Init();

  // Applies placements in order; stops early once at least `bytes` of RAM were released (0: apply
  // all). *freed receives the RAM released (in_memory() before - after). On error, placements
  // already applied stay applied.
  Status Apply(const Plan& plan, uint64_t bytes, uint64_t* freed);
  Status Move(const Placement& p);
  Status Restore(const UnitRef& u);
  // Restores every evicted unit, forward order (base, then layer 0: weights, KV chunks, layer 1...),
  // over opts.restore_threads workers. Verifies the model file's identity first if any weight unit
  // is dropped. Returns the first error; other units are still restored.
  Status RestoreAll();
  // Restores the longest forward-order prefix of the evicted units (same order as RestoreAll)
  // whose restored RAM fits in max_bytes (at least nothing; a unit larger than the budget stops
  // the prefix). *restored (optional) receives the RAM the restored units now occupy. Same error
  // contract as RestoreAll; units before a failed one stay restored.
  // stop (optional) is polled before each unit, from the worker threads: once it returns true no
  // further unit starts, units in flight finish, and *stopped (optional) is set. Every unit is
  // either fully restored or untouched in its evicted state: stopping never tears one.
  Status RestoreUpTo(uint64_t max_bytes, uint64_t* restored, const std::function<bool()>& stop = nullptr,
                     bool* stopped = nullptr);
  // What compute needs before a forward pass that writes chunks >= first_write_chunk: every
  // evicted unit is restored (as RestoreAll) except KV chunks below first_write_chunk that compute
  // can read compressed (readable_compressed). Those compressed on storage are first loaded into
  // the in-memory swap as they are, as restore_generate does: per layer, extents that lie back to
  // back in the swap file are read with one request of up to kLoadRunBytes (LoadCompressedRun),
  // layers over opts.restore_threads workers. Same error contract as RestoreAll; a load that fails
  // leaves its chunk on storage (a checksum mismatch: lost) and the others of its run loaded.
  Status RestoreForCompute(int first_write_chunk);
  static constexpr uint64_t kLoadRunBytes = uint64_t(4) << 20;  // as PipelineOptions::coalesce_bytes
  // KV chunk (layer, chunk) is held compressed in memory in a form the attention kernel reads in
  // place (the q8 codec): compute does not need it restored. Such chunks stay in state
  // kKvMemCompressed until restored (RestoreAll, RestoreUpTo, Restore).
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
  // Bytes of the extents of KV chunks now on storage that the page cache holds (mincore), for
  // checks that a measured restore reads the disk. Errors if the swap file cannot be inspected.
  Status SwapBytesCached(uint64_t* out) const;
  // The rows of chunk `chunk` (every layer) from the current token count on will be written again
  // (the context was truncated inside it): a chunk mapped from its swap extent is no longer clean
  // (its next eviction writes it anew; writes go to private copies of the pages, never the file).
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
  // The restore pipeline (coalesce_bytes) and RestoreForCompute plan their loads with it.
  std::vector<std::vector<int>> LoadRuns(int layer, const std::vector<int>& chunks, uint64_t max_bytes) const;
  // The swap-file extent of a KV chunk on storage (raw or compressed): false if it has none or
  // is lost (never to be read again).
  bool StoredExtent(int layer, int chunk, uint64_t* off, uint64_t* len) const;
  bool AllResident() const;
  Status VerifyModelIdentity() const { return model_->VerifyIdentity(); }
  // The two phases of one unit's restoration, for the pipeline. AllocateFor maps and prefaults
  // memory for u (nullptr if u is resident, is file-backed weights, or the mapping fails; *bytes
  // receives the size mapped, 0 for nullptr);
  // RestoreInto fills it and installs it (taking ownership of mem, which may be nullptr: then it
  // allocates itself). Distinct units may be restored concurrently.
  void* AllocateFor(const UnitRef& u, size_t* bytes);
  // RAM unit u occupies when resident (what AllocateFor maps for it).
  size_t RestoreBytes(const UnitRef& u) const;
  Env* env() const;
  Status RestoreInto(const UnitRef& u, void* mem);
  // Forget chunks >= first_chunk (context truncation): frees their swap copies.
  void ForgetChunksFrom(int first_chunk);

  // Copies KV chunk (layer, chunk) in raw form into dst (chunk_bytes()) whatever its state, without
  // changing it (decoding a compressed copy). Used to save sessions.
  Status ReadChunk(int layer, int chunk, uint16_t* dst) const;
  // Valid token rows of chunk c in the current context (the codec shape).
  ChunkShape shape(int layer, int chunk) const;

  UnitState state(const UnitRef& u) const;
  // True if chunk c of layer exists in the context (resident or not).
  bool has_chunk(int layer, int chunk) const { return chunk >= 0 && chunk < kv_->n_chunks() && layer >= 0 && layer < kv_->geometry().n_layer; }
  bool lost(int layer, int chunk) const;
  MemoryReport Report() const;
  const KvCodec& codec() const { return *codec_; }
  const ElasticOptions& options() const { return opts_; }

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
  };
  // Unmaps a chunk mapped from its extent (data: its memory, already released from the KvCache), drops the extent's pages from the page cache and,
  // free_extent, frees the extent. The slot's state is left to the caller.
  void UnmapFromSwap(KvSlot& s, bool free_extent, void* data);
  // map_swap on, a swap file with direct I/O, 4 KiB pages, chunks a multiple of 4 KiB.
  bool CanMapSwap() const;
  // The same conditions for a swap file whose direct I/O is swap_direct (shared by CanMapSwap and
  // KvStorageMapped, which predicts it before the file exists).
  bool MapsSwapWith(bool swap_direct) const;
  KvSlot& slot(int layer, int chunk);
  const KvSlot* find_slot(int layer, int chunk) const;
  Status EnsureSwap();
  // RestoreUpTo, skipping chunks < keep_compressed_below that are readable_compressed.
  Status RestoreSelected(uint64_t max_bytes, uint64_t* restored, const std::function<bool()>& stop, bool* stopped,
                         int keep_compressed_below);
  Status EvictKv(int layer, int chunk, UnitState target);
  // LoadCompressed's two halves: checks the chunk and makes *reserved its room (prefaulted);
  // then installs the chunk from the room once read (read_st: the read's outcome; on failure the
  // room is freed and a kCorruption marks the chunk lost).
  Status PrepareLoad(int layer, int chunk, LoadSlot* reserved);
  Status FinishLoad(int layer, int chunk, LoadSlot* reserved, Status read_st);
  Status RestoreKv(int layer, int chunk, void* mem = nullptr);
  int weight_unit(int layer) const { return layer < 0 ? model_->base_unit() : layer; }

  Model* model_;
  KvCache* kv_;
  ElasticOptions opts_;
  std::unique_ptr<KvCodec> codec_;
  std::unique_ptr<CompressedStack> stack_;
  std::unique_ptr<SwapFile> swap_;
  std::vector<std::vector<KvSlot>> slots_;  // [layer][chunk]; missing = resident
};

}  // namespace mz
