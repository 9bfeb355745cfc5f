// DeviceProfile: the throughputs the restoration policy balances (paper §4.3 "Offline profiling"):
// per-codec decode throughput, sequential direct-I/O read throughput by request size, allocation
// cost. Measured once per device by `mzcache profile`; per-unit times for any model are derived
// from it without re-profiling.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace mz {
class Env;
}

namespace mz {

struct DeviceProfile {
  std::string device;                          // machine description
  std::map<std::string, double> decode_Bps;    // codec -> raw bytes/s decoded, one thread
  std::map<std::string, double> encode_Bps;    // codec -> raw bytes/s encoded, one thread
  std::map<std::string, double> ratio;         // codec -> encoded / raw bytes on real KV
  std::vector<std::pair<uint64_t, double>> read_Bps;  // request bytes -> bytes/s (direct I/O, sequential)
  // Page-cache readahead into file mappings (Env::PopulateMapped by two threads), bytes/s, for
  // 64 MiB pieces: the stand-in for every size in profiles without mapped_read_by_request; 0 = not
  // measured (ReadBps(4 MiB) stands in).
  double mapped_read_Bps = 0.0;
  // The same by piece size (request bytes -> bytes/s): one populate per KV chunk is slower than one
  // per 64 MiB. Empty in profiles written before it was measured (mapped_read_Bps stands in).
  std::vector<std::pair<uint64_t, double>> mapped_read_by_request;
  double alloc_s_per_MiB = 0.0;                // mmap + first touch
  // codec -> extra attention seconds per MiB of raw KV when a query of kInPlaceQueryTokens tokens
  // reads chunks compressed in memory in place (KvLayerView::q8_chunks) instead of fp16 chunks, one
  // thread. Only codecs the attention kernel reads in place (q8) appear. May be <= 0 (reading half
  // the bytes can be faster); users clamp it (DeriveUnitTimes).
  std::map<std::string, double> attend_in_place_s_per_MiB;
  static constexpr int kInPlaceQueryTokens = 8;
  // ggml type name ("q4_0", "q4_K") -> bytes/s ggml re-lays a matrix of that type into its
  // repacked CPU layout (model/repack.h), one thread: the repack part of re-making a repacked
  // layer (MZ_WEIGHTS_REPACKED). Only types this CPU has a repacked kernel for; empty in profiles
  // written before it was measured (the repack is then not costed).
  std::map<std::string, double> repack_Bps;
  int threads = 1;                             // threads the decode path uses in restoration
  // The remote tier (pool/remote_tier.h, Redis) as `mzcache profile --remote URL` measured it:
  // pipelined reads of chunk-sized values, bytes/s of payload, and the time to the first reply of
  // one small read (seconds). 0 = not measured (profiles written before it, or without --remote):
  // the pool then learns the rate at run time from RemoteTierStats (bytes_fetched / fetch_s).
  double remote_read_Bps = 0.0;
  double remote_first_byte_s = 0.0;

  // Read throughput for requests of `bytes` (interpolated; the peak measured rate above the largest size).
  double ReadBps(uint64_t bytes) const;
  // Page-cache read throughput into a file mapping of `bytes` (mapped_read_by_request interpolated
  // the same way, but the largest piece's rate above it; else mapped_read_Bps; else ReadBps(4 MiB)).
  double MappedReadBps(uint64_t bytes) const;
  // Smallest measured request size that reaches 90% of the peak read throughput.
  uint64_t SaturatingRequest() const;
  double DecodeBps(const std::string& codec) const;
  double Ratio(const std::string& codec) const;

  // JSON at path, written / read through env (nullptr: Env::Default()) with Env::WriteSmallFile
  // (created or truncated, not atomic) / ReadSmallFile. Failure: kIOError naming the path (and the
  // OS error); Load also kCorruption naming the bad field, *out then unchanged. Load accepts only
  // plausible values (every throughput >= 1 B/s and finite, ratios in [0.001, 4], alloc_s_per_MiB
  // in [0, 1], |attend_in_place_s_per_MiB| <= 1, threads in [1, 1024],
  // remote_first_byte_s in [0, 60]), so that the unit times derived from a loaded profile are finite.
  // Writes the profile as JSON crash-safely (path.tmp, sync, rename, folder sync): on failure path
  // keeps its previous content and the error keeps its code (kNoSpace for a full disk).
  Status Save(const std::string& path, Env* env = nullptr) const;
  static Status Load(const std::string& path, DeviceProfile* out, Env* env = nullptr);
  // Conservative stand-in when no profile was measured (documented in docs/design.md).
  static DeviceProfile Default();
};

// Per-unit restoration times (seconds) for one model and KV geometry: what each evicted unit adds
// to the first token's wait (paper §4.3's t_d^KV, t_r^KV, t_r^W).
struct UnitTimes {
  double t_d_kv = 0;   // a KV chunk compressed in memory (decoded, or read in place by attention)
  double t_r_kv = 0;   // read one raw KV chunk from storage
  double t_r_kvc = 0;  // read one compressed KV chunk from storage (and decode it, or read it in place)
  double t_r_w = 0;    // read one weight layer from storage
};

// How evicted units come back in this engine (the restore paths the times are derived for).
struct RestorePaths {
  // Weights are re-read through the page cache (Model::file_backed): at MappedReadBps(layer), no
  // anonymous memory to allocate. false: direct reads of 4 MiB + allocation.
  bool weights_file_backed = false;
  // Full raw KV chunks on storage are mapped from the swap file (UnitTable::CanMapSwap): read
  // at MappedReadBps(chunk), nothing allocated. false: a direct read of one chunk + allocation.
  bool kv_mapped = false;
  // Compute reads compressed chunks in place (ContextOptions::attend_compressed and a codec the
  // kernel reads: q8): a chunk compressed in memory costs the first token only the extra attention
  // time (attend_in_place_s_per_MiB), not a decode and a fresh fp16 chunk; one on storage costs its
  // compressed read plus that. false (or no measured figure for the codec): decode + allocation.
  bool kv_in_place = false;
  // Weights are repacked layers (Model::repack): a restore stages the layer through the page cache
  // (MappedReadBps), fills a fresh anonymous region (allocation) and repacks it: this many seconds
  // per layer on top (the model's repackable bytes by type over DeviceProfile::repack_Bps).
  bool weights_repacked = false;
  double repack_s_per_layer = 0;
};
UnitTimes DeriveUnitTimes(const DeviceProfile& p, const std::string& codec, uint64_t chunk_bytes,
                          uint64_t layer_bytes, const RestorePaths& paths = RestorePaths());

}  // namespace mz
