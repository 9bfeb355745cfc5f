// ResidencyReport: every memory unit of one context (weight units, KV chunks) as mzcache counts it
// and as the kernel sees it (issue 24 §5, "Residency as the kernel sees it").
//
// Per unit: mzcache's state (unit_table.h), what backs its bytes (anonymous memory, a private
// mapping of the model file, a private mapping of the swap file), how many of its bytes are in RAM
// now (mincore, Env::ResidentBytes: a page of a file mapping the kernel reclaimed, or an anonymous
// page swapped out, is not), for units whose copy lies in a file (dropped weights, KV on storage)
// how much of that copy the page cache holds (Env::CachedBytes: what a restore reads without
// storage I/O), and the smaps accounting (Rss, Pss, Anonymous, Swap) of the VMAs the unit's
// memory lies in.
//
// smaps is per VMA, not per unit: the numbers given for a unit are those of every VMA overlapping
// it, whole, with their total size (vma_bytes). When vma_bytes equals the unit's mapped size the
// VMAs are the unit's own (a weight unit's file runs usually are) and Rss/Pss are exactly the
// unit's; when it is larger the VMA is shared with other memory (anonymous KV chunks next to each
// other are merged by the kernel into one VMA) and Rss/Pss are the VMA's, not the unit's. The
// summary's smaps totals count each such VMA once. mincore (in_ram) is always exact per unit.
//
// Note the difference between the two kernel views of a file-backed page: mincore says whether the
// page is in the page cache (reading it costs at most a minor fault); Rss counts it only while
// this process maps it (a page the kernel unmapped but kept cached is in in_ram, not in Rss).
//
// The warning: a weight unit mzcache counts resident and that is a mapping of the model file with
// pages not in RAM (the kernel reclaimed them under pressure): a decode then stalls on major faults
// reading them back from storage a page at a time, every token (the field notes' "the token rate
// falls by a factor of five and stays there"). mz_restore_generate / restore-ahead reconcile such
// units (ContextOptions::reconcile_min_missing) and restore them by readahead, overlapped with
// compute; a plain decode does not.
//
// Thread-safety: BuildResidencyReport reads the unit table, the KV cache and the model: the caller
// serializes it with every state change (Context::MeasureResidency takes the context's lock).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/smaps.h"
#include "memory/kv_cache.h"
#include "memory/unit_table.h"
#include "model/model.h"

namespace mz {

// What backs a unit's bytes in RAM now. Values mirror enum mz_backing of the C API.
enum class Backing : uint8_t {
  kNone = 0,       // it holds no memory in its state (weights dropped, KV on storage)
  kAnonymous = 1,  // anonymous memory (the kernel can only swap it out)
  kModelFile = 2,  // private read-only mapping of the model file (clean page cache, reclaimable)
  kSwapFile = 3,   // private mapping of a swap or stored file (a KV chunk restored by mapping;
                   // rows written since are anonymous copies, counted in vma_anonymous)
};
const char* BackingName(Backing b);

struct UnitResidency {
  UnitRef unit;                    // weights: layer (-1 base unit); KV: layer, chunk
  UnitState state = UnitState::kResident;  // mzcache's own count
  bool lost = false;               // KV: its stored copy failed verification
  Backing backing = Backing::kNone;
  uint64_t bytes = 0;              // RAM the unit takes when resident (weight region / raw chunk)
  uint64_t held_bytes = 0;         // RAM mzcache counts for it now: bytes when resident, its encoded
                                   // bytes when compressed in memory, 0 otherwise
  uint64_t addr = 0;               // where those bytes start in this process (0: none)
  // mincore: counted_bytes are the bytes asked about (resident weights: the runs mapped from the
  // file, or the anonymous region; a resident chunk: the chunk; compressed in memory: the whole
  // pages spanning its entry, which it may share with neighbouring entries); in_ram_bytes of them
  // are in RAM now. 0 of 0 for a unit that holds no memory.
  uint64_t counted_bytes = 0, in_ram_bytes = 0;
  // Units whose copy is in a file (weights: always, the model file; KV: on storage, or mapped
  // from its extent): the copy's bytes and those of them the page cache holds. 0 of 0 otherwise.
  uint64_t file_bytes = 0, file_cached_bytes = 0;
  // smaps of the VMAs overlapping [addr, addr + held_bytes) (whole VMAs: see the file comment).
  int n_vmas = 0;
  uint64_t vma_bytes = 0, vma_rss = 0, vma_pss = 0, vma_anonymous = 0, vma_swap = 0;
  uint64_t missing() const { return counted_bytes - in_ram_bytes; }
};

struct ResidencySummary {
  // mincore totals over the units mzcache counts in RAM, by kind of memory.
  uint64_t weights_file_counted = 0, weights_file_in_ram = 0;  // resident weights mapped from the model file
  uint64_t weights_anon_counted = 0, weights_anon_in_ram = 0;  // resident weights in anonymous memory
  uint64_t kv_counted = 0, kv_in_ram = 0;                      // resident KV chunks (any backing)
  uint64_t kv_compressed_counted = 0, kv_compressed_in_ram = 0;  // pages of chunks compressed in memory
  // Weight units counted resident, mapped from the model file, with pages not in RAM, and those
  // bytes: the warning's condition (any such unit).
  int weight_units_out_of_page_cache = 0;
  uint64_t weights_out_of_page_cache = 0;
  bool warn = false;
  std::string warning;             // "" or a sentence saying what is missing and what it costs
  // smaps totals over the distinct VMAs overlapping some unit (each counted once).
  bool smaps_ok = false;           // false: smaps could not be read or parsed (smaps_error says why)
  std::string smaps_error;
  int n_vmas = 0;
  uint64_t vma_bytes = 0, vma_rss = 0, vma_pss = 0, vma_anonymous = 0, vma_swap = 0;
  uint64_t counted() const { return weights_file_counted + weights_anon_counted + kv_counted + kv_compressed_counted; }
  uint64_t in_ram() const { return weights_file_in_ram + weights_anon_in_ram + kv_in_ram + kv_compressed_in_ram; }
};

struct ResidencyReport {
  // Weight units in layer order (the base unit last), then KV chunks layer by layer, chunk by chunk.
  std::vector<UnitResidency> units;
  ResidencySummary summary;
};

// Builds the report for the units of `table` (over model and kv, which it manages). env: the
// context's Env (mincore, the page cache, smaps). with_smaps = false skips reading smaps (the
// kernel walks every page table for it); smaps_ok is then false and smaps_error says so.
// Errors: a failing mincore / page-cache query (the Env's error naming the unit; *out then
// holds the units reported so far). A smaps that cannot be read or parsed is not an error: the
// report is built without it (smaps_ok false, smaps_error the reason).
Status BuildResidencyReport(Env* env, const Model& model, const KvCache& kv, const UnitTable& table,
                            bool with_smaps, ResidencyReport* out);

// Fills the smaps fields of every unit of *r, and the summary's, from vmas (sorted, as ParseSmaps
// gives them). Pure: what BuildResidencyReport does once smaps was read.
void AttributeSmaps(const std::vector<SmapsVma>& vmas, ResidencyReport* r);

}  // namespace mz
