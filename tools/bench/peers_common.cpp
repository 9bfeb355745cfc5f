#include "tools/bench/peers_common.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <memory>

#include "env/env.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "tools/bench/bench_util.h"
#include "tools/common.h"
#include "tools/bench/real_text.h"

namespace mz::cli {

std::string ModelStem(const std::string& model_path) {
  std::string stem = model_path.substr(model_path.find_last_of('/') + 1);
  const size_t dot = stem.rfind(".gguf");
  return dot == std::string::npos ? stem : stem.substr(0, dot);
}

Status RealTokens(const std::string& model_path, int n, std::vector<int32_t>* toks) {
  std::unique_ptr<Tokenizer> tok;
  MZ_RETURN_IF_ERROR(Tokenizer::Load(model_path, &tok));
  // English prose is ~4 bytes per token: 8 bytes per token cuts the text far past token n, so the
  // first n tokens do not depend on where it is cut (bench ttft cuts at the same rate).
  std::string text;
  MZ_RETURN_IF_ERROR(RealText(size_t(n) * 8, &text));
  MZ_RETURN_IF_ERROR(tok->Tokenize(text.substr(0, size_t(n) * 8), true, false, toks));
  if (int(toks->size()) < n) return Status::Internal("the real text is too short for " + std::to_string(n) + " tokens");
  toks->resize(size_t(n));
  return Status::Ok();
}

std::string SessionPathFor(const std::string& model_path, int n, KvType kv_type) {
  const std::string kv = kv_type == KvType::kF16 ? "" : std::string("-") + KvTypeName(kv_type);
  return CacheDir() + "/contexts/" + ModelStem(model_path) + "-" + std::to_string(n) + kv + ".sess";
}

Status ParseKvTypeList(const std::string& list, const char* option, std::vector<KvType>* out) {
  out->clear();
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    KvType t;
    if (!ParseKvType(item, &t))
      return Status::InvalidArgument(std::string(option) + ": " + item + " is not f16 or q8_0");
    if (std::find(out->begin(), out->end(), t) == out->end()) out->push_back(t);
  }
  if (out->empty()) return Status::InvalidArgument(std::string(option) + ": no KV type");
  return Status::Ok();
}

Status EnsureSessionContext(Context& ctx, const std::string& model_path, const std::vector<int32_t>& toks, int n,
                            std::string* session_path, bool* built) {
  if (n > int(toks.size())) return Status::InvalidArgument("context longer than the token stream");
  const std::string sess = SessionPathFor(model_path, n, ctx.kv().geometry().kv_type);
  *session_path = sess;
  if (built) *built = false;
  FileInfo fi;
  if (Env::Default()->StatPath(sess, &fi).ok()) {
    const double t0 = NowSeconds();
    Status st = LoadSession(ctx, sess);
    if (st.ok() && int(ctx.history().size()) == n &&
        std::equal(ctx.history().begin(), ctx.history().end(), toks.begin())) {
      std::fprintf(stderr, "  context %d: loaded %s in %.1f s (built earlier by prefill)\n", n, sess.c_str(),
                   NowSeconds() - t0);
      return Status::Ok();
    }
    std::fprintf(stderr, "  context %d: %s unusable (%s); rebuilding\n", n, sess.c_str(),
                 st.ok() ? "other tokens" : st.ToString().c_str());
  }
  if (std::system(("mkdir -p '" + CacheDir() + "/contexts'").c_str()) != 0)
    return Status::IOError("cannot create " + CacheDir() + "/contexts");
  std::fprintf(stderr, "  context %d: building by prefill of real text (once; saved to %s)\n", n, sess.c_str());
  ctx.Truncate(0);
  const double t0 = NowSeconds();
  for (int off = 0; off < n; off += 512) {
    const int m = std::min(512, n - off);
    MZ_RETURN_IF_ERROR(ctx.Decode(toks.data() + off, m, false));
    std::fprintf(stderr, "\r  prefill %d/%d tokens (%.0f s)", off + m, n, NowSeconds() - t0);
  }
  std::fprintf(stderr, "\n");
  if (built) *built = true;
  return SaveSession(ctx, sess, "none");
}

Status MeasureLevel(Context& ctx, double level, const std::vector<int32_t>& query, int base, LevelRun* out,
                    const PipelineOptions& po) {
  MZ_RETURN_IF_ERROR(ctx.Restore());
  ctx.Truncate(base);
  if (level < 1.0) {
    MemoryReport m = ctx.Report();
    const double in_mem = double(m.in_memory() - m.base_resident), foot = double(m.footprint() - m.base_total);
    const double target = std::max(0.0, level) * foot;
    if (in_mem > target) MZ_RETURN_IF_ERROR(ctx.EvictBytes(uint64_t(in_mem - target), nullptr));
  }
  out->remaining = ctx.Report().remaining(true);
  RestoreGenerateStats st;
  MZ_RETURN_IF_ERROR(ctx.RestoreGenerate(query.data(), int(query.size()), po, &st));
  out->ttft = st.ttft_s;
  out->alloc = st.pipeline.alloc_s;
  out->reload = st.pipeline.reload_s;
  out->bytes_from_storage = st.pipeline.bytes_from_storage;
  out->bytes_decoded = st.pipeline.bytes_decoded;
  const float* l = ctx.logits(ctx.n_logit_rows() - 1);
  const int nv = int(ctx.model()->hparams().n_vocab);
  out->top1 = l ? int(std::max_element(l, l + nv) - l) : -1;
  return Status::Ok();
}

std::string Sprintf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < int(sizeof buf)) return std::string(buf, size_t(std::max(n, 0)));
  std::string s(size_t(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(s.data(), s.size(), fmt, ap);
  va_end(ap);
  s.resize(size_t(n));
  return s;
}

}  // namespace mz::cli
