#include "runtime/context.h"

#include "ggml.h"

#include "runtime/memory_plan.h"

#include "policy/partial_offload.h"
#include "restore/executor.h"
#include "core/sync_point.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <thread>

namespace mz {

Context::Context(Model* model, const ContextOptions& opts) : model_(model), opts_(opts) {
  const HParams& hp = model->hparams();
  KvGeometry g;
  g.n_layer = int(hp.n_layer);
  g.n_kv_head = int(hp.n_head_kv);
  g.head_dim = int(hp.head_dim);
  g.chunk_tokens = opts.kv_chunk_tokens;
  g.kv_type = opts.kv_type;
  kv_ = std::make_unique<KvCache>(model->env(), g, opts.n_ctx);
  UnitTableOptions eo;
  eo.codec = opts.kv_codec;
  eo.swap_path = opts.swap_path;
  eo.direct_io = opts.direct_io;
  eo.map_swap = opts.map_swap;
  eo.restore_threads = opts.restore_threads;
  eo.touch_restored = opts.touch_restored;
  eo.segment_cache = opts.segment_cache;
  units_ = std::make_unique<UnitTable>(model, kv_.get(), eo);
}

Forward* Context::OwnForwardLocked() {
  if (!fwd_) {
    ForwardOptions fo;
    fo.n_threads = opts_.n_threads;
    fo.n_ubatch = opts_.n_ubatch;
    fwd_ = std::make_unique<Forward>(model_, kv_.get(), fo);
    own_forward_made_.store(true);
  }
  return fwd_.get();
}

const std::vector<int>& Context::compute_cpus() const {
  static const std::vector<int> kNone;
  return own_forward_made_.load() ? fwd_->cpus() : kNone;  // set after fwd_: made and never replaced
}

const Forward& Context::forward() {
  std::lock_guard<std::mutex> lk(mu_);
  return *OwnForwardLocked();
}

Status Context::Init() {
  if (opts_.memory_check) {
    // The model is loaded: what the process holds beyond its resident weights is the overhead.
    PlanShape shape = ShapeOfModel(*model_);
    PlanRequest req;
    req.n_ctx = opts_.n_ctx;
    req.chunk_tokens = opts_.kv_chunk_tokens;
    req.n_ubatch = opts_.n_ubatch;
    req.kv_type = opts_.kv_type;
    SelfMemory self;
    uint64_t resident_weights = 0;
    for (int u = 0; u < model_->n_units(); ++u)
      if (model_->unit(u).resident()) resident_weights += model_->unit(u).region_bytes;
    if (ReadSelfMemory(model_->env(), &self)) req.overhead = self.rss > resident_weights ? self.rss - resident_weights : 0;
    MZ_RETURN_IF_ERROR(CheckFits(shape, req, ReadMemoryLimits(model_->env(), opts_.memory_budget)));
  }
  MZ_RETURN_IF_ERROR(units_->Init());
  if (opts_.fastest_cluster_only) {
    // A machine whose topology cannot be read is treated as homogeneous: nothing pinned.
    CpuTopology topo;
    if (ReadCpuTopology(model_->env(), &topo, opts_.cpu_root).ok() && topo.heterogeneous()) {
      const ComputeCpus cc = ChooseComputeCpus(topo, opts_.n_threads);
      // The fastest cluster may be outside this process's CPU set (a cpuset cgroup): then as asked.
      if (OwnForwardLocked()->SetThreads(cc.n_threads, cc.cpus).ok()) opts_.n_threads = cc.n_threads;
    }
  }
  profile_ = DeviceProfile::Default();
  std::string path = opts_.profile_path;
  if (path.empty()) {
    MZ_RETURN_IF_ERROR(CacheDir(model_->env(), &path));
    path += "/profile.json";
    FileInfo fi;
    if (!model_->env()->StatPath(path, &fi).ok()) return Status::Ok();
  }
  return DeviceProfile::Load(path, &profile_, model_->env());
}

PolicyInput Context::MakePolicyInput(uint64_t bytes) {
  PolicyInput in;
  const HParams& hp = model_->hparams();
  in.n_layer = int(hp.n_layer);
  in.n_chunks = kv_->n_chunks();
  for (int l = 0; l < in.n_layer; ++l) in.layer_bytes.push_back(model_->unit(l).region_bytes);
  in.base_bytes = model_->unit(model_->base_unit()).region_bytes;
  in.chunk_bytes = kv_->geometry().chunk_bytes();
  in.ratio = profile_.Ratio(opts_.kv_codec);
  // The profile's ratio is against fp16 chunks; a q8_0 chunk is already about that small.
  if (kv_->geometry().q8())
    in.ratio = std::min(1.0, in.ratio * double(kv_->geometry().f16_chunk_bytes()) / double(in.chunk_bytes));
  const uint64_t mean_layer = in.layer_bytes.empty() ? 0 : in.layer_bytes[0];
  RestorePaths paths;
  if (opts_.cost_restore_paths) {
    paths.weights_file_backed = model_->file_backed();
    const WeightUnit& w0 = model_->unit(0);
    if (w0.n_repack > 0 && model_->repack()) {  // the mean layer's repack, by type, where measured
      paths.weights_repacked = true;
      for (const TensorExtent& e : w0.tensors) {
        const auto r = e.repack ? profile_.repack_Bps.find(ggml_type_name(e.tensor->type)) : profile_.repack_Bps.end();
        if (r != profile_.repack_Bps.end()) paths.repack_s_per_layer += double(e.bytes) / r->second;
      }
    }
    paths.kv_mapped = units_->KvStorageMapped();
    paths.kv_in_place = opts_.attend_compressed && units_->codec_readable_in_place();
  }
  in.t = DeriveUnitTimes(profile_, opts_.kv_codec, in.chunk_bytes, mean_layer, paths);
  UnitTable* e = units_.get();
  in.state = [e](const UnitRef& u) { return e->policy_state(u); };  // borrowed chunks are never planned
  in.bytes = bytes;
  in.order = opts_.evict_order;
  in.seed = opts_.evict_seed;
  in.parallel_paths = opts_.hybrid;
  in.kv_only = opts_.shared_weights;
  return in;
}

Status Context::ReconcileLocked(RestoreGenerateStats* stats, bool weights) {
  if (opts_.reconcile_min_missing == 0) return Status::Ok();
  ReconcileStats rs;
  Status st = units_->Reconcile(opts_.reconcile_min_missing, &rs, weights && !opts_.shared_weights);
  if (stats) {
    stats->reconciled = rs;
    stats->kernel_missing_at_start = rs.missing + rs.unreconciled_missing;
  }
  return st;
}

Status Context::MeasureInRam(KernelResidency* out) {
  ForegroundLock lk(this);  // a caller waits for it: restore-ahead yields
  return units_->MeasureInRam(out);
}

Status Context::MeasureResidency(bool with_smaps, ResidencyReport* out) {
  ForegroundLock lk(this);
  return BuildResidencyReport(model_->env(), *model_, *kv_, *units_, with_smaps, out);
}

Status Context::EvictBytes(uint64_t bytes, uint64_t* freed, PolicyOutput* last_plan, EvictScope scope) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a generation is running: eviction refused (retry when it finishes)");
  if (freed) *freed = 0;
  const bool kv_only = scope == EvictScope::kKvOnly || (scope == EvictScope::kDefault && opts_.shared_weights);
  // Evict what is really in RAM: units the kernel already took count as evicted first. Weights
  // only when this call may move them (kAll: the owner of shared weights said so).
  if (opts_.reconcile_min_missing) {
    ReconcileStats rs;
    MZ_RETURN_IF_ERROR(units_->Reconcile(opts_.reconcile_min_missing, &rs, !kv_only));
  }
  uint64_t total = 0;
  // Estimates can be off (compression ratio, segment rounding): plan again until done or stuck.
  for (int round = 0; round < 8 && total < bytes; ++round) {
    PolicyInput in = MakePolicyInput(bytes - total);
    in.kv_only = kv_only;
    PolicyOutput plan = opts_.partial_offload ? PlanPartialOffload(in) : PlanHybridSwap(in);
    if (plan.plan.empty()) break;
    uint64_t f = 0;
    Status st = units_->Apply(plan.plan, bytes - total, &f);
    total += f;
    if (last_plan) *last_plan = plan;
    if (!st.ok()) {
      if (freed) *freed = total;
      return st;
    }
    if (f == 0) break;
  }
  if (freed) *freed = total;
  return Status::Ok();
}

Status Context::SetThreads(int n, const std::vector<int>& cpus) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a generation is running: threads not changed (retry when it finishes)");
  MZ_SYNC_POINT("context:set_threads_locked", n);
  MZ_RETURN_IF_ERROR(OwnForwardLocked()->SetThreads(n, cpus));
  opts_.n_threads = n;
  return Status::Ok();
}

Status Context::Evict(const Plan& plan, uint64_t bytes, uint64_t* freed) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a generation is running: eviction refused (retry when it finishes)");
  return units_->Apply(plan, bytes, freed);
}

Status Context::ImportKv(int n_tokens, const std::function<void(int, int, uint16_t*)>& fill,
                         const std::vector<int32_t>* tokens) {
  ForegroundLock lk(this);
  if (n_tokens < 0 || n_tokens > kv_->n_ctx_max())
    return Status::ContextFull("ImportKv: " + std::to_string(n_tokens) + " tokens, n_ctx " +
                               std::to_string(kv_->n_ctx_max()));
  if (tokens && int(tokens->size()) != n_tokens)
    return Status::InvalidArgument("ImportKv: " + std::to_string(tokens->size()) + " history tokens for " +
                                   std::to_string(n_tokens) + " KV rows");
  const KvGeometry& g = kv_->geometry();
  const int n = kv_->n_chunks_for(n_tokens);
  Env* env = kv_->env();
  std::vector<uint16_t*> chunks(size_t(g.n_layer) * size_t(n), nullptr);
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < n; ++c) {
      uint16_t*& p = chunks[size_t(l) * size_t(n) + size_t(c)];
      p = static_cast<uint16_t*>(env->MapAnon(g.chunk_bytes()));
      if (!p) {
        for (uint16_t* q : chunks)
          if (q) env->Unmap(q, g.chunk_bytes());
        return Status::NoMemory("ImportKv: a KV chunk");
      }
      fill(l, c, p);
    }
  if (tokens)
    history_ = *tokens;
  else
    history_.assign(size_t(n_tokens), 0);
  turn_mark_ = -1;
  logits_.clear();
  Status st = units_->ReplaceKv(n_tokens, std::move(chunks));
  if (!st.ok()) history_.clear();
  return st;
}

Status Context::BorrowShared(const int32_t* expect, int n_chunks, const std::shared_ptr<SharedChunkStore>& store,
                             const std::vector<SharedChunkStore::Ref>& refs) {
  ForegroundLock lk(this);
  const KvGeometry& g = kv_->geometry();
  const int n_tok = n_chunks * g.chunk_tokens;
  auto release_all = [&] {
    for (auto r : refs)
      if (r && store) store->Release(r);
  };
  if (!store || n_chunks <= 0 || refs.size() != size_t(g.n_layer) * size_t(n_chunks)) {
    release_all();
    return Status::InvalidArgument("BorrowShared: " + std::to_string(refs.size()) + " references for " +
                                   std::to_string(n_chunks) + " chunks");
  }
  if (history_.empty()) {
    MZ_RETURN_IF_ERROR(units_->AdoptShared(n_tok, store, refs));
    history_.assign(expect, expect + n_tok);
    turn_mark_ = -1;
    logits_.clear();
    return Status::Ok();
  }
  if (int(history_.size()) < n_tok || !std::equal(expect, expect + n_tok, history_.begin())) {
    release_all();
    return Status::InvalidArgument("BorrowShared: the conversation no longer starts with the expected tokens");
  }
  Status first;
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < n_chunks; ++c) {
      const bool attach = units_->state(UnitRef::Kv(l, c)) == UnitState::kResident;
      Status st = units_->ShareChunk(l, c, store, refs[size_t(l) * size_t(n_chunks) + size_t(c)], attach);
      if (!st.ok() && first.ok()) first = st;
    }
  return first;
}

int Context::SharedPrefixChunks() {
  ForegroundLock lk(this);
  const KvGeometry& g = kv_->geometry();
  const int full = int(history_.size()) / g.chunk_tokens;
  int k = 0;
  for (; k < full; ++k) {
    bool all = true;
    for (int l = 0; l < g.n_layer && all; ++l) all = units_->shared(l, k);
    if (!all) break;
  }
  return k;
}

Status Context::DetachShared(int* n) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a generation is running: shared chunks stay attached");
  const int d = units_->DetachShared();
  if (n) *n = d;
  return Status::Ok();
}

Status Context::ReadKvChunk(const int32_t* expect, int n_expect, int layer, int chunk, uint16_t* dst) {
  ForegroundLock lk(this);
  const KvGeometry& g = kv_->geometry();
  if (layer < 0 || layer >= g.n_layer || chunk < 0 || n_expect < (chunk + 1) * g.chunk_tokens ||
      n_expect > int(history_.size()) || !std::equal(expect, expect + n_expect, history_.begin()))
    return Status::InvalidArgument("ReadKvChunk: the conversation no longer starts with the expected tokens");
  return units_->ReadChunk(layer, chunk, dst);
}

void Context::set_touch_restored(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  opts_.touch_restored = on;
  units_->set_touch_restored(on);
}

void Context::set_map_swap(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  units_->set_map_swap(on);
}

Status Context::Restore() {
  ForegroundLock lk(this);
  return RunRestore(units_.get(), RestoreRequest());
}

MemoryReport Context::Report() {
  std::lock_guard<std::mutex> lk(mu_);
  return units_->Report();
}

Status Context::Decode(const int32_t* tokens, int n, bool all_logits) {
  SafePointOnExit safe_point{this};
  ForegroundLock lk(this);
  MZ_SYNC_POINT("context:decode_locked", n);
  // Chunks this call writes must be resident; earlier ones may stay compressed if compute reads
  // them in place (opts_.attend_compressed).
  const int first_write = int(history_.size()) / kv_->geometry().chunk_tokens;
  if (units_->shared(0, first_write))  // a full chunk is never written: a borrowed one least of all
    return Status::Internal("Decode: the chunk to write is borrowed from the shared store");
  RestoreRequest req;
  if (opts_.attend_compressed) {
    req.mode = RestoreMode::kForCompute;
    req.attend_compressed_below = first_write;
  }
  units_->set_write_until(int(history_.size()) + n);  // a partial chunk's rows this pass writes come back populated
  Status rs = RunRestore(units_.get(), req);
  units_->set_write_until(0);
  MZ_RETURN_IF_ERROR(rs);
  const uint64_t tc = model_->env()->NowNs();
  MZ_RETURN_IF_ERROR(ComputeLocked(tokens, n, all_logits));
  if (!all_logits) NoteComputeLocked(n, model_->env()->NowNs() - tc);
  history_.insert(history_.end(), tokens, tokens + n);
  return Status::Ok();
}

Status Context::TryReleaseComputeBuffers(uint64_t* freed) {
  *freed = 0;
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a call holds the context: its compute buffers stay");
  if (opts_.batcher || !fwd_) return Status::Ok();  // the batcher's buffers, or none made yet
  *freed = fwd_->ReleaseComputeBuffers();
  compute_buffer_bytes_.store(0);
  return Status::Ok();
}

void Context::NoteComputeLocked(int n, uint64_t ns) {
  if (n < 2 || ns == 0) return;  // one-token steps cost more per token than a prompt
  const double s = double(ns) * 1e-9 / n, old = compute_s_per_token_.load();
  compute_s_per_token_.store(old > 0 ? 0.5 * old + 0.5 * s : s);
}

RestoreCosts Context::RestoreModeCosts(int n, const PipelineOptions& po) {
  ForegroundLock lk(this);
  return RestoreModeCostsLocked(n, po);
}

RestoreCosts Context::RestoreModeCostsLocked(int n, const PipelineOptions& po) {
  RestoreCosts c;
  std::vector<int> cpus;
  c.cores = model_->env()->GetThreadAffinity(&cpus).ok() && !cpus.empty() ? int(cpus.size()) : 1;
  c.compute_threads = opts_.batcher ? opts_.batcher->options().n_threads : opts_.n_threads;
  c.io_workers = po.io_threads;
  c.decode_workers = po.decode_threads;
  c.compute_s = compute_s_per_token_.load() * n;
  const MemoryReport r = units_->Report();
  const DeviceProfile& p = profile_;
  const uint64_t layer = model_->unit(0).region_bytes, chunk = kv_->geometry().chunk_bytes();
  const double mib = 1.0 / 1048576.0;
  // Page-cache reads are CPU work in the reading thread; the profile measured them on two threads.
  auto mapped_s = [&](uint64_t bytes, uint64_t piece) { return double(bytes) / (p.MappedReadBps(piece) / 2); };
  if (model_->file_backed()) {
    c.restore_cpu_s += mapped_s(r.weights_dropped, layer);
  } else {
    c.restore_wait_s += double(r.weights_dropped) / p.ReadBps(4u << 20) / std::max(1, po.io_threads);
    c.restore_cpu_s += double(r.weights_dropped) * mib * p.alloc_s_per_MiB;
  }
  if (units_->KvStorageMapped()) {
    c.restore_cpu_s += mapped_s(r.kv_storage_raw, chunk);
  } else {
    c.restore_wait_s += double(r.kv_storage_raw) / p.ReadBps(chunk) / std::max(1, po.io_threads);
    c.restore_cpu_s += double(r.kv_storage_raw) * mib * p.alloc_s_per_MiB;
  }
  // Compressed chunks: read in place by attention (their loads from storage only wait), or decoded.
  const bool in_place = po.attend_compressed && opts_.attend_compressed && units_->codec_readable_in_place();
  c.restore_wait_s += double(r.kv_storage_compressed) / p.ReadBps(chunk) / std::max(1, po.io_threads);
  if (!in_place) {
    const uint64_t raw = r.kv_storage_compressed_raw + r.kv_mem_compressed_raw;
    c.restore_cpu_s += double(raw) / p.DecodeBps(opts_.kv_codec) + double(raw) * mib * p.alloc_s_per_MiB;
  }
  return c;
}

Status Context::ComputeLocked(const int32_t* tokens, int n, bool all_logits, const std::function<Status(int)>& wait,
                              const std::function<bool()>& restoring, int threads_while_restoring, double* wait_s) {
  cancel_.store(false);
  if (!opts_.batcher) {
    Forward* fwd = OwnForwardLocked();
    fwd->set_wait(wait);
    Status st = fwd->Decode(tokens, n, all_logits, &logits_);
    if (wait_s) *wait_s = fwd->timing().wait_s;
    fwd->set_wait(nullptr);
    compute_buffer_bytes_.store(fwd->compute_buffer_bytes());
    return st;
  }
  Batcher::Request r;
  r.kv = kv_.get();
  r.tokens = tokens;
  r.n = n;
  r.all_logits = all_logits;
  r.logits = &logits_;
  r.wait = wait;
  r.restoring = restoring;
  r.threads_while_restoring = threads_while_restoring;
  r.cancel = &cancel_;
  r.decoding_since_ns = n == 1 ? decoding_since_ns_ : 0;
  Status st = opts_.batcher->Run(&r);
  if (wait_s) *wait_s = r.wait_s;
  if (st.ok() && n > 1) decoding_since_ns_ = model_->env()->NowNs();
  return st;
}

int Context::n_logit_rows() const {
  const size_t nv = model_->hparams().n_vocab;
  return int(logits_.size() / nv);
}

const float* Context::logits(int row) const {
  if (row < 0 || row >= n_logit_rows()) return nullptr;
  return logits_.data() + size_t(row) * model_->hparams().n_vocab;
}

Status Context::SetTurnMark(int n) {
  std::lock_guard<std::mutex> lk(mu_);
  if (n < 0 || n > int(history_.size()))
    return Status::InvalidArgument("turn mark " + std::to_string(n) + " outside the history (" +
                                   std::to_string(history_.size()) + " tokens)");
  turn_mark_ = n;
  return Status::Ok();
}

void Context::Truncate(int n_keep) {
  std::lock_guard<std::mutex> lk(mu_);
  if (n_keep < 0) n_keep = 0;
  if (n_keep >= int(history_.size())) return;
  const int T = kv_->geometry().chunk_tokens;
  if (n_keep % T != 0) {
    // Copy-on-write: rows of the chunk kept in part will be written again; a borrowed (shared)
    // chunk becomes this context's own copy first. If it cannot be copied, it is dropped whole.
    bool any = false;
    for (int l = 0; l < kv_->geometry().n_layer; ++l) any = any || units_->shared(l, n_keep / T);
    if (any && !units_->Unshare(n_keep / T).ok()) n_keep = n_keep / T * T;
  }
  history_.resize(size_t(n_keep));
  if (turn_mark_ > n_keep) turn_mark_ = -1;
  units_->ForgetChunksFrom(kv_->n_chunks_for(n_keep));
  // Rows from n_keep on will be written again: a chunk mapped from the swap that holds them is no
  // longer a copy of its extent once they are.
  if (n_keep % kv_->geometry().chunk_tokens != 0) units_->WillRewriteChunk(n_keep / kv_->geometry().chunk_tokens);
  kv_->Truncate(n_keep);
  logits_.clear();
}

}  // namespace mz

namespace mz {

static double CpuSeconds(Env* env) { return double(env->ProcessCpuNs()) * 1e-9; }

Status Context::RestoreGenerate(const int32_t* tokens, int n, const PipelineOptions& po, RestoreGenerateStats* stats) {
  SafePointOnExit safe_point{this};
  ForegroundLock lk(this);
  MZ_SYNC_POINT("context:decode_locked", n);
  const uint64_t t0 = model_->env()->NowNs();
  const double c0 = CpuSeconds(model_->env());
  const int start = int(history_.size());
  if (stats) {
    *stats = RestoreGenerateStats();
    const MemoryReport r = units_->Report();
    stats->counted_resident_at_start = r.weights_resident + r.kv_resident;
  }
  // Units the kernel took back under pressure are restored by the pipeline, not faulted by compute.
  MZ_RETURN_IF_ERROR(ReconcileLocked(stats));
  if (stats) stats->remaining_at_start = units_->Report().remaining(true);
  // Chunks for the new tokens exist before workers run (the chunk table must not grow under them).
  MZ_RETURN_IF_ERROR(kv_->Reserve(start + n));
  // A partial chunk's rows this call writes come back populated and touched with its valid rows
  // (UnitTable::RestoreRanges); cleared on every return below.
  units_->set_write_until(start + n);
  struct ClearWriteUntil {
    UnitTable* u;
    ~ClearWriteUntil() { u->set_write_until(0); }
  } clear_write_until{units_.get()};
  PipelineOptions pipe_opts = po;
  pipe_opts.attend_compressed_below =
      po.attend_compressed && opts_.attend_compressed ? start / kv_->geometry().chunk_tokens : 0;
  if (opts_.batcher && opts_.batcher->active() > 0) {
    // Others are generating through the shared pass: this call's units come back first, then it
    // joins the batch. Their steps never wait for its units; with restore_nice_beside_batch the
    // restore runs on one thread below their priority, so it takes the CPU time their steps leave
    // instead of half their cores.
    RestoreRequest req;
    if (pipe_opts.attend_compressed_below > 0) {
      req.mode = RestoreMode::kForCompute;
      req.attend_compressed_below = pipe_opts.attend_compressed_below;
    }
    Status st;
    Env* env = model_->env();
    std::thread low;
    if (opts_.restore_nice_beside_batch > 0) {
      req.threads = 1;
      const int nice = std::min(19, env->ThreadNice() + opts_.restore_nice_beside_batch);
      if (!env->StartThread([&] {
             (void)env->SetThreadNice(nice);  // raising the nice is always allowed; a refusal: as is
             st = RunRestore(units_.get(), req);
           }, &low).ok())
        st = RunRestore(units_.get(), req);  // no thread: on this one, at its priority
      else
        low.join();
    } else {
      st = RunRestore(units_.get(), req);
    }
    const uint64_t tr = model_->env()->NowNs();
    if (st.ok()) st = ComputeLocked(tokens, n, false);
    if (!st.ok()) {
      kv_->Truncate(start);
      return st;
    }
    history_.insert(history_.end(), tokens, tokens + n);
    if (stats) {
      stats->ttft_s = double(model_->env()->NowNs() - t0) * 1e-9;
      stats->wait_s = double(tr - t0) * 1e-9;  // the restore ran before compute
      stats->cpu_s = CpuSeconds(model_->env()) - c0;
      stats->compute_threads_during_restore = 0;
    }
    return Status::Ok();
  }
  // The one place a restore-mode plan is applied (kAuto): overlap or serial, workers, threads.
  RestoreModePlan plan;
  const bool auto_mode = po.overlap == Overlap::kAuto;
  if (auto_mode) {
    const RestoreCosts costs = RestoreModeCostsLocked(n, po);
    plan = PlanRestoreMode(costs);
    pipe_opts.overlap = plan.overlap ? Overlap::kFull : Overlap::kNone;
    pipe_opts.io_threads = plan.io_workers;
    pipe_opts.decode_threads = plan.decode_workers;
    if (stats) stats->mode_costs = costs;
  }
  if (stats) {
    stats->overlap = pipe_opts.overlap;
    stats->auto_mode = auto_mode;
    stats->mode_plan = plan;
  }
  RestorePipeline pipe(units_.get(), int(model_->hparams().n_layer), pipe_opts);
  Status st = pipe.Start();
  const int full = opts_.batcher ? opts_.batcher->options().n_threads : opts_.n_threads;
  // Restoration threads that run ahead of compute (restore_nice granted) need no core kept free;
  // a kAuto plan says how many compute keeps while restoration runs.
  const int during = pipe.done() || pipe.restore_priority_raised() ? full
                     : po.compute_threads_while_restoring > 0     ? std::min(full, po.compute_threads_while_restoring)
                     : auto_mode                                  ? std::max(1, std::min(full, plan.compute_threads_during))
                                                                  : std::max(1, full - 1);
  const bool restored_before_compute = pipe.done();
  const uint64_t tc = model_->env()->NowNs();
  double wait = 0;
  if (opts_.batcher) {
    // Alone in the batcher while it restores (front layers first, overlapped with this prefill);
    // once every unit is back it batches with whoever arrived meanwhile. A restore that failed
    // keeps it alone with the waits, so the failing layer's Wait returns the restore's error to
    // this call only (never a step of other conversations failing on a unit that is not there).
    MZ_SYNC_POINT("context:before_batched_restore_compute", 0);  // tests: let the restore finish first
    if (st.ok())
      st = ComputeLocked(
          tokens, n, false, [&](int unit) { return pipe.Wait(unit); }, [&] { return !pipe.done() || pipe.failed(); },
          during, &wait);
  } else {
    Forward* fwd = OwnForwardLocked();
    fwd->set_n_threads(during);
    if (st.ok())
      st = ComputeLocked(
          tokens, n, false,
          [&](int unit) -> Status {
            Status s = pipe.Wait(unit);
            if ((pipe.done() || (po.full_threads_for_io && pipe.cpu_work_done())) && fwd->n_threads() != full)
              fwd->set_n_threads(full);
            return s;
          },
          nullptr, 0, &wait);
    fwd->set_n_threads(full);
  }
  const uint64_t t1 = model_->env()->NowNs();
  // Compute that never waited for a unit measures the prefill rate the restore-mode plan uses.
  if (st.ok() && restored_before_compute) NoteComputeLocked(n, t1 - tc);
  Status fin = pipe.Finish();
  // The restore's error is the cause when compute found a unit not there (kBusy) after it.
  if (!fin.ok() && (st.ok() || st.code() == Status::kBusy)) st = fin;
  if (!st.ok()) {
    kv_->Truncate(start);
    return st;
  }
  history_.insert(history_.end(), tokens, tokens + n);
  if (stats) {
    stats->pipeline = pipe.stats();
    stats->ttft_s = double(t1 - t0) * 1e-9;
    stats->wait_s = wait;
    stats->cpu_s = CpuSeconds(model_->env()) - c0;
    stats->compute_threads_during_restore = during;
  }
  return Status::Ok();
}

}  // namespace mz

namespace mz {

bool Context::TryReport(MemoryReport* out) {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return false;
  *out = units_->Report();
  return true;
}

Status Context::TryRestoreUpTo(uint64_t max_bytes, uint64_t* restored, bool yield) {
  if (restored) *restored = 0;
  if (yield && fg_waiting_.load() > 0) return Status::Busy("restore-ahead yields to a foreground call");
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) return Status::Busy("a generation is running: restore skipped (it restores what it needs)");
  // Restore what the kernel took as well as what mzcache evicted, front layers first.
  MZ_RETURN_IF_ERROR(ReconcileLocked());
  RestoreRequest req;
  req.mode = RestoreMode::kUpTo;
  req.max_bytes = max_bytes;
  if (yield) req.stop = [this] { return fg_waiting_.load() > 0; };
  RestoreResult res;
  Status st = RunRestore(units_.get(), req, &res);
  if (restored) *restored = res.restored;
  if (st.ok() && res.stopped && res.restored == 0) return Status::Busy("restore-ahead yielded to a foreground call");
  return st;
}

void Context::SetSafePointHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lk(hook_mu_);
  safe_point_hook_ = std::move(hook);
}

void Context::RunSafePoint() {
  MZ_SYNC_POINT("context:safe_point", 0);
  std::lock_guard<std::mutex> lk(hook_mu_);
  if (!safe_point_hook_) return;
  try {
    safe_point_hook_();
  } catch (...) {
  }
}

}  // namespace mz
