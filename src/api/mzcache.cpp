// The C boundary: catches every exception, maps Status to mz_status, records the message. This file:
// the version, status strings, CPU lists, and the params conversions shared by the rooms by handle:
// model_api.cpp (mz_model), context_api.cpp (mz_context, its sessions, mz_sampler),
// pressure_api.cpp (a context's memory pressure), profile_api.cpp, pool_api.cpp (mz_pool,
// mz_conversation, mz_budget), plan_api.cpp, sustained_api.cpp.
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
  if (p.restore_nice_beside_batch < 0 || p.restore_nice_beside_batch > 19)
    return mz::Status::InvalidArgument("restore_nice_beside_batch " + std::to_string(p.restore_nice_beside_batch) +
                                       " is not in 0..19");
  o->restore_nice_beside_batch = p.restore_nice_beside_batch;
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
  if (p.compute_threads_while_restoring < 0) return mz::Status::InvalidArgument("compute_threads_while_restoring < 0");
  po->compute_threads_while_restoring = p.compute_threads_while_restoring;
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
