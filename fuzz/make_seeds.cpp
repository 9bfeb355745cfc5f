// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): a few valid inputs and a
// few truncated ones per target, small (the whole corpus stays well under 200 KiB). Deterministic:
// re-running it rewrites the same files. Usage: fuzz_make_seeds <corpus folder>
// (scripts/fuzz.sh --make-seeds runs it into fuzz/corpus). GGUF seeds carry no .gguf suffix (ignored by git).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "env/env.h"
#include "fuzz_util.h"
#include "ggml.h"
#include "gguf.h"
#include "model/model.h"
#include "policy/device_profile.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "store/kv_codec.h"

namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void WriteAll(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
// The valid seed, and cuts of it at the given lengths (clamped below its size).
void WriteWithCuts(const fs::path& dir, const std::string& name, const std::vector<uint8_t>& b,
                   std::vector<size_t> cuts) {
  WriteAll(dir / (name), b);
  for (size_t c : cuts)
    if (c < b.size()) WriteAll(dir / (name + ".cut" + std::to_string(c)), std::vector<uint8_t>(b.begin(), b.begin() + long(c)));
}

// A minimal GGUF the loader accepts: 1 layer, n_embd 32, 4 heads of 8 (2 KV heads), n_ff 64, a
// 16-token vocabulary (no tokenizer: the loader does not read one).
std::vector<uint8_t> TinyGguf(const std::string& arch, ggml_type wtype, bool untied) {
  const int64_t E = 32, H = 4, HKV = 2, D = 8, F = 64, V = 16;
  ggml_init_params ip{size_t(64) << 10, nullptr, false};
  ggml_context* c = ggml_init(ip);
  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", arch.c_str());
  gguf_set_val_str(g, "general.name", ("fuzz-seed-" + arch).c_str());
  const std::string p = arch + ".";
  gguf_set_val_u32(g, (p + "context_length").c_str(), 128);
  gguf_set_val_u32(g, (p + "embedding_length").c_str(), E);
  gguf_set_val_u32(g, (p + "block_count").c_str(), 1);
  gguf_set_val_u32(g, (p + "feed_forward_length").c_str(), F);
  gguf_set_val_u32(g, (p + "attention.head_count").c_str(), H);
  gguf_set_val_u32(g, (p + "attention.head_count_kv").c_str(), HKV);
  gguf_set_val_f32(g, (p + "attention.layer_norm_rms_epsilon").c_str(), 1e-6f);
  gguf_set_val_f32(g, (p + "rope.freq_base").c_str(), 10000.0f);
  uint8_t fill = 1;
  auto add = [&](const std::string& name, ggml_type t, std::vector<int64_t> ne) {
    ggml_tensor* x = ggml_new_tensor(c, t, int(ne.size()), ne.data());
    ggml_set_name(x, name.c_str());
    std::memset(x->data, fill++, ggml_nbytes(x));
    if (t == GGML_TYPE_F32)
      for (int64_t i = 0; i < ggml_nelements(x); ++i) static_cast<float*>(x->data)[i] = 1.0f;
    gguf_add_tensor(g, x);
  };
  add("token_embd.weight", wtype, {E, V});
  add("output_norm.weight", GGML_TYPE_F32, {E});
  if (untied) add("output.weight", wtype, {E, V});
  add("blk.0.attn_norm.weight", GGML_TYPE_F32, {E});
  add("blk.0.attn_q.weight", wtype, {E, H * D});
  add("blk.0.attn_k.weight", wtype, {E, HKV * D});
  add("blk.0.attn_v.weight", wtype, {E, HKV * D});
  add("blk.0.attn_output.weight", wtype, {H * D, E});
  if (arch == "qwen2") {
    add("blk.0.attn_q.bias", GGML_TYPE_F32, {H * D});
    add("blk.0.attn_k.bias", GGML_TYPE_F32, {HKV * D});
    add("blk.0.attn_v.bias", GGML_TYPE_F32, {HKV * D});
  }
  if (arch == "qwen3") {
    add("blk.0.attn_q_norm.weight", GGML_TYPE_F32, {D});
    add("blk.0.attn_k_norm.weight", GGML_TYPE_F32, {D});
  }
  add("blk.0.ffn_norm.weight", GGML_TYPE_F32, {E});
  add("blk.0.ffn_gate.weight", wtype, {E, F});
  add("blk.0.ffn_up.weight", wtype, {E, F});
  add("blk.0.ffn_down.weight", wtype, {F, E});
  const std::string tmp = mz::fuzz::ScratchPath("seed.gguf");
  if (!gguf_write_to_file(g, tmp.c_str(), false)) mz::fuzz::Fail("gguf_write_to_file");
  gguf_free(g);
  ggml_free(c);
  std::vector<uint8_t> b = ReadAll(tmp);
  mz::ModelOptions o;
  o.load_weights = false;
  std::unique_ptr<mz::Model> m;
  mz::Status st = mz::Model::Load(mz::Env::Default(), tmp, o, &m);
  if (!st.ok()) mz::fuzz::Fail("seed GGUF rejected: " + st.ToString());
  return b;
}

void GgufSeeds(const fs::path& dir) {
  WriteWithCuts(dir, "qwen3-q8_0", TinyGguf("qwen3", GGML_TYPE_Q8_0, false), {24, 200, 1000});
  WriteWithCuts(dir, "llama-f16-untied", TinyGguf("llama", GGML_TYPE_F16, true), {600});
  WriteWithCuts(dir, "qwen2-q8_0", TinyGguf("qwen2", GGML_TYPE_Q8_0, false), {});
}

void SessionSeeds(const fs::path& dir) {
  std::unique_ptr<mz::Model> m;
  mz::Status st = mz::Model::Load(mz::Env::Default(), mz::fuzz::TinyModelPath("tiny-qwen3"), mz::ModelOptions(), &m);
  if (!st.ok()) mz::fuzz::Fail(st.ToString());
  mz::ContextOptions co;  // as fuzz_session.cpp
  co.n_ctx = 64;
  co.kv_chunk_tokens = 16;
  co.n_threads = 1;
  co.restore_threads = 1;
  co.swap_path = mz::fuzz::ScratchPath("seed.swap");
  mz::Context ctx(m.get(), co);
  if (!(st = ctx.Init()).ok()) mz::fuzz::Fail(st.ToString());
  const mz::HParams& hp = m->hparams();
  const size_t chunk_elems = 2 * size_t(hp.n_head_kv) * size_t(co.kv_chunk_tokens) * size_t(hp.head_dim);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  auto fill = [&](int, int, uint16_t* dst) {
    for (size_t i = 0; i < chunk_elems; ++i) dst[i] = ggml_fp32_to_fp16(u(rng));
  };
  const std::string tmp = mz::fuzz::ScratchPath("seed.mzs");
  // 5 tokens (one chunk per layer) per codec, and an empty conversation; cuts of the q8 one.
  for (const char* codec : {"none", "q8", "cachegen"}) {
    if (!(st = ctx.ImportKv(5, fill)).ok() || !(st = mz::SaveSession(ctx, tmp, codec)).ok()) mz::fuzz::Fail(st.ToString());
    if (std::string(codec) == "q8") WriteWithCuts(dir, std::string("5tok-") + codec + ".mzs", ReadAll(tmp), {100, 4096, 9000});
    else WriteAll(dir / (std::string("5tok-") + codec + ".mzs"), ReadAll(tmp));
  }
  if (!(st = ctx.ImportKv(0, fill)).ok() || !(st = mz::SaveSession(ctx, tmp, "q8")).ok()) mz::fuzz::Fail(st.ToString());
  WriteAll(dir / "empty.mzs", ReadAll(tmp));
}

// Codec inputs (fuzz_codec.cpp layout): 8 shape/mode bytes, then a blob each codec made from a
// chunk of 2 KV heads x 16 tokens x head_dim 32 with 10 valid rows (layer 1 of 2); the same with
// the harness writing the header (payload only); and a cut blob.
void CodecSeeds(const fs::path& dir) {
  mz::ChunkShape s{2, 16, 32, 10, 1, 2};
  std::vector<uint16_t> raw(s.raw_bytes() / 2);
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0.f, 1.f);
  for (auto& v : raw) v = ggml_fp32_to_fp16(n(rng));
  for (const std::string& name : mz::KvCodecNames()) {
    auto c = mz::MakeKvCodec(name);
    std::vector<uint8_t> blob(c->MaxEncodedSize(s));
    size_t w = 0;
    mz::Status st = c->Encode(s, raw.data(), blob.data(), blob.size(), &w);
    if (!st.ok()) mz::fuzz::Fail(st.ToString());
    blob.resize(w);
    std::vector<uint8_t> in = {c->id(), 1, 31, 15, 9, 1, 1, 0};
    in.insert(in.end(), blob.begin(), blob.end());
    WriteWithCuts(dir, name + ".blob", in, {8 + mz::kKvCodecHeaderBytes + 7});
    std::vector<uint8_t> pl = {c->id(), 1, 31, 15, 9, 1, 1, 1};
    pl.insert(pl.end(), blob.begin() + mz::kKvCodecHeaderBytes, blob.end());
    WriteAll(dir / (name + ".payload"), pl);
  }
}

void ProfileSeeds(const fs::path& dir) {
  mz::DeviceProfile p = mz::DeviceProfile::Default();
  const std::string tmp = mz::fuzz::ScratchPath("seed.json");
  mz::Status st = p.Save(tmp);
  if (!st.ok()) mz::fuzz::Fail(st.ToString());
  std::vector<uint8_t> a = ReadAll(tmp);
  WriteWithCuts(dir, "default.json", a, {a.size() / 2});
  p.device = "measured";
  p.encode_Bps = {{"q8", 1.5e9}, {"cachegen", 2e8}};
  p.ratio = {{"q8", 0.53}, {"q4", 0.28}, {"cachegen", 0.2}};
  p.mapped_read_Bps = 2.5e9;
  p.mapped_read_by_request = {{256 << 10, 0.9e9}, {64 << 20, 2.5e9}};
  p.threads = 2;
  if (!(st = p.Save(tmp)).ok()) mz::fuzz::Fail(st.ToString());
  WriteAll(dir / "measured.json", ReadAll(tmp));
}

// Chat inputs (fuzz_chat.cpp layout): a flags byte, then role\0content\0...
void ChatSeeds(const fs::path& dir) {
  auto put = [&](const std::string& name, uint8_t flags, const std::string& body) {
    std::vector<uint8_t> b = {flags};
    b.insert(b.end(), body.begin(), body.end());
    WriteAll(dir / name, b);
  };
  using namespace std::string_literals;
  put("qwen-2turns", 0x0e, "system\0You are terse.\0user\0Hello, who are you?\0assistant\0A model.\0user\0Why?"s);
  put("llama-1turn", 0x07, "user\0<|begin_of_text|>Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 tabs\tand\nlines"s);
  put("qwen-special", 0x08, "user\0<|im_start|>assistant\n<|im_end|><think></think>"s);
  put("bytes", 0x01, "\xff\xfe\x80 invalid utf-8 \xc3"s);
  put("empty", 0x02, "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus folder>\n", argv[0]);
    return 2;
  }
  const fs::path root(argv[1]);
  for (const char* t : {"gguf", "session", "codec", "profile", "chat"}) fs::create_directories(root / t);
  GgufSeeds(root / "gguf");
  SessionSeeds(root / "session");
  CodecSeeds(root / "codec");
  ProfileSeeds(root / "profile");
  ChatSeeds(root / "chat");
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
