// profile: measures this device's restoration throughputs (paper §4.3 offline profiling) and writes
// the profile the eviction policy balances with.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "model/model.h"
#include "kernels/attention.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "store/kv_codec.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/real_text.h"

namespace mz::cli {
namespace {

// Extra attention time per MiB of raw KV when a query of DeviceProfile::kInPlaceQueryTokens tokens
// reads chunks compressed by `codec` in place instead of fp16 chunks (one thread, one layer of
// kChunks chunks built from the real ones, the two layouts alternating, median of kReps).
// kInvalidArgument: the attention kernel does not read this codec in place.
Status MeasureInPlaceAttention(const std::string& codec_name, const std::vector<std::vector<uint16_t>>& chunks,
                               const ChunkShape& shape, int n_head, double* extra_s_per_MiB) {
  auto codec = MakeKvCodec(codec_name);
  if (!codec || !codec->attention_reads_in_place()) return Status::InvalidArgument(codec_name + " is not read in place");
  constexpr int kChunks = 32, kReps = 9;
  std::vector<std::vector<uint8_t>> enc(kChunks);
  // Distinct buffers for all kChunks chunks (a model with fewer sample chunks repeats their
  // contents, never their memory): otherwise the fp16 side would re-read the same cached bytes.
  std::vector<std::vector<uint16_t>> raws(kChunks);
  std::vector<const uint16_t*> kp(kChunks), vp(kChunks);
  std::vector<const uint8_t*> qp(kChunks);
  std::vector<int> rows(kChunks, shape.chunk_tokens);
  for (int c = 0; c < kChunks; ++c) {
    raws[c] = chunks[size_t(c) % chunks.size()];
    const std::vector<uint16_t>& raw = raws[c];
    ChunkShape s = shape;
    s.layer = int(size_t(c) % chunks.size() / 2);
    enc[c].resize(codec->MaxEncodedSize(s));
    size_t n = 0;
    MZ_RETURN_IF_ERROR(codec->Encode(s, raw.data(), enc[c].data(), enc[c].size(), &n));
    kp[c] = raw.data();
    vp[c] = raw.data() + shape.block_elems();
    qp[c] = enc[c].data() + kKvCodecHeaderBytes;
  }
  KvLayerView fp16{kp.data(), vp.data(), kChunks, shape.chunk_tokens, shape.n_kv_head, shape.head_dim,
                   kChunks * shape.chunk_tokens};
  KvLayerView q8 = fp16;
  q8.q8_chunks = qp.data();
  q8.q8_rows = rows.data();
  const int nq = DeviceProfile::kInPlaceQueryTokens;
  std::vector<float> q(size_t(nq) * size_t(n_head) * size_t(shape.head_dim)), out(q.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& x : q) x = nd(rng);
  AttnArgs args{q.data(), out.data(), nq, n_head, fp16.n_kv - nq, 1.0f / std::sqrt(float(shape.head_dim))};
  auto time = [&](const KvLayerView& v) {
    const double t0 = NowSeconds();
    for (int i = 0; i < 4; ++i) attention_chunked(args, v, 0, 1);
    return (NowSeconds() - t0) / 4;
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

struct ProfileArgs {
  std::string model;
  std::string out;
  std::string dir = "/var/tmp";
  int file_mib = 512;
  int threads = 2;
};

}  // namespace

void AddProfileCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<ProfileArgs>();
  auto* p = app.add_subcommand("profile", "measure codec, storage and allocation throughputs; write the device profile");
  p->add_option("-m,--model", a->model, "model whose real KV is used for codec throughput (default: Qwen3-0.6B)");
  p->add_option("-o,--out", a->out, "profile path (default: <cache>/profile.json)");
  p->add_option("--dir", a->dir, "folder on the storage to profile (where the swap file lives)");
  p->add_option("--file-mib", a->file_mib, "size of the read test file");
  p->add_option("-t,--threads", a->threads, "max decode threads to measure");
  runners.push_back([p, a]() -> int {
    if (!p->parsed()) return -1;
    if (a->model.empty()) {
      Status st = EnsureDefaultModel(&a->model);
      if (!st.ok()) return Fail(st);
    }
    if (a->out.empty()) a->out = CacheDir() + "/profile.json";
    DeviceProfile prof;
    prof.device = MachineDescription();
    prof.threads = 1;

    // 1. Codecs on real KV.
    std::vector<std::vector<uint16_t>> chunks;
    ChunkShape shape;
    int n_head = 0;
    Status st = RealKvChunks(a->model, &chunks, &shape, &n_head);
    if (!st.ok()) return Fail(st);
    std::printf("| codec | ratio | encode GB/s (1 thr) | decode GB/s (1 thr) | decode GB/s (%d thr) |\n|---|---|---|---|---|\n",
                a->threads);
    for (const std::string& name : KvCodecNames()) {
      auto codec = MakeKvCodec(name);
      std::vector<std::vector<uint8_t>> enc(chunks.size());
      double raw = 0, encoded = 0;
      double t0 = NowSeconds();
      for (size_t i = 0; i < chunks.size(); ++i) {
        ChunkShape s = shape;
        s.layer = int(i / 2);
        enc[i].resize(codec->MaxEncodedSize(s));
        size_t n = 0;
        st = codec->Encode(s, chunks[i].data(), enc[i].data(), enc[i].size(), &n);
        if (!st.ok()) return Fail(st);
        enc[i].resize(n);
        raw += double(s.raw_bytes());
        encoded += double(n);
      }
      const double enc_Bps = raw / (NowSeconds() - t0);
      auto decode = [&](int nt) {
        double best = 0;
        for (int rep = 0; rep < 3; ++rep) {
          std::atomic<size_t> next{0};
          double d0 = NowSeconds();
          std::vector<std::thread> ts;
          for (int t = 0; t < nt; ++t)
            ts.emplace_back([&] {
              std::vector<uint16_t> out(shape.raw_bytes() / 2);
              for (size_t i; (i = next.fetch_add(1)) < enc.size();) {
                ChunkShape s = shape;
                s.layer = int(i / 2);
                (void)codec->Decode(s, enc[i].data(), enc[i].size(), out.data());
              }
            });
          for (auto& t : ts) t.join();
          best = std::max(best, raw / (NowSeconds() - d0));
        }
        return best;
      };
      const double d1 = decode(1), dn = decode(a->threads);
      prof.encode_Bps[name] = enc_Bps;
      prof.decode_Bps[name] = d1;
      prof.ratio[name] = encoded / raw;
      std::printf("| %s | %.3f (saves %.1f%%) | %.2f | %.2f | %.2f |\n", name.c_str(), encoded / raw,
                  100.0 * (1 - encoded / raw), enc_Bps / 1e9, d1 / 1e9, dn / 1e9);
    }

    // 2. What reading compressed chunks in place costs attention (the in-memory path's time when
    // compute does not wait for a decode).
    for (const std::string& name : KvCodecNames()) {
      double extra = 0;
      st = MeasureInPlaceAttention(name, chunks, shape, n_head, &extra);
      if (st.code() == Status::kInvalidArgument) continue;  // not read in place
      if (!st.ok()) return Fail(st);
      prof.attend_in_place_s_per_MiB[name] = extra;
      std::printf("\nattention over %s chunks read in place, %d-token query, 1 thread: %+.4f ms per MiB of KV vs fp16 "
                  "(decoding instead: %.3f ms per MiB + allocation)\n",
                  name.c_str(), DeviceProfile::kInPlaceQueryTokens, extra * 1e3, 1048576.0 / prof.DecodeBps(name) * 1e3);
    }

    // 3. Sequential direct-I/O reads by request size.
    const std::string path = a->dir + "/mzcache-profile.bin";
    const size_t file_bytes = size_t(a->file_mib) << 20;
    {
      std::unique_ptr<File> f;
      st = Env::Default()->Open(path, OpenMode::kCreateTrunc, true, &f);
      if (!st.ok()) return Fail(st);
      if (!f->direct()) std::fprintf(stderr, "warning: %s does not support O_DIRECT; figures include the page cache\n", a->dir.c_str());
      const size_t blk = 4 << 20;
      void* buf = std::aligned_alloc(4096, blk);
      std::mt19937_64 rng(1);
      for (size_t i = 0; i < blk / 8; ++i) static_cast<uint64_t*>(buf)[i] = rng();
      for (size_t off = 0; off < file_bytes && st.ok(); off += blk) {
        st = f->Write(buf, blk, off);
        Progress("writing read-test file", off + blk, file_bytes);
      }
      std::free(buf);
      if (!st.ok()) return Fail(st);
      f->Sync();
    }
    std::printf("\n| request | direct read MB/s |\n|---|---|\n");
    for (uint64_t req : {128ull << 10, 256ull << 10, 512ull << 10, 1ull << 20, 2ull << 20, 4ull << 20}) {
      std::unique_ptr<File> f;
      st = Env::Default()->Open(path, OpenMode::kRead, true, &f);
      if (!st.ok()) return Fail(st);
      void* buf = std::aligned_alloc(4096, req);
      const size_t total = std::min(file_bytes, size_t(256) << 20);
      double best = 0;
      for (int rep = 0; rep < 2; ++rep) {
        double t0 = NowSeconds();
        for (size_t off = 0; off < total; off += req) {
          size_t got = 0;
          st = f->Read(buf, req, off, &got);
          if (!st.ok()) break;
        }
        best = std::max(best, double(total) / (NowSeconds() - t0));
      }
      std::free(buf);
      if (!st.ok()) return Fail(st);
      prof.read_Bps.push_back({req, best});
      std::printf("| %llu KiB | %.0f |\n", (unsigned long long)(req >> 10), best / 1e6);
    }
    // How file-backed weights and mapped KV chunks are re-read: page-cache readahead into file
    // mappings, one populate per piece (a KV chunk is 0.25-1 MiB, a weight layer tens of MiB).
    std::printf("\n| mapped piece (2 threads) | page-cache read MB/s |\n|---|---|\n");
    for (uint64_t piece : {256ull << 10, 1ull << 20, 4ull << 20, 64ull << 20}) {
      const double bps = MeasureMappedRead(path, std::min(file_bytes, size_t(256) << 20), piece);
      if (!(bps > 0)) {
        Env::Default()->Remove(path);
        return Fail(Status::IOError("measuring page-cache reads of " + path + " failed"));
      }
      prof.mapped_read_by_request.push_back({piece, bps});
      if (piece == (64ull << 20)) prof.mapped_read_Bps = bps;
      std::printf("| %llu KiB | %.0f |\n", (unsigned long long)(piece >> 10), bps / 1e6);
    }
    Env::Default()->Remove(path);

    // 4. Allocation (map + fault in) per MiB.
    {
      const double s_per_byte = MeasurePopulateCost();
      if (s_per_byte < 0) return Fail(Status::NoMemory("cannot map 256 MiB to measure the allocation cost"));
      prof.alloc_s_per_MiB = s_per_byte * 1048576.0;
      std::printf("\nallocation (mmap + fault in): %.3f ms per MiB (%.1f GB/s)\n", prof.alloc_s_per_MiB * 1e3,
                  1048576.0 / prof.alloc_s_per_MiB / 1e9);
    }
    const uint64_t sat = prof.SaturatingRequest();
    const uint64_t chunk = shape.raw_bytes();
    std::printf("reads saturate (90%% of peak) at %llu KiB requests; a %d-token KV chunk of this model is %llu KiB "
                "per layer (K+V): %s\n",
                (unsigned long long)(sat >> 10), shape.chunk_tokens, (unsigned long long)(chunk >> 10),
                chunk >= sat ? "big enough to saturate a read (§4.3 rule holds)"
                             : "smaller than the saturating request: use more tokens per chunk");
    // 5. What the policy derives from it for this model (paper §4.3: no re-profiling per model).
    {
      std::unique_ptr<Model> model;
      ModelOptions mo;
      mo.load_weights = false;
      st = Model::Load(Env::Default(), a->model, mo, &model);
      if (!st.ok()) return Fail(st);
      const uint64_t layer = model->unit(0).region_bytes;
      RestorePaths ours;
      ours.weights_file_backed = ours.kv_mapped = ours.kv_in_place = true;
      std::printf("\nunit times for %s (q8 codec, %llu KiB chunks, %.1f MiB layers), ms:\n\n"
                  "| restore paths | t_d^KV | t_r^KV | t_r^KVc | t_r^W | k = floor(t_r^W / t_d^KV) |\n|---|---|---|---|---|---|\n",
                  model->hparams().name.c_str(), (unsigned long long)(chunk >> 10), double(layer) / 1048576.0);
      for (int i = 0; i < 2; ++i) {
        const UnitTimes t = DeriveUnitTimes(prof, "q8", chunk, layer, i == 0 ? ours : RestorePaths());
        std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.0f |\n",
                    i == 0 ? "mzcache's (KV mapped, q8 read in place, weights via page cache)" : "the paper's (direct reads, decode)",
                    t.t_d_kv * 1e3, t.t_r_kv * 1e3, t.t_r_kvc * 1e3, t.t_r_w * 1e3, std::floor(t.t_r_w / t.t_d_kv));
      }
    }
    st = prof.Save(a->out);
    if (!st.ok()) return Fail(st);
    std::printf("profile written to %s\n", a->out.c_str());
    return 0;
  });
}

}  // namespace mz::cli
