// The C boundary of a context (include/mzcache.h "context"): decode, threads, evict / restore,
// residency and memory reports, its session files, and samplers over its logits.
#include "mzcache.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <vector>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "env/cpu_topology.h"
#include "model/model.h"
#include "policy/profiler.h"
#include "pressure/manual_source.h"
#include "pressure/monitor.h"
#include "runtime/chat_render.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "api/api_internal.h"

using namespace mz_api;

extern "C" {

mz_context_params mz_context_default_params(void) {
  mz_context_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.n_ctx = 8192;
  p.kv_chunk_tokens = 256;
  p.n_threads = 2;
  p.n_ubatch = 512;
  p.kv_codec = "q8";
  p.swap_path = nullptr;
  p.direct_io = true;
  p.restore_threads = 2;
  p.reconcile_min_missing = mz::ContextOptions().reconcile_min_missing;
  p.memory_budget = 0;
  p.memory_check = true;
  p.kv_type = MZ_KV_F16;
  p.restore_nice_beside_batch = mz::ContextOptions().restore_nice_beside_batch;
  return p;
}

int mz_context_new(mz_model* model, const mz_context_params* params, mz_context** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!model || !out) return mz::Status::InvalidArgument("model and out must not be NULL");
    mz_context_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_context_default_params(), kContextParamsSizes, "mz_context_params", &p));
    // A caller built against 0.8 or older does not know the memory check: it stays off for it, so
    // an unchanged app is not refused a context it was given before.
    if (params && params->struct_size < offsetof(mz_context_params, memory_check) + sizeof(params->memory_check)) p.memory_check = false;
    mz::ContextOptions o;
    MZ_RETURN_IF_ERROR(ToContextOptions(p, &o));
    auto c = std::make_unique<mz_context>();
    c->ctx = std::make_unique<mz::Context>(model->model.get(), o);
    MZ_RETURN_IF_ERROR(c->ctx->Init());
    *out = c.release();
    return mz::Status::Ok();
  });
}

void mz_context_free(mz_context* ctx) { delete ctx; }

int mz_decode(mz_context* ctx, const mz_token* tokens, int32_t n, bool all_logits) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !tokens || n <= 0) return mz::Status::InvalidArgument("need a context and at least one token");
    return SustainedStep(ctx, n, [&] { return ctx->ctx->Decode(tokens, n, all_logits); });
  });
}

const float* mz_get_logits(mz_context* ctx, int32_t i) { return ctx ? ctx->ctx->logits(i) : nullptr; }
int32_t mz_context_n_tokens(const mz_context* ctx) { return ctx ? int32_t(ctx->ctx->history().size()) : 0; }

int mz_context_truncate(mz_context* ctx, int32_t n_keep) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || n_keep < 0) return mz::Status::InvalidArgument("bad context or n_keep");
    ctx->ctx->Truncate(n_keep);
    return mz::Status::Ok();
  });
}

int mz_context_set_turn_mark(mz_context* ctx, int32_t n) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    return ctx->ctx->SetTurnMark(n);
  });
}

int32_t mz_context_turn_mark(const mz_context* ctx) { return ctx ? int32_t(ctx->ctx->turn_mark()) : -1; }

int mz_context_set_threads(mz_context* ctx, int32_t n_threads, const int32_t* cpus, int32_t n_cpus) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    std::vector<int> c;
    if (cpus) {
      if (n_cpus < 0) return mz::Status::InvalidArgument("n_cpus " + std::to_string(n_cpus));
      c.assign(cpus, cpus + n_cpus);
      if (c.empty()) return mz::Status::InvalidArgument("cpus given with n_cpus 0 (pass NULL for no pinning)");
    }
    return ctx->ctx->SetThreads(n_threads, c);
  });
}

int32_t mz_context_get_threads(mz_context* ctx, int32_t* n_threads, int32_t* cpus, int32_t cap) {
  if (n_threads) *n_threads = 0;
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (cap < 0 || (!cpus && cap > 0)) return mz::Status::InvalidArgument("cpus must hold cap >= 0 entries");
    std::vector<int> c = ctx->ctx->compute_cpus();
    std::sort(c.begin(), c.end());  // the header promises ascending ids, whatever order they were given in
    n = int32_t(c.size());
    for (int32_t i = 0; i < std::min(n, cap); ++i) cpus[i] = c[size_t(i)];
    if (n_threads) *n_threads = ctx->ctx->n_threads();
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : int32_t(rc);
}

int mz_evict(mz_context* ctx, uint64_t bytes, const mz_plan* plan, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (!plan) return ctx->ctx->EvictBytes(bytes, freed);
    if (plan->n_items && !plan->items) return mz::Status::InvalidArgument("plan items are NULL");
    mz::Plan p;
    for (size_t i = 0; i < plan->n_items; ++i) {
      const mz_placement& x = plan->items[i];
      if (x.kind != MZ_UNIT_WEIGHTS && x.kind != MZ_UNIT_KV)
        return mz::Status::InvalidArgument("placement " + std::to_string(i) + ": bad kind");
      if (x.state < 0 || x.state > MZ_STATE_WEIGHTS_DROPPED)
        return mz::Status::InvalidArgument("placement " + std::to_string(i) + ": bad state");
      p.push_back({x.kind == MZ_UNIT_WEIGHTS ? mz::UnitRef::Weights(x.layer) : mz::UnitRef::Kv(x.layer, x.chunk),
                   mz::UnitState(x.state)});
    }
    uint64_t f = 0;
    mz::Status st = ctx->ctx->Evict(p, bytes, &f);
    if (freed) *freed = f;
    return st;
  });
}

int mz_restore(mz_context* ctx) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    return ctx->ctx->Restore();
  });
}

mz_restore_params mz_restore_default_params(void) {
  mz_restore_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.overlap = MZ_OVERLAP_AUTO;
  p.io_threads = 2;
  p.decode_threads = 1;
  p.attend_compressed = 1;
  return p;
}

int mz_restore_generate(mz_context* ctx, const mz_token* tokens, int32_t n, const mz_restore_params* params,
                        mz_restore_stats* stats) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !tokens || n <= 0) return mz::Status::InvalidArgument("need a context and at least one token");
    mz::PipelineOptions po;
    MZ_RETURN_IF_ERROR(ToPipelineOptions(params, &po));
    mz::RestoreGenerateStats st;
    MZ_RETURN_IF_ERROR(SustainedStep(ctx, n, [&] { return ctx->ctx->RestoreGenerate(tokens, n, po, &st); }));
    if (stats) ToRestoreStats(st, stats);
    return mz::Status::Ok();
  });
}

int mz_kernel_residency(mz_context* ctx, uint64_t* counted, uint64_t* in_ram) {
  if (counted) *counted = 0;
  if (in_ram) *in_ram = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("ctx must not be NULL");
    mz::KernelResidency k;
    MZ_RETURN_IF_ERROR(ctx->ctx->MeasureInRam(&k));
    if (counted) *counted = k.counted();
    if (in_ram) *in_ram = k.in_ram();
    return mz::Status::Ok();
  });
}

namespace context_api {
void CopyText(const std::string& from, char* to, size_t cap) {
  const size_t n = std::min(from.size(), cap - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}
}  // namespace context_api
using namespace context_api;

int32_t mz_residency_report(mz_context* ctx, bool with_smaps, mz_residency_summary* summary, mz_unit_residency* units,
                            int32_t cap) {
  if (summary) *summary = mz_residency_summary{};
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("ctx must not be NULL");
    if (cap < 0 || (!units && cap > 0)) return mz::Status::InvalidArgument("units must hold cap >= 0 entries");
    mz::ResidencyReport r;
    MZ_RETURN_IF_ERROR(ctx->ctx->MeasureResidency(with_smaps, &r));
    n = int32_t(r.units.size());
    for (int32_t i = 0; i < std::min(n, cap); ++i) {
      const mz::UnitResidency& u = r.units[size_t(i)];
      mz_unit_residency& o = units[i];
      o = mz_unit_residency{};
      o.kind = u.unit.kind == mz::UnitRef::kWeights ? MZ_UNIT_WEIGHTS : MZ_UNIT_KV;
      o.layer = u.unit.layer;
      o.chunk = u.unit.kind == mz::UnitRef::kWeights ? -1 : u.unit.chunk;
      o.state = int32_t(u.state);
      o.backing = int32_t(u.backing);
      o.lost = u.lost ? 1 : 0;
      o.bytes = u.bytes;
      o.held_bytes = u.held_bytes;
      o.address = u.addr;
      o.counted_bytes = u.counted_bytes;
      o.in_ram_bytes = u.in_ram_bytes;
      o.file_bytes = u.file_bytes;
      o.file_cached_bytes = u.file_cached_bytes;
      o.n_vmas = u.n_vmas;
      o.vma_bytes = u.vma_bytes;
      o.vma_rss = u.vma_rss;
      o.vma_pss = u.vma_pss;
      o.vma_anonymous = u.vma_anonymous;
      o.vma_swap = u.vma_swap;
    }
    if (summary) {
      const mz::ResidencySummary& s = r.summary;
      summary->n_units = n;
      summary->weights_file_counted = s.weights_file_counted;
      summary->weights_file_in_ram = s.weights_file_in_ram;
      summary->weights_anon_counted = s.weights_anon_counted;
      summary->weights_anon_in_ram = s.weights_anon_in_ram;
      summary->kv_counted = s.kv_counted;
      summary->kv_in_ram = s.kv_in_ram;
      summary->kv_compressed_counted = s.kv_compressed_counted;
      summary->kv_compressed_in_ram = s.kv_compressed_in_ram;
      summary->weight_units_out_of_page_cache = s.weight_units_out_of_page_cache;
      summary->weights_out_of_page_cache = s.weights_out_of_page_cache;
      summary->warn = s.warn;
      CopyText(s.warning, summary->warning, sizeof summary->warning);
      summary->smaps_ok = s.smaps_ok;
      CopyText(s.smaps_error, summary->smaps_error, sizeof summary->smaps_error);
      summary->n_vmas = s.n_vmas;
      summary->vma_bytes = s.vma_bytes;
      summary->vma_rss = s.vma_rss;
      summary->vma_pss = s.vma_pss;
      summary->vma_anonymous = s.vma_anonymous;
      summary->vma_swap = s.vma_swap;
    }
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : int32_t(rc);
}

int mz_get_memory_report(mz_context* ctx, mz_memory_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !out) return mz::Status::InvalidArgument("null argument");
    mz::MemoryReport r = ctx->ctx->Report();
    out->weights_total = r.weights_total;
    out->weights_resident = r.weights_resident;
    out->weights_dropped = r.weights_dropped;
    out->kv_total = r.kv_total;
    out->kv_resident = r.kv_resident;
    out->kv_mem_compressed_raw = r.kv_mem_compressed_raw;
    out->kv_mem_compressed = r.kv_mem_compressed;
    out->kv_storage_raw = r.kv_storage_raw;
    out->kv_storage_compressed_raw = r.kv_storage_compressed_raw;
    out->kv_storage_compressed = r.kv_storage_compressed;
    out->swap_stack_mapped = r.stack_mapped;
    out->swap_file_used = r.swap_file_used;
    out->in_memory = r.in_memory();
    out->footprint = r.footprint();
    out->remaining = r.remaining();
    for (int i = 0; i < 5; ++i) out->n_weight_units[i] = r.n_weight_units[i], out->n_kv_chunks[i] = r.n_kv_chunks[i];
    out->n_kv_lost = r.n_kv_lost;
    return mz::Status::Ok();
  });
}

int mz_session_save(mz_context* ctx, const char* path, const char* codec) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !path) return mz::Status::InvalidArgument("null argument");
    return mz::SaveSession(*ctx->ctx, path, codec ? codec : "q8");
  });
}

int mz_session_get_info(mz_context* ctx, const char* path, mz_session_info* out) {
  if (out) *out = mz_session_info{};
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !path || !out) return mz::Status::InvalidArgument("null argument");
    std::unique_ptr<mz::SessionReader> r;
    MZ_RETURN_IF_ERROR(mz::SessionReader::Open(*ctx->ctx->model(), ctx->ctx->kv().geometry().chunk_tokens, path, &r));
    out->n_tokens = int32_t(r->tokens().size());
    out->n_chunks = r->n_chunks();
    CopyText(r->codec(), out->codec, sizeof out->codec);
    out->file_bytes = r->file_bytes();
    return mz::Status::Ok();
  });
}

int mz_session_load(mz_context* ctx, const char* path) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !path) return mz::Status::InvalidArgument("null argument");
    return mz::LoadSession(*ctx->ctx, path);
  });
}

mz_sampler_params mz_sampler_default_params(void) {
  mz_sampler_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.temperature = 0.0f;
  p.top_k = 40;
  p.top_p = 0.95f;
  p.seed = 42;
  return p;
}

mz_sampler* mz_sampler_new(const mz_sampler_params* params) {
  mz_sampler* out = nullptr;
  (void)Guard(__func__, [&]() -> mz::Status {
    mz_sampler_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_sampler_default_params(), kSamplerParamsSizes, "mz_sampler_params", &p));
    mz::SamplerParams sp{p.temperature, p.top_k, p.top_p, p.seed};
    auto s = std::make_unique<mz_sampler>();
    s->s = std::make_unique<mz::Sampler>(sp);
    out = s.release();
    return mz::Status::Ok();
  });
  return out;
}

void mz_sampler_free(mz_sampler* s) { delete s; }

mz_token mz_sampler_sample(mz_sampler* s, mz_context* ctx, int32_t i) {
  if (!s || !ctx) return MZ_ERR_INVALID_ARG;
  const float* l = ctx->ctx->logits(i);
  if (!l) return MZ_ERR_INVALID_ARG;
  return s->s->Sample(l, int32_t(ctx->ctx->model()->hparams().n_vocab));
}

}  // extern "C"
