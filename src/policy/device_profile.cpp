#include "policy/device_profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "env/env.h"

namespace mz {

namespace {

// Throughput for requests of `bytes` from a table of (request bytes, bytes/s): linear between
// measured sizes, proportional below the smallest (per-request latency dominates); above the
// largest, the peak of the table (peak_above) or the largest size's rate. REQUIRES a non-empty table.
double Interpolate(std::vector<std::pair<uint64_t, double>> v, uint64_t bytes, bool peak_above) {
  std::sort(v.begin(), v.end());
  if (bytes <= v.front().first) return v.front().second * double(bytes) / double(v.front().first);
  for (size_t i = 1; i < v.size(); ++i)
    if (bytes <= v[i].first) {
      const double f = double(bytes - v[i - 1].first) / double(v[i].first - v[i - 1].first);
      // (1 - f) a + f b, not a + f (b - a): exact at the ends and never below min(a, b). With rates
      // of 8e80 and 1.6e9 B/s the latter cancelled to 0 at f = 1 and a read took forever (an
      // infinite unit time; found by fuzz/fuzz_profile.cpp).
      return (1.0 - f) * v[i - 1].second + f * v[i].second;
    }
  if (!peak_above) return v.back().second;
  return std::max_element(v.begin(), v.end(), [](auto& a, auto& b) { return a.second < b.second; })->second;
}

// Plausibility bounds of a loaded profile (Load rejects values outside them): with them every unit
// time DeriveUnitTimes derives is finite and the policy's integer conversions stay in range. A
// profile with decode_Bps of 1e-320, a ratio of 1e300 or alloc_s_per_MiB of 1e308 (finite, positive,
// accepted before) gave infinite or NaN times and undefined float-to-int conversions in the policy
// (found by fuzz/fuzz_profile.cpp).
constexpr double kMinBps = 1.0;                         // any throughput, bytes/s
constexpr double kMinRatio = 1e-3, kMaxRatio = 4.0;     // encoded / raw
constexpr double kMaxAllocSPerMiB = 1.0;                // 1 s per MiB
constexpr double kMaxAttendSPerMiB = 1.0;               // |attend_in_place_s_per_MiB|
constexpr int kMaxThreads = 1024;
constexpr double kMaxFirstByteS = 60.0;                 // remote_first_byte_s

// A (request bytes, bytes/s) table from JSON; every entry must have a positive size and rate.
Status TableFromJson(const nlohmann::json& j, const std::string& what, std::vector<std::pair<uint64_t, double>>* out) {
  for (auto& r : j) {
    // An integer, checked before get<uint64_t>: nlohmann converts a float (1.3e20, -1.5) with a
    // plain cast, undefined out of range (found by fuzz/fuzz_profile.cpp).
    if (!r.at("request_bytes").is_number_unsigned()) return Status::Corruption("bad " + what + " entry (request_bytes)");
    const uint64_t n = r.at("request_bytes").get<uint64_t>();
    const double b = r.at("Bps").get<double>();
    if (n == 0 || !(b >= kMinBps) || !std::isfinite(b)) return Status::Corruption("bad " + what + " entry");
    out->push_back({n, b});
  }
  return Status::Ok();
}

nlohmann::json TableToJson(const std::vector<std::pair<uint64_t, double>>& v) {
  nlohmann::json r = nlohmann::json::array();
  for (auto& [n, b] : v) r.push_back({{"request_bytes", n}, {"Bps", b}});
  return r;
}

}  // namespace

double DeviceProfile::ReadBps(uint64_t bytes) const { return read_Bps.empty() ? 1e9 : Interpolate(read_Bps, bytes, true); }

double DeviceProfile::MappedReadBps(uint64_t bytes) const {
  if (!mapped_read_by_request.empty()) return Interpolate(mapped_read_by_request, bytes, false);
  return mapped_read_Bps > 0 ? mapped_read_Bps : ReadBps(4 << 20);
}

uint64_t DeviceProfile::SaturatingRequest() const {
  if (read_Bps.empty()) return 0;
  double peak = 0;
  for (auto& [n, b] : read_Bps) peak = std::max(peak, b);
  auto v = read_Bps;
  std::sort(v.begin(), v.end());
  for (auto& [n, b] : v)
    if (b >= 0.9 * peak) return n;
  return v.back().first;
}

double DeviceProfile::DecodeBps(const std::string& codec) const {
  auto it = decode_Bps.find(codec);
  return (it != decode_Bps.end() ? it->second : 2e9) * std::max(1, threads);
}

double DeviceProfile::Ratio(const std::string& codec) const {
  auto it = ratio.find(codec);
  if (it != ratio.end()) return it->second;
  return codec == "q8" ? 0.52 : codec == "q4" ? 0.3 : codec == "cachegen" ? 0.3 : 1.0;
}

Status DeviceProfile::Save(const std::string& path, Env* env) const {
  nlohmann::json j;
  j["device"] = device;
  j["decode_Bps"] = decode_Bps;
  j["encode_Bps"] = encode_Bps;
  j["ratio"] = ratio;
  j["read_Bps"] = TableToJson(read_Bps);
  j["mapped_read_by_request"] = TableToJson(mapped_read_by_request);
  j["alloc_s_per_MiB"] = alloc_s_per_MiB;
  j["mapped_read_Bps"] = mapped_read_Bps;
  j["attend_in_place_s_per_MiB"] = attend_in_place_s_per_MiB;
  j["repack_Bps"] = repack_Bps;
  j["threads"] = threads;
  j["remote_read_Bps"] = remote_read_Bps;
  j["remote_first_byte_s"] = remote_first_byte_s;
  // Crash-safe and all-or-nothing: written whole and synced to path.tmp, renamed over path, the
  // folder synced. On any failure path keeps its previous content (a context reads it at creation:
  // a partial profile would refuse every later context) and path.tmp is removed.
  Env* e = env ? env : Env::Default();
  const std::string tmp = path + ".tmp";
  Status st = e->WriteSmallFile(tmp, j.dump(2) + "\n", /*create=*/true);
  if (st.ok()) st = e->Rename(tmp, path);
  if (st.ok()) st = e->SyncDir(path);
  if (!st.ok()) {
    e->Remove(tmp);  // best effort: it may not exist
    return st.With("cannot write profile " + path);  // keeps the code: a full disk is kNoSpace
  }
  return Status::Ok();
}

Status DeviceProfile::Load(const std::string& path, DeviceProfile* out, Env* env) {
  std::string text;
  Status rd = (env ? env : Env::Default())->ReadSmallFile(path, &text);
  if (!rd.ok()) return Status::IOError("cannot read profile " + path + ": " + rd.message());
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    DeviceProfile p;
    p.device = j.value("device", "");
    p.decode_Bps = j.at("decode_Bps").get<std::map<std::string, double>>();
    p.encode_Bps = j.value("encode_Bps", std::map<std::string, double>{});
    p.ratio = j.value("ratio", std::map<std::string, double>{});
    Status st = TableFromJson(j.at("read_Bps"), "read throughput", &p.read_Bps);
    if (st.ok() && j.contains("mapped_read_by_request"))
      st = TableFromJson(j.at("mapped_read_by_request"), "mapped read throughput", &p.mapped_read_by_request);
    if (!st.ok()) return Status::Corruption("profile " + path + ": " + st.message());
    p.alloc_s_per_MiB = j.value("alloc_s_per_MiB", 0.0);
    if (!(p.alloc_s_per_MiB >= 0 && p.alloc_s_per_MiB <= kMaxAllocSPerMiB))
      return Status::Corruption("profile " + path + ": alloc_s_per_MiB must be a number in [0, 1]");
    p.mapped_read_Bps = j.value("mapped_read_Bps", 0.0);
    if (!(p.mapped_read_Bps == 0 || p.mapped_read_Bps >= kMinBps) || !std::isfinite(p.mapped_read_Bps))
      return Status::Corruption("profile " + path + ": mapped_read_Bps must be 0 (not measured) or a finite number >= 1");
    // Absent from profiles written before it was measured: compressed chunks are then costed as decoded.
    p.attend_in_place_s_per_MiB = j.value("attend_in_place_s_per_MiB", std::map<std::string, double>{});
    for (auto& [k, v] : p.attend_in_place_s_per_MiB)
      if (!(std::fabs(v) <= kMaxAttendSPerMiB))
        return Status::Corruption("profile " + path + ": attend_in_place_s_per_MiB of " + k + " must be in [-1, 1]");
    // Absent from profiles written before it was measured: the repack is then not costed.
    p.repack_Bps = j.value("repack_Bps", std::map<std::string, double>{});
    for (auto& [k, v] : p.repack_Bps)
      if (!(v >= kMinBps) || !std::isfinite(v))
        return Status::Corruption("profile " + path + ": repack throughput of " + k + " must be >= 1 B/s");
    // An integer in int's range before the conversion (a float such as 1e20 cast to int is undefined).
    if (j.contains("threads") && !(j.at("threads").is_number_integer() && j.at("threads").get<int64_t>() >= 1 &&
                                   j.at("threads").get<int64_t>() <= kMaxThreads))
      return Status::Corruption("profile " + path + ": threads must be an integer in [1, 1024]");
    p.threads = j.value("threads", 1);
    if (p.threads < 1 || p.threads > kMaxThreads) return Status::Corruption("profile " + path + ": threads must be in [1, 1024]");
    // Absent from profiles written before it was measured (or without --remote): 0, learned at run time.
    p.remote_read_Bps = j.value("remote_read_Bps", 0.0);
    if (!(p.remote_read_Bps == 0 || p.remote_read_Bps >= kMinBps) || !std::isfinite(p.remote_read_Bps))
      return Status::Corruption("profile " + path + ": remote_read_Bps must be 0 (not measured) or a finite number >= 1");
    p.remote_first_byte_s = j.value("remote_first_byte_s", 0.0);
    if (!(p.remote_first_byte_s >= 0 && p.remote_first_byte_s <= kMaxFirstByteS))
      return Status::Corruption("profile " + path + ": remote_first_byte_s must be a number in [0, 60]");
    for (auto& [k, v] : p.encode_Bps)
      if (!(v >= kMinBps) || !std::isfinite(v)) return Status::Corruption("profile " + path + ": encode throughput of " + k + " must be >= 1 B/s");
    for (auto& [k, v] : p.decode_Bps)
      if (!(v >= kMinBps) || !std::isfinite(v)) return Status::Corruption("profile " + path + ": decode throughput of " + k + " must be >= 1 B/s");
    // A ratio is a divisor of storage reads and of what fits in memory: 0 or negative would give
    // NaN or negative unit times.
    for (auto& [k, v] : p.ratio)
      if (!(v >= kMinRatio && v <= kMaxRatio))
        return Status::Corruption("profile " + path + ": compression ratio of " + k + " must be in [0.001, 4]");
    *out = std::move(p);
  } catch (const std::exception& e) {
    return Status::Corruption("profile " + path + ": " + e.what());
  }
  return Status::Ok();
}

DeviceProfile DeviceProfile::Default() {
  DeviceProfile p;
  p.device = "default (not measured)";
  p.decode_Bps = {{"none", 8e9}, {"q8", 3e9}, {"q4", 2e9}, {"cachegen", 0.5e9}, {"lz4", 2e9}, {"zstd", 0.8e9}};
  p.read_Bps = {{128 << 10, 0.8e9}, {512 << 10, 1.5e9}, {4 << 20, 1.6e9}};
  p.alloc_s_per_MiB = 1e-4;
  // Measured 0.06 ms/MiB for an 8-token query on a 2-core AMD EPYC VM (docs/results.md); doubled
  // here, as the other defaults lean slow.
  p.attend_in_place_s_per_MiB = {{"q8", 1.2e-4}};
  p.threads = 1;
  return p;
}

UnitTimes DeriveUnitTimes(const DeviceProfile& p, const std::string& codec, uint64_t chunk_bytes,
                          uint64_t layer_bytes, const RestorePaths& paths) {
  UnitTimes t;
  const double chunk_mib = double(chunk_bytes) / 1048576.0;
  const double alloc_chunk = p.alloc_s_per_MiB * chunk_mib;
  const auto in_place = p.attend_in_place_s_per_MiB.find(codec);
  if (paths.kv_in_place && in_place != p.attend_in_place_s_per_MiB.end()) {
    // Never zero: k = floor(t_r^W / t_d^KV) must stay finite, and a compressed chunk is never
    // free (kMinInPlaceS: about one tile's dequantization).
    constexpr double kMinInPlaceS = 1e-6;
    t.t_d_kv = std::max(kMinInPlaceS, in_place->second * chunk_mib);
  } else {
    t.t_d_kv = double(chunk_bytes) / p.DecodeBps(codec) + alloc_chunk;
  }
  t.t_r_kv = paths.kv_mapped ? double(chunk_bytes) / p.MappedReadBps(chunk_bytes) : double(chunk_bytes) / p.ReadBps(chunk_bytes) + alloc_chunk;
  const uint64_t enc = uint64_t(double(chunk_bytes) * p.Ratio(codec));
  t.t_r_kvc = (enc ? double(enc) / p.ReadBps(enc) : 0.0) + t.t_d_kv;  // ReadBps(0) is 0: no 0/0
  if (paths.weights_repacked)
    t.t_r_w = double(layer_bytes) / p.MappedReadBps(layer_bytes) +
              p.alloc_s_per_MiB * double(layer_bytes) / 1048576.0 + std::max(0.0, paths.repack_s_per_layer);
  else if (paths.weights_file_backed)
    t.t_r_w = double(layer_bytes) / p.MappedReadBps(layer_bytes);
  else
    t.t_r_w = double(layer_bytes) / p.ReadBps(4 << 20) + p.alloc_s_per_MiB * double(layer_bytes) / 1048576.0;
  return t;
}

}  // namespace mz
