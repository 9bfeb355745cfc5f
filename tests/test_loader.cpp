// Loader robustness: Model::Load on hand-made corrupt GGUF files and on seeded random mutations.
//
// Contract under test (model.h): a file that is not a valid model of a supported architecture is
// rejected with a non-OK Status whose code says what kind of problem it is (kCorruption for a
// malformed / truncated / inconsistent file, kUnsupported for a well-formed file this build cannot
// run, kIOError when the OS refuses) and whose message names the file and says exactly what is wrong.
// Never a crash, abort or undefined behaviour: the suite also runs under ASan+UBSan.
//
// Every corrupt file is derived from a valid synthesized model (tiny-qwen3, q8_0): the test walks
// the GGUF header itself (GgufLayout below: magic u32, version u32, n_tensors u64, n_kv u64, KV pairs
// {key string, type u32, value}, tensor infos {name string, n_dims u32, ne u64 x n_dims, type u32,
// offset u64}, where a string is a u64 length + bytes) to find the byte positions to patch, so each
// case changes exactly one thing.
//
// The hand-made cases go through real files (the default POSIX Env). The mutation fuzz serves its
// variants from memory through an Env wrapper (a 50 MB copy per variant would dominate the runtime)
// and runs each load in a forked child, so a crash or abort in the parser fails the test with the
// exact input that caused it instead of killing the binary.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "env/fault_env.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace mz {
namespace {

// ---------------------------------------------------------------------------------------------
// Files

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteAll(const std::string& path, const char* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data, std::streamsize(n));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// ---------------------------------------------------------------------------------------------
// GGUF header walker (independent of ggml's parser): byte positions of every field a case patches.

struct KvField {
  std::string key;
  uint64_t key_off = 0;    // the key string's u64 length
  uint64_t type_off = 0;   // u32 type
  uint32_t type = 0;
  uint64_t value_off = 0;  // first byte of the value (for a string: its u64 length)
  uint64_t end = 0;        // one past the value
};

struct TensorField {
  std::string name;
  uint64_t name_off = 0;    // the name string's u64 length (the bytes follow at name_off + 8)
  uint64_t n_dims_off = 0;  // u32
  uint32_t n_dims = 0;
  uint64_t ne_off = 0;      // u64 x n_dims
  uint64_t type_off = 0;    // u32 ggml_type
  uint32_t type = 0;
  uint64_t offset_off = 0;  // u64, relative to the data section
  uint64_t offset = 0;
};

struct GgufLayout {
  uint64_t n_tensors = 0, n_kv = 0;
  std::vector<KvField> kvs;
  std::vector<TensorField> tensors;
  uint64_t infos_begin = 0, infos_end = 0, data_off = 0;

  const KvField& kv(const std::string& key) const {
    for (const auto& k : kvs)
      if (k.key == key) return k;
    throw std::runtime_error("no key " + key);
  }
  const TensorField& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  // Human description of the header field holding byte `off` (for fuzz reports).
  std::string Where(uint64_t off) const {
    if (off < 4) return "magic";
    if (off < 8) return "version";
    if (off < 16) return "n_tensors";
    if (off < 24) return "n_kv";
    for (const auto& k : kvs)
      if (off < k.end) return "kv '" + k.key + "' " + (off < k.type_off ? "key" : off < k.value_off ? "type" : "value");
    for (const auto& t : tensors)
      if (off < t.offset_off + 8)
        return "tensor info '" + t.name + "' " +
               (off < t.n_dims_off ? "name" : off < t.ne_off ? "n_dims" : off < t.type_off ? "ne" : off < t.offset_off ? "type" : "offset");
    return off < data_off ? "padding before data" : "tensor data";
  }
};

class Walker {
 public:
  explicit Walker(const std::string& b) : b_(b) {}
  uint64_t pos = 0;
  template <class T>
  T Get() {
    if (pos + sizeof(T) > b_.size()) throw std::runtime_error("walker: past end");
    T v;
    std::memcpy(&v, b_.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string Str() {
    uint64_t n = Get<uint64_t>();
    if (n > b_.size() - pos) throw std::runtime_error("walker: bad string");
    std::string s = b_.substr(pos, n);
    pos += n;
    return s;
  }
  void SkipValue(uint32_t type) {
    static const int kSize[] = {1, 1, 2, 2, 4, 4, 4, 1, -1, -1, 8, 8, 8};  // gguf_type -> bytes
    if (type == 8) {
      Str();
    } else if (type == 9) {
      uint32_t et = Get<uint32_t>();
      uint64_t n = Get<uint64_t>();
      for (uint64_t i = 0; i < n; ++i) SkipValue(et);
    } else if (type < 13) {
      pos += uint64_t(kSize[type]);
    } else {
      throw std::runtime_error("walker: bad type");
    }
  }

 private:
  const std::string& b_;
};

GgufLayout WalkGguf(const std::string& b) {
  GgufLayout L;
  Walker w(b);
  if (w.Get<uint32_t>() != 0x46554747u) throw std::runtime_error("not GGUF");
  w.Get<uint32_t>();
  L.n_tensors = w.Get<uint64_t>();
  L.n_kv = w.Get<uint64_t>();
  uint64_t alignment = 32;
  for (uint64_t i = 0; i < L.n_kv; ++i) {
    KvField k;
    k.key_off = w.pos;
    k.key = w.Str();
    k.type_off = w.pos;
    k.type = w.Get<uint32_t>();
    k.value_off = w.pos;
    if (k.key == "general.alignment") alignment = w.Get<uint32_t>(), w.pos = k.value_off;
    w.SkipValue(k.type);
    k.end = w.pos;
    L.kvs.push_back(k);
  }
  L.infos_begin = w.pos;
  for (uint64_t i = 0; i < L.n_tensors; ++i) {
    TensorField t;
    t.name_off = w.pos;
    t.name = w.Str();
    t.n_dims_off = w.pos;
    t.n_dims = w.Get<uint32_t>();
    t.ne_off = w.pos;
    w.pos += 8ull * t.n_dims;
    t.type_off = w.pos;
    t.type = w.Get<uint32_t>();
    t.offset_off = w.pos;
    t.offset = w.Get<uint64_t>();
    L.tensors.push_back(t);
  }
  L.infos_end = w.pos;
  L.data_off = AlignUp(L.infos_end, alignment);
  return L;
}

// ---------------------------------------------------------------------------------------------
// A corrupt variant of the valid file: byte patches, optionally cut to `size` bytes.

struct Variant {
  std::vector<std::pair<uint64_t, std::string>> patches;
  uint64_t size = UINT64_MAX;  // UINT64_MAX: keep the original size
};

template <class T>
std::string Bytes(T v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}
Variant Patch(uint64_t off, std::string bytes) { return Variant{{{off, std::move(bytes)}}}; }
Variant Cut(uint64_t size) {
  Variant v;
  v.size = size;
  return v;
}

struct Valid {
  std::string path;  // the synthesized model (never modified)
  std::string bytes;
  GgufLayout layout;
};

const Valid& TheValidFile() {
  static const Valid* v = [] {
    auto* x = new Valid;
    x->path = test::ModelPath("tiny-qwen3", "q8_0");
    x->bytes = ReadAll(x->path);
    x->layout = WalkGguf(x->bytes);
    return x;
  }();
  return *v;
}

// Scratch folder of this binary (removed when the LoaderCorrupt suite ends).
std::string Scratch() {
  std::string d = test::TempDir() + "/loader";
  std::filesystem::create_directories(d);
  return d;
}

// Writes the variant to a fresh file and returns its path.
std::string Materialize(const Variant& v, const std::string& name) {
  const std::string& src = TheValidFile().bytes;
  std::string b = src.substr(0, size_t(std::min<uint64_t>(v.size, src.size())));
  for (const auto& [off, bytes] : v.patches) {
    if (off + bytes.size() > b.size()) throw std::runtime_error("patch past the end of the variant");
    std::memcpy(b.data() + off, bytes.data(), bytes.size());
  }
  std::string path = Scratch() + "/" + name + ".gguf";
  WriteAll(path, b.data(), b.size());
  return path;
}

ModelOptions MetaOnly() {
  ModelOptions o;
  o.load_weights = false;
  return o;
}

// ---------------------------------------------------------------------------------------------
// The valid file loads (also the fixture setup of the C API test: makes sure the model exists).

TEST(LoaderValid, TinyQwen3Loads) {
  const Valid& v = TheValidFile();
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), v.path, ModelOptions(), &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(m->hparams().arch, Arch::kQwen3);
  EXPECT_EQ(m->hparams().n_layer, 4u);
  EXPECT_EQ(m->n_units(), 5);
  for (int u = 0; u < m->n_units(); ++u) EXPECT_TRUE(m->unit(u).resident()) << "unit " << u;
  // The walker agrees with ggml's parser on the layout it uses to place patches.
  EXPECT_EQ(v.layout.n_tensors, v.layout.tensors.size());
  EXPECT_EQ(m->unit(m->base_unit()).tensors.front().file_off, v.layout.data_off)
      << "token_embd.weight should be the first tensor of the data section";
}

// ---------------------------------------------------------------------------------------------
// The seeded list of hand-made corrupt files. Each entry: what is broken, how (a Variant built from
// the valid file's layout), the Status code and a substring of the message that pins the reason.

struct Case {
  const char* name;
  std::function<Variant(const GgufLayout&, const std::string&)> make;
  Status::Code code;
  const char* needle;
  bool load_weights = false;  // true: the weights are read too (data-section cases)
};

std::vector<Case> CorruptCases() {
  using L = const GgufLayout&;
  using B = const std::string&;
  auto u32_at = [](uint64_t off, uint32_t v) { return Patch(off, Bytes(v)); };
  // Value of a u32 metadata key.
  auto kv_u32 = [](L l, const std::string& key, uint32_t v) {
    const KvField& k = l.kv(key);
    if (k.type != 4) throw std::runtime_error(key + " is not u32");
    return Patch(k.value_off, Bytes(v));
  };
  // Renames a tensor in place (same length, so no offset moves).
  auto rename = [](L l, const std::string& from, const std::string& to) {
    if (from.size() != to.size()) throw std::runtime_error("rename must keep the length");
    return Patch(l.tensor(from).name_off + 8, to);
  };
  const std::string arch_key = "general.architecture";
  return {
      // ---- not a GGUF at all: caught by Load's own pre-checks before the parser runs
      {"empty_file", [](L, B) { return Cut(0); }, Status::kCorruption, "not a GGUF file (0 bytes)"},
      {"three_bytes", [](L, B) { return Cut(3); }, Status::kCorruption, "not a GGUF file (3 bytes)"},
      {"bad_magic", [](L, B) { return Patch(0, "GGUX"); }, Status::kCorruption, "bad magic"},
      // ---- header fields the parser validates (its own message is carried in the Status)
      {"version_0", [=](L, B) { return u32_at(4, 0); }, Status::kCorruption, "bad GGUF version: 0"},
      {"version_1", [=](L, B) { return u32_at(4, 1); }, Status::kCorruption, "GGUFv1 is no longer supported"},
      {"version_99", [=](L, B) { return u32_at(4, 99); }, Status::kCorruption, "version 99 but this software only supports up to version 3"},
      {"version_byteswapped", [=](L, B) { return u32_at(4, 0x03000000u); }, Status::kCorruption, "mismatch between the host and model endianness"},
      {"n_tensors_negative", [](L, B) { return Patch(8, Bytes(UINT64_MAX)); }, Status::kCorruption, "number of tensors is -1"},
      {"n_tensors_overflow", [](L, B) { return Patch(8, Bytes(uint64_t(1) << 62)); }, Status::kCorruption, "number of tensors is 4611686018427387904"},
      // One more tensor than present: the parser reads the alignment padding and the first data
      // bytes as a tensor info (empty name, 0 dims, f32, an offset made of weight bytes), and rejects
      // its offset.
      // The extra tensor info is parsed from whatever follows the last one (alignment padding, then
      // tensor data: what it reads depends on the file's layout, e.g. its chat template's length),
      // so only the parser's rejection is certain.
      {"n_tensors_plus_one", [](L l, B) { return Patch(8, Bytes(l.n_tensors + 1)); }, Status::kCorruption, "malformed GGUF"},
      {"n_kv_negative", [](L, B) { return Patch(16, Bytes(UINT64_MAX)); }, Status::kCorruption, "number of key value pairs is -1"},
      {"n_kv_overflow", [](L, B) { return Patch(16, Bytes(uint64_t(1) << 62)); }, Status::kCorruption, "number of key value pairs is 4611686018427387904"},
      // 2^40 pairs passes the range check; the parser runs out of file reading them.
      {"n_kv_huge", [](L, B) { return Patch(16, Bytes(uint64_t(1) << 40)); }, Status::kCorruption, "failed to read key-value pairs"},
      // ---- truncation at every level of the file
      {"truncated_in_header", [](L, B) { return Cut(12); }, Status::kCorruption, "failed to read header"},
      {"truncated_in_kv_section", [](L l, B) { return Cut(l.kvs[2].value_off + 4096); }, Status::kCorruption, "failed to read key-value pairs"},
      {"truncated_in_tensor_infos",
       [](L l, B) { return Cut(l.tensors[l.tensors.size() / 2].ne_off + 3); }, Status::kCorruption, "failed to read tensor info"},
      // Cut in the middle of the last tensor's data, with load_weights: the planner's range check
      // catches it at parse time, before any read, naming the tensor.
      {"truncated_tensor_data",
       [](L l, B b) {
         const TensorField& t = l.tensors.back();
         return Cut(l.data_off + t.offset + (b.size() - l.data_off - t.offset) / 2);
       },
       Status::kCorruption, "lies past end of file", /*load_weights=*/true},
      // Only the data section's first bytes survive.
      {"truncated_at_data_start", [](L l, B) { return Cut(l.data_off + 100); }, Status::kCorruption,
       "tensor 'token_embd.weight' data [", /*load_weights=*/true},
      // ---- malformed KV pairs
      {"key_length_huge", [](L l, B) { return Patch(l.kvs[0].key_off, Bytes(uint64_t(1) << 40)); }, Status::kCorruption, "exceeds maximum"},
      {"key_length_past_eof", [](L l, B) { return Patch(l.kvs[0].key_off, Bytes(uint64_t(200) << 20)); }, Status::kCorruption, "exceeds remaining file size"},
      {"kv_type_invalid", [](L l, B) { return Patch(l.kvs[0].type_off, Bytes(uint32_t(13))); }, Status::kCorruption, "has invalid GGUF type 13"},
      // A later key renamed to an earlier one of the same length.
      {"duplicate_key",
       [](L l, B) { return Patch(l.kv("qwen3.rope.dimension_count").key_off + 8, "qwen3.attention.key_length"); },
       Status::kCorruption, "duplicate key 'qwen3.attention.key_length'"},
      // ---- malformed tensor infos
      {"tensor_name_too_long", [](L l, B) { return Patch(l.tensors[0].name_off, Bytes(uint64_t(64))); }, Status::kCorruption, "is too long"},
      {"tensor_duplicate_name", [=](L l, B) { return rename(l, "blk.1.attn_q.weight", "blk.0.attn_q.weight"); }, Status::kCorruption, "duplicate tensor name 'blk.0.attn_q.weight'"},
      {"tensor_n_dims_5", [](L l, B) { return Patch(l.tensors[0].n_dims_off, Bytes(uint32_t(5))); }, Status::kCorruption, "invalid number of dimensions: 5"},
      {"tensor_ne_negative", [](L l, B) { return Patch(l.tensors[0].ne_off + 8, Bytes(int64_t(-5))); }, Status::kCorruption, "has invalid number of elements: -5"},
      // ne = [256, INT64_MAX / 256]: the element count is still representable, the parser's bound
      // check (elements >= INT64_MAX) fires.
      {"tensor_elements_overflow",
       [](L l, B) { return Patch(l.tensors[0].ne_off + 8, Bytes(INT64_MAX / 256)); }, Status::kCorruption, "total number of elements in tensor 'token_embd.weight'"},
      // ne = [256, 2^56]: 256 * 2^56 overflows int64 inside ggml_nelements, which ggml's parser
      // evaluates before its bound check (signed overflow in uninstrumented ggml code; in practice it
      // wraps to 0 elements and the check is skipped). The file is still rejected, by the next
      // tensor's offset check, because the tensor's byte size wraps too (to 2^60). Pinned so a change
      // in that path (a crash, or acceptance) is noticed.
      {"tensor_elements_wrap_to_zero",
       [](L l, B) { return Patch(l.tensors[0].ne_off + 8, Bytes(int64_t(1) << 56)); }, Status::kCorruption, "tensor 'output_norm.weight' has offset"},
      {"tensor_type_out_of_range", [](L l, B) { return Patch(l.tensors[0].type_off, Bytes(uint32_t(200))); }, Status::kCorruption, "has invalid ggml type 200"},
      // ggml type 4 (the removed Q4_2) has block size 0: must not divide by zero.
      {"tensor_type_removed", [](L l, B) { return Patch(l.tensors[0].type_off, Bytes(uint32_t(4))); }, Status::kCorruption, "not a multiple of block size (0)"},
      // f32 -> i32 keeps the size (offsets stay consistent) but a norm weight must be f32.
      {"tensor_norm_not_f32", [](L l, B) { return Patch(l.tensor("output_norm.weight").type_off, Bytes(uint32_t(26))); }, Status::kUnsupported, "tensor 'output_norm.weight' must be f32, is i32"},
      // The offset of the last tensor pointing past end of file. ggml's parser requires each offset to
      // equal the running sum of the previous tensors' padded sizes, so it is caught there.
      {"tensor_offset_past_eof",
       [](L l, B b) { return Patch(l.tensors.back().offset_off, Bytes(uint64_t(b.size()) * 2)); }, Status::kCorruption, "has offset"},
      {"tensor_offset_first_nonzero", [](L l, B) { return Patch(l.tensors[0].offset_off, Bytes(uint64_t(32))); }, Status::kCorruption, "tensor 'token_embd.weight' has offset 32, expected 0"},
      // ---- well-formed GGUF, inconsistent model: caught by ReadHParams / Model::Parse
      {"missing_tensor_ffn_up", [=](L l, B) { return rename(l, "blk.0.ffn_up.weight", "blk.0.ffn_uX.weight"); }, Status::kCorruption, "missing tensor 'blk.0.ffn_up.weight'"},
      {"missing_tensor_token_embd", [=](L l, B) { return rename(l, "token_embd.weight", "token_embX.weight"); }, Status::kCorruption, "missing tensor 'token_embd.weight'"},
      {"shape_mismatch_embedding_length", [=](L l, B) { return kv_u32(l, "qwen3.embedding_length", 512); }, Status::kCorruption, "tensor 'token_embd.weight' has shape [256, 151936], expected [512, n_vocab]"},
      {"shape_mismatch_feed_forward_length", [=](L l, B) { return kv_u32(l, "qwen3.feed_forward_length", 512); }, Status::kCorruption, "tensor 'blk.0.ffn_gate.weight' has shape [256, 768, 1, 1], expected [256, 512, 1, 1]"},
      {"arch_unsupported", [=](L l, B) { return Patch(l.kv(arch_key).value_off + 8, "gpt2x"); }, Status::kUnsupported, "architecture 'gpt2x' is not supported"},
      // A supported architecture whose keys are not in the file.
      {"arch_other_supported", [=](L l, B) { return Patch(l.kv(arch_key).value_off + 8, "qwen2"); }, Status::kCorruption, "missing metadata key 'qwen2.context_length'"},
      {"arch_wrong_type", [=](L l, B) { return Patch(l.kv(arch_key).type_off, Bytes(uint32_t(26))); }, Status::kCorruption, "invalid GGUF type 26"},
      {"head_count_not_multiple_of_kv", [=](L l, B) { return kv_u32(l, "qwen3.attention.head_count_kv", 3); }, Status::kCorruption, "head_count (4) is not a multiple of head_count_kv (3)"},
      {"head_count_kv_zero", [=](L l, B) { return kv_u32(l, "qwen3.attention.head_count_kv", 0); }, Status::kCorruption, "head_count (4) is not a multiple of head_count_kv (0)"},
      {"head_count_zero", [=](L l, B) { return kv_u32(l, "qwen3.attention.head_count", 0); }, Status::kCorruption, "hyper-parameters must be positive"},
      {"key_value_length_differ", [=](L l, B) { return kv_u32(l, "qwen3.attention.key_length", 32); }, Status::kUnsupported, "key_length != value_length"},
      {"context_length_wrong_type", [=](L l, B) { return Patch(l.kv("qwen3.context_length").type_off, Bytes(uint32_t(6))); }, Status::kCorruption, "metadata key 'qwen3.context_length' has the wrong type"},
      {"rms_eps_nan",
       [=](L l, B) { return Patch(l.kv("qwen3.attention.layer_norm_rms_epsilon").value_off, Bytes(std::nanf(""))); },
       Status::kCorruption, "'qwen3.attention.layer_norm_rms_epsilon' is not finite"},
      {"block_count_huge", [=](L l, B) { return kv_u32(l, "qwen3.block_count", 100000); }, Status::kCorruption, "hyper-parameters out of range"},
      // More layers declared than present: blk.4.* are missing.
      {"block_count_too_large", [=](L l, B) { return kv_u32(l, "qwen3.block_count", 5); }, Status::kCorruption, "missing tensor 'blk.4.attn_norm.weight'"},
      // Fewer layers declared than present: blk.3.* would be silently ignored.
      {"block_count_too_small", [=](L l, B) { return kv_u32(l, "qwen3.block_count", 3); }, Status::kCorruption, "belongs to a layer beyond block_count (3)"},
  };
}

class LoaderCorrupt : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    std::filesystem::remove_all(test::TempDir() + "/loader");
    std::error_code ec;
    std::filesystem::remove(test::TempDir(), ec);  // the per-process folder, if nothing else is in it
  }
};

// Threads the OS refuses (Env::StartThread) slow synthesis and loading down, never change what
// they produce: a model synthesized with no helper thread is byte-identical to the normal one, and
// loading it with every weight unit's helper refused gives every unit resident.
TEST(LoaderValid, RefusedThreadsChangeNothing) {
  SynthOptions o;
  o.type = "q8_0";
  o.threads = 4;
  o.vocab_dir = std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab";
  const std::string ref = test::TempDir() + "/threads-allowed.gguf";
  ASSERT_TRUE(SynthesizeModel(Env::Default(), *FindModelSpec("tiny-qwen3"), o, ref).ok());
  FaultEnv env(Env::Default());
  env.fail_threads_after = 0;
  const std::string path = test::TempDir() + "/refused-threads.gguf";
  ASSERT_TRUE(SynthesizeModel(&env, *FindModelSpec("tiny-qwen3"), o, path).ok());
  EXPECT_EQ(env.threads_started.load(), 0);
  EXPECT_GT(env.threads_refused.load(), 0);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_TRUE(slurp(path) == slurp(ref)) << "a model synthesized on one thread differs";
  ModelOptions mo;
  mo.weights = WeightMemory::kAnonymous;
  mo.io_threads = 4;
  std::unique_ptr<Model> m;
  Status st = Model::Load(&env, path, mo, &m);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (int u = 0; u < m->n_units(); ++u) EXPECT_TRUE(m->unit(u).resident()) << u;
  EXPECT_EQ(env.threads_started.load(), 0);
  EXPECT_GT(env.threads_refused.load(), 1) << "the load's helper was never asked for";
  std::remove(path.c_str());
  std::remove(ref.c_str());
}

// A path that does not exist is an I/O error naming the path, not corruption.
TEST_F(LoaderCorrupt, MissingFileIsIOError) {
  std::unique_ptr<Model> m;
  const std::string path = Scratch() + "/does-not-exist.gguf";
  Status st = Model::Load(Env::Default(), path, MetaOnly(), &m);
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  EXPECT_NE(st.message().find(path), std::string::npos) << st.ToString();
  EXPECT_EQ(m, nullptr);
}

TEST_F(LoaderCorrupt, EachCaseRejectedWithItsOwnMessage) {
  const Valid& v = TheValidFile();
  std::set<std::string> seen;
  for (const Case& c : CorruptCases()) {
    SCOPED_TRACE(c.name);
    Variant var;
    ASSERT_NO_THROW(var = c.make(v.layout, v.bytes));
    const std::string path = Materialize(var, c.name);
    ModelOptions o;
    o.load_weights = c.load_weights;
    std::unique_ptr<Model> m;
    Status st = Model::Load(Env::Default(), path, o, &m);
    // Reported, so the messages can be reviewed for clarity.
    std::printf("[corrupt] %-36s %s\n", c.name, st.ToString().c_str());
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << "expected \"" << c.needle << "\" in: " << st.ToString();
    EXPECT_NE(st.message().find(path), std::string::npos) << "the message should name the file: " << st.ToString();
    EXPECT_EQ(m, nullptr) << "*out must stay untouched on failure";
    EXPECT_TRUE(seen.insert(st.message()).second) << "two cases produced the same message: " << st.message();
    std::filesystem::remove(path);
  }
}

// The same file loads again once the damage is undone: the cases test the damage, not the path.
TEST_F(LoaderCorrupt, UndamagedCopyLoads) {
  const std::string path = Materialize(Variant{}, "undamaged");
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), path, ModelOptions(), &m);
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// Seeded mutation fuzz.
//
// Variant = the valid file with a window [patch_off, patch_off + patch.size()) replaced; served from
// memory by OverlayEnv (Model::Load only opens, stats and reads the file).

class OverlayFile final : public File {
 public:
  OverlayFile(const std::string& base, uint64_t patch_off, const std::string& patch, std::string path)
      : base_(base), off_(patch_off), patch_(patch), path_(std::move(path)) {}
  Status Read(void* buf, size_t n, uint64_t off, size_t* got) override {
    *got = 0;
    if (off >= base_.size()) return Status::Ok();
    n = size_t(std::min<uint64_t>(n, base_.size() - off));
    std::memcpy(buf, base_.data() + off, n);
    // Overlay the part of [off, off + n) that intersects the patch window.
    const uint64_t lo = std::max<uint64_t>(off, off_), hi = std::min<uint64_t>(off + n, off_ + patch_.size());
    if (lo < hi) std::memcpy(static_cast<char*>(buf) + (lo - off), patch_.data() + (lo - off_), size_t(hi - lo));
    *got = n;
    return Status::Ok();
  }
  Status Write(const void*, size_t, uint64_t) override { return Status::IOError("read-only"); }
  Status Sync() override { return Status::Ok(); }
  Status Truncate(uint64_t) override { return Status::IOError("read-only"); }
  Status Stat(FileInfo* info) override {
    info->size = base_.size();
    info->mtime_ns = 1;
    return Status::Ok();
  }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }
  int native_handle() const override { return -1; }  // served from memory: nothing to map

 private:
  const std::string& base_;
  uint64_t off_;
  const std::string& patch_;
  std::string path_;
};

class OverlayEnv final : public EnvWrapper {
 public:
  OverlayEnv(const std::string& base, uint64_t patch_off, const std::string& patch)
      : EnvWrapper(Env::Default()), base_(base), off_(patch_off), patch_(patch) {}
  static constexpr const char* kPath = "/overlay/fuzzed.gguf";
  Status Open(const std::string& p, OpenMode m, bool d, std::unique_ptr<File>* o) override {
    if (p != kPath) return EnvWrapper::Open(p, m, d, o);
    o->reset(new OverlayFile(base_, off_, patch_, p));
    return Status::Ok();
  }
  Status StatPath(const std::string& p, FileInfo* i) override {
    if (p != kPath) return EnvWrapper::StatPath(p, i);
    i->size = base_.size();
    i->mtime_ns = 1;
    return Status::Ok();
  }

 private:
  const std::string& base_;
  uint64_t off_;
  const std::string& patch_;
};

// Child exit codes: load OK / non-OK with a message / non-OK without a message.
constexpr int kExitOk = 70, kExitFailed = 71, kExitNoMessage = 72;

struct FuzzOutcome {
  bool crashed = false;
  std::string detail;  // the Status (or how the child died)
  int code = 0;        // Status code when not crashed
};

// Loads the variant in a forked child so an abort or sanitizer report is caught and attributed.
FuzzOutcome LoadInChild(const std::string& base, uint64_t patch_off, const std::string& patch) {
  int fds[2];
  if (pipe(fds) != 0) return {true, "pipe failed", 0};
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    OverlayEnv env(base, patch_off, patch);
    std::unique_ptr<Model> m;
    Status st = Model::Load(&env, OverlayEnv::kPath, MetaOnly(), &m);
    std::string msg = std::to_string(int(st.code())) + "\n" + st.message();
    for (size_t done = 0; done < msg.size();) {
      ssize_t w = write(fds[1], msg.data() + done, msg.size() - done);
      if (w <= 0) break;
      done += size_t(w);
    }
    close(fds[1]);
    _exit(st.ok() ? kExitOk : st.message().empty() ? kExitNoMessage : kExitFailed);
  }
  close(fds[1]);
  std::string msg;
  char buf[4096];
  for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(r));
  close(fds[0]);
  int ws = 0;
  waitpid(pid, &ws, 0);
  FuzzOutcome out;
  if (WIFSIGNALED(ws)) {
    out.crashed = true;
    out.detail = "killed by signal " + std::to_string(WTERMSIG(ws)) + " (" + strsignal(WTERMSIG(ws)) + ")";
  } else if (!WIFEXITED(ws) || (WEXITSTATUS(ws) != kExitOk && WEXITSTATUS(ws) != kExitFailed)) {
    out.crashed = true;
    out.detail = WEXITSTATUS(ws) == kExitNoMessage ? "non-OK Status with an empty message"
                                                    : "exited with code " + std::to_string(WEXITSTATUS(ws));
  } else {
    size_t nl = msg.find('\n');
    out.code = std::atoi(msg.substr(0, nl).c_str());
    out.detail = nl == std::string::npos ? msg : msg.substr(nl + 1);
  }
  return out;
}

// Runs `iterations` seeded variants, each flipping 1-4 random bytes (xor with a random non-zero
// value) in [lo, hi). Every variant must load OK or fail with a non-OK Status carrying a message.
void Fuzz(const char* label, uint64_t lo, uint64_t hi, int iterations, uint32_t seed) {
  const Valid& v = TheValidFile();
  ASSERT_LT(lo, hi);
  ASSERT_LE(hi, v.bytes.size());
  std::mt19937 rng(seed);
  std::map<int, int> by_code;
  int crashes = 0;
  for (int it = 0; it < iterations; ++it) {
    std::string patch = v.bytes.substr(size_t(lo), size_t(hi - lo));
    const int n_flips = std::uniform_int_distribution<int>(1, 4)(rng);
    std::string what;
    for (int k = 0; k < n_flips; ++k) {
      const uint64_t at = std::uniform_int_distribution<uint64_t>(0, hi - lo - 1)(rng);
      const uint8_t x = uint8_t(std::uniform_int_distribution<int>(1, 255)(rng));
      const uint8_t before = uint8_t(patch[size_t(at)]);
      patch[size_t(at)] = char(before ^ x);
      char desc[160];
      std::snprintf(desc, sizeof desc, "%s byte %llu: 0x%02x -> 0x%02x (%s)", k ? ";" : "", (unsigned long long)(lo + at),
                    before, uint8_t(patch[size_t(at)]), v.layout.Where(lo + at).c_str());
      what += desc;
    }
    FuzzOutcome out = LoadInChild(v.bytes, lo, patch);
    if (out.crashed) {
      if (++crashes > 20) continue;  // counted below; the first 20 inputs are enough to reproduce
      ADD_FAILURE() << label << " iteration " << it << " (seed " << seed << "): " << out.detail
                    << "\n  input: the valid tiny-qwen3-q8_0.gguf with" << what;
      continue;
    }
    ++by_code[out.code];
  }
  std::printf("[fuzz %s] %d variants of bytes [%llu, %llu), seed %u: %d crashed;", label, iterations,
              (unsigned long long)lo, (unsigned long long)hi, seed, crashes);
  for (auto [code, n] : by_code) std::printf(" %s: %d;", StatusCodeName(Status::Code(code)), n);
  std::printf("\n");
  EXPECT_EQ(crashes, 0) << label << ": variants that crashed (first 20 reported above)";
}

// The first 64 KiB: magic, counts and the start of the tokenizer arrays.
TEST(LoaderFuzz, First64KiB) { Fuzz("first 64 KiB", 0, 64 * 1024, 300, 20240601u); }

// The tail of the header: the model's hyper-parameter keys and the tensor infos (what the first
// 64 KiB never reaches, since the tokenizer arrays come first in the file). Nearly every variant
// here parses the whole tokenizer section first, so fewer iterations keep the ASan run short.
TEST(LoaderFuzz, HyperParametersAndTensorInfos) {
  const GgufLayout& l = TheValidFile().layout;
  uint64_t lo = l.kv("general.architecture").key_off;
  Fuzz("hparams + tensor infos", lo, l.infos_end, 200, 7u);
}

}  // namespace
}  // namespace mz
