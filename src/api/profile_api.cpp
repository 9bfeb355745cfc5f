// The C boundary of device profiling (mz_profile_*).
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
#include "store/remote_kv.h"
#include "pressure/manual_source.h"
#include "pressure/monitor.h"
#include "runtime/chat_render.h"
#include "runtime/context.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "api/api_internal.h"

using namespace mz_api;
namespace profile_api {
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
}  // namespace profile_api
using namespace profile_api;

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
  p.remote_url = nullptr;
  p.remote_ca_file = nullptr;
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
    // The remote tier's store first (seconds), so that a store that cannot be reached fails before
    // the long measurements.
    std::unique_ptr<mz::RemoteKv> store;
    if (p.remote_ca_file && !(p.remote_url && *p.remote_url))
      return mz::Status::InvalidArgument("remote_ca_file without a remote_url");
    if (p.remote_url && *p.remote_url) {
      mz::RedisOptions ro;
      MZ_RETURN_IF_ERROR(mz::ParseRemoteUrl(p.remote_url, &ro.url));
      if (p.remote_ca_file) {
        if (!ro.url.tls)
          return mz::Status::InvalidArgument("remote_ca_file '" + std::string(p.remote_ca_file) +
                                             "' needs a rediss:// remote_url (TLS)");
        ro.ca_file = p.remote_ca_file;
      }
      MZ_RETURN_IF_ERROR(mz::OpenRedisKv(ro, &store));
    }
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
    mz::DeviceProfile remote;
    if (store) {
      // Values of a realistic chunk's size: one chunk of every layer at the q8 ratio (the tier's
      // default codec), as the tier stores them.
      const uint64_t chunk = uint64_t(kv.chunks.empty() ? 0 : kv.chunks[0].size() * 2) * uint64_t(kv.shape.n_layer);
      const uint64_t value = std::max<uint64_t>(1, uint64_t(double(chunk) * mz::DeviceProfile::Default().Ratio("q8")));
      MZ_RETURN_IF_ERROR(mz::ProfileRemote(env, store.get(), value, p.quick ? 4 : 8, p.quick ? 3 : 10, &remote, o.report));
    } else if (o.report) {
      o.report("\nRemote tier: not measured (no remote URL: `mzcache profile --remote redis://host:port`); a pool "
               "with a remote tier learns its rate at run time (RemoteTierStats: bytes_fetched / fetch_s)\n");
    }
    mz::DeviceProfile prof;
    MZ_RETURN_IF_ERROR(mz::ProfileDevice(env, kv, pm, o, &prof));
    prof.remote_read_Bps = remote.remote_read_Bps;
    prof.remote_first_byte_s = remote.remote_first_byte_s;
    return prof.Save(out_path);
  });
}

}  // extern "C"