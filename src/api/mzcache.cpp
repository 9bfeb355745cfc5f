// The C boundary: catches every exception, maps Status to mz_status, records the message.
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

const char* mz_version(void) {
#define MZ_STR2(x) #x
#define MZ_STR(x) MZ_STR2(x)
  return MZ_STR(MZ_VERSION_MAJOR) "." MZ_STR(MZ_VERSION_MINOR) "." MZ_STR(MZ_VERSION_PATCH);
#undef MZ_STR
#undef MZ_STR2
}

const char* mz_status_str(int status) { return mz::StatusCodeName(mz::Status::Code(status)); }
const char* mz_last_error(void) { return t_last_error.c_str(); }

mz_model_params mz_model_default_params(void) {
  mz_model_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.direct_io = true;
  p.io_threads = 2;
  p.weight_memory = MZ_WEIGHTS_PAGE_CACHE;
  return p;
}

namespace {
std::atomic<int> g_live_models{0};  // models loaded and not freed (mz_model_free's teardown)

// Ends the calling thread's OpenMP worker threads when the last model is freed (issue 46).
// ggml's CPU backend computes with OpenMP (libgomp). libgomp keeps the workers of a thread's
// parallel regions in a pool for the next region and never joins them: they are still there
// (spinning, then asleep) when main returns, and exit() runs every library's static destructors
// (ggml's backend registry, libstdc++'s, libgomp's own) beside them. A program on the library that
// loaded a model, decoded a few tokens and returned from main died once in about 1,060 runs with
// SIGSEGV in ggml's registry destructor while such a worker was running. ReleaseOpenMpWorkers asks
// libgomp to end the calling thread's pool (OpenMP 5.0 omp_pause_resource_all(omp_pause_soft):
// gomp_free_thread, which releases every worker and waits until each has left the pool; they then
// exit). The next parallel region makes a new pool, so calling it early costs only that.
//
// Looked up at run time (dlsym), so the library needs no OpenMP at build time and a ggml built
// without OpenMP makes it a no-op. Not to be called inside a parallel region (libgomp refuses
// then: nothing happens). Thread-safe: it touches only the calling thread's pool.
// true if the OpenMP runtime was found and released the calling thread's pool.
bool ReleaseOpenMpWorkers() {
  using PauseFn = int (*)(int);
  constexpr int kOmpPauseSoft = 1;  // omp_pause_soft in omp.h (OpenMP 5.0)
  static const PauseFn pause = reinterpret_cast<PauseFn>(dlsym(RTLD_DEFAULT, "omp_pause_resource_all"));
  return pause && pause(kOmpPauseSoft) == 0;
}
}  // namespace

int mz_model_load(const char* path, const mz_model_params* params, mz_model** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!path || !out) return mz::Status::InvalidArgument("path and out must not be NULL");
    mz_model_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_model_default_params(), kModelParamsSizes, "mz_model_params", &p));
    mz::ModelOptions o;
    o.direct_io = p.direct_io;
    o.io_threads = p.io_threads > 0 ? p.io_threads : 1;
    if (p.weight_memory != MZ_WEIGHTS_PAGE_CACHE && p.weight_memory != MZ_WEIGHTS_ANONYMOUS)
      return mz::Status::InvalidArgument("weight_memory must be MZ_WEIGHTS_PAGE_CACHE or MZ_WEIGHTS_ANONYMOUS");
    o.weights = p.weight_memory == MZ_WEIGHTS_ANONYMOUS ? mz::WeightMemory::kAnonymous : mz::WeightMemory::kPageCache;
    auto m = std::make_unique<mz_model>();
    MZ_RETURN_IF_ERROR(mz::Model::Load(mz::Env::Default(), path, o, &m->model));
    MZ_RETURN_IF_ERROR(mz::Tokenizer::Load(path, &m->tok));
    *out = m.release();
    g_live_models.fetch_add(1);
    return mz::Status::Ok();
  });
}

int mz_model_verify_file(mz_model* model) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!model) return mz::Status::InvalidArgument("model must not be NULL");
    return model->model->VerifyIdentity();
  });
}

void mz_model_free(mz_model* model) {
  if (!model) return;
  delete model;
  // The last model gone: the calling thread's OpenMP workers end too, so that a program returning
  // from main has no libgomp thread running beside its exit (runtime/openmp_teardown.h).
  if (g_live_models.fetch_sub(1) == 1) ReleaseOpenMpWorkers();
}

int mz_model_get_info(const mz_model* model, mz_model_info* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!model || !out) return mz::Status::InvalidArgument("model and out must not be NULL");
    const mz::HParams& hp = model->model->hparams();
    out->arch = mz::ArchName(hp.arch);
    out->name = hp.name.c_str();
    out->n_vocab = int32_t(hp.n_vocab);
    out->n_ctx_train = int32_t(hp.n_ctx_train);
    out->n_embd = int32_t(hp.n_embd);
    out->n_layer = int32_t(hp.n_layer);
    out->n_head = int32_t(hp.n_head);
    out->n_head_kv = int32_t(hp.n_head_kv);
    out->head_dim = int32_t(hp.head_dim);
    out->n_ff = int32_t(hp.n_ff);
    out->weight_bytes = model->model->tensor_bytes();
    out->kv_bytes_per_token = hp.kv_bytes_per_token();
    return mz::Status::Ok();
  });
}

int mz_tokenize(const mz_model* model, const char* text, bool add_special, bool parse_special, mz_token* out,
                int32_t cap, int32_t* n_out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!model || !text || !n_out || (cap > 0 && !out)) return mz::Status::InvalidArgument("null argument");
    std::vector<int32_t> toks;
    MZ_RETURN_IF_ERROR(model->tok->Tokenize(text, add_special, parse_special, &toks));
    *n_out = int32_t(toks.size());
    if (int32_t(toks.size()) > cap)
      return mz::Status::InvalidArgument("output buffer too small: need " + std::to_string(toks.size()));
    std::memcpy(out, toks.data(), toks.size() * sizeof(mz_token));
    return mz::Status::Ok();
  });
}

int32_t mz_chat_apply_template(const mz_model* model, const mz_chat_message* msgs, size_t n, bool add_assistant,
                               char* buf, int32_t cap) {
  std::string text;
  int rc = Guard(__func__, [&]() -> mz::Status {
    if (!model || (n > 0 && !msgs) || cap < 0 || (cap > 0 && !buf)) return mz::Status::InvalidArgument("null argument");
    std::vector<std::pair<std::string, std::string>> m;
    for (size_t i = 0; i < n; ++i) {
      if (!msgs[i].role || !msgs[i].content)
        return mz::Status::InvalidArgument("message " + std::to_string(i) + ": NULL role or content");
      m.emplace_back(msgs[i].role, msgs[i].content);
    }
    MZ_RETURN_IF_ERROR(model->tok->ApplyChat(m, add_assistant, &text));
    if (text.size() > size_t(INT32_MAX - 1)) return mz::Status::InvalidArgument("chat text too long");
    return mz::Status::Ok();
  });
  if (rc != MZ_OK) return rc;
  if (cap > 0) {
    const size_t k = std::min(text.size(), size_t(cap - 1));
    std::memcpy(buf, text.data(), k);
    buf[k] = 0;
  }
  return int32_t(text.size());
}

int32_t mz_chat_render(const mz_model* model, const char* chat_template, const char* messages_json,
                       const char* tools_json, bool add_generation_prompt, char* out, int32_t cap) {
  std::string text;
  int rc = Guard(__func__, [&]() -> mz::Status {
    if (!model || !messages_json || cap < 0 || (cap > 0 && !out)) return mz::Status::InvalidArgument("null argument");
    mz::ChatRenderInput in;
    in.tmpl = chat_template && *chat_template ? std::string(chat_template) : model->tok->ChatTemplateSource();
    in.bos_token = model->tok->BosText();
    in.eos_token = model->tok->EosText();
    in.add_bos = model->tok->AddsBos();
    in.add_eos = model->tok->AddsEos();
    in.messages_json = messages_json;
    if (tools_json) in.tools_json = tools_json;
    in.add_generation_prompt = add_generation_prompt;
    in.now = std::time_t(mz::Env::Default()->WallClockMs() / 1000);  // the template's date (Llama 3.x)
    MZ_RETURN_IF_ERROR(mz::RenderChatTemplate(in, &text));
    if (text.size() > size_t(INT32_MAX - 1)) return mz::Status::InvalidArgument("chat text too long");
    return mz::Status::Ok();
  });
  if (rc != MZ_OK) return rc;
  if (cap > 0) {
    const size_t k = std::min(text.size(), size_t(cap - 1));
    std::memcpy(out, text.data(), k);
    out[k] = 0;
  }
  return int32_t(text.size());
}

int32_t mz_model_get_text(const mz_model* model, int32_t what, char* buf, int32_t cap) {
  if (!model || cap < 0 || (cap > 0 && !buf)) return MZ_ERR_INVALID_ARG;
  std::string s;
  switch (what) {
    case MZ_MODEL_TEXT_CHAT_TEMPLATE: s = model->tok->ChatTemplateSource(); break;
    case MZ_MODEL_TEXT_BOS: s = model->tok->BosText(); break;
    case MZ_MODEL_TEXT_EOS: s = model->tok->EosText(); break;
    default: return MZ_ERR_INVALID_ARG;
  }
  if (s.size() > size_t(INT32_MAX - 1)) return MZ_ERR_INVALID_ARG;
  if (cap > 0) {
    const size_t n = std::min(s.size(), size_t(cap - 1));
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return int32_t(s.size());
}

int32_t mz_token_to_piece(const mz_model* model, mz_token token, char* buf, int32_t cap) {
  if (!model || token < 0 || token >= model->tok->n_vocab()) return MZ_ERR_INVALID_ARG;
  std::string s = model->tok->Piece(token);
  if (buf && cap > 0) {
    size_t n = std::min(s.size(), size_t(cap - 1));
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return int32_t(s.size());
}

bool mz_token_is_eog(const mz_model* model, mz_token token) { return model && model->tok->IsEog(token); }

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

int32_t mz_parse_cpu_list(const char* list, int32_t* out, int32_t cap) {
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (!list) return mz::Status::InvalidArgument("null list");
    if (cap < 0 || (!out && cap > 0)) return mz::Status::InvalidArgument("out must hold cap >= 0 entries");
    std::vector<int> c;
    MZ_RETURN_IF_ERROR(mz::ParseCpuList(list, &c));
    n = int32_t(c.size());
    for (int32_t i = 0; i < std::min(n, cap); ++i) out[i] = c[size_t(i)];
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : int32_t(rc);
}

int32_t mz_cpu_clusters(mz_cpu_cluster* out, int32_t cap) {
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (cap < 0 || (!out && cap > 0)) return mz::Status::InvalidArgument("out must hold cap >= 0 entries");
    mz::CpuTopology topo;
    mz::Status st = mz::ReadCpuTopology(mz::Env::Default(), &topo);
    // The header's codes: a file that cannot be read is MZ_ERR_IO, one that cannot be parsed
    // MZ_ERR_CORRUPT (ReadCpuTopology calls bad text an invalid argument).
    if (st.code() == mz::Status::kInvalidArgument) return mz::Status::Corruption(st.message());
    MZ_RETURN_IF_ERROR(st);
    n = int32_t(topo.clusters.size());
    for (int32_t i = 0; i < std::min(n, cap); ++i) {
      const mz::CpuCluster& cl = topo.clusters[size_t(i)];
      mz_cpu_cluster& o = out[i];
      o = mz_cpu_cluster{};
      o.capacity = cl.capacity;
      o.max_freq_khz = cl.max_freq_khz;
      for (int c : cl.cpus) {
        if (c < 0 || c >= 64 * 64) continue;  // beyond the mask (ParseCpuList refuses such ids)
        o.cpus[c / 64] |= uint64_t(1) << (c % 64);
        ++o.n_cpus;
      }
    }
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

namespace {
void CopyText(const std::string& from, char* to, size_t cap) {
  const size_t n = std::min(from.size(), cap - 1);
  std::memcpy(to, from.data(), n);
  to[n] = '\0';
}
}  // namespace

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

namespace mz_api {

mz::Status ToContextOptions(const mz_context_params& p, mz::ContextOptions* o) {
  if (p.n_ctx == 0 || p.n_ctx > (1u << 24)) return mz::Status::InvalidArgument("n_ctx out of range");
  if (p.kv_chunk_tokens == 0 || p.kv_chunk_tokens > 65536)
    return mz::Status::InvalidArgument("kv_chunk_tokens out of range");
  if (p.n_threads <= 0 || p.n_threads > 256) return mz::Status::InvalidArgument("n_threads out of range");
  if (p.n_ubatch == 0) return mz::Status::InvalidArgument("n_ubatch must be positive");
  o->n_ctx = int(p.n_ctx);
  o->kv_chunk_tokens = int(p.kv_chunk_tokens);
  o->n_threads = p.n_threads;
  o->n_ubatch = int(p.n_ubatch);
  o->kv_codec = p.kv_codec ? p.kv_codec : "q8";
  o->swap_path = p.swap_path ? p.swap_path : "";
  o->direct_io = p.direct_io;
  o->restore_threads = p.restore_threads > 0 ? p.restore_threads : 1;
  o->reconcile_min_missing = p.reconcile_min_missing;
  o->memory_budget = p.memory_budget;
  o->memory_check = p.memory_check;
  if (p.kv_type != MZ_KV_F16 && p.kv_type != MZ_KV_Q8_0)
    return mz::Status::InvalidArgument("kv_type " + std::to_string(p.kv_type) + " is not MZ_KV_F16 or MZ_KV_Q8_0");
  o->kv_type = mz::KvType(p.kv_type);
  return mz::Status::Ok();
}

mz::Status ToPipelineOptions(const mz_restore_params* params, mz::PipelineOptions* po) {
  mz_restore_params p;
  MZ_RETURN_IF_ERROR(ReadParams(params, mz_restore_default_params(), kRestoreParamsSizes, "mz_restore_params", &p));
  if (p.overlap < MZ_OVERLAP_NONE || p.overlap > MZ_OVERLAP_AUTO) return mz::Status::InvalidArgument("bad overlap");
  po->overlap = mz::Overlap(p.overlap);
  po->io_threads = std::max(1, p.io_threads);
  po->decode_threads = std::max(1, p.decode_threads);
  po->attend_compressed = p.attend_compressed != 0;
  return mz::Status::Ok();
}

// Android level -> pressure level; false: no action for this level.
bool TrimLevel(int32_t level, mz::PressureLevel* out) {
  if (level >= MZ_TRIM_MEMORY_MODERATE) *out = mz::PressureLevel::kCritical;
  else if (level >= MZ_TRIM_MEMORY_BACKGROUND) *out = mz::PressureLevel::kMedium;
  else if (level >= MZ_TRIM_MEMORY_UI_HIDDEN) return false;
  else if (level >= MZ_TRIM_MEMORY_RUNNING_CRITICAL) *out = mz::PressureLevel::kMedium;
  else if (level >= MZ_TRIM_MEMORY_RUNNING_MODERATE) *out = mz::PressureLevel::kLow;
  else return false;
  return true;
}

void ToRestoreStats(const mz::RestoreGenerateStats& st, mz_restore_stats* stats) {
  stats->ttft_s = st.ttft_s;
  stats->alloc_s = st.pipeline.alloc_s;
  stats->reload_s = st.pipeline.reload_s;
  stats->wait_s = st.wait_s;
  stats->cpu_s = st.cpu_s;
  stats->bytes_from_storage = st.pipeline.bytes_from_storage;
  stats->bytes_decoded = st.pipeline.bytes_decoded;
  stats->units_restored = st.pipeline.units;
  stats->bytes_read_compressed = st.pipeline.bytes_read_compressed;
}

}  // namespace mz_api

// ---- memory pressure ----

namespace mz_api {

mz::Status ToPressureOptions(const mz_pressure_params& p, mz::PressureSourceOptions* so, mz::AmountOptions* ao) {
  if (!(p.step_points > 0 && p.step_points <= 1)) return mz::Status::InvalidArgument("step_points must be in (0, 1]");
  if (!(p.escalation >= 1 && p.escalation <= 16)) return mz::Status::InvalidArgument("escalation must be in [1, 16]");
  if (!(p.max_step_points >= p.step_points && p.max_step_points <= 1))
    return mz::Status::InvalidArgument("max_step_points must be in [step_points, 1]");
  if (!(p.floor_points >= 0 && p.floor_points < 1)) return mz::Status::InvalidArgument("floor_points must be in [0, 1)");
  if (p.poll_ms == 0) return mz::Status::InvalidArgument("poll_ms must be positive");
  if (!(p.restore_margin >= 0 && p.restore_margin < 1)) return mz::Status::InvalidArgument("restore_margin must be in [0, 1)");
  so->kind = p.source ? p.source : "auto";
  so->cgroup_dir = p.cgroup_dir ? p.cgroup_dir : "";
  so->psi_stall_us = p.psi_stall_us;
  so->psi_window_us = p.psi_window_us;
  so->poll_ms = int(p.poll_ms);
  ao->step_points = p.step_points;
  ao->escalation = p.escalation;
  ao->max_step_points = p.max_step_points;
  ao->floor_points = p.floor_points;
  ao->escalation_window_ns = uint64_t(p.escalation_window_ms) * 1000000ull;
  ao->hysteresis_ns = uint64_t(p.hysteresis_ms) * 1000000ull;
  ao->restore_ahead = p.restore_in_background ? mz::AmountOptions::RestoreAhead::kBackground
                                              : mz::AmountOptions::RestoreAhead::kOnRequest;
  ao->calm_ns = uint64_t(p.calm_ms) * 1000000ull;
  ao->restore_margin = p.restore_margin;
  return mz::Status::Ok();
}

}  // namespace mz_api

namespace {
using mz_api::ToPressureOptions;

void SetActionHandler(mz_context* ctx, void (*on_action)(const mz_pressure_action*, void*), void* user);

// Makes ctx->pressure a monitor over `src`, counting its actions into ctx->stats and passing each to
// on_action (mz_pressure_params.on_action; NULL: none) with user. pressure_mu held.
void InstallMonitor(mz_context* ctx, std::unique_ptr<mz::PressureSource> src, const mz::AmountOptions& ao,
                    void (*on_action)(const mz_pressure_action*, void*) = nullptr, void* user = nullptr) {
  ctx->pressure.reset();  // first: the old monitor's destructor removes the safe-point hook
  ctx->pressure = std::make_unique<mz::PressureMonitor>(ctx->ctx.get(), std::move(src), ao);
  if (ctx->generating) ctx->pressure->BeginGeneration();
  SetActionHandler(ctx, on_action, user);
}

// The monitor's action handler: counts each action into ctx->stats and passes it to on_action
// (NULL: none) with user. pressure_mu held, ctx->pressure set.
void SetActionHandler(mz_context* ctx, void (*on_action)(const mz_pressure_action*, void*), void* user) {
  ctx->pressure->set_on_action([ctx, on_action, user](const mz::PressureAction& a) {
    {
      std::lock_guard<std::mutex> lk(ctx->stats_mu);
      mz_pressure_stats& s = ctx->stats;
      if (a.restored) {
        if (a.status.ok()) s.restores++;
        s.bytes_restored += a.restored_bytes;
      } else if (a.event.source == "restore-ahead") {
        // waiting for headroom: not a pressure event
      } else {
        s.events++;
        s.last_level = int32_t(a.event.level);
        s.last_freed = a.freed;
        if (a.freed > 0) {
          s.evictions++;
          s.deferred += a.deferred ? 1 : 0;
          s.bytes_freed += a.freed;
        }
      }
      s.last_remaining = a.remaining;
    }  // stats_mu released: on_action may read the statistics
    if (!on_action) return;
    const mz_pressure_action x{a.event.source.c_str(),
                               int32_t(a.event.level),
                               mz::PressureLevelName(a.event.level),
                               a.requested,
                               a.freed,
                               a.deferred,
                               a.restored,
                               a.restored_bytes,
                               a.remaining,
                               double(a.applied_ns - std::min(a.applied_ns, a.event.time_ns)) * 1e-9,
                               a.repeats,
                               int32_t(a.status.code()),
                               a.status.message().c_str(),
                               a.note.c_str()};
    on_action(&x, user);
  });
}

// Handles ev as the context's watcher would (without one: a manual monitor with the default
// mz_pressure_params, kept for later events); the status of its action.
mz::Status SubmitEvent(mz_context* ctx, const mz::PressureEvent& ev) {
  std::lock_guard<std::mutex> lk(ctx->pressure_mu);
  if (!ctx->pressure) {
    mz::PressureSourceOptions so;
    mz::AmountOptions ao;
    MZ_RETURN_IF_ERROR(ToPressureOptions(mz_pressure_default_params(), &so, &ao));
    InstallMonitor(ctx, std::make_unique<mz::ManualSource>(), ao);
  }
  return ctx->pressure->Submit(ev).status;
}


}  // namespace

extern "C" {

mz_pressure_params mz_pressure_default_params(void) {
  mz_pressure_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.source = "auto";
  p.cgroup_dir = nullptr;
  p.step_points = 0.25f;
  p.escalation = 1.5f;
  p.max_step_points = 1.0f;
  p.floor_points = 0.0f;
  p.escalation_window_ms = 5000;
  p.hysteresis_ms = 1000;
  p.restore_in_background = false;
  p.calm_ms = 10000;
  p.restore_margin = 0.2f;
  p.psi_stall_us = 150000;
  p.psi_window_us = 1000000;
  p.poll_ms = 100;
  p.on_action = nullptr;
  p.user = nullptr;
  return p;
}

int mz_on_trim_memory(mz_context* ctx, int32_t level) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (level < 0) return mz::Status::InvalidArgument("negative trim level " + std::to_string(level));
    mz::PressureEvent ev;
    if (!TrimLevel(level, &ev.level)) return mz::Status::Ok();
    ev.time_ns = mz::Env::Default()->NowNs();
    ev.source = "onTrimMemory(" + std::to_string(level) + ")";
    return SubmitEvent(ctx, ev);
  });
}

int mz_pressure_submit(mz_context* ctx, int32_t level, const char* source) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (level < 0 || level > 3) return mz::Status::InvalidArgument("pressure level " + std::to_string(level) + " is not 0..3");
    mz::PressureEvent ev;
    ev.level = mz::PressureLevel(level);
    ev.time_ns = mz::Env::Default()->NowNs();
    ev.source = source ? source : "manual";
    return SubmitEvent(ctx, ev);
  });
}

int mz_pressure_set_generating(mz_context* ctx, bool generating) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (generating == ctx->generating) return mz::Status::Ok();
    ctx->generating = generating;
    if (ctx->pressure) {
      if (generating) ctx->pressure->BeginGeneration();
      else ctx->pressure->EndGeneration();
    }
    return mz::Status::Ok();
  });
}

int32_t mz_pressure_watch_reason(mz_context* ctx, char* buf, int32_t cap) {
  int32_t n = 0;
  const int rc = Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    if (cap < 0 || (!buf && cap > 0)) return mz::Status::InvalidArgument("buf must hold cap >= 0 bytes");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    const std::string why = ctx->watching ? ctx->watch_why : "";
    n = int32_t(why.size());
    if (cap > 0) CopyText(why, buf, size_t(cap));
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : int32_t(rc);
}

int mz_pressure_watch_start(mz_context* ctx, const mz_pressure_params* params) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    mz_pressure_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_pressure_default_params(), kPressureParamsSizes, "mz_pressure_params", &p));
    mz::PressureSourceOptions so;
    mz::AmountOptions ao;
    MZ_RETURN_IF_ERROR(ToPressureOptions(p, &so, &ao));
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (ctx->watching) return mz::Status::Busy("a pressure watcher already runs on this context");
    std::unique_ptr<mz::PressureSource> src;
    std::string why;
    MZ_RETURN_IF_ERROR(mz::CreatePressureSource(mz::Env::Default(), so, &src, &why));
    InstallMonitor(ctx, std::move(src), ao, p.on_action, p.user);
    mz::Status st = ctx->pressure->Start();
    if (!st.ok()) {
      ctx->pressure.reset();
      return st;
    }
    ctx->watching = true;
    ctx->watch_why = why;
    return mz::Status::Ok();
  });
}

int mz_pressure_watch_stop(mz_context* ctx) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx) return mz::Status::InvalidArgument("null context");
    std::lock_guard<std::mutex> lk(ctx->pressure_mu);
    if (ctx->pressure) {
      ctx->pressure->Stop();  // the monitor stays for mz_on_trim_memory and mz_pressure_submit,
      // without the stopped watcher's on_action: its user data may be freed once this returns (the
      // monitor calls its callback under a lock that SetActionHandler takes, so none is running then)
      SetActionHandler(ctx, nullptr, nullptr);
    }
    ctx->watching = false;
    return mz::Status::Ok();
  });
}

int mz_pressure_get_stats(mz_context* ctx, mz_pressure_stats* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!ctx || !out) return mz::Status::InvalidArgument("null argument");
    std::string name;
    bool pending = false, watching = false;
    {
      std::lock_guard<std::mutex> lk(ctx->pressure_mu);
      watching = ctx->watching;
      if (ctx->pressure) {
        pending = ctx->pressure->pending();
        if (watching) name = ctx->pressure->source().name();
      }
    }
    {
      std::lock_guard<std::mutex> lk(ctx->stats_mu);
      *out = ctx->stats;
    }
    out->watching = watching;
    out->pending = pending ? 1 : 0;
    std::snprintf(out->source, sizeof out->source, "%s", name.c_str());
    return mz::Status::Ok();
  });
}

}  // extern "C"

namespace {
// The profile's KV sample: a prefill of kProfileSampleTokens tokens of the built-in prose on the
// model (default context options, 256-token chunks), chunks 0 and 1 of every layer.
mz::Status SampleKv(mz::Model* model, const mz::Tokenizer& tok, mz::KvSample* out) {
  std::string text;
  while (text.size() < 16384) text += mz::ProfileSampleText();
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(tok.Tokenize(text, true, false, &toks));
  if (int(toks.size()) < mz::kProfileSampleTokens) return mz::Status::Internal("profile: sample text too short");
  toks.resize(size_t(mz::kProfileSampleTokens));
  mz::ContextOptions co;
  co.n_ctx = 2 * mz::kProfileSampleTokens;
  mz::Context ctx(model, co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  MZ_RETURN_IF_ERROR(ctx.Decode(toks.data(), int(toks.size()), false));
  const mz::KvGeometry& g = ctx.kv().geometry();
  if (2 * g.chunk_tokens > mz::kProfileSampleTokens) return mz::Status::Internal("profile: chunks too large for the sample");
  out->shape = mz::ChunkShape{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer};
  out->n_head = int(model->hparams().n_head);
  out->chunks.clear();
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < 2; ++c) {
      const uint16_t* p = ctx.kv().chunk(l, c);
      out->chunks.emplace_back(p, p + g.chunk_bytes() / 2);
    }
  return mz::Status::Ok();
}
}  // namespace

extern "C" {

mz_profile_params mz_profile_default_params(void) {
  mz_profile_params p;
  std::memset(static_cast<void*>(&p), 0, sizeof p);
  p.struct_size = uint32_t(sizeof(p));
  p.dir = nullptr;
  p.file_mib = 512;
  p.threads = 2;
  p.quick = false;
  p.progress = nullptr;
  p.report = nullptr;
  p.user = nullptr;
  return p;
}

int mz_profile_device(const char* model_path, const mz_profile_params* params, const char* out_path) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!model_path || !out_path) return mz::Status::InvalidArgument("model_path and out_path must not be NULL");
    mz_profile_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_profile_default_params(), kProfileParamsSizes, "mz_profile_params", &p));
    if (p.file_mib == 0 || p.file_mib > (1u << 20)) return mz::Status::InvalidArgument("file_mib out of range");
    if (p.threads <= 0 || p.threads > 256) return mz::Status::InvalidArgument("threads out of range");
    if (p.dir && !*p.dir) return mz::Status::InvalidArgument("dir is empty (NULL means /var/tmp)");
    mz::Env* env = mz::Env::Default();
    std::unique_ptr<mz::Model> model;
    MZ_RETURN_IF_ERROR(mz::Model::Load(env, model_path, mz::ModelOptions(), &model));
    std::unique_ptr<mz::Tokenizer> tok;
    MZ_RETURN_IF_ERROR(mz::Tokenizer::Load(model_path, &tok));
    mz::KvSample kv;
    MZ_RETURN_IF_ERROR(SampleKv(model.get(), *tok, &kv));
    mz::ProfileModel pm{model->hparams().name, model->unit(0).region_bytes};
    model.reset();  // the weights are not needed while measuring
    mz::ProfileOptions o;
    if (p.dir) o.dir = p.dir;
    o.file_bytes = size_t(p.file_mib) << 20;
    o.threads = p.threads;
    o.quick = p.quick;
    if (p.progress)
      o.progress = [&p](const std::string& step, int done, int total) { p.progress(step.c_str(), done, total, p.user); };
    if (p.report) o.report = [&p](const std::string& text) { p.report(text.c_str(), p.user); };
    mz::DeviceProfile prof;
    MZ_RETURN_IF_ERROR(mz::ProfileDevice(env, kv, pm, o, &prof));
    return prof.Save(out_path);
  });
}

}  // extern "C"
