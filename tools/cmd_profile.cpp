// profile: measures this device's restoration throughputs (paper §4.3 offline profiling) and writes
// the profile the eviction policy balances with.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "model/model.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "swap/kv_codec.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/real_text.h"

namespace mz::cli {
namespace {

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
    Status st = RealKvChunks(a->model, &chunks, &shape);
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

    // 2. Sequential direct-I/O reads by request size.
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
    // How file-backed weights are re-read: page-cache readahead into file mappings.
    prof.mapped_read_Bps = MeasureMappedRead(path, std::min(file_bytes, size_t(256) << 20));
    std::printf("\npage-cache readahead into file mappings (64 MiB pieces, 2 threads): %.0f MB/s\n",
                prof.mapped_read_Bps / 1e6);
    Env::Default()->Remove(path);

    // 3. Allocation (map + fault in) per MiB.
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
    st = prof.Save(a->out);
    if (!st.ok()) return Fail(st);
    std::printf("profile written to %s\n", a->out.c_str());
    return 0;
  });
}

}  // namespace mz::cli
