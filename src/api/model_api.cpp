// The C boundary of a model (include/mzcache.h "model"): load, verify, free, info, tokenizer, chat
// templates.
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

mz_model_params mz_model_default_params(void) {
  mz_model_params p;
  p.struct_size = uint32_t(sizeof(p));
  p.direct_io = true;
  p.io_threads = 2;
  p.weight_memory = MZ_WEIGHTS_PAGE_CACHE;
  return p;
}

namespace model_api {
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
}  // namespace model_api
using namespace model_api;

int mz_model_load(const char* path, const mz_model_params* params, mz_model** out) {
  if (out) *out = nullptr;
  return Guard(__func__, [&]() -> mz::Status {
    if (!path || !out) return mz::Status::InvalidArgument("path and out must not be NULL");
    mz_model_params p;
    MZ_RETURN_IF_ERROR(ReadParams(params, mz_model_default_params(), kModelParamsSizes, "mz_model_params", &p));
    mz::ModelOptions o;
    o.direct_io = p.direct_io;
    o.io_threads = p.io_threads > 0 ? p.io_threads : 1;
    if (p.weight_memory != MZ_WEIGHTS_PAGE_CACHE && p.weight_memory != MZ_WEIGHTS_ANONYMOUS &&
        p.weight_memory != MZ_WEIGHTS_REPACKED)
      return mz::Status::InvalidArgument(
          "weight_memory must be MZ_WEIGHTS_PAGE_CACHE, MZ_WEIGHTS_ANONYMOUS or MZ_WEIGHTS_REPACKED");
    o.weights = p.weight_memory == MZ_WEIGHTS_ANONYMOUS ? mz::WeightMemory::kAnonymous : mz::WeightMemory::kPageCache;
    o.repack = p.weight_memory == MZ_WEIGHTS_REPACKED;
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

}  // extern "C"
