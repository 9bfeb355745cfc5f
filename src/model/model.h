// Model: a GGUF file's weights held as independently resident units.
//
// Unit u in [0, n_layer) holds transformer layer u's tensors; unit n_layer is the base unit (token
// embedding, output norm, output head, rope frequency factors). Each unit owns one anonymous mmap
// region laid out as an image of the file ranges it came from ("read runs"), so a unit is (re)loaded
// with a few large, page-aligned direct-I/O reads straight into place and tensors keep the file's
// own layout (no repacking). The region is handed to ggml with ggml_backend_cpu_buffer_from_ptr.
//
// Thread-safety: LoadUnit/DropUnit on distinct units may run concurrently; on the same unit they
// need external synchronization. Compute must not touch a unit that is not resident.
#pragma once
#include <cstdint>
#include <memory>
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

struct WeightUnit {
  int index = 0;
  int layer = -1;                 // -1 for the base unit
  std::vector<TensorExtent> tensors;
  std::vector<ReadRun> runs;
  uint64_t tensor_bytes = 0;      // sum of tensor sizes (what the model "is")
  uint64_t region_bytes = 0;      // mapped bytes when resident (tensor bytes + alignment slack)
  void* region = nullptr;         // non-null iff resident
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
  bool direct_io = true;   // read weights with O_DIRECT (falls back to buffered where unsupported)
  bool load_weights = true;  // false: parse and plan only (info, tests)
  int io_threads = 2;        // threads reading units at load
  // OS Paging baseline: weights are file-backed mappings of the GGUF (as llama.cpp's mmap) that the
  // kernel may drop and fault back, instead of mzcache's own anonymous units.
  bool mmap_weights = false;
};

class Model {
 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Parses and validates path (header, metadata, every tensor's name, type, shape and data range),
  // plans the units, and (unless options.load_weights is false) loads every unit. On failure
  // *out is untouched and the Status says exactly what is wrong with the file.
  // Weight units are file mappings (ModelOptions::mmap_weights), not anonymous memory.
  bool mmap_weights() const { return opts_.mmap_weights; }
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

  // Allocates unit u's region and reads it from the model file (direct I/O). Before reading, the file
  // is checked against the identity recorded at load (kModelChanged if it differs). On failure the
  // unit stays dropped and nothing leaks. No-op if resident.
  // region: optional pre-allocated mapping of unit(u).region_bytes (from Env::MapAnon) that the
  // call takes ownership of (the restoration pipeline allocates ahead of reading).
  Status LoadUnit(int u, void* region = nullptr);
  // Releases unit u's memory to the OS. No-op if not resident.
  void DropUnit(int u);
  // Re-reads the file's header and checks size, mtime and header hash against the identity recorded
  // at load: kModelChanged if anything differs. Call before re-reading dropped weights.
  Status VerifyIdentity() const;
  // Loads every dropped unit (parallel over options.io_threads).
  Status LoadAll();

 private:
  Model() = default;
  Status Parse(gguf_context* g, uint64_t file_size);
  Status LoadUnitFrom(File* f, WeightUnit& unit, void* region);

  Env* env_ = nullptr;
  std::string path_;
  ModelOptions opts_;
  HParams hp_;
  BaseTensors base_;
  std::vector<LayerTensors> layers_;
  std::vector<WeightUnit> units_;
  FileIdentity identity_;
  uint64_t meta_len_ = 0;  // bytes before the tensor data (hashed into identity_)
  ggml_context* meta_ = nullptr;  // owns the ggml_tensor structs (no data)
};

}  // namespace mz
