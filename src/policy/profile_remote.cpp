// The remote tier's part of the device profile (policy/profiler.h: ProfileRemote).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "policy/profiler.h"
#include "pool/remote_kv.h"

namespace mz {

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
