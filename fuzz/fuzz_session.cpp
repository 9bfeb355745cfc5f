// Fuzz target: session files (LoadSession) into a small context (n_ctx 64, 16-token chunks) of the
// synthesized tiny-qwen3 model. Each input is loaded twice: as it is (the checksums almost always
// reject it), then with its checksums fixed up by the harness (the model hash, every chunk record's
// payload hash that lies inside the file, the index hash, the header hash: see session_file.h for
// the layout), so that the fuzzer reaches the geometry, index, record and codec checks behind them.
// Contracts: LoadSession returns a Status (never crashes or reads out of bounds); on failure the
// context's conversation is unchanged; on success it holds the file's tokens and decodes a token.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "env/env.h"
#include "fuzz_util.h"
#include "model/model.h"
#include "runtime/context.h"
#include "runtime/session_file.h"

namespace {
mz::Model* g_model = nullptr;
mz::Context* g_ctx = nullptr;
std::string* g_path = nullptr;
constexpr size_t kHeaderBytes = 4096;
// Field offsets of the version-1 header (runtime/session_file.cpp, struct Header, packed).
constexpr size_t kModelHash = 16, kNTokens = 44, kNChunks = 48, kIndexOff = 56, kIndexBytes = 64, kHeaderHash = 80;
constexpr size_t kRecordBytes = 32;  // {u64 offset, u64 size, u64 xxh64, u32 enc_tokens, u32 reserved}

uint64_t Get64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
uint32_t Get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
void Put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Fixes the checksums of a session image in place (what a valid writer would have computed).
void FixUp(std::vector<uint8_t>& f) {
  Put64(&f[kModelHash], g_model->identity().header_hash);
  const uint64_t io = Get64(&f[kIndexOff]), ib = Get64(&f[kIndexBytes]);
  if (io <= f.size() && ib >= 8 && ib <= f.size() - io) {
    uint8_t* idx = &f[io];
    const uint64_t toks = uint64_t(Get32(&f[kNTokens])) * 4;
    for (uint64_t r = toks; r + kRecordBytes <= ib - 8; r += kRecordBytes) {
      const uint64_t off = Get64(idx + r), size = Get64(idx + r + 8);
      if (off <= f.size() && size <= f.size() - off) Put64(idx + r + 16, XXH64(&f[off], size, 0));
    }
    Put64(idx + ib - 8, XXH64(idx, ib - 8, 0));
  }
  Put64(&f[kHeaderHash], XXH64(f.data(), kHeaderHash, 0));
  (void)kNChunks;
}

void LoadOnce(const uint8_t* data, size_t size) {
  mz::fuzz::WriteInput(g_model->env(), *g_path, data, size);
  const std::vector<int32_t> before = g_ctx->history();
  mz::SessionInfo info;
  mz::Status st = mz::LoadSession(*g_ctx, *g_path, &info);
  if (!st.ok()) {
    if (g_ctx->history() != before) mz::fuzz::Fail("a failed LoadSession changed the conversation");
    return;
  }
  if (int(g_ctx->history().size()) != info.n_tokens) mz::fuzz::Fail("loaded token count");
  // The restored KV is usable: one more token decodes (or the context is full).
  const int32_t t = 1;
  st = g_ctx->Decode(&t, 1, false);
  if (!st.ok() && st.code() != mz::Status::kContextFull) mz::fuzz::Fail("decode after load: " + st.ToString());
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  mz::ModelOptions mo;
  std::unique_ptr<mz::Model> m;
  mz::Status st = mz::Model::Load(mz::Env::Default(), mz::fuzz::TinyModelPath("tiny-qwen3"), mo, &m);
  if (!st.ok()) mz::fuzz::Fail("harness: " + st.ToString());
  g_model = m.release();
  mz::ContextOptions co;
  co.n_ctx = 64;
  co.kv_chunk_tokens = 16;
  co.n_threads = 1;
  co.restore_threads = 1;
  co.swap_path = mz::fuzz::ScratchPath("ctx.swap");
  g_ctx = new mz::Context(g_model, co);
  st = g_ctx->Init();
  if (!st.ok()) mz::fuzz::Fail("harness: " + st.ToString());
  g_path = new std::string(mz::fuzz::ScratchPath("session.mzs"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  LoadOnce(data, size);
  if (size < kHeaderBytes) return 0;
  std::vector<uint8_t> f(data, data + size);
  FixUp(f);
  LoadOnce(f.data(), f.size());
  return 0;
}
