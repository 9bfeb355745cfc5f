// The C boundary of the pool (include/mzcache.h "pool"): handles over pool/pool.h.
#include <algorithm>
#include <cstdio>

#include "api/api_internal.h"
#include "pool/pool.h"

using namespace mz_api;

struct mz_pool {
  mz_model* model = nullptr;
  std::unique_ptr<mz::Pool> pool;
};
struct mz_budget {
  std::shared_ptr<mz::SharedBudget> budget;
};
struct mz_conversation {
  mz_pool* pool = nullptr;
  std::shared_ptr<mz::Conversation> conv;
};

namespace {


void FillReport(const mz::ConversationReport& r, mz_conversation_report* out) {
  std::memset(out, 0, sizeof *out);
  std::snprintf(out->id, sizeof out->id, "%s", r.id.c_str());
  out->n_tokens = r.n_tokens;
  out->open = r.open;
  out->busy = r.busy;
  out->kv_resident = r.kv_resident;
  out->kv_mem_compressed = r.kv_mem_compressed;
  out->kv_storage = r.kv_storage;
  out->stored_bytes = r.stored_bytes;
  out->stored_tokens = r.stored_tokens;
  out->last_use_unix_ms = r.last_use_unix_ms;
  out->shared_chunks = r.shared_chunks;
}

}  // namespace

extern "C" {

mz_pool_params mz_pool_default_params(void) {
  mz_pool_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = uint32_t(sizeof(p));
  p.dir = nullptr;
  p.memory_budget = 0;
  p.disk_budget = 0;
  p.persist_codec = nullptr;
  p.write_behind = true;
  p.write_behind_idle_ms = 2000;
  p.share_prefixes = true;
  p.context = nullptr;
  p.read_stored_whole = false;
  p.load_arena_bytes = UINT64_MAX;
  p.write_behind_yield_ms = 2000;
  p.batch = true;
  p.batch_max_seqs = 64;
  p.batch_prefill_slice = 512;
  p.batch_itl_factor = 2.0f;
  p.shared_budget = nullptr;
  p.remote_url = nullptr;
  p.remote_password_file = nullptr;
  p.remote_timeout_ms = 2000;
  p.remote_ttl_s = 7u * 24u * 3600u;
  p.remote_ca_file = nullptr;
  p.remote_cert_file = nullptr;
  p.remote_key_file = nullptr;
  p.remote_prefix_whole = false;
  return p;
}

int mz_pool_new(mz_model* model, const mz_pool_params* params, mz_pool** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!model || !out) return mz::Status::InvalidArgument("model and out must not be NULL");
    mz_pool_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_pool_default_params(), kPoolParamsSizes, "mz_pool_params", &p));
    mz_context_params cp;
    MZ_RETURN_IF_ERROR(ReadParams(p.context, mz_context_default_params(), kContextParamsSizes, "mz_context_params", &cp));
    mz::PoolOptions o;
    MZ_RETURN_IF_ERROR(ToContextOptions(cp, &o.context));
    // The pool keeps RAM within its own memory_budget by evicting: its conversations are not
    // each refused at start (mz_context_params.memory_check applies to mz_context_new).
    o.context.memory_check = false;
    if (p.dir && !*p.dir) return mz::Status::InvalidArgument("dir is empty (NULL: nothing persisted)");
    o.dir = p.dir ? p.dir : "";
    o.memory_budget = p.memory_budget;
    o.disk_budget = p.disk_budget;
    o.persist_codec = p.persist_codec ? p.persist_codec : "q8";
    o.write_behind = p.write_behind;
    o.write_behind_idle_ms = p.write_behind_idle_ms;
    o.share_prefixes = p.share_prefixes;
    o.stored_as_storage = !p.read_stored_whole;
    o.load_arena_bytes = p.load_arena_bytes == UINT64_MAX ? mz::PoolOptions::kAutoArena : p.load_arena_bytes;
    o.write_behind_yield_ms = p.write_behind_yield_ms;
    if (p.batch_max_seqs < 1 || p.batch_prefill_slice < 1)
      return mz::Status::InvalidArgument("batch_max_seqs and batch_prefill_slice must be >= 1");
    if (!(p.batch_itl_factor == 0 || (p.batch_itl_factor >= 1 && p.batch_itl_factor <= 1000)))
      return mz::Status::InvalidArgument("batch_itl_factor must be 0 or in [1, 1000]");
    o.batch_itl_factor = p.batch_itl_factor;
    o.batch = p.batch;
    o.batch_max_seqs = p.batch_max_seqs;
    o.batch_prefill_slice = p.batch_prefill_slice;
    if (p.shared_budget) o.shared_budget = p.shared_budget->budget;
    if (p.remote_url) {
      if (!p.dir) return mz::Status::InvalidArgument("remote_url needs dir (the remote tier is written from the stored files)");
      if (p.remote_timeout_ms == 0) return mz::Status::InvalidArgument("remote_timeout_ms must be > 0");
      o.remote.url = p.remote_url;
      o.remote.password_file = p.remote_password_file ? p.remote_password_file : "";
      o.remote.timeout_ms = p.remote_timeout_ms;
      o.remote.ttl_s = p.remote_ttl_s;
      o.remote.ca_file = p.remote_ca_file ? p.remote_ca_file : "";
      o.remote.cert_file = p.remote_cert_file ? p.remote_cert_file : "";
      o.remote.key_file = p.remote_key_file ? p.remote_key_file : "";
      o.remote.stream_prefix = !p.remote_prefix_whole;
    }
    auto h = std::make_unique<mz_pool>();
    h->model = model;
    MZ_RETURN_IF_ERROR(mz::Pool::Open(model->model.get(), o, &h->pool));
    *out = h.release();
    return mz::Status::Ok();
  });
}

void mz_pool_free(mz_pool* pool) {
  try {
    delete pool;
  } catch (...) {
  }
}

int mz_pool_open(mz_pool* pool, const char* id, mz_conversation** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id || !out) return mz::Status::InvalidArgument("pool, id and out must not be NULL");
    auto h = std::make_unique<mz_conversation>();
    h->pool = pool;
    MZ_RETURN_IF_ERROR(pool->pool->OpenConversation(id, &h->conv));
    *out = h.release();
    return mz::Status::Ok();
  });
}

void mz_conversation_release(mz_conversation* conv) { delete conv; }

int mz_pool_close(mz_pool* pool, const char* id) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id) return mz::Status::InvalidArgument("pool and id must not be NULL");
    return pool->pool->Close(id);
  });
}

int mz_pool_delete(mz_pool* pool, const char* id) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id) return mz::Status::InvalidArgument("pool and id must not be NULL");
    return pool->pool->Delete(id);
  });
}

int mz_pool_evict(mz_pool* pool, uint64_t bytes, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool) return mz::Status::InvalidArgument("null pool");
    return pool->pool->Evict(bytes, freed);
  });
}

int mz_pool_flush(mz_pool* pool) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool) return mz::Status::InvalidArgument("null pool");
    return pool->pool->Flush();
  });
}

int mz_pool_pressure_watch_start(mz_pool* pool, const mz_pressure_params* params) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool) return mz::Status::InvalidArgument("null pool");
    mz_pressure_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_pressure_default_params(), kPressureParamsSizes, "mz_pressure_params", &p));
    mz::PoolPressureOptions o;
    MZ_RETURN_IF_ERROR(ToPressureOptions(p, &o.source, &o.amount));
    return pool->pool->WatchPressure(o, nullptr);
  });
}

int mz_pool_pressure_watch_stop(mz_pool* pool) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool) return mz::Status::InvalidArgument("null pool");
    pool->pool->StopWatchingPressure();
    return mz::Status::Ok();
  });
}

int mz_pool_on_trim_memory(mz_pool* pool, int32_t level, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || level < 0) return mz::Status::InvalidArgument("bad pool or level");
    mz::PressureEvent ev;
    if (!TrimLevel(level, &ev.level)) return mz::Status::Ok();
    ev.time_ns = pool->model->model->env()->NowNs();
    ev.source = "onTrimMemory";
    return pool->pool->OnPressure(ev, freed);
  });
}

int mz_conversation_decode(mz_conversation* conv, const mz_token* tokens, int32_t n, bool all_logits) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv || !tokens || n <= 0) return mz::Status::InvalidArgument("need a conversation and at least one token");
    return conv->conv->Decode(tokens, n, all_logits);
  });
}

int mz_conversation_restore_generate(mz_conversation* conv, const mz_token* tokens, int32_t n,
                                     const mz_restore_params* params, mz_restore_stats* stats) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv || !tokens || n <= 0) return mz::Status::InvalidArgument("need a conversation and at least one token");
    mz::PipelineOptions po;
    MZ_RETURN_IF_ERROR(ToPipelineOptions(params, &po));
    mz::RestoreGenerateStats st;
    MZ_RETURN_IF_ERROR(conv->conv->RestoreGenerate(tokens, n, po, &st));
    if (stats) ToRestoreStats(st, stats);
    return mz::Status::Ok();
  });
}

const float* mz_conversation_logits(mz_conversation* conv, int32_t i) {
  return conv ? conv->conv->logits(i) : nullptr;
}

mz_token mz_conversation_sample(mz_conversation* conv, mz_sampler* s, int32_t i) {
  if (!conv || !s) return MZ_ERR_INVALID_ARG;
  const float* l = conv->conv->logits(i);
  if (!l) return MZ_ERR_INVALID_ARG;
  return s->s->Sample(l, int32_t(conv->pool->model->model->hparams().n_vocab));
}

int32_t mz_conversation_n_tokens(mz_conversation* conv) { return conv ? conv->conv->n_tokens() : 0; }

int mz_conversation_truncate(mz_conversation* conv, int32_t n_keep) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv || n_keep < 0) return mz::Status::InvalidArgument("bad conversation or n_keep");
    return conv->conv->Truncate(n_keep);
  });
}

int mz_conversation_set_turn_mark(mz_conversation* conv, int32_t n) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv) return mz::Status::InvalidArgument("null conversation");
    return conv->conv->SetTurnMark(n);
  });
}

int mz_conversation_commit(mz_conversation* conv) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv) return mz::Status::InvalidArgument("null conversation");
    return conv->conv->Commit();
  });
}

int mz_pool_conversation_report(mz_pool* pool, const char* id, mz_conversation_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id || !out) return mz::Status::InvalidArgument("pool, id and out must not be NULL");
    mz::ConversationReport r;
    MZ_RETURN_IF_ERROR(pool->pool->Report(id, &r));
    FillReport(r, out);
    return mz::Status::Ok();
  });
}

int32_t mz_pool_list(mz_pool* pool, mz_conversation_report* out, int32_t cap) {
  int32_t n = 0;
  int rc = Guard(__func__, [&]() -> mz::Status {
    if (!pool || cap < 0 || (cap > 0 && !out)) return mz::Status::InvalidArgument("bad pool, out or cap");
    const auto all = pool->pool->List();
    for (int32_t i = 0; i < cap && size_t(i) < all.size(); ++i) FillReport(all[size_t(i)], &out[i]);
    n = int32_t(all.size());
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : rc;
}

int mz_pool_get_shared_report(mz_pool* pool, mz_pool_shared_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::SharedChunkReport s = pool->pool->Stats().shared;
    std::memset(out, 0, sizeof *out);
    out->chunks = s.chunks;
    out->units = s.units;
    out->resident_bytes = s.resident_bytes;
    out->storage_bytes = s.storage_bytes;
    out->refs = s.refs;
    out->bytes_if_copied = s.bytes_if_copied;
    return mz::Status::Ok();
  });
}

int mz_pool_get_stored_report(mz_pool* pool, mz_pool_stored_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::PoolStats s = pool->pool->Stats();
    std::memset(out, 0, sizeof *out);
    out->chunk_files = s.chunk_files;
    out->chunk_file_bytes = s.chunk_file_bytes;
    out->chunk_file_refs = s.chunk_file_refs;
    out->chunk_files_damaged = s.chunk_files_damaged;
    return mz::Status::Ok();
  });
}

int mz_pool_get_io_report(mz_pool* pool, mz_pool_io_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::PoolStats s = pool->pool->Stats();
    std::memset(out, 0, sizeof *out);
    out->arena_bytes = s.arena_bytes;
    out->arena_cap = s.arena_cap;
    out->arena_reused_bytes = s.arena_reused;
    out->persist_yielded_s = s.persist_yielded_s;
    out->unsaved = s.unsaved;
    return mz::Status::Ok();
  });
}

int mz_pool_get_batch_report(mz_pool* pool, mz_pool_batch_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::PoolStats s = pool->pool->Stats();
    std::memset(out, 0, sizeof *out);
    out->batching = pool->pool->options().batch;
    out->steps = s.batch.steps;
    out->seq_slots = s.batch.seq_slots;
    out->tokens = s.batch.tokens;
    out->prefill_tokens = s.batch.prefill_tokens;
    out->cancelled = s.batch.cancelled;
    out->max_batch = s.batch.max_batch;
    out->compute_buffer_bytes = s.batch.compute_buffer_bytes;
    out->in_use = s.in_use;
    out->budget_spared_in_use = s.budget_spared_in_use;
    return mz::Status::Ok();
  });
}

int mz_conversation_cancel(mz_conversation* conv) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv) return mz::Status::InvalidArgument("conv must not be NULL");
    conv->conv->Cancel();
    return mz::Status::Ok();
  });
}

int mz_pool_evict_conversation(mz_pool* pool, const char* id, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id) return mz::Status::InvalidArgument("pool and id must not be NULL");
    uint64_t f = 0;
    mz::Status st = pool->pool->EvictConversation(id, &f);
    if (freed) *freed = f;
    return st;
  });
}

int mz_pool_restore_conversation(mz_pool* pool, const char* id, uint64_t* restored) {
  if (restored) *restored = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id) return mz::Status::InvalidArgument("pool and id must not be NULL");
    uint64_t r = 0;
    mz::Status st = pool->pool->RestoreConversation(id, &r);
    if (restored) *restored = r;
    return st;
  });
}

int mz_pool_get_event_report(mz_pool* pool, mz_pool_event_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::PoolStats s = pool->pool->Stats();
    std::memset(out, 0, sizeof *out);
    out->evict_budget = s.evict_budget;
    out->evict_budget_bytes = s.evict_budget_bytes;
    out->evict_pressure = s.evict_pressure;
    out->evict_pressure_bytes = s.evict_pressure_bytes;
    out->evict_trim = s.evict_trim;
    out->evict_trim_bytes = s.evict_trim_bytes;
    out->evict_manual = s.evict_manual;
    out->evict_manual_bytes = s.evict_manual_bytes;
    out->evict_conversation = s.evict_conversation;
    out->evict_conversation_bytes = s.evict_conversation_bytes;
    out->pressure_events = s.pressure_events;
    out->trim_events = s.trim_events;
    out->restored_ahead_bytes = s.restored_ahead;
    out->conversation_restores = s.conversation_restores;
    out->conversation_restored_bytes = s.conversation_restored_bytes;
    out->recomputed = s.recomputed;
    return mz::Status::Ok();
  });
}

int mz_pool_get_remote_report(mz_pool* pool, mz_pool_remote_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::RemoteTierStats r = pool->pool->Stats().remote;
    std::memset(out, 0, sizeof *out);
    out->enabled = r.enabled;
    out->degraded = r.degraded;
    out->pending = r.pending;
    out->manifests_written = r.manifests_written;
    out->chunks_written = r.chunks_written;
    out->chunks_present = r.chunks_present;
    out->bytes_written = r.bytes_written;
    out->write_failures = r.write_failures;
    out->manifest_hits = r.manifest_hits;
    out->manifest_misses = r.manifest_misses;
    out->chunks_fetched = r.chunks_fetched;
    out->bytes_fetched = r.bytes_fetched;
    out->damaged = r.damaged;
    out->prefix_chunks = r.prefix_chunks;
    out->fetch_s = r.fetch_s;
    std::snprintf(out->address, sizeof out->address, "%s", r.address.c_str());
    std::snprintf(out->last_error, sizeof out->last_error, "%s", r.last_error.c_str());
    return mz::Status::Ok();
  });
}

int mz_pool_get_remote_fetch_report(mz_pool* pool, mz_pool_remote_fetch_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::RemoteTierStats r = pool->pool->Stats().remote;
    std::memset(out, 0, sizeof *out);
    out->prefix_chunks = r.prefix_chunks;
    out->fetches_skipped_slower = r.fetches_skipped_slower;
    out->chunks_skipped_slower = r.chunks_skipped_slower;
    out->streaming = r.streaming;
    return mz::Status::Ok();
  });
}

int mz_pool_flush_remote(mz_pool* pool) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool) return mz::Status::InvalidArgument("pool must not be NULL");
    return pool->pool->FlushRemote();
  });
}

int mz_pool_get_report(mz_pool* pool, mz_pool_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    const mz::PoolStats s = pool->pool->Stats();
    std::memset(out, 0, sizeof *out);
    out->n_conversations = s.n_conversations;
    out->n_open = s.n_open;
    out->n_damaged = s.n_damaged;
    out->weights_total = s.weights_total;
    out->weights_resident = s.weights_resident;
    out->kv_resident = s.kv_resident;
    out->kv_mem_compressed = s.kv_mem_compressed;
    out->kv_storage = s.kv_storage;
    out->in_memory = s.in_memory;
    out->stored_bytes = s.stored_bytes;
    out->memory_budget = s.memory_budget;
    out->disk_budget = s.disk_budget;
    out->conversations_lost = s.conversations_lost;
    out->persists = s.persists;
    out->persist_failures = s.persist_failures;
    out->prefix_chunks_reused = s.prefix_chunks_reused;
    out->evictions = s.evictions;
    out->bytes_evicted = s.bytes_evicted;
    return mz::Status::Ok();
  });
}

int32_t mz_pool_conversation_tokens(mz_pool* pool, const char* id, mz_token* out, int32_t cap) {
  int32_t n = 0;
  int rc = Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id || cap < 0 || (cap > 0 && !out)) return mz::Status::InvalidArgument("bad pool, id, out or cap");
    std::vector<int32_t> h;
    MZ_RETURN_IF_ERROR(pool->pool->History(id, &h));
    if (h.size() > size_t(INT32_MAX)) return mz::Status::Internal("history too long");
    std::copy_n(h.begin(), std::min(h.size(), size_t(cap)), out);
    n = int32_t(h.size());
    return mz::Status::Ok();
  });
  return rc == MZ_OK ? n : rc;
}

int mz_pool_conversation_turn_mark(mz_pool* pool, const char* id, int32_t* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !id || !out) return mz::Status::InvalidArgument("bad pool, id or out");
    int m = -1;
    MZ_RETURN_IF_ERROR(pool->pool->TurnMark(id, &m));
    *out = m;
    return mz::Status::Ok();
  });
}

int32_t mz_pool_damaged(mz_pool* pool, int32_t i, char* buf, int32_t cap) {
  if (!pool || i < 0 || (cap > 0 && !buf)) return MZ_ERR_INVALID_ARG;
  const auto d = pool->pool->Damaged();
  if (size_t(i) >= d.size()) return MZ_ERR_INVALID_ARG;
  const std::string s = d[size_t(i)].path + ": " + d[size_t(i)].error;
  if (cap > 0) std::snprintf(buf, size_t(cap), "%s", s.c_str());
  return int32_t(s.size());
}

mz_budget_params mz_budget_default_params(void) {
  mz_budget_params p;
  std::memset(&p, 0, sizeof p);
  p.struct_size = uint32_t(sizeof(p));
  p.pass_after_return = true;
  return p;
}

int mz_budget_new(const mz_budget_params* params, mz_budget** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!out) return mz::Status::InvalidArgument("out must not be NULL");
    mz_budget_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_budget_default_params(), kBudgetParamsSizes, "mz_budget_params", &p));
    auto h = std::make_unique<mz_budget>();
    h->budget = std::make_shared<mz::SharedBudget>(p.memory_budget, mz::AmountOptions(), p.pass_after_return);
    h->budget->set_spread_idle_weights(p.spread_idle_weights);
    h->budget->set_room_behind(p.room_behind);
    *out = h.release();
    return mz::Status::Ok();
  });
}

void mz_budget_free(mz_budget* budget) {
  try {
    delete budget;
  } catch (...) {
  }
}

int mz_budget_evict(mz_budget* budget, uint64_t bytes, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!budget) return mz::Status::InvalidArgument("budget must not be NULL");
    return budget->budget->Evict(bytes, freed);
  });
}

int mz_budget_on_trim_memory(mz_budget* budget, int32_t level, uint64_t* freed) {
  if (freed) *freed = 0;
  return Guard(__func__, [&]() -> mz::Status {
    if (!budget || level < 0) return mz::Status::InvalidArgument("bad budget or level");
    mz::PressureEvent ev;
    if (!TrimLevel(level, &ev.level)) return mz::Status::Ok();
    ev.time_ns = mz::Env::Default()->NowNs();
    ev.source = "onTrimMemory";
    return budget->budget->OnPressure(ev, freed);
  });
}

int mz_budget_get_report(mz_budget* budget, mz_budget_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!budget || !out) return mz::Status::InvalidArgument("budget and out must not be NULL");
    const mz::SharedBudgetStats s = budget->budget->Stats();
    std::memset(out, 0, sizeof *out);
    out->memory_budget = s.memory_budget;
    out->in_memory = s.in_memory;
    out->n_pools = s.n_pools;
    out->passes = s.passes;
    out->bytes_evicted = s.bytes_evicted;
    out->idle_model_kv_bytes = s.idle_model_kv_bytes;
    out->idle_model_weight_bytes = s.idle_model_weight_bytes;
    out->active_model_bytes = s.active_model_bytes;
    out->pressure_events = s.pressure_events;
    out->pressure_bytes = s.pressure_bytes;
    out->evict_calls = s.evict_calls;
    out->evict_bytes = s.evict_bytes;
    return mz::Status::Ok();
  });
}

int mz_budget_settle(mz_budget* budget) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!budget) return mz::Status::InvalidArgument("budget must not be NULL");
    budget->budget->Settle();
    return mz::Status::Ok();
  });
}

int mz_conversation_get_call_report(mz_conversation* conv, mz_call_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!conv || !out) return mz::Status::InvalidArgument("conversation and out must not be NULL");
    const mz::Conversation::CallTimes t = conv->conv->last_call();
    std::memset(out, 0, sizeof *out);
    out->room_s = t.room_s;
    out->room_bytes = t.room_bytes;
    out->pass_s = t.pass_s;
    return mz::Status::Ok();
  });
}

int mz_pool_get_weights_report(mz_pool* pool, mz_pool_weights_report* out) {
  return Guard(__func__, [&]() -> mz::Status {
    if (!pool || !out) return mz::Status::InvalidArgument("pool and out must not be NULL");
    std::memset(out, 0, sizeof *out);
    mz::WeightsTierReport w;
    MZ_RETURN_IF_ERROR(pool->pool->WeightsTiers(&w));
    out->total = w.total;
    out->resident = w.resident;
    out->dropped = w.dropped;
    out->dropped_cached = w.dropped_cached;
    out->units = w.units;
    out->units_resident = w.units_resident;
    out->in_use = pool->pool->ModelInUse();
    for (const auto& r : pool->pool->List())
      out->last_use_unix_ms = std::max<int64_t>(out->last_use_unix_ms, int64_t(r.last_use_unix_ms));
    return mz::Status::Ok();
  });
}

}  // extern "C"
