// The restore executor: the one place that decides which evicted units come back, in what order and
// on which threads. The UnitTable (memory/unit_table.h) keeps the state and commits each unit's
// transition (RestoreInto, LoadCompressedRun); the executor reserves room, plans the load runs
// (UnitTable::LoadRuns), carves one mapping into slices (MapSlices) and runs the units on workers.
//
// Modes:
//   kAll          every evicted unit (mz_restore, Context::Restore)
//   kUpTo         the longest forward-order prefix of the evicted units whose restored RAM fits
//                 max_bytes (restore-ahead, Context::TryRestoreUpTo)
//   kForCompute   what a forward pass needs (Context::Decode): every evicted unit except the KV
//                 chunks below attend_compressed_below that compute reads compressed in place
//   overlapped    with prefill, layer by layer: RestorePipeline (restore/restore_pipeline.h), built
//                 on the same pieces (MapSlices, LoadRuns, the table's per-unit transitions).
//
// Order: forward order (base unit, then layer 0: weights, KV chunks, layer 1, ...); units are handed
// to opts.restore_threads workers in that order (a thread the OS refuses: the others take its units).
// Failure: every unit is tried; the first error is returned; a unit that fails stays evicted (a
// checksum mismatch: lost), the others are restored. Dropped weights are restored only after the
// model file's identity is verified (kModelChanged otherwise, nothing restored).
// Thread-safety: the caller serializes with compute and with every other change of the table (the
// Context's lock).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "memory/unit_table.h"

namespace mz {

enum class RestoreMode { kAll, kUpTo, kForCompute };

struct RestoreRequest {
  RestoreMode mode = RestoreMode::kAll;
  uint64_t max_bytes = UINT64_MAX;  // kUpTo: RAM the restored units may occupy (a larger unit ends the prefix)
  // kForCompute: KV chunks below this index that compute reads compressed in place
  // (UnitTable::readable_compressed) stay compressed; those compressed on storage are first loaded
  // into the in-memory swap as they are, one read per run of back-to-back extents of at most
  // kLoadRunBytes (UnitTable::LoadCompressedRun), layers over the workers. A load that fails leaves
  // its chunk on storage (a checksum mismatch: lost), the others of its run loaded. At most the
  // first chunk the forward pass writes (written chunks must be resident).
  int attend_compressed_below = 0;
  // Polled before each unit, from the worker threads (optional): once it returns true no further
  // unit starts, units in flight finish, and RestoreResult::stopped is set. Every unit is either
  // fully restored or untouched in its evicted state: stopping never tears one.
  std::function<bool()> stop;
  // Worker threads (0: the table's options().restore_threads). The first runs on the calling
  // thread (RunOnThreads), at its priority.
  int threads = 0;
};

struct RestoreResult {
  uint64_t restored = 0;  // RAM the units restored by this call now occupy
  bool stopped = false;   // RestoreRequest::stop ended the call early
};

// Requests of at most this many bytes read back-to-back extents of chunks compressed on storage
// (as PipelineOptions::coalesce_bytes).
constexpr uint64_t kLoadRunBytes = uint64_t(4) << 20;

// Every evicted unit in forward order (base unit, then per layer its weights and its KV chunks):
// the order every mode plans in.
std::vector<UnitRef> EvictedInForwardOrder(const UnitTable& table);

// Runs one restore in the request's mode over table->options().restore_threads workers.
// out (optional) receives what was restored.
Status RunRestore(UnitTable* table, const RestoreRequest& req, RestoreResult* out = nullptr);

// One anonymous mapping for a list of units, carved into page-aligned slices: one mmap instead of
// one per unit (per-unit mmaps serialize page population on the address-space lock). bytes[i]: the
// size of slice i (0: none). *off receives each slice's offset, *total the mapping's length. Returns
// the mapping (not populated), or nullptr if total is 0 or the mapping fails (callers then map unit
// by unit). The caller owns the mapping piecewise: each slice handed to UnitTable::RestoreInto
// belongs to its unit from then on; the rest the caller unmaps.
char* MapSlices(Env* env, const std::vector<size_t>& bytes, std::vector<size_t>* off, size_t* total);

}  // namespace mz
