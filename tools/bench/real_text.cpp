#include "tools/bench/real_text.h"

#include <memory>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"

#include <fstream>
#include <sstream>

#include "tools/bench/bench_util.h"
#include "tools/common.h"

namespace mz::cli {

Status RealText(size_t min_bytes, std::string* out) {
  const std::string path = CacheDir() + "/text/kjv.txt";
  std::ifstream f(path);
  std::string text;
  if (f) {
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  } else {
    int rc = 0;
    // Strip the verse references ("Ge1:1 ") so the context is plain prose.
    text = RunCapture("bible -f 'gen1:1-rev22:21' 2>/dev/null | sed 's/^[^ ]* //'", &rc);
    if (rc == 0 && text.size() > 1000000) {
      WriteFile(CacheDir() + "/text", "kjv.txt", text);
    } else {
      text.clear();
      for (const char* p : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2",
                            "/usr/share/common-licenses/Apache-2.0"}) {
        std::ifstream g(p);
        std::stringstream ss;
        ss << g.rdbuf();
        text += ss.str();
      }
      if (text.empty()) return Status::IOError("no long text found: install bible-kjv (scripts/deps.sh does)");
    }
  }
  out->clear();
  while (out->size() < min_bytes) *out += text;
  return Status::Ok();
}

// Real KV: chunks of a context built by prefill of real text.
Status RealKvChunks(const std::string& model_path, std::vector<std::vector<uint16_t>>* chunks, ChunkShape* shape,
                    int* n_head) {
  std::unique_ptr<Model> model;
  MZ_RETURN_IF_ERROR(Model::Load(Env::Default(), model_path, ModelOptions(), &model));
  std::unique_ptr<Tokenizer> tok;
  MZ_RETURN_IF_ERROR(Tokenizer::Load(model_path, &tok));
  std::string text;
  MZ_RETURN_IF_ERROR(RealText(64 << 10, &text));
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(tok->Tokenize(text, true, false, &toks));
  toks.resize(512);
  ContextOptions co;
  co.n_ctx = 1024;
  Context ctx(model.get(), co);
  MZ_RETURN_IF_ERROR(ctx.Init());
  std::fprintf(stderr, "  prefill of 512 real-text tokens for real KV chunks...\n");
  MZ_RETURN_IF_ERROR(ctx.Decode(toks.data(), 512, false));
  const KvGeometry& g = ctx.kv().geometry();
  *shape = ChunkShape{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer};
  if (n_head) *n_head = int(model->hparams().n_head);
  for (int l = 0; l < g.n_layer; ++l)
    for (int c = 0; c < 2; ++c) {
      const uint16_t* p = ctx.kv().chunk(l, c);
      chunks->emplace_back(p, p + g.chunk_bytes() / 2);
    }
  return Status::Ok();
}

}  // namespace mz::cli
