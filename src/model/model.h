// Model: a GGUF file's weights held as independently resident units.
//
// Unit u in [0, n_layer) holds transformer layer u's tensors; unit n_layer is the base unit (token
// embedding, output norm, output head, rope frequency factors). Each unit owns one region laid out
// as an image of the file ranges it came from ("read runs", page aligned), so tensors keep the
// file's own layout (no repacking). The region is handed to ggml with
// ggml_backend_cpu_buffer_from_ptr. What backs the region (WeightMemory):
//   kPageCache (default)  the runs are mapped read-only from the model file and populated from the
//                         page cache when the unit is loaded (every page mapped: compute takes
//                         no fault; the 2 MiB-aligned interior in 2 MiB folios mapped by PMD
//                         entries, the edges in 4 KiB pages by windowed readahead: MapRegion,
//                         Env::PopulateMapped); dropping the unit unmaps it
//                         and drops its file range from the page cache, so the memory goes back to
//                         the OS. No anonymous memory is zeroed on reload (measured: 0.03 vs 0.24
//                         CPU-seconds per 544 MiB reloaded, docs/design.md "Weights in the page
//                         cache"). The kernel may also reclaim these clean pages under pressure
//                         before mzcache evicts (compute then faults them back, as OS paging).
//   kAnonymous            anonymous memory filled by a few large direct-I/O reads (buffered where
//                         the file system refuses O_DIRECT); the kernel cannot reclaim it without
//                         swap.
//   kOsPaging             the OS Paging baseline: file mappings the kernel faults in lazily and
//                         reclaims on its own, as llama.cpp's mmap.
//
// Thread-safety: LoadUnit/DropUnit on distinct units may run concurrently; on the same unit they
// need external synchronization. Compute must not touch a unit that is not resident.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "model/hparams.h"

struct ggml_tensor;
struct ggml_context;
struct ggml_backend_buffer;
struct gguf_context;

namespace mz {

struct LayerTensors {
  ggml_tensor* attn_norm = nullptr;  // [n_embd] f32
  ggml_tensor* wq = nullptr;         // [n_embd, n_embd_q]
  ggml_tensor* wk = nullptr;         // [n_embd, n_embd_kv]
  ggml_tensor* wv = nullptr;         // [n_embd, n_embd_kv]
  ggml_tensor* wo = nullptr;         // [n_embd_q, n_embd]
  ggml_tensor* bq = nullptr;         // [n_embd_q] (qwen2)
  ggml_tensor* bk = nullptr;         // [n_embd_kv] (qwen2)
  ggml_tensor* bv = nullptr;         // [n_embd_kv] (qwen2)
  ggml_tensor* q_norm = nullptr;     // [head_dim] (qwen3)
  ggml_tensor* k_norm = nullptr;     // [head_dim] (qwen3)
  ggml_tensor* ffn_norm = nullptr;   // [n_embd]
  ggml_tensor* ffn_gate = nullptr;   // [n_embd, n_ff]
  ggml_tensor* ffn_up = nullptr;     // [n_embd, n_ff]
  ggml_tensor* ffn_down = nullptr;   // [n_ff, n_embd]
};

struct BaseTensors {
  ggml_tensor* tok_embd = nullptr;     // [n_embd, n_vocab]
  ggml_tensor* output_norm = nullptr;  // [n_embd]
  ggml_tensor* output = nullptr;       // [n_embd, n_vocab]; == tok_embd when tied
  ggml_tensor* rope_freqs = nullptr;   // [head_dim/2] f32 (llama3), optional
};

// One tensor's bytes: where they are in the file and in the unit's region.
struct TensorExtent {
  ggml_tensor* tensor = nullptr;
  uint64_t file_off = 0;  // absolute offset in the GGUF file
  uint64_t bytes = 0;
  uint64_t region_off = 0;
  bool repack = false;  // held in ggml's repacked layout when the unit is made (ModelOptions::repack)
};

// One direct-I/O read: [file_off, file_off + len) into region + region_off. file_off, len and
// region_off are multiples of kDirectIoAlign; `need` (<= len) bytes must be present (the rest may
// lie past end of file).
struct ReadRun {
  uint64_t file_off = 0;
  uint64_t len = 0;
  uint64_t need = 0;
  uint64_t region_off = 0;
};

enum class WeightMemory : uint8_t { kPageCache = 0, kAnonymous = 1, kOsPaging = 2 };
const char* WeightMemoryName(WeightMemory w);

struct WeightUnit {
  int index = 0;
  int layer = -1;                 // -1 for the base unit
  std::vector<TensorExtent> tensors;
  std::vector<ReadRun> runs;
  uint64_t tensor_bytes = 0;      // sum of tensor sizes (what the model "is")
  uint64_t region_bytes = 0;      // mapped bytes when resident (tensor bytes + alignment slack)
  void* region = nullptr;         // non-null iff resident
  WeightMemory backing = WeightMemory::kAnonymous;  // how the resident region was made
  // The resident region holds this unit's repackable tensors in ggml's repacked layout (then it is
  // anonymous memory, backing kAnonymous, made by reading the file and repacking: see
  // ModelOptions::repack).
  bool repacked = false;
  int n_repack = 0;  // tensors of this unit with TensorExtent::repack
  ggml_backend_buffer* buffer = nullptr;
  bool resident() const { return region != nullptr; }
};

// Identity of the model file, checked before re-reading dropped weights.
struct FileIdentity {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t header_hash = 0;  // xxh64 of the GGUF header + metadata + tensor infos
  bool operator==(const FileIdentity& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && header_hash == o.header_hash;
  }
};

struct ModelOptions {
  // kPageCache falls back to kAnonymous where runs cannot be mapped (pages other than 4 KiB, a file
  // system without mmap): check Model::weight_memory().
  WeightMemory weights = WeightMemory::kPageCache;
  bool direct_io = true;   // kAnonymous: read with O_DIRECT (falls back to buffered where unsupported)
  bool load_weights = true;  // false: parse and plan only (info, tests)
  int io_threads = 2;        // threads reading units at load
  // The third way (issue 49; docs/residency.md "Repacked weights"): each layer unit's matrices that
  // this CPU has a repacked kernel for (model/repack.h) are held in ggml's repacked layout, in
  // anonymous memory of the unit's region size (same offsets as the file image), so decode runs
  // the repacked kernels as llama.cpp's default loader does. Making such a unit (at load, and on
  // every restore after it was dropped) reads its file form (the `weights` way: page-cache mapping
  // or anonymous reads, into a staging region unmapped afterwards, its file range then dropped from
  // the page cache) and repacks it; dropping it returns the anonymous region to the OS (the kernel
  // cannot reclaim it otherwise: it is what mzcache evicts under pressure, one layer at a time).
  // Making a unit holds its staging and its repacked region at once (twice the unit, per unit
  // being made: io_threads at load, the restore workers on restore). A layer with nothing
  // repackable, and the base unit (embeddings read by GET_ROWS), keep the file form. Default false: the file-backed form the kernel can reclaim on its own (the
  // repacked layout gains ~6% decode for Q4_0 on AVX2, docs/results.md; nothing for Q8_0, which has
  // no AVX2 repack).
  bool repack = false;
};

class Model {
 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Parses and validates path (header, metadata, every tensor's name, type, shape and data range),
  // plans the units, and (unless options.load_weights is false) loads every unit. On failure
  // *out is untouched and the Status says exactly what is wrong with the file.
  // Weight units are file mappings (kPageCache, kOsPaging), not anonymous memory: restoring one
  // needs no anonymous memory allocated ahead.
  // With ModelOptions::repack a unit holding repacked tensors is anonymous memory: not file-backed.
  bool file_backed() const {
    return opts_.weights != WeightMemory::kAnonymous && !(opts_.repack && n_repack_units_ > 0);
  }
  bool repack() const { return opts_.repack; }
  int n_repack_units() const { return n_repack_units_; }  // units that hold repacked tensors when resident
  WeightMemory weight_memory() const { return opts_.weights; }
  // Changes how units loaded from now on are backed (kPageCache <-> kAnonymous; benchmarks compare
  // the two on one model). Units keep the backing they were loaded with until dropped. Not
  // thread-safe: call while no unit is being loaded or dropped.
  void set_weight_memory(WeightMemory w) { opts_.weights = w; }
  static Status Load(Env* env, const std::string& path, const ModelOptions& options,
                     std::unique_ptr<Model>* out);

  const HParams& hparams() const { return hp_; }
  const std::string& path() const { return path_; }
  const BaseTensors& base() const { return base_; }
  const LayerTensors& layer(int il) const { return layers_[il]; }
  int n_units() const { return int(units_.size()); }
  int base_unit() const { return int(hp_.n_layer); }
  const WeightUnit& unit(int u) const { return units_[u]; }
  uint64_t tensor_bytes() const;         // all tensors of the model
  const FileIdentity& identity() const { return identity_; }
  Env* env() const { return env_; }

  // Bytes of dropped units' runs still in the page cache (whatever backing they had): a page-cache
  // reload reads the rest from the disk. A folio (up to 2 MiB) shared with a resident neighbour
  // stays cached, so after DropUnit this is at most about 2 MiB per boundary between a resident and
  // a dropped unit. A range that cannot be checked counts as cached. which (optional) receives the
  // units concerned. Not thread-safe against concurrent LoadUnit/DropUnit.
  uint64_t DroppedBytesCached(std::vector<int>* which = nullptr) const;
  // Bytes of resident unit u that the kernel holds in RAM now (mincore: Env::ResidentBytes), out of
  // *counted (the bytes that hold its tensors: its mapped file runs, or its whole anonymous region).
  // A file-backed unit's clean pages may have been reclaimed by the kernel under pressure (compute
  // would fault them back from storage); an anonymous one's pages swapped out. A dropped unit: 0 of
  // 0. Errors: the Env's (then *in_ram is 0). Not thread-safe against LoadUnit/DropUnit of u.
  Status UnitInRam(int u, uint64_t* in_ram, uint64_t* counted) const;
  // Bytes of unit u's file runs (resident or not, whatever its backing) that the page cache holds
  // now (Env::CachedBytes: mincore over a mapping of the file), out of *file_bytes (the runs'
  // bytes within the file). For a dropped unit: what a page-cache reload finds without reading
  // storage. Errors: the Env's (then *cached is 0). Thread-safe (reads the held file only).
  Status UnitFileCached(int u, uint64_t* cached, uint64_t* file_bytes) const;
  // The model file as held since load (for reports naming it; nullptr before load).
  File* file() const { return file_.get(); }
  // Checks that the file at the path is still the one loaded: size, mtime, inode and device against
  // the identity recorded at load, then the header's hash (re-read): kModelChanged if anything
  // differs, the Env's error if the header cannot be read. Call before re-reading dropped weights.
  // The header (megabytes: the vocabulary) is read again only when the file's status changed since
  // the last check that read it (stat, ctime included: every write moves it and no user can set it
  // back), or when that check ran less than 2 s of wall clock after the ctime it saw (a write in
  // the same clock tick could leave ctime unchanged). Thread-safe.
  Status VerifyIdentity() const;

 private:
  // A weight unit's residency is unit state: only the UnitTable (memory/unit_table.h, the sole
  // mutator of unit state) loads and drops units once a context exists; tests reach them through
  // ModelTestPeer.
  friend class UnitTable;
  friend struct ModelTestPeer;
  // Loads every dropped unit (parallel over options.io_threads).
  Status LoadAll();
  // Makes unit u resident: reads it from the model file (kAnonymous: into a fresh anonymous region
  // with direct I/O; kPageCache: maps its runs and populates them from the page cache; kOsPaging:
  // maps them only). Before reading, the file is checked against the identity recorded at load
  // (kModelChanged if it differs). On failure (kIOError, kCorruption for a truncated file,
  // kNoMemory) the unit stays dropped and nothing leaks. No-op if resident.
  // region: optional mapping of unit(u).region_bytes (from Env::MapAnon) that the call takes
  // ownership of (the restoration pipeline allocates ahead of reading; file-backed units only use
  // it as the address range to map over, so they need none).
  Status LoadUnit(int u, void* region = nullptr);
  // Releases unit u's memory to the OS (kPageCache: unmaps it and, with drop_cached, drops its file
  // range from the page cache). No-op if not resident.
  void DropUnit(int u, bool drop_cached = true);
  Model() = default;
  Status Parse(gguf_context* g, uint64_t file_size);
  // A fresh region for unit u loaded the `mode` way (Env::MapAnon, region_bytes; nullptr if refused).
  // kPageCache: placed so that its address and the file offsets it maps are congruent modulo 2 MiB
  // (the first run's; later runs of a unit with several may not be), so the populate reads the
  // 2 MiB-aligned interior in 2 MiB folios mapped by PMD entries (Env::PopulateMapped).
  void* MapRegion(const WeightUnit& u, WeightMemory mode) const;
  // f: the open model file (kAnonymous only; nullptr otherwise).
  Status LoadUnitFrom(File* f, WeightUnit& unit, void* region, WeightMemory mode);
  // Fills region (unit.region_bytes, from Env::MapAnon) with unit's file image the `mode` way. On
  // failure region is unmapped and the Status says what failed.
  Status FillFileForm(File* f, const WeightUnit& unit, void* region, WeightMemory mode);
  // Re-lays unit's tensors from staging (its file image) into packed (anonymous, region_bytes):
  // repackable tensors repacked, the others copied; binds them to buf (over packed) or the repack
  // tag buffer.
  Status BindRepacked(WeightUnit& unit, void* packed, const void* staging);
  bool CanMapRuns() const;  // this kernel and file system can map the runs (else kAnonymous)
  void DropRuns(const WeightUnit& w) const;  // kPageCache: drops w's file ranges from the page cache

  Env* env_ = nullptr;
  std::string path_;
  // The model file as opened at load (buffered, read-only), held for the model's lifetime: units
  // are mapped from it and its pages dropped through it (no open per unit). If the file is
  // replaced on disk this still names the old one: the identity checks compare the path's inode
  // and device with file_inode_/file_device_ and refuse re-reads then (kModelChanged).
  std::unique_ptr<File> file_;
  uint64_t file_inode_ = 0, file_device_ = 0;
  ModelOptions opts_;
  HParams hp_;
  BaseTensors base_;
  std::vector<LayerTensors> layers_;
  std::vector<WeightUnit> units_;
  FileIdentity identity_;
  int n_repack_units_ = 0;
  uint64_t meta_len_ = 0;  // bytes before the tensor data (hashed into identity_)
  // The file's stat at the last VerifyIdentity that read the header, found it unchanged and ran
  // at least 2 s after that stat's ctime (verified_ok_); a call whose stat equals it skips the read.
  mutable std::mutex verify_mu_;
  mutable FileInfo verified_;
  mutable bool verified_ok_ = false;
  ggml_context* meta_ = nullptr;  // owns the ggml_tensor structs (no data)
};

}  // namespace mz
