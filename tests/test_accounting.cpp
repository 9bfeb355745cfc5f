// Unit accounting: the bytes mzcache says a model and a conversation occupy are exactly the bytes
// they occupy, and a unit dropped and reloaded holds exactly what it held before.
//
//  (a) Weight units vs the GGUF file, read independently with ggml's own gguf API: the units
//      partition the file's tensors (each tensor in exactly one unit, the right one), their byte
//      counts sum to the file's tensor bytes, every tensor lies inside its unit's region at the
//      file's alignment, and the direct-I/O read runs are 4096-aligned and cover every tensor.
//  (b) KV bytes: resident_bytes() == 2 (K,V) x n_layer x n_kv_head x head_dim x 2 (fp16) x tokens
//      rounded up to whole chunks, for a KvCache driven directly and for a Context decoding real
//      tokens; nothing is allocated before the first token, memory grows with use and shrinks on
//      truncation.
//  (c) DropUnit + LoadUnit restores every unit byte for byte (and equal to the file's bytes), and
//      LoadUnit refuses with kModelChanged once the file's mtime or size changed; for each way of
//      backing weights (page cache, anonymous with direct or buffered reads). Page cache: dropping
//      every unit leaves none of their pages cached (the memory really goes back), and an I/O error
//      while reading a unit leaves it dropped and a retry reads it whole.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include "ggml.h"
#include "gguf.h"
#include "env/fault_env.h"
#include "memory/kv_cache.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"

namespace mz {
// Model::LoadUnit/DropUnit are the UnitTable's alone (the sole mutator of unit state); this test
// exercises them directly.
struct ModelTestPeer {
  static Status LoadUnit(Model& m, int u) { return m.LoadUnit(u); }
  static void DropUnit(Model& m, int u) { m.DropUnit(u); }
};
namespace {

struct GgufFile {
  gguf_context* g = nullptr;
  explicit GgufFile(const std::string& path) {
    gguf_init_params p{/*no_alloc=*/true, /*ctx=*/nullptr};
    g = gguf_init_from_file(path.c_str(), p);
  }
  ~GgufFile() {
    if (g) gguf_free(g);
  }
};

// Unit a tensor must belong to: blk.N.* -> layer N, everything else -> the base unit.
int ExpectedUnit(const std::string& name, int base_unit) {
  if (name.rfind("blk.", 0) != 0) return base_unit;
  return std::atoi(name.c_str() + 4);
}

// ---------------------------------------------------------------------------------------------
// (a) weight units vs the file

class UnitAccounting : public ::testing::TestWithParam<std::string> {};

TEST_P(UnitAccounting, UnitsPartitionTheFilesTensors) {
  const std::string path = test::ModelPath(GetParam(), "q8_0");
  ModelOptions o;
  o.load_weights = false;  // metadata and plan only
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), path, o, &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  FileInfo fi;
  ASSERT_TRUE(Env::Default()->StatPath(path, &fi).ok());

  GgufFile f(path);
  ASSERT_NE(f.g, nullptr);
  const uint64_t data_off = gguf_get_data_offset(f.g);
  const uint64_t align = gguf_get_alignment(f.g);
  // name -> (absolute file offset, size) per ggml's parser
  std::map<std::string, std::pair<uint64_t, uint64_t>> file_tensors;
  uint64_t file_bytes = 0;
  for (int64_t i = 0; i < gguf_get_n_tensors(f.g); ++i) {
    const uint64_t sz = gguf_get_tensor_size(f.g, i);
    file_tensors[gguf_get_tensor_name(f.g, i)] = {data_off + gguf_get_tensor_offset(f.g, i), sz};
    file_bytes += sz;
  }

  // Sum over units == sum over the file's tensors (every tensor of these files is used).
  uint64_t unit_sum = 0;
  for (int u = 0; u < m->n_units(); ++u) unit_sum += m->unit(u).tensor_bytes;
  EXPECT_EQ(unit_sum, file_bytes);
  EXPECT_EQ(m->tensor_bytes(), file_bytes);

  std::map<std::string, int> owner;  // tensor name -> unit
  for (int u = 0; u < m->n_units(); ++u) {
    const WeightUnit& w = m->unit(u);
    SCOPED_TRACE("unit " + std::to_string(u));
    EXPECT_EQ(w.index, u);
    EXPECT_EQ(w.layer, u == m->base_unit() ? -1 : u);
    EXPECT_FALSE(w.resident());
    ASSERT_FALSE(w.tensors.empty());
    EXPECT_GE(w.region_bytes, w.tensor_bytes);

    uint64_t sum = 0;
    for (const TensorExtent& e : w.tensors) {
      const std::string name = ggml_get_name(e.tensor);
      SCOPED_TRACE(name);
      EXPECT_TRUE(owner.emplace(name, u).second) << "tensor in two units: " << owner[name] << " and " << u;
      EXPECT_EQ(ExpectedUnit(name, m->base_unit()), u) << "tensor in the wrong unit";
      auto it = file_tensors.find(name);
      ASSERT_NE(it, file_tensors.end()) << "tensor not in the file";
      EXPECT_EQ(e.file_off, it->second.first);
      EXPECT_EQ(e.bytes, it->second.second);
      EXPECT_EQ(e.bytes, ggml_nbytes(e.tensor));
      // Inside the region, at the file's alignment (ggml kernels rely on it).
      EXPECT_LE(e.region_off + e.bytes, w.region_bytes);
      EXPECT_EQ(e.region_off % align, 0u);
      EXPECT_EQ(e.file_off % align, 0u);
      // Inside exactly one read run, at the same offset relative to the run in file and region.
      int runs_holding = 0;
      for (const ReadRun& r : w.runs) {
        if (e.file_off >= r.file_off && e.file_off + e.bytes <= r.file_off + r.need) {
          ++runs_holding;
          EXPECT_EQ(e.region_off - r.region_off, e.file_off - r.file_off);
        }
      }
      EXPECT_EQ(runs_holding, 1);
      sum += e.bytes;
    }
    EXPECT_EQ(sum, w.tensor_bytes);

    // Read runs: 4096-aligned in file, length and region; minimal aligned cover of `need`; packed
    // back to back in the region; the needed bytes exist in the file.
    uint64_t region = 0;
    for (const ReadRun& r : w.runs) {
      EXPECT_EQ(r.file_off % kDirectIoAlign, 0u);
      EXPECT_EQ(r.len % kDirectIoAlign, 0u);
      EXPECT_EQ(r.region_off % kDirectIoAlign, 0u);
      EXPECT_LE(r.need, r.len);
      EXPECT_GT(r.need + kDirectIoAlign, r.len) << "run longer than its aligned cover";
      EXPECT_EQ(r.region_off, region);
      EXPECT_LE(r.file_off + r.need, fi.size);
      region += r.len;
    }
    EXPECT_EQ(region, w.region_bytes);
  }
  // Every tensor of the file belongs to a unit.
  EXPECT_EQ(owner.size(), file_tensors.size());
  for (const auto& [name, where] : file_tensors) EXPECT_TRUE(owner.count(name)) << name << " belongs to no unit";
  std::printf("[%s] %d units, %llu tensor bytes, %llu region bytes\n", GetParam().c_str(), m->n_units(),
              (unsigned long long)file_bytes, [&] {
                unsigned long long r = 0;
                for (int u = 0; u < m->n_units(); ++u) r += m->unit(u).region_bytes;
                return r;
              }());
}

// qwen3-0.6b is a real shape (~640 MB synthesized once per build tree, ~15 s the first time);
// the larger real shapes are left out to keep the suite fast.
INSTANTIATE_TEST_SUITE_P(Shapes, UnitAccounting,
                         ::testing::Values("tiny-qwen3", "tiny-llama", "tiny-qwen2", "qwen3-0.6b"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// ---------------------------------------------------------------------------------------------
// (b) KV bytes

uint64_t ExpectedKvBytes(const HParams& hp, int tokens, int chunk) {
  const uint64_t rounded = uint64_t((tokens + chunk - 1) / chunk) * uint64_t(chunk);
  return 2ull * hp.n_layer * hp.n_head_kv * hp.head_dim * 2ull * rounded;
}

const HParams& TinyQwen3HParams() {
  static const HParams hp = [] {
    ModelOptions o;
    o.load_weights = false;
    std::unique_ptr<Model> m;
    Status st = Model::Load(Env::Default(), test::ModelPath("tiny-qwen3", "q8_0"), o, &m);
    if (!st.ok()) throw std::runtime_error(st.ToString());
    return m->hparams();
  }();
  return hp;
}

TEST(KvAccounting, KvCacheBytesAreWholeChunks) {
  const HParams& hp = TinyQwen3HParams();
  for (int chunk : {16, 256}) {
    KvGeometry g;
    g.n_layer = int(hp.n_layer);
    g.n_kv_head = int(hp.n_head_kv);
    g.head_dim = int(hp.head_dim);
    g.chunk_tokens = chunk;
    KvCache kv(Env::Default(), g, 4096);
    EXPECT_EQ(kv.resident_bytes(), 0u) << "nothing allocated before use";
    uint64_t prev = 0;
    for (int tokens : {1, 255, 256, 257, 1000}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", tokens " + std::to_string(tokens));
      ASSERT_TRUE(kv.Reserve(tokens).ok());
      EXPECT_EQ(kv.resident_bytes(), ExpectedKvBytes(hp, tokens, chunk));
      EXPECT_EQ(kv.resident_bytes(), hp.kv_bytes_per_token() * uint64_t(kv.n_chunks()) * uint64_t(chunk));
      EXPECT_EQ(kv.n_chunks(), kv.n_chunks_for(tokens));
      EXPECT_GE(kv.resident_bytes(), prev) << "memory only grows while the context grows";
      prev = kv.resident_bytes();
      // A fresh cache reserving `tokens` at once ends up identical (no dependence on history).
      KvCache fresh(Env::Default(), g, 4096);
      ASSERT_TRUE(fresh.Reserve(tokens).ok());
      EXPECT_EQ(fresh.resident_bytes(), kv.resident_bytes());
    }
    kv.Truncate(257);
    EXPECT_EQ(kv.resident_bytes(), ExpectedKvBytes(hp, 257, chunk)) << "truncation frees whole chunks";
    kv.Truncate(0);
    EXPECT_EQ(kv.resident_bytes(), 0u);
    // Past n_ctx: refused, nothing allocated.
    EXPECT_EQ(kv.Reserve(4097).code(), Status::kContextFull);
    EXPECT_EQ(kv.resident_bytes(), 0u);
  }
}

// The same accounting through a Context decoding real tokens (the forward pass reserves the KV).
// The 1000-token step (two ubatches in one Decode) runs with 16-token chunks only, to keep the ASan
// run short; KvCacheBytesAreWholeChunks covers 1000 tokens with both chunk sizes.
TEST(KvAccounting, ContextGrowsWithDecodedTokens) {
  const std::string path = test::ModelPath("tiny-qwen3", "q8_0");
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), path, ModelOptions(), &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const HParams& hp = m->hparams();
  for (int chunk : {16, 256}) {
    ContextOptions co;
    co.n_ctx = 2048;
    co.kv_chunk_tokens = chunk;
    co.n_ubatch = 512;
    Context ctx(m.get(), co);
    st = ctx.Init();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(ctx.kv().resident_bytes(), 0u) << "no KV memory before the first decode";
    int have = 0;
    std::vector<int> counts = {1, 255, 256, 257};
    if (chunk == 16) counts.push_back(1000);
    for (int tokens : counts) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + ", tokens " + std::to_string(tokens));
      std::vector<int32_t> toks;
      for (int i = have; i < tokens; ++i) toks.push_back(int32_t(100 + (i * 7919) % 20000));
      st = ctx.Decode(toks.data(), int(toks.size()), false);
      ASSERT_TRUE(st.ok()) << st.ToString();
      have = tokens;
      EXPECT_EQ(ctx.kv().n_tokens(), tokens);
      EXPECT_EQ(ctx.kv().resident_bytes(), ExpectedKvBytes(hp, tokens, chunk));
    }
    ctx.Truncate(255);
    EXPECT_EQ(ctx.kv().resident_bytes(), ExpectedKvBytes(hp, 255, chunk));
    ctx.Truncate(0);
    EXPECT_EQ(ctx.kv().resident_bytes(), 0u);
  }
}

// ---------------------------------------------------------------------------------------------
// (c) drop / reload

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Hash of every tensor of unit u, from its resident memory.
std::vector<uint64_t> UnitHashes(const Model& m, int u) {
  std::vector<uint64_t> h;
  for (const TensorExtent& e : m.unit(u).tensors) h.push_back(XXH64(e.tensor->data, e.bytes, 0));
  return h;
}

// 0: page cache (the default), 1: anonymous + direct I/O, 2: anonymous + buffered reads.
class DropReload : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    dir_ = test::TempDir() + "/accounting-" + std::to_string(GetParam());
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/model.gguf";
    // A private copy: this test changes the file's mtime and size.
    std::filesystem::copy_file(test::ModelPath("tiny-qwen3", "q8_0"), path_,
                               std::filesystem::copy_options::overwrite_existing);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    std::error_code ec;
    std::filesystem::remove(test::TempDir(), ec);  // the per-process folder, if nothing else is in it
  }
  std::string dir_, path_;
};

TEST_P(DropReload, ReloadRestoresEveryByteAndRefusesAChangedFile) {
  ModelOptions o;
  o.weights = GetParam() == 0 ? WeightMemory::kPageCache : WeightMemory::kAnonymous;
  o.direct_io = GetParam() == 1;
  FaultEnv env(Env::Default());
  env.path_filter = "model.gguf";
  std::unique_ptr<Model> m;
  Status st = Model::Load(&env, path_, o, &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::string file = ReadAll(path_);

  for (int u = 0; u < m->n_units(); ++u) {
    SCOPED_TRACE("unit " + std::to_string(u));
    const WeightUnit& w = m->unit(u);
    ASSERT_TRUE(w.resident());
    const std::vector<uint64_t> before = UnitHashes(*m, u);
    // The resident bytes are the file's bytes.
    for (size_t i = 0; i < w.tensors.size(); ++i) {
      const TensorExtent& e = w.tensors[i];
      ASSERT_LE(e.file_off + e.bytes, file.size());
      EXPECT_EQ(before[i], XXH64(file.data() + e.file_off, e.bytes, 0)) << ggml_get_name(e.tensor);
    }
    ModelTestPeer::DropUnit(*m, u);
    EXPECT_FALSE(w.resident());
    for (const TensorExtent& e : w.tensors) EXPECT_EQ(e.tensor->data, nullptr) << "dropped tensor still points at memory";
    st = ModelTestPeer::LoadUnit(*m, u);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(w.resident());
    for (const TensorExtent& e : w.tensors)
      EXPECT_EQ(e.tensor->data, static_cast<char*>(w.region) + e.region_off) << ggml_get_name(e.tensor);
    EXPECT_EQ(UnitHashes(*m, u), before) << "reloaded bytes differ";
    EXPECT_TRUE(ModelTestPeer::LoadUnit(*m, u).ok()) << "LoadUnit of a resident unit is a no-op";
  }

  // An I/O error while reading a unit: refused with the error, the unit stays dropped (no tensor
  // points at memory), and a retry reads it whole.
  {
    const int u = m->n_units() / 2;
    const std::vector<uint64_t> before = UnitHashes(*m, u);
    ModelTestPeer::DropUnit(*m, u);
    env.fail_reads_after = 0;
    st = ModelTestPeer::LoadUnit(*m, u);
    EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
    EXPECT_FALSE(m->unit(u).resident());
    for (const TensorExtent& e : m->unit(u).tensors) EXPECT_EQ(e.tensor->data, nullptr);
    env.fail_reads_after = -1;
    st = ModelTestPeer::LoadUnit(*m, u);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(UnitHashes(*m, u), before) << "bytes reloaded after an I/O error differ";
  }

  if (GetParam() == 0) {
    // Resident units' bytes are file pages in the page cache; dropping every unit gives them all back.
    uint64_t cached = 0;
    const ReadRun& r0 = m->unit(0).runs.front();
    std::unique_ptr<File> file;
    ASSERT_TRUE(Env::Default()->Open(path_, OpenMode::kRead, false, &file).ok());
    ASSERT_TRUE(Env::Default()->CachedBytes(file.get(), r0.file_off, r0.len, &cached).ok());
    EXPECT_EQ(cached, r0.len) << "a resident unit's pages should be the file's cached pages";
    for (int u = 0; u < m->n_units(); ++u) ModelTestPeer::DropUnit(*m, u);
    EXPECT_EQ(m->DroppedBytesCached(), 0u) << "dropped weights still held in the page cache";
    for (int u = 0; u < m->n_units(); ++u) ASSERT_TRUE(ModelTestPeer::LoadUnit(*m, u).ok());
  }

  // mtime changed (content identical): refused, the unit stays dropped and consistent.
  struct stat sb;
  ASSERT_EQ(stat(path_.c_str(), &sb), 0);
  const timespec orig[2] = {sb.st_atim, sb.st_mtim};
  timespec later[2] = {sb.st_atim, sb.st_mtim};
  later[1].tv_sec += 10;
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), later, 0), 0);
  ModelTestPeer::DropUnit(*m, 0);
  st = ModelTestPeer::LoadUnit(*m, 0);
  EXPECT_EQ(st.code(), Status::kModelChanged) << st.ToString();
  EXPECT_FALSE(m->unit(0).resident());
  // The original mtime back: the same identity, so the unit loads again.
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), orig, 0), 0);
  st = ModelTestPeer::LoadUnit(*m, 0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(UnitHashes(*m, 0).size(), m->unit(0).tensors.size());

  // Replaced by rename with a copy of the same size and mtime (as `cp -p` + `mv` would): the held
  // file is no longer the one at the path, so re-reads are refused (weights would otherwise come
  // from two different files).
  {
    const std::string copy = path_ + ".replacement";
    {
      std::ifstream in(path_, std::ios::binary);
      std::ofstream out(copy, std::ios::binary);
      out << in.rdbuf();
    }
    ASSERT_EQ(utimensat(AT_FDCWD, copy.c_str(), orig, 0), 0);
    ASSERT_EQ(std::rename(copy.c_str(), path_.c_str()), 0);
    ModelTestPeer::DropUnit(*m, 0);
    st = ModelTestPeer::LoadUnit(*m, 0);
    EXPECT_EQ(st.code(), Status::kModelChanged) << st.ToString();
    EXPECT_NE(st.message().find("replaced"), std::string::npos) << st.ToString();
    EXPECT_FALSE(m->unit(0).resident());
  }

  // Size changed (one byte appended, mtime restored so only the size differs): refused.
  {
    std::ofstream f(path_, std::ios::binary | std::ios::app);
    f.put('x');
  }
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), orig, 0), 0);
  ModelTestPeer::DropUnit(*m, m->base_unit());
  st = ModelTestPeer::LoadUnit(*m, m->base_unit());
  EXPECT_EQ(st.code(), Status::kModelChanged) << st.ToString();
  EXPECT_NE(st.message().find(path_), std::string::npos) << "the message should name the file: " << st.ToString();
  EXPECT_FALSE(m->unit(m->base_unit()).resident());
}

// The wall clock moved by ahead_ms (Model::VerifyIdentity trusts a check made >= 2 s after the
// file's ctime).
class ShiftedClockEnv : public FaultEnv {
 public:
  using FaultEnv::FaultEnv;
  std::atomic<int64_t> ahead_ms{0};
  uint64_t WallClockMs() override { return uint64_t(int64_t(FaultEnv::WallClockMs()) + ahead_ms.load()); }
};

// The server checks the model file before every request: the header (the vocabulary, megabytes)
// is read again only when the file's status moved since a check that read it, and a change made
// in place with the mtime set back is still found (its ctime moved).
TEST_P(DropReload, VerifyReadsTheHeaderAgainOnlyWhenTheFileStatusMoved) {
  if (GetParam() != 0) GTEST_SKIP() << "the check does not depend on how weights are held: run once";
  ShiftedClockEnv env(Env::Default());
  env.path_filter = "model.gguf";
  std::unique_ptr<Model> m;
  Status st = Model::Load(&env, path_, ModelOptions(), &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // A check that runs within 2 s of the file's last change is never trusted: each one reads.
  env.ahead_ms = -10000;
  for (int i = 0; i < 2; ++i) {
    const int64_t r = env.n_reads.load();
    ASSERT_TRUE(m->VerifyIdentity().ok());
    EXPECT_GT(env.n_reads.load(), r) << "check " << i << " did not read the header";
  }
  // Later: one check reads and is trusted; the next, with the same status, reads nothing.
  env.ahead_ms = 10000;
  int64_t r = env.n_reads.load();
  ASSERT_TRUE(m->VerifyIdentity().ok());
  EXPECT_GT(env.n_reads.load(), r);
  r = env.n_reads.load();
  ASSERT_TRUE(m->VerifyIdentity().ok());
  EXPECT_EQ(env.n_reads.load(), r) << "the unchanged file's header was read again";
  // One header byte changed in place, size and mtime as before: found (the ctime moved).
  struct stat sb;
  ASSERT_EQ(stat(path_.c_str(), &sb), 0);
  const timespec orig[2] = {sb.st_atim, sb.st_mtim};
  {
    std::fstream io(path_, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(100);
    const char c = char(io.get());
    io.seekp(100);
    io.put(char(~c));
  }
  ASSERT_EQ(utimensat(AT_FDCWD, path_.c_str(), orig, 0), 0);
  r = env.n_reads.load();
  st = m->VerifyIdentity();
  EXPECT_EQ(st.code(), Status::kModelChanged) << st.ToString();
  EXPECT_GT(env.n_reads.load(), r) << "the changed file's header was not read again";
}

INSTANTIATE_TEST_SUITE_P(Io, DropReload, ::testing::Values(0, 1, 2), [](const auto& info) {
  return std::string(info.param == 0 ? "PageCache" : info.param == 1 ? "AnonDirectIo" : "AnonBuffered");
});

}  // namespace
}  // namespace mz
