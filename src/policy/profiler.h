// Device profiler (paper §4.3 "Offline profiling"): measures what the restoration policy balances
// on this device (codec throughputs on real KV, what reading q8 chunks in place costs attention,
// direct-I/O and page-cache read throughputs of the storage, the cost of fresh anonymous memory)
// and fills a DeviceProfile. Every OS effect goes through the Env passed in (files, O_DIRECT,
// mappings, the clock, threads), so a FaultEnv reaches all of it.
//
// The measuring helpers below are also what the benches use to print their storage bounds.
// Thread-safety: the free functions may run concurrently (each uses its own test file); a
// StorageProbe is not thread-safe.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "policy/device_profile.h"
#include "store/kv_codec.h"

namespace mz {
class RemoteKv;

// Real KV to measure the codecs on: full raw fp16 chunks ([K block | V block], each
// shape.block_elems() halves) of a context prefilled with real text, 2 per layer in layer order
// (chunk c of layer l at index 2*l + c), so a layer-aware codec sees layer = index / 2.
struct KvSample {
  std::vector<std::vector<uint16_t>> chunks;
  ChunkShape shape;  // n_tokens == chunk_tokens
  int n_head = 0;    // the model's query heads (the in-place attention test's query shape)
};

// The prose whose KV a profile measures: the opening of Genesis (King James Version, public
// domain), as `mzcache` benches read it from Debian's bible-kjv, so the profile and the benches
// see the same KV. About 1100 tokens; NUL-terminated, static.
const char* ProfileSampleText();
// Tokens of ProfileSampleText a profile prefills (the sample's two chunks per layer need 512).
inline constexpr int kProfileSampleTokens = 512;

struct ProfileOptions {
  std::string dir = "/var/tmp";      // folder on the storage to profile (where swap files live)
  size_t file_bytes = size_t(512) << 20;  // read-test file written there, removed before return
  int threads = 2;                   // most decode threads measured (the report's last column)
  // Small and fast (seconds, for tests and a first look; figures are noisier): fewer repetitions,
  // 8 chunks instead of 32 in the in-place attention test, 16 MiB instead of 256 MiB in the
  // allocation test. file_bytes is not changed: set it small too.
  bool quick = false;
  // Called after each step: (step name, steps done, steps in all). May be empty.
  std::function<void(const std::string& step, int done, int total)> progress;
  // Receives the human-readable figures as they are measured (markdown tables and notes, each
  // piece ending in a newline), including warnings (a folder without O_DIRECT). May be empty.
  std::function<void(const std::string& text)> report;
};

// The model a profile's unit-time table is printed for (optional: layer_bytes == 0 skips it).
struct ProfileModel {
  std::string name;
  uint64_t layer_bytes = 0;  // one weight layer unit
};

// Measures this device into *out (out->device = MachineDescription(env), threads = 1; every other
// field measured). kv must hold at least one chunk. Errors: kInvalidArgument (no KV chunks, bad
// options); kIOError / kNoSpace (the read-test file could not be written or read: the dir is
// missing, read-only or full); kNoMemory (the allocation test could not map memory). The test file
// is removed on every path. *out is only complete on success.
Status ProfileDevice(Env* env, const KvSample& kv, const ProfileModel& model, const ProfileOptions& o,
                     DeviceProfile* out);

// The remote tier's read rate (pool/remote_tier.h) into out->remote_read_Bps and
// out->remote_first_byte_s: writes `values` values of value_bytes each (random bytes, keys
// "mz:profile:<n>:{<i>}" with a 10-minute TTL, so a crash leaves nothing for long) through kv, then
// reads them back in one pipeline (GET, as the tier fetches a prefix's chunks), reps times: the
// rate is the best repetition's bytes / seconds; the first byte is the best of reps one-byte
// GETRANGEs of one value (a round trip). The values are removed after, on every path (best effort).
// Timed with env->NowNs. Errors: kInvalidArgument (values < 1, value_bytes < 1, reps < 1), the
// store's (kIOError: unreachable), kCorruption (a value read back differs from the one written).
// report (may be empty) receives the figures as a markdown note.
Status ProfileRemote(Env* env, RemoteKv* kv, uint64_t value_bytes, int values, int reps, DeviceProfile* out,
                     const std::function<void(const std::string&)>& report);

// "CPU model, N cores, M GiB RAM, OS release" from /proc/cpuinfo, /proc/meminfo and
// /proc/sys/kernel/{ostype,osrelease} (Env::ReadSmallFile, so a FaultEnv can fake them); "unknown
// CPU", 0 cores / GiB or "unknown" OS for what cannot be read.
std::string MachineDescription(Env* env);

// Page-cache read bandwidth of the existing file `path` ([0, bytes)), read the way file-backed weight
// units and mapped KV chunks are: `piece`-sized pieces (a weight layer, a KV chunk) mapped and
// populated (Env::PopulateMapped) by two threads in turn, as the restore pipeline's two storage
// workers do. Best of `reps` (bytes/s), the file's pages dropped from the page cache before each; 0
// on error.
double MeasureMappedRead(Env* env, const std::string& path, size_t bytes, size_t piece = size_t(64) << 20,
                         int reps = 2);
// Sequential direct-I/O read bandwidth (bytes/s, best of 2) of the storage holding `dir` for each
// reader count in `threads` (readers take `request`-sized O_DIRECT reads in turn: that many
// requests in flight), from one `bytes` test file (rounded up to 4 MiB) written there and removed.
// 0s on error. mapped_Bps (optional): also the page-cache read bandwidth of the same file, as
// file-backed weight units are read (MeasureMappedRead with 64 MiB pieces; 0 on error).
std::vector<double> MeasureDirectReads(Env* env, const std::string& dir, size_t bytes, size_t request,
                                       const std::vector<int>& threads, double* mapped_Bps = nullptr);
// A read-test file kept for a whole benchmark run, so that the storage's read rate can be measured
// again between repetitions (a disk whose rate drifts within a run: the bound of each cell then
// uses the rate measured during that cell). Not thread-safe; the file is removed by the destructor.
class StorageProbe {
 public:
  // Writes a `bytes` (rounded up to 4 MiB) test file in dir with direct I/O; ok() tells if it did.
  StorageProbe(Env* env, const std::string& dir, size_t bytes);
  ~StorageProbe();
  StorageProbe(const StorageProbe&) = delete;
  StorageProbe& operator=(const StorageProbe&) = delete;
  bool ok() const { return ok_; }
  // The best of, measured now (bytes/s, 0 on error): one pass of direct reads with 4 MiB requests,
  // 1 in flight, one with 2 in flight (as the pipeline's two storage workers), and page-cache
  // reads of 64 MiB mapped pieces by two threads (MeasureMappedRead: best of 2, the file dropped
  // from the page cache first): the kinds of read the run-start figure takes the best of.
  double ReadNow();

 private:
  Env* env_;
  std::string path_;
  size_t bytes_;
  bool ok_ = false;
};
// Cost of making fresh anonymous memory usable (Env::MapAnon + Prefault, the restore pipeline's
// way), seconds per byte, best of `reps` over `bytes`. -1 if the mapping fails.
double MeasurePopulateCost(Env* env, size_t bytes = size_t(256) << 20, int reps = 3);

}  // namespace mz
