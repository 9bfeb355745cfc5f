#include "runtime/forward.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/q8_block.h"
#include "store/q8_kv.h"

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace mz {
namespace {

// Seconds on env's monotonic clock.
double Now(Env* env) { return double(env->NowNs()) * 1e-9; }

// One sequence of a layer graph: its cache and its columns [row0, row0 + n) of the ubatch, at
// positions [pos0, pos0 + n).
struct SeqSlice {
  KvCache* kv;
  int row0, n, pos0;
};

// Shared by the two custom ops of one layer graph; lives on the stack of RunUbatch.
struct LayerOpData {
  const SeqSlice* seqs;
  int n_seqs;
  const int* seq_of_row;  // [n_tokens]: which slice each column belongs to
  int layer;
  int n_tokens;
  float scale;
};

// dst->src[0] = k [D, Hkv, n] f32, dst->src[1] = v [D, Hkv, n] f32. Writes fp16 rows into each
// column's sequence's chunks (q8_0 KV: q8 rows, store/q8_kv.h). Threads split columns. The fp16
// rounding is ggml-cpu's (ggml_cpu_fp32_to_fp16: the CPU's F16C conversion where the build has it,
// round to nearest even, the same values as ggml's scalar ggml_fp32_to_fp16_row, which took 3% of
// a prefill's samples; session 37).
void KvStoreOp(ggml_tensor* dst, int ith, int nth, void* ud) {
  auto* d = static_cast<LayerOpData*>(ud);
  const ggml_tensor* k = dst->src[0];
  const ggml_tensor* v = dst->src[1];
  thread_local std::vector<uint16_t> h16;
  for (int i = ith; i < d->n_tokens; i += nth) {
    const SeqSlice& s = d->seqs[d->seq_of_row[i]];
    KvCache* kv = s.kv;
    const KvGeometry& g = kv->geometry();
    const int D = g.head_dim, H = g.n_kv_head, T = g.chunk_tokens;
    const int pos = s.pos0 + (i - s.row0);
    const int c = pos / T, off = pos % T;
    if (g.q8()) {
      // q8_0 KV: each row (one token of one kv head) rounded to fp16 as below, then q8-encoded into
      // row `off` of its segment (rows = T); rows are independent.
      if (int(h16.size()) < D) h16.resize(size_t(D));
      uint8_t* q = reinterpret_cast<uint8_t*>(kv->chunk(d->layer, c));
      for (int b = 0; b < 2; ++b) {
        const ggml_tensor* src = b == 0 ? k : v;
        for (int h = 0; h < H; ++h) {
          const float* x = reinterpret_cast<const float*>(static_cast<const char*>(src->data) + i * src->nb[2] + h * src->nb[1]);
          ggml_cpu_fp32_to_fp16(x, reinterpret_cast<ggml_fp16_t*>(h16.data()), D);
          uint8_t* seg = q8_segment(q, T, D, b * H + h);
          Q8KvEncodeRow(h16.data(), D, q8_row_codes(seg, T, D, off), q8_row_amax(seg, off));
        }
      }
      continue;
    }
    uint16_t* kb = kv->k_block(d->layer, c);
    uint16_t* vb = kv->v_block(d->layer, c);
    for (int h = 0; h < H; ++h) {
      const float* ks = reinterpret_cast<const float*>(static_cast<const char*>(k->data) + i * k->nb[2] + h * k->nb[1]);
      const float* vs = reinterpret_cast<const float*>(static_cast<const char*>(v->data) + i * v->nb[2] + h * v->nb[1]);
      uint16_t* kd = kb + (size_t(h) * T + off) * D;
      uint16_t* vd = vb + (size_t(h) * T + off) * D;
      ggml_cpu_fp32_to_fp16(ks, reinterpret_cast<ggml_fp16_t*>(kd), D);
      ggml_cpu_fp32_to_fp16(vs, reinterpret_cast<ggml_fp16_t*>(vd), D);
    }
  }
}

// dst [D, H, n] f32 = attention(q = dst->src[0] [D, H, n] f32 contiguous), each sequence's columns
// over its own layer's chunks. Every thread takes its share of every sequence (attention_chunked's
// split: disjoint output rows, no barrier).
void AttentionOp(ggml_tensor* dst, int ith, int nth, void* ud) {
  auto* d = static_cast<LayerOpData*>(ud);
  const ggml_tensor* q = dst->src[0];
  const int H = int(q->ne[1]), D = int(q->ne[0]);
  for (int si = 0; si < d->n_seqs; ++si) {
    const SeqSlice& s = d->seqs[si];
    AttnArgs a;
    a.q = static_cast<const float*>(q->data) + size_t(s.row0) * H * D;
    a.out = static_cast<float*>(dst->data) + size_t(s.row0) * H * D;
    a.n_tokens = s.n;
    a.n_head = H;
    a.pos0 = s.pos0;
    a.scale = d->scale;
    KvLayerView view = s.kv->view(d->layer, s.pos0 + s.n);
    attention_chunked(a, view, ith, nth);
  }
}

ggml_tensor* Norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* w, float eps) {
  return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

}  // namespace

// File-local helpers of the graph builders (named: unity builds share anonymous namespaces).
namespace forward_graph {

// The residual stream [E, n] f32 as a graph input or output at `data` (outside the compute buffers).
ggml_tensor* ActTensor(ggml_context* ctx, void* data, int E, int n) {
  ggml_tensor* t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, E, n);
  t->data = data;
  return t;
}

// kBusy unless, for each slice, every KV chunk layer il reads is readable (resident, or compressed
// in a form attention reads) and every chunk it writes is resident.
Status CheckLayerKv(const std::vector<SeqSlice>& slices, int il) {
  for (const SeqSlice& sl : slices) {
    KvCache* kv = sl.kv;
    const int first_write = sl.pos0 / kv->geometry().chunk_tokens;
    for (int c = 0; c < first_write; ++c)
      if (!kv->chunk_readable(il, c)) return Status::Busy("KV chunk " + std::to_string(c) + " of layer " +
                                                          std::to_string(il) + " is not in memory");
    for (int c = first_write; c < kv->n_chunks_for(sl.pos0 + sl.n); ++c)
      if (!kv->chunk_resident(il, c)) return Status::Busy("KV chunk " + std::to_string(c) + " of layer " +
                                                          std::to_string(il) + " is not resident");
  }
  return Status::Ok();
}

}  // namespace forward_graph

// Under ThreadSanitizer, ggml computes on the calling thread only: its OpenMP fork/join and barriers
// live in uninstrumented libraries (libgomp, libggml-cpu), so TSan would report every hand-off to
// our custom ops as a race. Our own threads (restoration workers, swap, codecs) still run
// concurrently with compute and are fully checked.
#if defined(__SANITIZE_THREAD__)
static int ComputeThreads(int n) { return n > 0 ? 1 : n; }
#else
static int ComputeThreads(int n) { return n; }
#endif

Forward::Forward(Model* model, KvCache* kv, const ForwardOptions& opts) : model_(model), kv_(kv), opts_(opts) {
  backend_ = ggml_backend_cpu_init();
  ggml_backend_cpu_set_n_threads(backend_, ComputeThreads(opts_.n_threads));
  galloc_ = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
  meta_buf_.resize(ggml_tensor_overhead() * kGraphSize + ggml_graph_overhead_custom(kGraphSize, false));
}

bool Forward::whole_step_fits() const {
  // Tensors of a whole step: per layer (BuildLayer) at most kTensorsPerLayer, plus the ids,
  // positions, embedding and head (a few): each one a tensor of the metadata buffer and at most one
  // node or leaf of the graph.
  return int64_t(model_->hparams().n_layer) * kTensorsPerLayer + 32 <= kGraphSize;
}

Forward::~Forward() {
  ggml_gallocr_free(galloc_);
  ggml_backend_free(backend_);
  if (pool_) ggml_threadpool_free(pool_);
}

void Forward::set_n_threads(int n) {
  n = std::max(1, n);
  if (pool_) n = std::min(n, pool_threads_);  // ggml indexes the pool's workers by thread number
  opts_.n_threads = n;
  ggml_backend_cpu_set_n_threads(backend_, ComputeThreads(n));
}

Status Forward::SetThreads(int n, const std::vector<int>& cpus) {
  if (n < 1 || n > GGML_MAX_N_THREADS)
    return Status::InvalidArgument("n_threads " + std::to_string(n) + " outside [1, " +
                                   std::to_string(GGML_MAX_N_THREADS) + "]");
  Env* env = model_->env();
  std::vector<int> allowed;
  if (!cpus.empty() || pool_) MZ_RETURN_IF_ERROR(env->GetThreadAffinity(&allowed).With("CPUs this thread may use"));
  std::vector<int> use;
  if (!cpus.empty()) {
    if (int(cpus.size()) < n)
      return Status::InvalidArgument(std::to_string(n) + " threads pinned to " + std::to_string(cpus.size()) +
                                     " CPUs (one CPU per thread)");
    use.assign(cpus.begin(), cpus.begin() + n);
    std::vector<int> sorted = use;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i > 0 && sorted[i] == sorted[i - 1]) return Status::InvalidArgument("CPU " + std::to_string(sorted[i]) + " listed twice");
      if (sorted[i] < 0 || sorted[i] >= GGML_MAX_N_THREADS || !std::binary_search(allowed.begin(), allowed.end(), sorted[i]))
        return Status::InvalidArgument("CPU " + std::to_string(sorted[i]) + " is not one this process may run on");
    }
  }
  ggml_threadpool* pool = nullptr;
  if (!use.empty() || pool_) {
    // Pinned: a strict mask, thread i on the i-th of `use` (ascending). Unpinned after a pinned
    // pool: a loose mask of every allowed CPU, which ggml applies to each worker, undoing the pin.
    ggml_threadpool_params tp = ggml_threadpool_params_default(n);
    for (int c : use.empty() ? allowed : use)
      if (c >= 0 && c < GGML_MAX_N_THREADS) tp.cpumask[c] = true;
    tp.strict_cpu = !use.empty();
    pool = ggml_threadpool_new(&tp);
    if (!pool) return Status::NoMemory("ggml_threadpool_new(" + std::to_string(n) + " threads)");
  }
  // Nothing fails past this point.
  if (pool) {
    ggml_backend_cpu_set_threadpool(backend_, pool);
    if (pool_) ggml_threadpool_free(pool_);
    pool_ = pool;
    pool_threads_ = n;
  }
  cpus_ = std::move(use);
  set_n_threads(n);
  return Status::Ok();
}

Status Forward::Wait(int unit) {
  if (wait_) {
    double t0 = Now(model_->env());
    Status st = wait_(unit);
    timing_.wait_s += Now(model_->env()) - t0;
    MZ_RETURN_IF_ERROR(st);
  }
  if (!model_->unit(unit).resident())
    return Status::Busy("weight unit " + std::to_string(unit) + " is not resident (restore it first)");
  return Status::Ok();
}

Status Forward::ComputeAndFree(ggml_context* ctx, ggml_tensor* out) {
  ggml_cgraph* gf = ggml_new_graph_custom(ctx, kGraphSize, false);
  ggml_build_forward_expand(gf, out);
  timing_.graphs++;
  Status st = Status::Ok();
  if (!ggml_gallocr_alloc_graph(galloc_, gf)) st = Status::NoMemory("allocating compute buffers");
  else if (ggml_backend_graph_compute(backend_, gf) != GGML_STATUS_SUCCESS) st = Status::Internal("graph compute failed");
  ggml_free(ctx);
  return st;
}

Status Forward::Decode(const int32_t* tokens, int n, bool all_logits, std::vector<float>* logits) {
  if (!pool_) return DecodePass(tokens, n, all_logits, logits);
  // ggml pins the calling thread as compute thread 0 (OpenMP) and leaves it so; one thread runs
  // on the caller alone and ggml does not pin it: do it here. Put the caller's affinity back after.
  Env* env = model_->env();
  std::vector<int> saved;
  const bool restore = env->GetThreadAffinity(&saved).ok() && !saved.empty();
  if (!cpus_.empty() && opts_.n_threads == 1) (void)env->SetThreadAffinity({cpus_[0]});  // best effort: a refusal only costs placement
  Status st = DecodePass(tokens, n, all_logits, logits);
  if (restore) (void)env->SetThreadAffinity(saved);
  return st;
}

uint64_t Forward::compute_buffer_bytes() const { return galloc_ ? ggml_gallocr_get_buffer_size(galloc_, 0) : 0; }

uint64_t Forward::ReleaseComputeBuffers() {
  const uint64_t bytes = compute_buffer_bytes();
  if (bytes == 0) return 0;
  ggml_gallocr_free(galloc_);
  galloc_ = ggml_gallocr_new(ggml_backend_cpu_buffer_type());  // empty: allocates at the next graph
  return bytes;
}

Status Forward::DecodePass(const int32_t* tokens, int n, bool all_logits, std::vector<float>* logits) {
  if (n <= 0) return Status::InvalidArgument("no tokens to decode");
  if (!kv_) return Status::InvalidArgument("Decode: this pass has no KV cache of its own (use Step)");
  const int n_vocab = int(model_->hparams().n_vocab);
  for (int i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= n_vocab)
      return Status::InvalidArgument("token id " + std::to_string(tokens[i]) + " out of range [0, " +
                                     std::to_string(n_vocab) + ")");
  const int start = kv_->n_tokens();
  Status st = kv_->Reserve(start + n);
  if (!st.ok()) {
    kv_->Truncate(start);
    return st;
  }
  timing_ = LayerTiming();
  logits->clear();
  for (int off = 0; off < n; off += opts_.n_ubatch) {
    const int m = std::min(opts_.n_ubatch, n - off);
    const bool want = all_logits || off + m == n;
    Seq seq;
    seq.kv = kv_;
    seq.tokens = tokens + off;
    seq.n = m;
    seq.n_logits = want ? (all_logits ? m : 1) : 0;
    seq.logits = logits;
    st = RunUbatch(&seq, 1);
    if (!st.ok()) {
      kv_->Truncate(start);
      return st;
    }
    kv_->SetTokens(start + off + m);
  }
  return Status::Ok();
}

Status Forward::Step(Seq* seqs, int n_seqs) {
  if (n_seqs <= 0) return Status::InvalidArgument("Step: no sequences");
  const int n_vocab = int(model_->hparams().n_vocab);
  int total = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const Seq& q = seqs[s];
    if (!q.kv || !q.tokens || q.n <= 0 || (q.n_logits != 0 && q.n_logits != 1 && q.n_logits != q.n) ||
        (q.n_logits && !q.logits))
      return Status::InvalidArgument("Step: sequence " + std::to_string(s) + " is malformed");
    for (int t = 0; t < s; ++t)
      if (seqs[t].kv == q.kv) return Status::InvalidArgument("Step: a KV cache appears twice");
    if (q.kv->n_chunks() < q.kv->n_chunks_for(q.kv->n_tokens() + q.n))
      return Status::InvalidArgument("Step: sequence " + std::to_string(s) + " has no chunks reserved");
    if (q.kv->geometry().n_layer != int(model_->hparams().n_layer) ||
        q.kv->geometry().n_kv_head != int(model_->hparams().n_head_kv) ||
        q.kv->geometry().head_dim != int(model_->hparams().head_dim))
      return Status::InvalidArgument("Step: a KV cache of another model");
    for (int i = 0; i < q.n; ++i)
      if (q.tokens[i] < 0 || q.tokens[i] >= n_vocab)
        return Status::InvalidArgument("token id " + std::to_string(q.tokens[i]) + " out of range [0, " +
                                       std::to_string(n_vocab) + ")");
    total += q.n;
  }
  if (total > opts_.n_ubatch)
    return Status::InvalidArgument("Step: " + std::to_string(total) + " tokens exceed n_ubatch " +
                                   std::to_string(opts_.n_ubatch));
  std::vector<size_t> before(static_cast<size_t>(n_seqs));
  for (int s = 0; s < n_seqs; ++s) before[size_t(s)] = seqs[s].logits ? seqs[s].logits->size() : 0;
  timing_ = LayerTiming();
  Env* env = model_->env();
  std::vector<int> saved;
  const bool restore = pool_ && env->GetThreadAffinity(&saved).ok() && !saved.empty();
  if (pool_ && !cpus_.empty() && opts_.n_threads == 1) (void)env->SetThreadAffinity({cpus_[0]});
  Status st = RunUbatch(seqs, n_seqs);
  if (restore) (void)env->SetThreadAffinity(saved);
  for (int s = 0; s < n_seqs; ++s) {
    if (st.ok()) {
      seqs[s].kv->SetTokens(seqs[s].kv->n_tokens() + seqs[s].n);
    } else {
      seqs[s].kv->Truncate(seqs[s].kv->n_tokens());  // rows past the old length are dropped
      if (seqs[s].logits) seqs[s].logits->resize(before[size_t(s)]);
    }
  }
  return st;
}

ggml_tensor* Forward::BuildLayer(ggml_context* ctx, int il, ggml_tensor* x, ggml_tensor* pos, void* od) {
  const HParams& hp = model_->hparams();
  const int D = int(hp.head_dim), H = int(hp.n_head), HKV = int(hp.n_head_kv);
  const int n = int(x->ne[1]);
  const BaseTensors& B = model_->base();
  const LayerTensors& L = model_->layer(il);

  ggml_tensor* cur = Norm(ctx, x, L.attn_norm, hp.rms_eps);
  ggml_tensor* q = ggml_mul_mat(ctx, L.wq, cur);
  ggml_tensor* k = ggml_mul_mat(ctx, L.wk, cur);
  ggml_tensor* v = ggml_mul_mat(ctx, L.wv, cur);
  if (L.bq) q = ggml_add(ctx, q, L.bq);
  if (L.bk) k = ggml_add(ctx, k, L.bk);
  if (L.bv) v = ggml_add(ctx, v, L.bv);
  q = ggml_reshape_3d(ctx, q, D, H, n);
  k = ggml_reshape_3d(ctx, k, D, HKV, n);
  v = ggml_reshape_3d(ctx, v, D, HKV, n);
  if (L.q_norm) q = Norm(ctx, q, L.q_norm, hp.rms_eps);
  if (L.k_norm) k = Norm(ctx, k, L.k_norm, hp.rms_eps);
  const int mode = int(hp.rope_type);
  q = ggml_rope_ext(ctx, q, pos, B.rope_freqs, int(hp.n_rot), mode, int(hp.n_ctx_train), hp.rope_freq_base,
                    hp.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
  k = ggml_rope_ext(ctx, k, pos, B.rope_freqs, int(hp.n_rot), mode, int(hp.n_ctx_train), hp.rope_freq_base,
                    hp.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
  ggml_tensor* store_args[2] = {k, v};
  ggml_tensor* stored = ggml_custom_4d(ctx, GGML_TYPE_F32, 1, 1, 1, 1, store_args, 2, KvStoreOp,
                                       GGML_N_TASKS_MAX, od);
  ggml_tensor* attn_args[2] = {q, stored};
  ggml_tensor* attn = ggml_custom_4d(ctx, GGML_TYPE_F32, D, H, n, 1, attn_args, 2, AttentionOp,
                                     GGML_N_TASKS_MAX, od);
  cur = ggml_reshape_2d(ctx, attn, D * H, n);
  cur = ggml_mul_mat(ctx, L.wo, cur);
  ggml_tensor* h = ggml_add(ctx, cur, x);
  cur = Norm(ctx, h, L.ffn_norm, hp.rms_eps);
  ggml_tensor* gate = ggml_mul_mat(ctx, L.ffn_gate, cur);
  ggml_tensor* up = ggml_mul_mat(ctx, L.ffn_up, cur);
  cur = ggml_swiglu_split(ctx, gate, up);
  cur = ggml_mul_mat(ctx, L.ffn_down, cur);
  return ggml_add(ctx, cur, h);
}

ggml_tensor* Forward::BuildHead(ggml_context* ctx, ggml_tensor* act, int n_out, bool tail) {
  const HParams& hp = model_->hparams();
  const BaseTensors& B = model_->base();
  const int E = int(hp.n_embd), n = int(act->ne[1]);
  ggml_tensor* x = act;
  if (tail) {  // the last n_out columns (one sequence's rows): a view
    x = ggml_view_2d(ctx, act, E, n_out, act->nb[1], size_t(n - n_out) * act->nb[1]);
  } else {
    ggml_tensor* rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_out);
    rows->data = out_rows_.data();
    x = ggml_get_rows(ctx, act, rows);
  }
  ggml_tensor* cur = Norm(ctx, x, B.output_norm, hp.rms_eps);
  // The logits [n_vocab, n_out] are written straight into out_ (resized by the caller): a tensor
  // with its data set is not placed in the compute buffers, which would otherwise hold n_vocab
  // floats per row (39 MB for 64 rows of a 152k vocabulary). Reservation passes no out_.
  cur = ggml_mul_mat(ctx, B.output, cur);
  cur->data = out_.empty() ? static_cast<void*>(&reserve_only_) : static_cast<void*>(out_.data());
  return cur;
}

ggml_tensor* Forward::BuildEmbed(ggml_context* ctx, int n) {
  ggml_tensor* ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
  ids->data = ids_.data();
  return ggml_get_rows(ctx, model_->base().tok_embd, ids);
}

ggml_tensor* Forward::BuildWhole(ggml_context* ctx, int n, int n_out, bool tail, void* const* od, bool reserve) {
  ggml_tensor* pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
  pos->data = reserve ? static_cast<void*>(&reserve_only_) : static_cast<void*>(pos_.data());
  ggml_tensor* x = BuildEmbed(ctx, n);
  for (int il = 0; il < int(model_->hparams().n_layer); ++il) x = BuildLayer(ctx, reserve ? 0 : il, x, pos, od[il]);
  // No logits asked for (a prompt slice): the last layer's output ends the graph; what the step
  // keeps is the KV its layers stored.
  return n_out == 0 ? x : BuildHead(ctx, x, n_out, tail);
}

Status Forward::ReserveCompute(int n_tokens, int n_out) {
  if (n_tokens < 1 || n_out < 1 || n_out > n_tokens)
    return Status::InvalidArgument("ReserveCompute: " + std::to_string(n_out) + " rows of " + std::to_string(n_tokens) + " tokens");
  // No data is read: the graphs are only measured (their inputs and outputs live outside the
  // buffers, as in a step). The three graphs of a step layer by layer, then (when it fits) a whole
  // step with every layer built from layer 0's tensors (same shapes; a layer whose unit is not
  // resident has no data and would be measured as if it lived in the buffers).
  using forward_graph::ActTensor;
  const int E = int(model_->hparams().n_embd);
  void* none = &reserve_only_;
  ggml_init_params ip{meta_buf_.size(), meta_buf_.data(), /*no_alloc=*/true};
  std::vector<LayerOpData> od(model_->hparams().n_layer, LayerOpData{nullptr, 0, nullptr, 0, n_tokens, 1.0f});
  std::vector<void*> odp(od.size());
  for (size_t i = 0; i < od.size(); ++i) odp[i] = &od[i];
  const int graphs = whole_step_fits() ? 4 : 3;
  for (int g = 0; g < graphs; ++g) {
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* out = nullptr;
    if (g == 0) {
      out = ggml_cpy(ctx, BuildEmbed(ctx, n_tokens), ActTensor(ctx, none, E, n_tokens));
    } else if (g == 1) {
      ggml_tensor* x = ActTensor(ctx, none, E, n_tokens);
      ggml_tensor* pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
      pos->data = none;
      out = ggml_cpy(ctx, BuildLayer(ctx, 0, x, pos, odp[0]), x);
    } else if (g == 2) {
      out = BuildHead(ctx, ActTensor(ctx, none, E, n_tokens), n_out, false);
    } else {
      out = BuildWhole(ctx, n_tokens, n_out, false, odp.data(), /*reserve=*/true);
    }
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, kGraphSize, false);
    ggml_build_forward_expand(gf, out);
    const bool ok = ggml_gallocr_reserve(galloc_, gf);
    ggml_free(ctx);
    if (!ok) return Status::NoMemory("reserving compute buffers for " + std::to_string(n_tokens) + " tokens");
  }
  return Status::Ok();
}

void Forward::CopyLogits(const Seq* seqs, int n_seqs) {
  const size_t nv = model_->hparams().n_vocab;
  size_t k = 0;  // each sequence's rows, in its order
  for (int s = 0; s < n_seqs; ++s) {
    const Seq& q = seqs[s];
    if (!q.n_logits) continue;
    const size_t at = q.logits->size(), len = size_t(q.n_logits) * nv;
    q.logits->resize(at + len);
    std::memcpy(q.logits->data() + at, out_.data() + k * nv, len * sizeof(float));
    k += size_t(q.n_logits);
  }
}

Status Forward::RunUbatch(const Seq* seqs, int n_seqs) {
  const HParams& hp = model_->hparams();
  const int E = int(hp.n_embd), D = int(hp.head_dim), L = int(hp.n_layer);
  const int base = model_->base_unit();
  int n = 0;
  for (int s = 0; s < n_seqs; ++s) n += seqs[s].n;
  ids_.resize(size_t(n));
  pos_.resize(size_t(n));
  using forward_graph::ActTensor;
  using forward_graph::CheckLayerKv;
  std::vector<SeqSlice> slices(static_cast<size_t>(n_seqs));
  std::vector<int> seq_of_row(static_cast<size_t>(n));
  out_rows_.clear();
  for (int s = 0, row = 0; s < n_seqs; ++s) {
    const Seq& q = seqs[s];
    slices[size_t(s)] = SeqSlice{q.kv, row, q.n, q.kv->n_tokens()};
    for (int i = 0; i < q.n; ++i, ++row) {
      ids_[size_t(row)] = q.tokens[i];
      pos_[size_t(row)] = q.kv->n_tokens() + i;
      seq_of_row[size_t(row)] = s;
      if (i >= q.n - q.n_logits) out_rows_.push_back(row);
    }
  }
  const int n_out = int(out_rows_.size());
  const bool tail = n_out > 0 && out_rows_.front() == n - n_out;
  out_.resize(size_t(n_out) * hp.n_vocab);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<LayerOpData> od(static_cast<size_t>(L));
  std::vector<void*> odp(static_cast<size_t>(L));
  for (int il = 0; il < L; ++il) {
    od[size_t(il)] = LayerOpData{slices.data(), n_seqs, seq_of_row.data(), il, n, scale};
    odp[size_t(il)] = &od[size_t(il)];
  }
  ggml_init_params ip{meta_buf_.size(), meta_buf_.data(), /*no_alloc=*/true};
  double t0 = Now(model_->env());

  if (!wait_ && whole_step_fits()) {
    // No restore pending: every unit and chunk is checked now, and the whole step is one graph
    // (one fork/join of the compute threads instead of n_layer + 2).
    MZ_RETURN_IF_ERROR(Wait(base));
    for (int il = 0; il < L; ++il) {
      MZ_RETURN_IF_ERROR(Wait(il));
      MZ_RETURN_IF_ERROR(CheckLayerKv(slices, il));
    }
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* out = BuildWhole(ctx, n, n_out, tail, odp.data(), /*reserve=*/false);
    MZ_RETURN_IF_ERROR(ComputeAndFree(ctx, out).With("the step's graph"));
    timing_.layers_s += Now(model_->env()) - t0;
    if (n_out > 0) CopyLogits(seqs, n_seqs);
    return Status::Ok();
  }

  // Layer by layer: the wait hook runs before each graph (a restore in flight); the residual
  // stream lives in act_ between the graphs.
  act_.resize(size_t(n) * E);
  MZ_RETURN_IF_ERROR(Wait(base));
  {
    ggml_context* ctx = ggml_init(ip);
    MZ_RETURN_IF_ERROR(ComputeAndFree(ctx, ggml_cpy(ctx, BuildEmbed(ctx, n), ActTensor(ctx, act_.data(), E, n))));
  }
  double t1 = Now(model_->env());
  timing_.embed_s += t1 - t0;

  for (int il = 0; il < L; ++il) {
    MZ_RETURN_IF_ERROR(Wait(il));
    MZ_RETURN_IF_ERROR(CheckLayerKv(slices, il));
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* x = ActTensor(ctx, act_.data(), E, n);
    ggml_tensor* pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
    pos->data = pos_.data();
    // The residual is written back in place (x read earlier).
    ggml_tensor* out = ggml_cpy(ctx, BuildLayer(ctx, il, x, pos, odp[size_t(il)]), x);
    MZ_RETURN_IF_ERROR(ComputeAndFree(ctx, out).With("layer " + std::to_string(il)));
  }
  double t2 = Now(model_->env());
  timing_.layers_s += t2 - t1;

  if (n_out > 0) {
    MZ_RETURN_IF_ERROR(Wait(base));
    ggml_context* ctx = ggml_init(ip);
    MZ_RETURN_IF_ERROR(ComputeAndFree(ctx, BuildHead(ctx, ActTensor(ctx, act_.data(), E, n), n_out, tail)));
    CopyLogits(seqs, n_seqs);
    timing_.head_s += Now(model_->env()) - t2;
  }
  return Status::Ok();
}

}  // namespace mz
