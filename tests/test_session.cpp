// Session files: save a context, load it in a fresh process, and the continuation is identical (a
// killed process resumes its conversation without recompute). Truncated or corrupt files, and
// files of another model, are rejected with kCorruption and leave the context unchanged.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/context.h"
#include "runtime/session_file.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr int kPrompt = 300;  // crosses chunk boundaries (chunk 64)
constexpr int kNext = 4;

struct Rig {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Rig Make(const std::string& path) {
  Rig r;
  EXPECT_TRUE(Model::Load(Env::Default(), path, ModelOptions(), &r.model).ok());
  ContextOptions co;
  co.n_ctx = 1024;
  co.kv_chunk_tokens = 64;
  co.swap_path = test::TempDir() + "/sess-" + std::to_string(getpid()) + ".swap";
  r.ctx = std::make_unique<Context>(r.model.get(), co);
  EXPECT_TRUE(r.ctx->Init().ok());
  return r;
}

std::vector<int32_t> Tokens(const std::string& path) { return test::PromptTokens(path, kPrompt + kNext); }

// Logits of the kNext continuation tokens, all rows.
std::vector<float> Continue(Context& c, const std::vector<int32_t>& toks) {
  Status st = c.Decode(toks.data() + kPrompt, kNext, true);
  EXPECT_TRUE(st.ok()) << st.ToString();
  const size_t nv = c.model()->hparams().n_vocab;
  std::vector<float> out;
  for (int i = 0; i < kNext; ++i) out.insert(out.end(), c.logits(i), c.logits(i) + nv);
  return out;
}

std::vector<float> ReadFloats(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

// Child side: runs only when the parent re-executes this binary with MZ_SESSION_CHILD set.
TEST(SessionChild, LoadAndContinue) {
  const char* sess = std::getenv("MZ_SESSION_CHILD");
  if (!sess) GTEST_SKIP() << "runs only as the child process of SessionFile.FreshProcessContinuesIdentically";
  const std::string path = test::ModelPath("tiny-qwen3");
  Rig r = Make(path);
  SessionInfo info;
  Status st = LoadSession(*r.ctx, sess, &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(info.n_tokens, kPrompt);
  auto out = Continue(*r.ctx, Tokens(path));
  std::ofstream f(std::string(sess) + ".logits", std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * 4));
}

class SessionFile : public ::testing::TestWithParam<std::string> {};

TEST_P(SessionFile, FreshProcessContinuesIdentically) {
  const std::string codec = GetParam();
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Tokens(path);
  Rig a = Make(path);
  ASSERT_TRUE(a.ctx->Decode(toks.data(), kPrompt, false).ok());
  const std::string sess = test::TempDir() + "/s-" + codec + ".sess";
  SessionInfo info;
  ASSERT_TRUE(SaveSession(*a.ctx, sess, codec, &info).ok());
  EXPECT_EQ(info.n_tokens, kPrompt);
  // The reference continuation: with "none" the never-saved context; with a lossy codec, the same
  // context after its KV went through that codec in memory (same encode, same decode).
  std::vector<float> want;
  if (codec == "none") {
    want = Continue(*a.ctx, toks);
  } else {
    ContextOptions co = a.ctx->options();
    co.kv_codec = codec;
    Context c(a.model.get(), co);
    ASSERT_TRUE(c.Init().ok());
    ASSERT_TRUE(c.Decode(toks.data(), kPrompt, false).ok());
    Plan p;
    for (int l = 0; l < 4; ++l)
      for (int ch = 0; ch < c.kv().n_chunks(); ++ch) p.push_back({UnitRef::Kv(l, ch), UnitState::kKvMemCompressed});
    ASSERT_TRUE(c.Evict(p, 0, nullptr).ok());
    want = Continue(c, toks);
  }
  // A fresh process: this binary again, running only the child test.
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  exe[n] = 0;
  const std::string cmd = "MZ_SESSION_CHILD='" + sess + "' '" + exe + "' --gtest_filter=SessionChild.* > '" + sess +
                          ".log' 2>&1";
  ASSERT_EQ(0, std::system(cmd.c_str())) << "child failed; see " << sess << ".log";
  const auto got = ReadFloats(sess + ".logits");
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4))
      << "the continuation in a fresh process differs from the reference";
}

INSTANTIATE_TEST_SUITE_P(Codecs, SessionFile, ::testing::Values("none", "q8"));

TEST(SessionFile, CorruptOrTruncatedFilesAreRejectedAndTheContextIsUnchanged) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Tokens(path);
  Rig a = Make(path);
  ASSERT_TRUE(a.ctx->Decode(toks.data(), kPrompt, false).ok());
  const std::string sess = test::TempDir() + "/good.sess";
  ASSERT_TRUE(SaveSession(*a.ctx, sess, "q8").ok());
  std::ifstream in(sess, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  Rig b = Make(path);
  ASSERT_TRUE(b.ctx->Decode(toks.data(), 10, false).ok());  // a different conversation that must survive
  const auto before = b.ctx->history();
  auto attempt = [&](const std::string& bytes, const char* what) {
    const std::string p = test::TempDir() + "/bad.sess";
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), std::streamsize(bytes.size()));
    }
    Status st = LoadSession(*b.ctx, p);
    EXPECT_EQ(st.code(), Status::kCorruption) << what << ": " << st.ToString();
    EXPECT_EQ(b.ctx->history(), before) << what << ": the context changed";
  };
  for (size_t cut : {size_t(0), size_t(100), size_t(4095), size_t(4096), size_t(5000), good.size() / 2, good.size() - 1})
    attempt(good.substr(0, cut), ("truncated at " + std::to_string(cut)).c_str());
  std::mt19937 rng(5);
  // Header fields, the token list, a chunk record, and a chunk's payload (data starts at 8192 here:
  // header 4096 + index of 300 tokens and 20 records, aligned). Padding after a payload is not data.
  for (size_t off : {size_t(3), size_t(20), size_t(60), size_t(4100), size_t(4096 + 4 * kPrompt + 8), size_t(8192 + 20)}) {
    std::string bad = good;
    bad[off] = char(bad[off] ^ 0x40);
    attempt(bad, ("byte flipped at " + std::to_string(off)).c_str());
  }
  // Another model's session.
  Rig other = [&] {
    Rig r;
    EXPECT_TRUE(Model::Load(Env::Default(), test::ModelPath("tiny-qwen2"), ModelOptions(), &r.model).ok());
    ContextOptions co;
    co.kv_chunk_tokens = 64;
    r.ctx = std::make_unique<Context>(r.model.get(), co);
    EXPECT_TRUE(r.ctx->Init().ok());
    return r;
  }();
  Status st = LoadSession(*other.ctx, sess);
  EXPECT_EQ(st.code(), Status::kCorruption);
  EXPECT_NE(st.message().find("different model"), std::string::npos) << st.message();
  // The good file still loads into b and replaces its conversation.
  ASSERT_TRUE(LoadSession(*b.ctx, sess).ok());
  EXPECT_EQ(int(b.ctx->history().size()), kPrompt);
}


// A session file opened as a context's storage tier (OpenSessionAsStorage): nothing is read at
// open (every chunk on storage), the continuation equals the original context's (lossless codec:
// exact, the same as LoadSession's), the file is never written or removed, a file of another codec
// or a damaged header is refused with the context unchanged, and a flipped payload byte is found
// when that chunk is read (kCorruption), not served.
TEST(SessionFile, OpenedAsStorageIsReadAsRestored) {
  const std::string path = test::ModelPath("tiny-qwen3");
  const auto toks = Tokens(path);
  auto make = [&](const std::string& codec) {
    Rig r;
    EXPECT_TRUE(Model::Load(Env::Default(), path, ModelOptions(), &r.model).ok());
    ContextOptions co;
    co.n_ctx = 1024;
    co.kv_chunk_tokens = 64;
    co.kv_codec = codec;
    co.swap_path = test::TempDir() + "/sess-st-" + codec + "-" + std::to_string(getpid()) + ".swap";
    r.ctx = std::make_unique<Context>(r.model.get(), co);
    EXPECT_TRUE(r.ctx->Init().ok());
    return r;
  };
  Rig a = make("none");
  ASSERT_TRUE(a.ctx->Decode(toks.data(), kPrompt, false).ok());
  const std::string sess = test::TempDir() + "/storage.sess";
  ASSERT_TRUE(SaveSession(*a.ctx, sess, "none").ok());
  const auto want = Continue(*a.ctx, toks);
  {
    Rig b = make("none");
    SessionInfo info;
    ASSERT_TRUE(OpenSessionAsStorage(*b.ctx, sess, &info).ok());
    EXPECT_EQ(info.n_tokens, kPrompt);
    const MemoryReport r = b.ctx->units().Report();
    EXPECT_EQ(r.kv_resident, 0u);
    EXPECT_EQ(r.n_kv_chunks[int(UnitState::kKvStorageCompressed)], r.n_kv_chunks[0] + r.n_kv_chunks[int(UnitState::kKvStorageCompressed)]);
    EXPECT_GT(r.kv_storage_compressed, 0u);
    EXPECT_EQ(b.ctx->history().size(), size_t(kPrompt));
    EXPECT_EQ(Continue(*b.ctx, toks), want);
    Rig c = make("none");
    ASSERT_TRUE(LoadSession(*c.ctx, sess).ok());
    EXPECT_EQ(Continue(*c.ctx, toks), want);
  }
  std::ifstream in(sess, std::ios::binary);
  ASSERT_TRUE(in.good()) << "the stored file was removed with the context";
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  Rig q = make("q8");
  ASSERT_TRUE(q.ctx->Decode(toks.data(), 10, false).ok());
  const auto before = q.ctx->history();
  Status st = OpenSessionAsStorage(*q.ctx, sess);
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  EXPECT_EQ(q.ctx->history(), before);
  Rig d = make("none");
  ASSERT_TRUE(d.ctx->Decode(toks.data(), 10, false).ok());
  const std::string p = test::TempDir() + "/storage-bad.sess";
  auto write = [&](const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  };
  std::string bad = good;
  bad[20] = char(bad[20] ^ 0x40);  // header
  write(bad);
  st = OpenSessionAsStorage(*d.ctx, p);
  EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
  EXPECT_EQ(d.ctx->history(), before);
  bad = good;
  bad[8192 + 20] = char(bad[8192 + 20] ^ 0x40);  // layer 0, chunk 0's payload
  write(bad);
  ASSERT_TRUE(OpenSessionAsStorage(*d.ctx, p).ok());  // the payload is not read at open
  st = d.ctx->Decode(toks.data() + kPrompt, 1, false);
  EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
}

// Regression (found by the fuzz seed generator under UBSan, fuzz/make_seeds.cpp): an empty
// conversation (0 tokens, 0 chunk records) saves and loads; the writer and the loader passed a
// null data() of an empty vector to memcpy. The UBSan stage of scripts/test.sh fails on that.
TEST(SessionFile, EmptyConversationSavesAndLoads) {
  const std::string path = test::ModelPath("tiny-qwen3");
  Rig a = Make(path);
  const std::string sess = test::TempDir() + "/empty.sess";
  SessionInfo info;
  ASSERT_TRUE(SaveSession(*a.ctx, sess, "q8", &info).ok());
  EXPECT_EQ(info.n_tokens, 0);
  Rig b = Make(path);
  const auto toks = Tokens(path);
  ASSERT_TRUE(b.ctx->Decode(toks.data(), 10, false).ok());
  Status st = LoadSession(*b.ctx, sess, &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(info.n_tokens, 0);
  EXPECT_TRUE(b.ctx->history().empty());
  ASSERT_TRUE(b.ctx->Decode(toks.data(), 3, false).ok());  // and the emptied context works
}

// A version-1 file whose reserved header field (now version 2's count of external chunks) is not
// zero still loads, as it did before version 2 existed: the field means nothing in version 1.
TEST(SessionFile, Version1IgnoresItsReservedField) {
  const std::string path = test::ModelPath("tiny-qwen3");
  Rig a = Make(path);
  const auto toks = Tokens(path);
  ASSERT_TRUE(a.ctx->Decode(toks.data(), kPrompt, false).ok());
  const std::string sess = test::TempDir() + "/reserved.sess";
  ASSERT_TRUE(SaveSession(*a.ctx, sess, "none").ok());
  {
    // Header: magic[8], version u32, reserved/n_external u32 at 12, ..., header_hash u64 at 80 =
    // xxh64 of bytes [0, 80).
    std::fstream f(sess, std::ios::in | std::ios::out | std::ios::binary);
    char h[88];
    f.read(h, sizeof h);
    uint32_t version = 0, reserved = 0xfeedbeef;
    std::memcpy(&version, h + 8, 4);
    ASSERT_EQ(version, 1u);
    std::memcpy(h + 12, &reserved, 4);
    const uint64_t hh = XXH64(h, 80, 0);
    std::memcpy(h + 80, &hh, 8);
    f.seekp(0);
    f.write(h, sizeof h);
  }
  Rig b = Make(path);
  SessionInfo info;
  Status st = LoadSession(*b.ctx, sess, &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(info.n_external, 0);
  EXPECT_EQ(Continue(*b.ctx, toks), Continue(*a.ctx, toks));
}

TEST(SessionFile, TheTurnMarkIsSavedLoadedAndCheckedAndATruncateBeforeItClearsIt) {
  const std::string path = test::ModelPath("tiny-qwen3");
  Rig a = Make(path);
  const auto toks = Tokens(path);
  ASSERT_TRUE(a.ctx->Decode(toks.data(), kPrompt, false).ok());
  EXPECT_EQ(a.ctx->turn_mark(), -1);
  EXPECT_EQ(a.ctx->SetTurnMark(kPrompt + 1).code(), Status::kInvalidArgument);
  EXPECT_EQ(a.ctx->SetTurnMark(-1).code(), Status::kInvalidArgument);
  ASSERT_TRUE(a.ctx->SetTurnMark(280).ok());
  const std::string sess = test::TempDir() + "/mark.sess", plain = test::TempDir() + "/nomark.sess";
  ASSERT_TRUE(SaveSession(*a.ctx, sess, "q8").ok());
  std::unique_ptr<SessionReader> r;
  ASSERT_TRUE(SessionReader::Open(*a.model, 64, sess, &r).ok());
  EXPECT_EQ(r->turn_mark(), 280);
  Rig b = Make(path);
  ASSERT_TRUE(LoadSession(*b.ctx, sess).ok());
  EXPECT_EQ(b.ctx->turn_mark(), 280);
  Rig c = Make(path);
  ASSERT_TRUE(OpenSessionAsStorage(*c.ctx, sess).ok());
  EXPECT_EQ(c.ctx->turn_mark(), 280);
  // A cut after the mark keeps it; one before it clears it.
  b.ctx->Truncate(290);
  EXPECT_EQ(b.ctx->turn_mark(), 280);
  b.ctx->Truncate(200);
  EXPECT_EQ(b.ctx->turn_mark(), -1);
  // A file without a mark (as every file before 0.17): none, and loading it clears the context's.
  ASSERT_TRUE(SaveSession(*b.ctx, plain, "q8").ok());
  ASSERT_TRUE(SessionReader::Open(*a.model, 64, plain, &r).ok());
  EXPECT_EQ(r->turn_mark(), -1);
  ASSERT_TRUE(LoadSession(*a.ctx, plain).ok());
  EXPECT_EQ(a.ctx->turn_mark(), -1);
  // A flipped bit in the extension (magic "MZSEXT01" at 512, mark at 520, checksum at 528) is
  // corruption, as in the header itself: the context is left as it was.
  std::ifstream in(sess, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.substr(512, 8), "MZSEXT01");
  for (size_t off : {size_t(520), size_t(530)}) {
    std::string bad = bytes;
    bad[off] = char(bad[off] ^ 0x10);
    const std::string p = test::TempDir() + "/badmark.sess";
    {
      std::ofstream out(p, std::ios::binary | std::ios::trunc);
      out.write(bad.data(), std::streamsize(bad.size()));
    }
    Status st = LoadSession(*a.ctx, p);
    EXPECT_EQ(st.code(), Status::kCorruption) << off;
    EXPECT_NE(st.message().find("extension"), std::string::npos) << st.ToString();
    EXPECT_EQ(int(a.ctx->history().size()), 200);
  }
}

}  // namespace
}  // namespace mz
