#include "model/model.h"

#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "core/ggml_log.h"
#include "model/repack.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

namespace mz {
namespace {

// gguf's parser reads the metadata one value at a time (~750k reads for a vocabulary): serve them
// from a read-ahead window of 1 MiB (or of the file's size, if smaller: Load sizes it, so that a
// small file does not cost a zeroed 1 MiB buffer, most of the time of loading one).
struct ReaderCtx {
  File* file;
  bool failed = false;
  std::vector<char> buf;
  uint64_t buf_off = 0;
  size_t buf_len = 0;
};

size_t GgufRead(void* ud, void* out, uint64_t off, size_t len) {
  auto* r = static_cast<ReaderCtx*>(ud);
  size_t done = 0;
  while (done < len) {
    const uint64_t pos = off + done;
    if (pos >= r->buf_off && pos < r->buf_off + r->buf_len) {
      const size_t n = std::min<size_t>(len - done, r->buf_off + r->buf_len - pos);
      std::memcpy(static_cast<char*>(out) + done, r->buf.data() + (pos - r->buf_off), n);
      done += n;
      continue;
    }
    if (len - done >= r->buf.size()) {  // large read: straight through
      size_t got = 0;
      if (!r->file->Read(static_cast<char*>(out) + done, len - done, pos, &got).ok()) r->failed = true;
      return done + got;
    }
    size_t got = 0;
    if (!r->file->Read(r->buf.data(), r->buf.size(), pos, &got).ok()) {
      r->failed = true;
      return done;
    }
    r->buf_off = pos;
    r->buf_len = got;
    if (got == 0) return done;
  }
  return done;
}

std::string ShapeStr(const int64_t* ne, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// Plans the direct-I/O read runs of a unit: tensors sorted by file offset, merged into one run
// while the gap to the next tensor is small, each run page-aligned in file and region.
void PlanRuns(WeightUnit& u) {
  constexpr uint64_t kMaxGap = 64 * 1024;
  std::sort(u.tensors.begin(), u.tensors.end(),
            [](const TensorExtent& a, const TensorExtent& b) { return a.file_off < b.file_off; });
  u.runs.clear();
  uint64_t region = 0;
  size_t i = 0;
  while (i < u.tensors.size()) {
    uint64_t start = u.tensors[i].file_off;
    uint64_t end = start + u.tensors[i].bytes;
    size_t j = i + 1;
    while (j < u.tensors.size() && u.tensors[j].file_off <= end + kMaxGap) {
      end = std::max(end, u.tensors[j].file_off + u.tensors[j].bytes);
      ++j;
    }
    ReadRun run;
    run.file_off = AlignDown(start, kDirectIoAlign);
    run.len = AlignUp(end, kDirectIoAlign) - run.file_off;
    run.need = end - run.file_off;
    run.region_off = region;
    for (size_t k = i; k < j; ++k) u.tensors[k].region_off = region + (u.tensors[k].file_off - run.file_off);
    region += run.len;
    u.runs.push_back(run);
    i = j;
  }
  u.region_bytes = region;
}

}  // namespace

Model::~Model() {
  // Unmap only: freeing the model does not push the file out of the page cache for other users
  // (the pages are clean and reclaimable once unmapped).
  for (int u = 0; u < n_units(); ++u) DropUnit(u, /*drop_cached=*/false);
  if (meta_) ggml_free(meta_);
}

uint64_t Model::tensor_bytes() const {
  uint64_t s = 0;
  for (const auto& u : units_) s += u.tensor_bytes;
  return s;
}

Status Model::Load(Env* env, const std::string& path, const ModelOptions& options, std::unique_ptr<Model>* out) {
  InitLibraryLogging();
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kRead, /*direct=*/false, &f));
  FileInfo info;
  MZ_RETURN_IF_ERROR(f->Stat(&info));
  if (info.size < 8) return Status::Corruption(path + ": not a GGUF file (" + std::to_string(info.size) + " bytes)");
  char magic[4];
  MZ_RETURN_IF_ERROR(ReadFully(f.get(), magic, 4, 0, path));
  if (std::memcmp(magic, "GGUF", 4) != 0) return Status::Corruption(path + ": bad magic (not a GGUF file)");

  std::unique_ptr<Model> m(new Model());
  m->env_ = env;
  m->path_ = path;
  m->opts_ = options;

  gguf_context* g = nullptr;
  {
    LogCapture cap;
    ReaderCtx rc{f.get()};
    rc.buf.resize(size_t(std::min<uint64_t>(uint64_t(1) << 20, info.size)));  // info.size >= 8
    gguf_init_params gp{/*no_alloc=*/true, /*ctx=*/nullptr};
    g = gguf_init_from_callback(GgufRead, &rc, 1 << 20, info.size, gp);
    if (!g) {
      if (rc.failed) return Status::IOError(path + ": read error while parsing the GGUF header");
      std::string why = cap.text();
      return Status::Corruption(path + ": malformed GGUF: " + (why.empty() ? "rejected by the parser" : why));
    }
  }
  Status st = ReadHParams(g, &m->hp_);
  if (st.ok()) st = m->Parse(g, info.size);
  if (st.ok()) {
    // Identity: size + mtime + hash of everything before the tensor data.
    uint64_t meta_len = gguf_get_data_offset(g);
    m->meta_len_ = meta_len;
    std::vector<char> head(meta_len);
    st = ReadFully(f.get(), head.data(), head.size(), 0, path);
    m->identity_.size = info.size;
    m->identity_.mtime_ns = info.mtime_ns;
    m->identity_.header_hash = XXH64(head.data(), head.size(), 0);
  }
  gguf_free(g);
  if (!st.ok()) return st.With(path);
  m->file_ = std::move(f);
  m->file_inode_ = info.inode;
  m->file_device_ = info.device;
  if (m->opts_.weights == WeightMemory::kPageCache && !m->CanMapRuns()) m->opts_.weights = WeightMemory::kAnonymous;
  if (m->opts_.repack) {
    // Which layer matrices this CPU has a repacked kernel for (the base unit keeps the file form:
    // its embeddings are read by GET_ROWS).
    for (int il = 0; il < int(m->hp_.n_layer); ++il) {
      WeightUnit& w = m->units_[il];
      const LayerTensors& L = m->layers_[il];
      for (TensorExtent& e : w.tensors) {
        const ggml_tensor* t = e.tensor;
        const bool matrix = t == L.wq || t == L.wk || t == L.wv || t == L.wo || t == L.ffn_gate ||
                            t == L.ffn_up || t == L.ffn_down;
        e.repack = matrix && e.region_off % 32 == 0 && CanRepack(e.tensor);
        w.n_repack += e.repack;
      }
      m->n_repack_units_ += w.n_repack > 0;
    }
  }
  if (options.load_weights) MZ_RETURN_IF_ERROR(m->LoadAll());
  *out = std::move(m);
  return Status::Ok();
}

Status Model::Parse(gguf_context* g, uint64_t file_size) {
  const HParams& hp = hp_;
  const int64_t n_tensors = gguf_get_n_tensors(g);
  const uint64_t data_off = gguf_get_data_offset(g);
  if (data_off > file_size) return Status::Corruption("tensor data section starts past end of file");

  // Vocabulary size: rows of token_embd.
  int64_t te = gguf_find_tensor(g, "token_embd.weight");
  if (te < 0) return Status::Corruption("missing tensor 'token_embd.weight'");
  const int64_t* te_ne = gguf_get_tensor_ne(g, te);
  if (te_ne[0] != hp.n_embd || te_ne[1] <= 0 || te_ne[1] > (1 << 24))
    return Status::Corruption("tensor 'token_embd.weight' has shape " + ShapeStr(te_ne, 2) + ", expected [" +
                              std::to_string(hp.n_embd) + ", n_vocab]");
  hp_.n_vocab = uint32_t(te_ne[1]);
  hp_.tied_output = gguf_find_tensor(g, "output.weight") < 0;
  hp_.rope_freqs = gguf_find_tensor(g, "rope_freqs.weight") >= 0;

  ggml_init_params ip{size_t(n_tensors + 16) * ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
  meta_ = ggml_init(ip);
  if (!meta_) return Status::NoMemory("ggml_init for tensor metadata");

  units_.resize(hp.n_layer + 1);
  for (int u = 0; u <= int(hp.n_layer); ++u) {
    units_[u].index = u;
    units_[u].layer = u < int(hp.n_layer) ? u : -1;
  }
  layers_.resize(hp.n_layer);
  std::vector<bool> used(size_t(n_tensors), false);

  // Creates the ggml tensor for `name` after checking type, shape and data range. Missing optional
  // tensors yield nullptr.
  auto take = [&](const std::string& name, std::vector<int64_t> shape, bool required, bool must_f32, int unit,
                  ggml_tensor** dst) -> Status {
    int64_t id = gguf_find_tensor(g, name.c_str());
    if (id < 0) {
      if (required) return Status::Corruption("missing tensor '" + name + "'");
      return Status::Ok();
    }
    const int64_t* ne = gguf_get_tensor_ne(g, id);
    int64_t want[GGML_MAX_DIMS] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i) want[i] = shape[i];
    for (int i = 0; i < GGML_MAX_DIMS; ++i)
      if (ne[i] != want[i])
        return Status::Corruption("tensor '" + name + "' has shape " + ShapeStr(ne, GGML_MAX_DIMS) + ", expected " +
                                  ShapeStr(want, GGML_MAX_DIMS));
    ggml_type type = gguf_get_tensor_type(g, id);
    if (must_f32 && type != GGML_TYPE_F32)
      return Status::Unsupported("tensor '" + name + "' must be f32, is " + ggml_type_name(type));
    if (ggml_get_type_traits_cpu(type)->vec_dot == nullptr && type != GGML_TYPE_F32)
      return Status::Unsupported("tensor '" + name + "' has type " + ggml_type_name(type) + " with no CPU kernel");
    ggml_tensor* t = ggml_new_tensor(meta_, type, int(shape.size()), shape.data());
    ggml_set_name(t, name.c_str());
    const uint64_t bytes = ggml_nbytes(t);
    const uint64_t off = gguf_get_tensor_offset(g, id);
    if (bytes != gguf_get_tensor_size(g, id)) return Status::Corruption("tensor '" + name + "' size mismatch");
    if (off > file_size || bytes > file_size || data_off + off > file_size - bytes)
      return Status::Corruption("tensor '" + name + "' data [" + std::to_string(data_off + off) + ", +" +
                                std::to_string(bytes) + ") lies past end of file (" + std::to_string(file_size) +
                                " bytes): file truncated?");
    used[size_t(id)] = true;
    units_[unit].tensors.push_back(TensorExtent{t, data_off + off, bytes, 0});
    units_[unit].tensor_bytes += bytes;
    *dst = t;
    return Status::Ok();
  };

  const int64_t E = hp.n_embd, Q = hp.n_embd_q(), KV = hp.n_embd_kv(), F = hp.n_ff, D = hp.head_dim;
  const int b = base_unit();
  MZ_RETURN_IF_ERROR(take("token_embd.weight", {E, int64_t(hp_.n_vocab)}, true, false, b, &base_.tok_embd));
  MZ_RETURN_IF_ERROR(take("output_norm.weight", {E}, true, true, b, &base_.output_norm));
  MZ_RETURN_IF_ERROR(take("output.weight", {E, int64_t(hp_.n_vocab)}, false, false, b, &base_.output));
  if (!base_.output) base_.output = base_.tok_embd;
  MZ_RETURN_IF_ERROR(take("rope_freqs.weight", {D / 2}, false, true, b, &base_.rope_freqs));

  for (int il = 0; il < int(hp.n_layer); ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerTensors& L = layers_[il];
    MZ_RETURN_IF_ERROR(take(p + "attn_norm.weight", {E}, true, true, il, &L.attn_norm));
    MZ_RETURN_IF_ERROR(take(p + "attn_q.weight", {E, Q}, true, false, il, &L.wq));
    MZ_RETURN_IF_ERROR(take(p + "attn_k.weight", {E, KV}, true, false, il, &L.wk));
    MZ_RETURN_IF_ERROR(take(p + "attn_v.weight", {E, KV}, true, false, il, &L.wv));
    MZ_RETURN_IF_ERROR(take(p + "attn_output.weight", {Q, E}, true, false, il, &L.wo));
    MZ_RETURN_IF_ERROR(take(p + "attn_q.bias", {Q}, hp.qkv_bias, true, il, &L.bq));
    MZ_RETURN_IF_ERROR(take(p + "attn_k.bias", {KV}, hp.qkv_bias, true, il, &L.bk));
    MZ_RETURN_IF_ERROR(take(p + "attn_v.bias", {KV}, hp.qkv_bias, true, il, &L.bv));
    MZ_RETURN_IF_ERROR(take(p + "attn_q_norm.weight", {D}, hp.qk_norm, true, il, &L.q_norm));
    MZ_RETURN_IF_ERROR(take(p + "attn_k_norm.weight", {D}, hp.qk_norm, true, il, &L.k_norm));
    MZ_RETURN_IF_ERROR(take(p + "ffn_norm.weight", {E}, true, true, il, &L.ffn_norm));
    MZ_RETURN_IF_ERROR(take(p + "ffn_gate.weight", {E, F}, true, false, il, &L.ffn_gate));
    MZ_RETURN_IF_ERROR(take(p + "ffn_up.weight", {E, F}, true, false, il, &L.ffn_up));
    MZ_RETURN_IF_ERROR(take(p + "ffn_down.weight", {F, E}, true, false, il, &L.ffn_down));
  }
  for (int64_t i = 0; i < n_tensors; ++i)
    if (!used[size_t(i)]) {
      std::string name = gguf_get_tensor_name(g, i);
      // llama.cpp files may carry tensors this engine does not use (e.g. rope_freqs duplicates);
      // a tensor of an unknown layer means the metadata lies about block_count.
      if (name.rfind("blk.", 0) == 0) {
        int il = std::atoi(name.c_str() + 4);
        if (il >= int(hp.n_layer))
          return Status::Corruption("tensor '" + name + "' belongs to a layer beyond block_count (" +
                                    std::to_string(hp.n_layer) + ")");
      }
    }
  for (auto& u : units_) PlanRuns(u);
  return Status::Ok();
}

bool Model::CanMapRuns() const {
  // Runs are 4096-aligned: mapping them needs 4 KiB pages, and a file system that can mmap.
  if (env_->PageSize() != kDirectIoAlign) return false;
  void* at = env_->MapAnon(kDirectIoAlign);
  if (!at) return false;
  const bool ok = env_->MapFileAt(file_.get(), 0, kDirectIoAlign, at, false).ok();
  env_->Unmap(at, kDirectIoAlign);
  return ok;
}

Status Model::FillFileForm(File* f, const WeightUnit& u, void* region, WeightMemory mode) {
  for (const ReadRun& r : u.runs) {
    if (mode != WeightMemory::kAnonymous) {
      // The run's last page may lie past end of file: map only what the file has.
      const uint64_t len = std::min<uint64_t>(r.len, AlignUp(identity_.size - r.file_off, kDirectIoAlign));
      char* at = static_cast<char*>(region) + r.region_off;
      Status st = env_->MapFileAt(file_.get(), r.file_off, len, at, false);
      if (st.ok() && mode == WeightMemory::kPageCache) st = env_->PopulateMapped(file_.get(), at, len, r.file_off);
      if (!st.ok()) {
        env_->Unmap(region, u.region_bytes);
        if (mode == WeightMemory::kPageCache) DropRuns(u);
        // A file cut short after the identity check faults like an I/O error: say which it was.
        FileInfo info;
        if (env_->StatPath(path_, &info).ok() && (info.size != identity_.size || info.mtime_ns != identity_.mtime_ns))
          return Status::ModelChanged(path_ + " changed while weight unit " + std::to_string(u.index) +
                                      " was being read (" + st.message() + ")");
        return st.With("mapping weight unit " + std::to_string(u.index));
      }
      continue;
    }
    size_t got = 0;
    Status st = f->Read(static_cast<char*>(region) + r.region_off, r.len, r.file_off, &got);
    if (st.ok() && got < r.need)
      st = Status::Corruption("model file truncated: unit " + std::to_string(u.index) + " needs " +
                              std::to_string(r.need) + " bytes at offset " + std::to_string(r.file_off) + ", got " +
                              std::to_string(got));
    if (!st.ok()) {
      env_->Unmap(region, u.region_bytes);
      return st.With("loading weight unit " + std::to_string(u.index));
    }
  }
  return Status::Ok();
}

Status Model::BindRepacked(WeightUnit& u, void* packed, const void* staging) {
  ggml_backend_buffer_t buf = ggml_backend_cpu_buffer_from_ptr(packed, u.region_bytes);
  if (!buf) return Status::NoMemory("ggml_backend_cpu_buffer_from_ptr");
  for (const TensorExtent& e : u.tensors) {
    char* to = static_cast<char*>(packed) + e.region_off;
    const char* from = static_cast<const char*>(staging) + e.region_off;
    if (e.repack) {
      RepackInto(e.tensor, to, from);
      continue;
    }
    std::memcpy(to, from, e.bytes);
    if (ggml_backend_tensor_alloc(buf, e.tensor, to) != GGML_STATUS_SUCCESS) {
      for (const TensorExtent& x : u.tensors) UnbindRepacked(x.tensor);
      ggml_backend_buffer_free(buf);
      return Status::Internal("ggml_backend_tensor_alloc failed for " + std::string(e.tensor->name));
    }
  }
  u.buffer = buf;
  return Status::Ok();
}

void* Model::MapRegion(const WeightUnit& u, WeightMemory mode) const {
  constexpr size_t kPmd = Env::kPmdBytes;
  // Only the page-cache form gains (2 MiB folios mapped by PMD entries, Env::PopulateMapped), and
  // only a unit with 2 MiB of file to map.
  if (mode != WeightMemory::kPageCache || u.runs.empty() || u.region_bytes < 2 * kPmd) return env_->MapAnon(u.region_bytes);
  // Reserve 2 MiB more, keep the part whose start is congruent with the first run's file offset
  // modulo 2 MiB, give back the rest (the region stays exactly region_bytes, as DropUnit unmaps it).
  char* raw = static_cast<char*>(env_->MapAnon(u.region_bytes + kPmd));
  if (!raw) return env_->MapAnon(u.region_bytes);
  const uintptr_t want = uintptr_t((u.runs[0].file_off - u.runs[0].region_off) % kPmd);
  const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
  char* at = raw + ((want + kPmd - a % kPmd) % kPmd);
  if (at > raw) env_->Unmap(raw, size_t(at - raw));
  const size_t after = size_t(raw + u.region_bytes + kPmd - (at + u.region_bytes));
  if (after > 0) env_->Unmap(at + u.region_bytes, after);
  return at;
}

Status Model::LoadUnitFrom(File* f, WeightUnit& u, void* region, WeightMemory mode) {
  if (u.resident()) {
    if (region) env_->Unmap(region, u.region_bytes);
    return Status::Ok();
  }
  if (!region) region = MapRegion(u, mode);
  if (!region) return Status::NoMemory("mapping " + std::to_string(u.region_bytes) + " bytes for weight unit " +
                                       std::to_string(u.index));
  if (opts_.repack && u.n_repack > 0) {
    // The third way: region becomes the repacked form; the file form is staged and let go.
    void* staging = env_->MapAnon(u.region_bytes);
    if (!staging) {
      env_->Unmap(region, u.region_bytes);
      return Status::NoMemory("mapping " + std::to_string(u.region_bytes) + " bytes to stage weight unit " +
                              std::to_string(u.index) + " for repacking");
    }
    Status st = FillFileForm(f, u, staging, mode);  // unmaps staging on failure
    if (st.ok()) {
      st = BindRepacked(u, region, staging);
      env_->Unmap(staging, u.region_bytes);
      // The repacked copy is the one held: the file range goes from the page cache (as when a
      // file-backed unit is dropped), so the unit is not held twice.
      if (mode == WeightMemory::kPageCache) DropRuns(u);
    }
    if (!st.ok()) {
      env_->Unmap(region, u.region_bytes);
      return st;
    }
    u.region = region;
    u.backing = WeightMemory::kAnonymous;
    u.repacked = true;
    return Status::Ok();
  }
  MZ_RETURN_IF_ERROR(FillFileForm(f, u, region, mode));  // unmaps region on failure
  ggml_backend_buffer_t buf = ggml_backend_cpu_buffer_from_ptr(region, u.region_bytes);
  if (!buf) {
    env_->Unmap(region, u.region_bytes);
    return Status::NoMemory("ggml_backend_cpu_buffer_from_ptr");
  }
  for (const TensorExtent& e : u.tensors) {
    if (ggml_backend_tensor_alloc(buf, e.tensor, static_cast<char*>(region) + e.region_off) != GGML_STATUS_SUCCESS) {
      for (const TensorExtent& x : u.tensors) x.tensor->data = nullptr, x.tensor->buffer = nullptr;
      ggml_backend_buffer_free(buf);
      env_->Unmap(region, u.region_bytes);
      return Status::Internal("ggml_backend_tensor_alloc failed for " + std::string(e.tensor->name));
    }
  }
  u.buffer = buf;
  u.region = region;
  u.backing = mode;
  u.repacked = false;
  return Status::Ok();
}

Status Model::LoadUnit(int u, void* region) {
  if (u < 0 || u >= n_units()) {
    if (region) return Status::Internal("region passed for a bad unit");
    return Status::InvalidArgument("no weight unit " + std::to_string(u));
  }
  auto fail = [&](Status st) {
    if (region) env_->Unmap(region, units_[u].region_bytes);
    return st;
  };
  if (units_[u].resident()) return fail(Status::Ok());
  FileInfo info;
  Status st = env_->StatPath(path_, &info);
  if (!st.ok()) return fail(Status::ModelChanged(path_ + " is gone: " + st.message()));
  if (info.size != identity_.size || info.mtime_ns != identity_.mtime_ns)
    return fail(Status::ModelChanged(path_ + " changed since it was loaded (size or modification time differ)"));
  if (info.inode != file_inode_ || info.device != file_device_)
    return fail(Status::ModelChanged(path_ + " was replaced since it was loaded (another file is at the path)"));
  const WeightMemory mode = opts_.weights;  // read once: set_weight_memory may not change it mid-load
  std::unique_ptr<File> f;                  // file-backed units map the held file_ instead
  if (mode == WeightMemory::kAnonymous) {
    st = env_->Open(path_, OpenMode::kRead, opts_.direct_io, &f);
    if (!st.ok()) return fail(st);
  }
  return LoadUnitFrom(f.get(), units_[u], region, mode);
}

void Model::DropUnit(int u, bool drop_cached) {
  WeightUnit& w = units_[u];
  if (!w.resident()) return;
  for (const TensorExtent& e : w.tensors) UnbindRepacked(e.tensor);  // data, buffer (and extra) cleared
  ggml_backend_buffer_free(w.buffer);
  env_->Unmap(w.region, w.region_bytes);
  w.buffer = nullptr;
  w.region = nullptr;
  w.repacked = false;
  // Also for an anonymous unit when units now load through the page cache: pages of its range that
  // something else cached (another process reading the file) would otherwise serve its reload.
  if (drop_cached && (w.backing == WeightMemory::kPageCache || opts_.weights == WeightMemory::kPageCache)) DropRuns(w);
}

Status Model::UnitInRam(int u, uint64_t* in_ram, uint64_t* counted) const {
  *in_ram = *counted = 0;
  const WeightUnit& w = units_[u];
  if (!w.resident()) return Status::Ok();
  if (w.backing == WeightMemory::kAnonymous) {
    *counted = w.region_bytes;
    return env_->ResidentBytes(w.region, w.region_bytes, in_ram);
  }
  for (const ReadRun& r : w.runs) {  // the mapped part of each run (as LoadUnitFrom maps it)
    const uint64_t len = std::min<uint64_t>(r.len, AlignUp(identity_.size - r.file_off, kDirectIoAlign));
    uint64_t got = 0;
    Status st = env_->ResidentBytes(static_cast<const char*>(w.region) + r.region_off, len, &got);
    if (!st.ok()) {
      *in_ram = 0;
      return st.With("weight unit " + std::to_string(u));
    }
    *counted += len;
    *in_ram += got;
  }
  return Status::Ok();
}

Status Model::UnitFileCached(int u, uint64_t* cached, uint64_t* file_bytes) const {
  *cached = *file_bytes = 0;
  if (u < 0 || u >= n_units()) return Status::InvalidArgument("no weight unit " + std::to_string(u));
  for (const ReadRun& r : units_[u].runs) {
    const uint64_t len = std::min<uint64_t>(r.len, AlignUp(identity_.size - r.file_off, kDirectIoAlign));
    uint64_t n = 0;
    Status st = env_->CachedBytes(file_.get(), r.file_off, len, &n);
    if (!st.ok()) {
      *cached = 0;
      return st.With("weight unit " + std::to_string(u));
    }
    *cached += n;
    *file_bytes += len;
  }
  return Status::Ok();
}

void Model::DropRuns(const WeightUnit& w) const {
  // Best effort (a deleted file's pages go once the held file_ and the last mapping are closed). The page cache
  // holds a file in folios of up to 2 MiB, and the kernel only drops folios wholly inside the range:
  // widen it to 2 MiB boundaries so the folios straddling the run's ends go too. A neighbour's
  // pages in that margin are dropped only if nothing maps them (the neighbour is dropped as well).
  constexpr uint64_t kFolio = uint64_t(2) << 20;
  for (const ReadRun& r : w.runs) {
    const uint64_t a = AlignDown(r.file_off, kFolio);
    (void)env_->DropCached(file_.get(), a, AlignUp(r.file_off + r.len, kFolio) - a);
  }
}

uint64_t Model::DroppedBytesCached(std::vector<int>* which) const {
  uint64_t total = 0;
  for (const WeightUnit& w : units_) {
    if (w.resident()) continue;
    for (const ReadRun& r : w.runs) {
      uint64_t n = 0;
      if (!env_->CachedBytes(file_.get(), r.file_off, r.len, &n).ok()) n = r.len;  // unknown counts as cached
      total += n;
      if (n && which && (which->empty() || which->back() != w.index)) which->push_back(w.index);
    }
  }
  return total;
}

const char* WeightMemoryName(WeightMemory w) {
  switch (w) {
    case WeightMemory::kPageCache: return "page-cache";
    case WeightMemory::kAnonymous: return "anonymous";
    case WeightMemory::kOsPaging: return "os-paging";
  }
  return "?";
}

Status Model::VerifyIdentity() const {
  FileInfo info;
  Status st = env_->StatPath(path_, &info);
  if (!st.ok()) return Status::ModelChanged(path_ + " is gone: " + st.message());
  if (info.size != identity_.size || info.mtime_ns != identity_.mtime_ns)
    return Status::ModelChanged(path_ + " changed since it was loaded (size or modification time differ)");
  if (info.inode != file_inode_ || info.device != file_device_)
    return Status::ModelChanged(path_ + " was replaced since it was loaded (another file is at the path)");
  auto same = [](const FileInfo& a, const FileInfo& b) {
    return a.ctime_ns != 0 && a.ctime_ns == b.ctime_ns && a.mtime_ns == b.mtime_ns && a.size == b.size &&
           a.inode == b.inode && a.device == b.device;
  };
  {
    std::lock_guard<std::mutex> lk(verify_mu_);
    if (verified_ok_ && same(info, verified_)) return Status::Ok();
  }
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env_->Open(path_, OpenMode::kRead, false, &f));
  std::vector<char> head(meta_len_);
  MZ_RETURN_IF_ERROR(ReadFully(f.get(), head.data(), head.size(), 0, path_));
  if (XXH64(head.data(), head.size(), 0) != identity_.header_hash)
    return Status::ModelChanged(path_ + " changed since it was loaded (header differs)");
  // Trusted from now on while the stat stays the same, unless this check ran so close to the last
  // change that a later write could keep its ctime (coarse timestamps): then the next call reads again.
  const int64_t now_ns = int64_t(env_->WallClockMs()) * 1000000;
  if (info.ctime_ns != 0 && now_ns - info.ctime_ns >= 2000000000LL) {
    std::lock_guard<std::mutex> lk(verify_mu_);
    verified_ = info;
    verified_ok_ = true;
  }
  return Status::Ok();
}

Status Model::LoadAll() {
  const WeightMemory mode = opts_.weights;
  std::unique_ptr<File> f;
  if (mode == WeightMemory::kAnonymous) MZ_RETURN_IF_ERROR(env_->Open(path_, OpenMode::kRead, opts_.direct_io, &f));
  std::atomic<int> next{0};
  std::vector<Status> errs(size_t(std::max(1, opts_.io_threads)));
  auto worker = [&](int t) {
    for (int u; (u = next.fetch_add(1)) < n_units();) {
      Status st = LoadUnitFrom(f.get(), units_[u], nullptr, mode);
      if (!st.ok()) {
        errs[t] = st;
        return;
      }
    }
  };
  RunOnThreads(env_, int(errs.size()), worker);  // a thread the OS refuses: the others load its units
  for (auto& e : errs)
    if (!e.ok()) return e;
  return Status::Ok();
}

}  // namespace mz
