// The C boundary of the memory plan (include/mzcache.h "memory plan"): runtime/memory_plan.h.
#include <algorithm>
#include <cstdio>

#include "api/api_internal.h"
#include "ggml.h"
#include "runtime/memory_plan.h"

using namespace mz_api;

namespace {


mz::Status ToRequest(const mz_plan_params& p, mz::PlanRequest* r) {
  if (p.n_ctx > (1u << 24)) return mz::Status::InvalidArgument("n_ctx out of range (at most 2^24)");
  if (p.kv_chunk_tokens == 0 || p.kv_chunk_tokens > 65536)
    return mz::Status::InvalidArgument("kv_chunk_tokens out of range");
  if (p.n_ubatch == 0) return mz::Status::InvalidArgument("n_ubatch must be positive");
  if (p.kv_type != MZ_KV_F16 && p.kv_type != MZ_KV_Q8_0)
    return mz::Status::InvalidArgument("kv_type must be MZ_KV_F16 or MZ_KV_Q8_0");
  if (p.weight_memory != MZ_WEIGHTS_PAGE_CACHE && p.weight_memory != MZ_WEIGHTS_ANONYMOUS &&
      p.weight_memory != MZ_WEIGHTS_REPACKED)
    return mz::Status::InvalidArgument(
        "weight_memory must be MZ_WEIGHTS_PAGE_CACHE, MZ_WEIGHTS_ANONYMOUS or MZ_WEIGHTS_REPACKED");
  if (!(p.margin >= 0 && p.margin < 1)) return mz::Status::InvalidArgument("margin must be in [0, 1)");
  r->n_ctx = int(p.n_ctx);
  r->chunk_tokens = int(p.kv_chunk_tokens);
  r->n_ubatch = int(p.n_ubatch);
  r->kv_type = p.kv_type == MZ_KV_Q8_0 ? mz::KvType::kQ8 : mz::KvType::kF16;
  return mz::Status::Ok();
}

// Fills out for shape s in this process (overhead: its VmRSS now + the model's).
mz::Status Plan(mz::PlanShape s, const mz_plan_params& p, mz_plan_result* out) {
  mz::PlanRequest r;
  MZ_RETURN_IF_ERROR(ToRequest(p, &r));
  s.weights_file_backed = p.weight_memory == MZ_WEIGHTS_PAGE_CACHE;  // repacked: anonymous
  mz::Env* env = mz::Env::Default();
  mz::SelfMemory self;
  r.overhead = mz::EstimateModelOverhead(s) + (mz::ReadSelfMemory(env, &self) ? self.rss : 0);
  const mz::MemoryLimits lim = mz::ReadMemoryLimits(env, p.memory_budget);
  const uint64_t limit = lim.effective();
  constexpr int kMaxCtx = 1 << 24;
  std::memset(static_cast<void*>(out), 0, sizeof *out);
  mz::PlanRequest q = r;
  q.kv_type = mz::KvType::kQ8;
  // Never past the model's training context (nor the largest n_ctx a context takes).
  const int cap = int(std::min<uint32_t>(std::max<uint32_t>(s.hp.n_ctx_train, 1), uint32_t(kMaxCtx)));
  out->max_ctx = uint32_t(mz::LargestContext(s, r, limit, p.margin, cap));
  out->max_ctx_q8 = uint32_t(mz::LargestContext(s, q, limit, p.margin, cap));
  if (r.n_ctx == 0) r.n_ctx = int(out->max_ctx);
  const mz::MemoryEstimate e = mz::EstimatePeak(s, r);
  out->n_layer = int32_t(s.hp.n_layer);
  out->n_head_kv = int32_t(s.hp.n_head_kv);
  out->head_dim = int32_t(s.hp.head_dim);
  out->n_vocab = int32_t(s.hp.n_vocab);
  out->weight_params = s.weight_params;
  out->kv_bytes_per_token = mz::KvBytesPerToken(s.hp, r.kv_type);
  out->n_ctx = uint32_t(r.n_ctx);
  out->weights = e.weights;
  out->weights_file_backed = e.weights_file_backed;
  out->kv = e.kv;
  out->compute = e.compute;
  out->swap_stack = e.swap_stack;
  out->overhead = e.overhead;
  out->peak = e.peak();
  out->cgroup_limit = lim.cgroup_limit;
  out->mem_available = lim.mem_available;
  out->mem_total = lim.mem_total;
  out->self_anon = lim.self_anon;
  out->memory_budget = lim.budget;
  out->limit = limit;
  std::snprintf(out->binding, sizeof out->binding, "%s", lim.binding());
  out->fits = r.n_ctx > 0 && (limit == 0 || e.peak() <= limit);
  return mz::Status::Ok();
}

bool GgmlType(const char* name, int* t) {
  const std::string n = name ? name : "";
  if (n == "f16") *t = GGML_TYPE_F16;
  else if (n == "q8_0") *t = GGML_TYPE_Q8_0;
  else if (n == "q4_0") *t = GGML_TYPE_Q4_0;
  else if (n == "q4_k") *t = GGML_TYPE_Q4_K;
  else return false;
  return true;
}

}  // namespace

extern "C" {

mz_plan_params mz_plan_default_params(void) {
  mz_plan_params p;
  std::memset(static_cast<void*>(&p), 0, sizeof p);
  p.struct_size = uint32_t(sizeof(p));
  p.n_ctx = 8192;
  p.kv_chunk_tokens = 256;
  p.n_ubatch = 512;
  p.kv_type = MZ_KV_F16;
  p.weight_memory = MZ_WEIGHTS_PAGE_CACHE;
  p.memory_budget = 0;
  p.margin = 0.1f;
  return p;
}

int mz_plan_estimate(const char* model_path, const mz_plan_params* params, mz_plan_result* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!model_path || !out) return mz::Status::InvalidArgument("model_path and out must not be NULL");
    mz_plan_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_plan_default_params(), kPlanParamsSizes, "mz_plan_params", &p));
    mz::ModelOptions o;
    o.load_weights = false;  // the header and tensor table only
    std::unique_ptr<mz::Model> m;
    MZ_RETURN_IF_ERROR(mz::Model::Load(mz::Env::Default(), model_path, o, &m));
    return Plan(mz::ShapeOfModel(*m), p, out);
  });
}

int mz_plan_estimate_shape(const mz_plan_shape* shape, const mz_plan_params* params, mz_plan_result* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!shape || !out) return mz::Status::InvalidArgument("shape and out must not be NULL");
    mz_plan_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_plan_default_params(), kPlanParamsSizes, "mz_plan_params", &p));
    const mz_plan_shape& h = *shape;
    if (h.n_layer <= 0 || h.n_head <= 0 || h.n_head_kv <= 0 || h.head_dim <= 0 || h.n_embd <= 0 || h.n_ff <= 0 ||
        h.n_vocab <= 0 || h.n_layer > 4096 || h.head_dim > 4096 || h.n_head_kv > h.n_head || h.n_head > 4096 ||
        h.n_embd > (1 << 20) || h.n_ff > (1 << 22) || h.n_vocab > (1 << 24))
      // The bounds keep every byte count of the plan (at up to 2^24 tokens) far inside 64 bits, so
      // the search for the largest context stays monotonic.
      return mz::Status::InvalidArgument(
          "shape: every dimension must be positive and at most n_layer/head_dim/n_head 4096, n_embd 2^20, n_ff 2^22, "
          "n_vocab 2^24 (and n_head_kv <= n_head)");
    mz::PlanShape s;
    if (!GgmlType(h.weight_type, &s.weight_type))
      return mz::Status::InvalidArgument("shape: weight_type must be f16, q8_0, q4_0 or q4_k");
    s.hp.n_layer = uint32_t(h.n_layer);
    s.hp.n_head = uint32_t(h.n_head);
    s.hp.n_head_kv = uint32_t(h.n_head_kv);
    s.hp.head_dim = uint32_t(h.head_dim);
    s.hp.n_embd = uint32_t(h.n_embd);
    s.hp.n_ff = uint32_t(h.n_ff);
    s.hp.n_vocab = uint32_t(h.n_vocab);
    s.hp.n_ctx_train = 1u << 24;
    s.weight_bytes = h.weight_bytes;
    s.weight_params = h.weight_params;
    return Plan(s, p, out);
  });
}

}  // extern "C"
