#include "policy/profiler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <iterator>
#include <random>
#include <vector>
#include <string>
#include <optional>
#include <limits>

#include "ggml.h"
#include "kernels/attention.h"
#include "model/repack.h"
#include "store/remote_kv.h"

namespace mz {

const char* ProfileSampleText() {
  return
R"(In the beginning God created the heaven and the earth.
And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.
And God said, Let there be light: and there was light.
And God saw the light, that it was good: and God divided the light from the darkness.
And God called the light Day, and the darkness he called Night. And the evening and the morning were the first day.
And God said, Let there be a firmament in the midst of the waters, and let it divide the waters from the waters.
And God made the firmament, and divided the waters which were under the firmament from the waters which were above the firmament: and it was so.
And God called the firmament Heaven. And the evening and the morning were the second day.
And God said, Let the waters under the heaven be gathered together unto one place, and let the dry land appear: and it was so.
And God called the dry land Earth; and the gathering together of the waters called he Seas: and God saw that it was good.
And God said, Let the earth bring forth grass, the herb yielding seed, and the fruit tree yielding fruit after his kind, whose seed is in itself, upon the earth: and it was so.
And the earth brought forth grass, and herb yielding seed after his kind, and the tree yielding fruit, whose seed was in itself, after his kind: and God saw that it was good.
And the evening and the morning were the third day.
And God said, Let there be lights in the firmament of the heaven to divide the day from the night; and let them be for signs, and for seasons, and for days, and years:
And let them be for lights in the firmament of the heaven to give light upon the earth: and it was so.
And God made two great lights; the greater light to rule the day, and the lesser light to rule the night: he made the stars also.
And God set them in the firmament of the heaven to give light upon the earth,
And to rule over the day and over the night, and to divide the light from the darkness: and God saw that it was good.
And the evening and the morning were the fourth day.
And God said, Let the waters bring forth abundantly the moving creature that hath life, and fowl that may fly above the earth in the open firmament of heaven.
And God created great whales, and every living creature that moveth, which the waters brought forth abundantly, after their kind, and every winged fowl after his kind: and God saw that it was good.
And God blessed them, saying, Be fruitful, and multiply, and fill the waters in the seas, and let fowl multiply in the earth.
And the evening and the morning were the fifth day.
And God said, Let the earth bring forth the living creature after his kind, cattle, and creeping thing, and beast of the earth after his kind: and it was so.
And God made the beast of the earth after his kind, and cattle after their kind, and every thing that creepeth upon the earth after his kind: and God saw that it was good.
And God said, Let us make man in our image, after our likeness: and let them have dominion over the fish of the sea, and over the fowl of the air, and over the cattle, and over all the earth, and over every creeping thing that creepeth upon the earth.
So God created man in his own image, in the image of God created he him; male and female created he them.
And God blessed them, and God said unto them, Be fruitful, and multiply, and replenish the earth, and subdue it: and have dominion over the fish of the sea, and over the fowl of the air, and over every living thing that moveth upon the earth.
And God said, Behold, I have given you every herb bearing seed, which is upon the face of all the earth, and every tree, in the which is the fruit of a tree yielding seed; to you it shall be for meat.
And to every beast of the earth, and to every fowl of the air, and to every thing that creepeth upon the earth, wherein there is life, I have given every green herb for meat: and it was so.
And God saw every thing that he had made, and, behold, it was very good. And the evening and the morning were the sixth day.
Thus the heavens and the earth were finished, and all the host of them.
And on the seventh day God ended his work which he had made; and he rested on the seventh day from all his work which he had made.
And God blessed the seventh day, and sanctified it: because that in it he had rested from all his work which God created and made.
These are the generations of the heavens and of the earth when they were created, in the day that the LORD God made the earth and the heavens,
And every plant of the field before it was in the earth, and every herb of the field before it grew: for the LORD God had not caused it to rain upon the earth, and there was not a man to till the ground.
But there went up a mist from the earth, and watered the whole face of the ground.
And the LORD God formed man of the dust of the ground, and breathed into his nostrils the breath of life; and man became a living soul.
)";
}

namespace {

double Seconds(Env* env) { return double(env->NowNs()) * 1e-9; }

// Anonymous page-aligned memory from env (what O_DIRECT buffers need), unmapped on destruction.
class AnonBuffer {
 public:
  AnonBuffer(Env* env, size_t bytes) : env_(env), bytes_(bytes), p_(env->MapAnon(bytes)) {}
  ~AnonBuffer() {
    if (p_) env_->Unmap(p_, bytes_);
  }
  AnonBuffer(const AnonBuffer&) = delete;
  AnonBuffer& operator=(const AnonBuffer&) = delete;
  char* data() const { return static_cast<char*>(p_); }

 private:
  Env* env_;
  size_t bytes_;
  void* p_;
};

// Appends printf-style text to the report (if one is wanted).
void Say(const ProfileOptions& o, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void Say(const ProfileOptions& o, const char* fmt, ...) {
  if (!o.report) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  o.report(buf);
}

// Counts steps for the progress callback.
struct Steps {
  const ProfileOptions& o;
  int total;
  int done = 0;
  void Done(const std::string& step) {
    ++done;
    if (o.progress) o.progress(step, done, total);
  }
};

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Writes a `bytes` test file of pseudo-random bytes at path with O_DIRECT (4 MiB writes) and syncs
// it; `written` (optional) is told the bytes written so far.
Status WriteReadTestFile(Env* env, const std::string& path, size_t bytes, std::unique_ptr<File>* out,
                         const std::function<void(size_t)>& written = nullptr) {
  std::unique_ptr<File> f;
  MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kCreateTrunc, true, &f));
  const size_t blk = size_t(4) << 20;
  AnonBuffer buf(env, blk);
  if (!buf.data()) return Status::NoMemory("cannot map a 4 MiB write buffer");
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < blk / 8; ++i) reinterpret_cast<uint64_t*>(buf.data())[i] = rng();
  for (size_t off = 0; off < bytes; off += blk) {
    MZ_RETURN_IF_ERROR(f->Write(buf.data(), blk, off));
    if (written) written(off + blk);
  }
  MZ_RETURN_IF_ERROR(f->Sync());
  if (out) *out = std::move(f);
  return Status::Ok();
}

// One pass of `request`-sized direct reads over [0, bytes) of f by `nt` readers taking the
// requests in turn (that many in flight; a reader thread the OS refuses leaves fewer); bytes/s,
// 0 on error.
double DirectReadPass(Env* env, File* f, size_t bytes, size_t request, int nt) {
  nt = std::max(1, nt);
  AnonBuffer buf(env, request * size_t(nt));
  if (!buf.data()) return 0;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  const double t0 = Seconds(env);
  RunOnThreads(env, nt, [&](int t) {
    char* b = buf.data() + size_t(t) * request;
    for (size_t off; (off = next.fetch_add(request)) < bytes && !failed;) {
      size_t got = 0;
      if (!f->Read(b, request, off, &got).ok()) failed = true;
    }
  });
  const double dt = Seconds(env) - t0;
  return failed ? 0 : double(bytes) / dt;
}

}  // namespace

double MeasureMappedRead(Env* env, const std::string& path, size_t bytes, size_t piece, int reps) {
  std::unique_ptr<File> file;
  if (piece == 0 || !env->Open(path, OpenMode::kRead, false, &file).ok()) return 0;
  File* f = file.get();
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    char* region = static_cast<char*>(env->MapAnon(bytes));
    if (!region) return 0;
    if (!env->DropCached(f, 0, bytes).ok()) {
      env->Unmap(region, bytes);
      return 0;
    }
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    const double t0 = Seconds(env);
    RunOnThreads(env, 2, [&](int) {
      for (size_t off; (off = next.fetch_add(piece)) < bytes && !failed;) {
        const size_t n = std::min(piece, bytes - off);
        if (!env->MapFileAt(f, off, n, region + off, false).ok() || !env->PopulateMapped(f, region + off, n, Env::kPopulateSmallPages).ok())
          failed = true;
      }
    });
    const double dt = Seconds(env) - t0;
    env->Unmap(region, bytes);
    (void)env->DropCached(f, 0, bytes);
    if (failed) return 0;
    best = std::max(best, double(bytes) / dt);
  }
  return best;
}

std::vector<double> MeasureDirectReads(Env* env, const std::string& dir, size_t bytes, size_t request,
                                       const std::vector<int>& threads, double* mapped_Bps) {
  std::vector<double> best(threads.size(), 0.0);
  const std::string path = dir + "/mzcache-read-test.bin";
  bytes = AlignUp(bytes, size_t(4) << 20);
  bool ok = WriteReadTestFile(env, path, bytes, nullptr).ok();
  std::unique_ptr<File> f;
  if (ok && env->Open(path, OpenMode::kRead, true, &f).ok()) {
    for (size_t k = 0; k < threads.size() && ok; ++k)
      for (int rep = 0; rep < 2 && ok; ++rep) {
        const double bps = DirectReadPass(env, f.get(), bytes, request, threads[k]);
        ok = bps > 0;
        best[k] = std::max(best[k], bps);
      }
    f.reset();
  }
  if (mapped_Bps) *mapped_Bps = ok ? MeasureMappedRead(env, path, bytes) : 0.0;
  env->Remove(path);
  if (!ok) std::fill(best.begin(), best.end(), 0.0);
  return best;
}

StorageProbe::StorageProbe(Env* env, const std::string& dir, size_t bytes)
    : env_(env), path_(dir + "/mzcache-read-probe.bin"), bytes_(AlignUp(bytes, size_t(4) << 20)) {
  ok_ = WriteReadTestFile(env_, path_, bytes_, nullptr).ok();
}

StorageProbe::~StorageProbe() { env_->Remove(path_); }

double StorageProbe::ReadNow() {
  if (!ok_) return 0;
  std::unique_ptr<File> f;
  double direct = 0;
  if (env_->Open(path_, OpenMode::kRead, true, &f).ok())
    for (int nt : {1, 2}) direct = std::max(direct, DirectReadPass(env_, f.get(), bytes_, size_t(4) << 20, nt));
  f.reset();
  return std::max(direct, MeasureMappedRead(env_, path_, bytes_));
}

double MeasurePopulateCost(Env* env, size_t bytes, int reps) {
  double best = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = Seconds(env);
    void* p = env->MapAnon(bytes);
    if (!p) return -1;
    env->Prefault(p, bytes);
    const double dt = Seconds(env) - t0;
    env->Unmap(p, bytes);
    best = std::min(best, dt / double(bytes));
  }
  return best;
}

std::string MachineDescription(Env* env) {
  std::string cpu = "unknown CPU", text;
  long cores = 0;
  if (env->ReadSmallFile("/proc/cpuinfo", &text).ok()) {
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t end = std::min(text.find('\n', pos), text.size());
      const std::string line = text.substr(pos, end - pos);
      if (line.rfind("processor", 0) == 0) ++cores;
      if (cpu == "unknown CPU" && line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
        cpu = line.substr(std::min(line.size(), line.find(':') + 2));
      pos = end + 1;
    }
  }
  double mem_gib = 0;
  if (env->ReadSmallFile("/proc/meminfo", &text).ok()) {
    unsigned long long kib = 0;
    if (std::sscanf(text.c_str(), "MemTotal: %llu kB", &kib) == 1) mem_gib = double(kib) * 1024.0 / double(1 << 30);
  }
  std::string os = "unknown", release;
  if (env->ReadSmallFile("/proc/sys/kernel/ostype", &text).ok()) os = FirstLine(text);
  if (env->ReadSmallFile("/proc/sys/kernel/osrelease", &text).ok()) release = FirstLine(text);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %ld cores, %.0f GiB RAM, %s %s", cpu.c_str(), cores, mem_gib, os.c_str(),
                release.c_str());
  return buf;
}

namespace {

// Encode (one thread) and decode (1 and o.threads threads) throughput of every codec on the
// sample, and its ratio, into prof; one report row per codec.
Status MeasureCodecs(Env* env, const KvSample& kv, const ProfileOptions& o, Steps* steps, DeviceProfile* prof) {
  Say(o, "| codec | ratio | encode GB/s (1 thr) | decode GB/s (1 thr) | decode GB/s (%d thr) |\n|---|---|---|---|---|\n",
      o.threads);
  const int reps = o.quick ? 1 : 3;
  for (const std::string& name : KvCodecNames()) {
    auto codec = MakeKvCodec(name);
    std::vector<std::vector<uint8_t>> enc(kv.chunks.size());
    double raw = 0, encoded = 0;
    const double t0 = Seconds(env);
    for (size_t i = 0; i < kv.chunks.size(); ++i) {
      ChunkShape s = kv.shape;
      s.layer = int(i / 2);
      enc[i].resize(codec->MaxEncodedSize(s));
      size_t n = 0;
      MZ_RETURN_IF_ERROR(codec->Encode(s, kv.chunks[i].data(), enc[i].data(), enc[i].size(), &n));
      enc[i].resize(n);
      raw += double(s.raw_bytes());
      encoded += double(n);
    }
    const double enc_Bps = raw / (Seconds(env) - t0);
    auto decode = [&](int nt) {
      double best = 0;
      for (int rep = 0; rep < reps; ++rep) {
        std::atomic<size_t> next{0};
        const double d0 = Seconds(env);
        RunOnThreads(env, nt, [&](int) {
          std::vector<uint16_t> out(kv.shape.raw_bytes() / 2);
          for (size_t i; (i = next.fetch_add(1)) < enc.size();) {
            ChunkShape s = kv.shape;
            s.layer = int(i / 2);
            (void)codec->Decode(s, enc[i].data(), enc[i].size(), out.data());
          }
        });
        best = std::max(best, raw / (Seconds(env) - d0));
      }
      return best;
    };
    const double d1 = decode(1), dn = decode(o.threads);
    prof->encode_Bps[name] = enc_Bps;
    prof->decode_Bps[name] = d1;
    prof->ratio[name] = encoded / raw;
    Say(o, "| %s | %.3f (saves %.1f%%) | %.2f | %.2f | %.2f |\n", name.c_str(), encoded / raw,
        100.0 * (1 - encoded / raw), enc_Bps / 1e9, d1 / 1e9, dn / 1e9);
    steps->Done("codec " + name);
  }
  return Status::Ok();
}

// Extra attention time per MiB of raw KV when a query of DeviceProfile::kInPlaceQueryTokens tokens
// reads chunks compressed by `codec` in place instead of fp16 chunks (one thread, one layer of
// kChunks chunks built from the sample's, the two layouts alternating, median of kReps).
// kInvalidArgument: the attention kernel does not read this codec in place.
Status MeasureInPlaceAttention(Env* env, const std::string& codec_name, const KvSample& kv, bool quick,
                               double* extra_s_per_MiB) {
  auto codec = MakeKvCodec(codec_name);
  if (!codec || !codec->attention_reads_in_place()) return Status::InvalidArgument(codec_name + " is not read in place");
  const ChunkShape& shape = kv.shape;
  const int kChunks = quick ? 8 : 32, kReps = quick ? 3 : 9;
  std::vector<std::vector<uint8_t>> enc(kChunks);
  // Distinct buffers for all kChunks chunks (a model with fewer sample chunks repeats their
  // contents, never their memory): otherwise the fp16 side would re-read the same cached bytes.
  std::vector<std::vector<uint16_t>> raws(kChunks);
  std::vector<const uint16_t*> kp(kChunks), vp(kChunks);
  std::vector<const uint8_t*> qp(kChunks);
  std::vector<int> rows(kChunks, shape.chunk_tokens);
  for (int c = 0; c < kChunks; ++c) {
    raws[c] = kv.chunks[size_t(c) % kv.chunks.size()];
    ChunkShape s = shape;
    s.layer = int(size_t(c) % kv.chunks.size() / 2);
    enc[c].resize(codec->MaxEncodedSize(s));
    size_t n = 0;
    MZ_RETURN_IF_ERROR(codec->Encode(s, raws[c].data(), enc[c].data(), enc[c].size(), &n));
    kp[c] = raws[c].data();
    vp[c] = raws[c].data() + shape.block_elems();
    qp[c] = enc[c].data() + kKvCodecHeaderBytes;
  }
  KvLayerView fp16{kp.data(), vp.data(), kChunks, shape.chunk_tokens, shape.n_kv_head, shape.head_dim,
                   kChunks * shape.chunk_tokens};
  KvLayerView q8 = fp16;
  q8.q8_chunks = qp.data();
  q8.q8_rows = rows.data();
  const int nq = DeviceProfile::kInPlaceQueryTokens;
  std::vector<float> q(size_t(nq) * size_t(kv.n_head) * size_t(shape.head_dim)), out(q.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& x : q) x = nd(rng);
  AttnArgs args{q.data(), out.data(), nq, kv.n_head, fp16.n_kv - nq, 1.0f / std::sqrt(float(shape.head_dim))};
  auto time = [&](const KvLayerView& v) {
    const double t0 = Seconds(env);
    for (int i = 0; i < 4; ++i) attention_chunked(args, v, 0, 1);
    return (Seconds(env) - t0) / 4;
  };
  (void)time(fp16), (void)time(q8);  // warm caches and scratch
  std::vector<double> diff;
  for (int r = 0; r < kReps; ++r) {
    const double a = time(fp16), b = time(q8);
    diff.push_back(b - a);
  }
  std::sort(diff.begin(), diff.end());
  *extra_s_per_MiB = diff[diff.size() / 2] / (double(kChunks) * double(shape.raw_bytes()) / 1048576.0);
  return Status::Ok();
}

// What reading compressed chunks in place costs attention (the in-memory path's time when compute
// does not wait for a decode), for every codec the kernel reads in place.
Status MeasureInPlace(Env* env, const KvSample& kv, const ProfileOptions& o, Steps* steps, DeviceProfile* prof) {
  for (const std::string& name : KvCodecNames()) {
    double extra = 0;
    Status st = MeasureInPlaceAttention(env, name, kv, o.quick, &extra);
    steps->Done("in-place attention " + name);
    if (st.code() == Status::kInvalidArgument) continue;  // not read in place
    MZ_RETURN_IF_ERROR(st);
    prof->attend_in_place_s_per_MiB[name] = extra;
    Say(o,
        "\nattention over %s chunks read in place, %d-token query, 1 thread: %+.4f ms per MiB of KV vs fp16 "
        "(decoding instead: %.3f ms per MiB + allocation)\n",
        name.c_str(), DeviceProfile::kInPlaceQueryTokens, extra * 1e3, 1048576.0 / prof->DecodeBps(name) * 1e3);
  }
  return Status::Ok();
}

constexpr uint64_t kReadRequests[] = {128ull << 10, 256ull << 10, 512ull << 10, 1ull << 20, 2ull << 20, 4ull << 20};
constexpr uint64_t kMappedPieces[] = {256ull << 10, 1ull << 20, 4ull << 20, 64ull << 20};

// Sequential direct-I/O reads by request size, then page-cache reads into file mappings by piece
// size (how file-backed weights and mapped KV chunks are re-read: one populate per piece; a KV
// chunk is 0.25-1 MiB, a weight layer tens of MiB), both of the test file at path.
Status MeasureReads(Env* env, const std::string& path, size_t file_bytes, const ProfileOptions& o, Steps* steps,
                    DeviceProfile* prof) {
  const size_t total = std::min(file_bytes, size_t(256) << 20);
  Say(o, "\n| request | direct read MB/s |\n|---|---|\n");
  for (uint64_t req : kReadRequests) {
    std::unique_ptr<File> f;
    MZ_RETURN_IF_ERROR(env->Open(path, OpenMode::kRead, true, &f));
    double best = 0;
    for (int rep = 0; rep < (o.quick ? 1 : 2); ++rep) {
      const double bps = DirectReadPass(env, f.get(), total, req, 1);
      if (!(bps > 0)) return Status::IOError("direct reads of " + path + " failed");
      best = std::max(best, bps);
    }
    prof->read_Bps.push_back({req, best});
    Say(o, "| %llu KiB | %.0f |\n", (unsigned long long)(req >> 10), best / 1e6);
    steps->Done("direct reads");
  }
  Say(o, "\n| mapped piece (2 threads) | page-cache read MB/s |\n|---|---|\n");
  for (uint64_t piece : kMappedPieces) {
    const double bps = MeasureMappedRead(env, path, total, piece, o.quick ? 1 : 2);
    if (!(bps > 0)) return Status::IOError("measuring page-cache reads of " + path + " failed");
    prof->mapped_read_by_request.push_back({piece, bps});
    if (piece == (64ull << 20)) prof->mapped_read_Bps = bps;
    Say(o, "| %llu KiB | %.0f |\n", (unsigned long long)(piece >> 10), bps / 1e6);
    steps->Done("page-cache reads");
  }
  return Status::Ok();
}

// The storage under o.dir: writes the read-test file, measures, removes it (on every path).
Status MeasureStorage(Env* env, const ProfileOptions& o, Steps* steps, DeviceProfile* prof) {
  const std::string path = o.dir + "/mzcache-profile.bin";
  const size_t file_bytes = AlignUp(o.file_bytes, size_t(4) << 20);
  std::unique_ptr<File> f;
  Status st = WriteReadTestFile(env, path, file_bytes, &f);
  if (st.ok() && !f->direct())
    Say(o, "warning: %s does not support O_DIRECT; figures include the page cache\n", o.dir.c_str());
  f.reset();
  steps->Done("writing read-test file");
  if (st.ok()) st = MeasureReads(env, path, file_bytes, o, steps, prof);
  env->Remove(path);
  return st;
}

// Allocation (map + fault in) per MiB.
Status MeasureAllocation(Env* env, const ProfileOptions& o, Steps* steps, DeviceProfile* prof) {
  const size_t bytes = o.quick ? size_t(16) << 20 : size_t(256) << 20;
  const double s_per_byte = MeasurePopulateCost(env, bytes, o.quick ? 1 : 3);
  if (s_per_byte < 0)
    return Status::NoMemory("cannot map " + std::to_string(bytes >> 20) + " MiB to measure the allocation cost");
  prof->alloc_s_per_MiB = s_per_byte * 1048576.0;
  Say(o, "\nallocation (mmap + fault in): %.3f ms per MiB (%.1f GB/s)\n", prof->alloc_s_per_MiB * 1e3,
      1048576.0 / prof->alloc_s_per_MiB / 1e9);
  steps->Done("allocation");
  return Status::Ok();
}

// ggml's repack into its CPU_REPACK layout, per weight type this CPU has a repacked kernel for
// (Q4_0, Q4_K), one thread: a Llama-3.1-8B attn_q-sized matrix (4096 x 4096; 1024 rows with quick)
// of valid blocks, the best of 3 (1 with quick) after one untimed pass that faults the target in.
Status MeasureRepack(Env* env, const ProfileOptions& o, Steps* steps, DeviceProfile* prof) {
  const int64_t K = 4096, N = o.quick ? 1024 : 4096;
  ggml_init_params ip{2 * ggml_tensor_overhead(), nullptr, true};
  for (ggml_type type : {GGML_TYPE_Q4_0, GGML_TYPE_Q4_K}) {
    ggml_context* ctx = ggml_init(ip);
    if (!ctx) return Status::NoMemory("ggml_init");
    ggml_tensor* t = ggml_new_tensor_2d(ctx, type, K, N);
    if (!CanRepack(t)) {
      ggml_free(ctx);
      continue;
    }
    const size_t bytes = ggml_nbytes(t), row = ggml_row_size(type, K);
    std::vector<float> f(size_t(K) * 8);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (float& x : f) x = u(rng);
    std::vector<uint8_t> src(bytes);
    ggml_quantize_chunk(type, f.data(), src.data(), 0, 8, K, nullptr);  // 8 rows, repeated
    for (size_t off = row * 8; off < bytes; off += row * 8) std::memcpy(src.data() + off, src.data(), row * 8);
    void* dst = env->MapAnon(bytes);
    if (!dst) {
      ggml_free(ctx);
      return Status::NoMemory("cannot map " + std::to_string(bytes >> 20) + " MiB to measure the repack");
    }
    RepackInto(t, dst, src.data());  // faults dst in
    double best = 0;
    for (int i = 0; i < (o.quick ? 1 : 3); ++i) {
      const uint64_t t0 = env->NowNs();
      RepackInto(t, dst, src.data());
      const double s = std::max(1e-9, double(env->NowNs() - t0) / 1e9);
      best = std::max(best, double(bytes) / s);
    }
    UnbindRepacked(t);
    env->Unmap(dst, bytes);
    ggml_free(ctx);
    prof->repack_Bps[ggml_type_name(type)] = best;
    Say(o, "repack %s (ggml CPU_REPACK, one thread): %.2f GB/s\n", ggml_type_name(type), best / 1e9);
  }
  steps->Done("repack");
  return Status::Ok();
}

// Notes what the policy derives from the profile for this model (paper §4.3: no re-profiling per
// model): where reads saturate against the chunk size, and the unit times of both restore paths.
void ReportUnitTimes(const DeviceProfile& prof, const KvSample& kv, const ProfileModel& model,
                     const ProfileOptions& o) {
  const uint64_t sat = prof.SaturatingRequest();
  const uint64_t chunk = kv.shape.raw_bytes();
  Say(o,
      "reads saturate (90%% of peak) at %llu KiB requests; a %d-token KV chunk of this model is %llu KiB "
      "per layer (K+V): %s\n",
      (unsigned long long)(sat >> 10), kv.shape.chunk_tokens, (unsigned long long)(chunk >> 10),
      chunk >= sat ? "big enough to saturate a read (§4.3 rule holds)"
                   : "smaller than the saturating request: use more tokens per chunk");
  if (model.layer_bytes == 0) return;
  RestorePaths ours;
  ours.weights_file_backed = ours.kv_mapped = ours.kv_in_place = true;
  Say(o,
      "\nunit times for %s (q8 codec, %llu KiB chunks, %.1f MiB layers), ms:\n\n"
      "| restore paths | t_d^KV | t_r^KV | t_r^KVc | t_r^W | k = floor(t_r^W / t_d^KV) |\n|---|---|---|---|---|---|\n",
      model.name.c_str(), (unsigned long long)(chunk >> 10), double(model.layer_bytes) / 1048576.0);
  for (int i = 0; i < 2; ++i) {
    const UnitTimes t = DeriveUnitTimes(prof, "q8", chunk, model.layer_bytes, i == 0 ? ours : RestorePaths());
    Say(o, "| %s | %.3f | %.3f | %.3f | %.3f | %.0f |\n",
        i == 0 ? "mzcache's (KV mapped, q8 read in place, weights via page cache)" : "the paper's (direct reads, decode)",
        t.t_d_kv * 1e3, t.t_r_kv * 1e3, t.t_r_kvc * 1e3, t.t_r_w * 1e3, std::floor(t.t_r_w / t.t_d_kv));
  }
}

}  // namespace

Status ProfileDevice(Env* env, const KvSample& kv, const ProfileModel& model, const ProfileOptions& o,
                     DeviceProfile* out) {
  if (kv.chunks.empty() || kv.shape.raw_bytes() == 0 || kv.n_head <= 0)
    return Status::InvalidArgument("profile: no KV sample to measure the codecs on");
  for (const auto& c : kv.chunks)
    if (c.size() * 2 != kv.shape.raw_bytes()) return Status::InvalidArgument("profile: a KV sample chunk has the wrong size");
  if (o.threads <= 0 || o.threads > 256) return Status::InvalidArgument("profile: threads out of range");
  if (o.file_bytes == 0) return Status::InvalidArgument("profile: the read-test file needs a size");
  const int n_codecs = int(KvCodecNames().size());
  Steps steps{o, 2 * n_codecs + 1 + int(std::size(kReadRequests)) + int(std::size(kMappedPieces)) + 2};
  DeviceProfile prof;
  prof.device = MachineDescription(env);
  prof.threads = 1;
  MZ_RETURN_IF_ERROR(MeasureCodecs(env, kv, o, &steps, &prof));
  MZ_RETURN_IF_ERROR(MeasureInPlace(env, kv, o, &steps, &prof));
  MZ_RETURN_IF_ERROR(MeasureStorage(env, o, &steps, &prof));
  MZ_RETURN_IF_ERROR(MeasureAllocation(env, o, &steps, &prof));
  MZ_RETURN_IF_ERROR(MeasureRepack(env, o, &steps, &prof));
  ReportUnitTimes(prof, kv, model, o);
  *out = std::move(prof);
  return Status::Ok();
}

// ---- the remote tier's part (ProfileRemote) ----

Status ProfileRemote(Env* env, RemoteKv* kv, uint64_t value_bytes, int values, int reps, DeviceProfile* out,
                     const std::function<void(const std::string&)>& report) {
  if (!env || !kv || !out || values < 1 || value_bytes < 1 || reps < 1)
    return Status::InvalidArgument("ProfileRemote: values, value_bytes and reps must be >= 1");
  // Values of random bytes (an xorshift seeded by the clock), each its own; their keys unique to
  // this run, each in its own Cluster slot (hash tag), as the tier's chunks are.
  uint64_t x = env->NowNs() | 1;
  char run[32];
  std::snprintf(run, sizeof run, "%016llx", static_cast<unsigned long long>(x));
  std::vector<std::string> keys, written;
  for (int i = 0; i < values; ++i) {
    keys.push_back(std::string("mz:profile:") + run + ":{" + std::to_string(i) + "}");
    std::string v(size_t(value_bytes), '\0');
    for (char& c : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      c = char(x);
    }
    written.push_back(std::move(v));
  }
  constexpr uint32_t kTtlS = 600;
  Status st;
  for (int i = 0; i < values && st.ok(); ++i) st = kv->Put(keys[size_t(i)], written[size_t(i)], kTtlS, false);
  double best_read_s = std::numeric_limits<double>::infinity(), best_first_s = best_read_s;
  for (int r = 0; r < reps && st.ok(); ++r) {
    std::vector<std::optional<std::string>> got;
    const uint64_t t0 = env->NowNs();
    st = kv->Get(keys, &got);
    const uint64_t t1 = env->NowNs();
    if (!st.ok()) break;
    for (int i = 0; i < values && st.ok(); ++i)
      if (!got[size_t(i)] || *got[size_t(i)] != written[size_t(i)])
        st = Status::Corruption("remote profile: value " + keys[size_t(i)] + " read back differs");
    best_read_s = std::min(best_read_s, double(t1 - t0) * 1e-9);
    std::vector<std::string> one;
    const uint64_t t2 = env->NowNs();
    if (st.ok()) st = kv->GetRange({keys[0]}, {{0, 1}}, &one);
    const uint64_t t3 = env->NowNs();
    if (st.ok()) best_first_s = std::min(best_first_s, double(t3 - t2) * 1e-9);
  }
  kv->Remove(keys);  // best effort: the TTL removes them otherwise
  if (!st.ok()) return st.With("profiling the remote tier at " + kv->Describe());
  const double bytes = double(value_bytes) * double(values);
  // A clock that did not advance (a read faster than its resolution) would divide by 0: one ns.
  out->remote_read_Bps = std::max(1.0, bytes / std::max(best_read_s, 1e-9));
  out->remote_first_byte_s = std::max(0.0, best_first_s);
  if (report) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "\nRemote tier %s: %d values of %.1f KiB read in one pipeline at %.1f MB/s (best of %d); "
                  "first byte %.3f ms\n",
                  kv->Describe().c_str(), values, double(value_bytes) / 1024.0, out->remote_read_Bps / 1e6, reps,
                  out->remote_first_byte_s * 1e3);
    report(line);
  }
  return Status::Ok();
}

}  // namespace mz
