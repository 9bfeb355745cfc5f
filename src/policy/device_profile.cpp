#include "policy/device_profile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace mz {

double DeviceProfile::ReadBps(uint64_t bytes) const {
  if (read_Bps.empty()) return 1e9;
  auto v = read_Bps;
  std::sort(v.begin(), v.end());
  if (bytes <= v.front().first) return v.front().second * double(bytes) / double(v.front().first);
  for (size_t i = 1; i < v.size(); ++i)
    if (bytes <= v[i].first) {
      const double f = double(bytes - v[i - 1].first) / double(v[i].first - v[i - 1].first);
      return v[i - 1].second + f * (v[i].second - v[i - 1].second);
    }
  return std::max_element(v.begin(), v.end(), [](auto& a, auto& b) { return a.second < b.second; })->second;
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

Status DeviceProfile::Save(const std::string& path) const {
  nlohmann::json j;
  j["device"] = device;
  j["decode_Bps"] = decode_Bps;
  j["encode_Bps"] = encode_Bps;
  j["ratio"] = ratio;
  nlohmann::json r = nlohmann::json::array();
  for (auto& [n, b] : read_Bps) r.push_back({{"request_bytes", n}, {"Bps", b}});
  j["read_Bps"] = r;
  j["alloc_s_per_MiB"] = alloc_s_per_MiB;
  j["mapped_read_Bps"] = mapped_read_Bps;
  j["attend_in_place_s_per_MiB"] = attend_in_place_s_per_MiB;
  j["threads"] = threads;
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f) return Status::IOError("cannot write profile " + path);
  return Status::Ok();
}

Status DeviceProfile::Load(const std::string& path, DeviceProfile* out) {
  std::ifstream f(path);
  if (!f) return Status::IOError("cannot read profile " + path);
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    DeviceProfile p;
    p.device = j.value("device", "");
    p.decode_Bps = j.at("decode_Bps").get<std::map<std::string, double>>();
    p.encode_Bps = j.value("encode_Bps", std::map<std::string, double>{});
    p.ratio = j.value("ratio", std::map<std::string, double>{});
    for (auto& r : j.at("read_Bps")) p.read_Bps.push_back({r.at("request_bytes").get<uint64_t>(), r.at("Bps").get<double>()});
    p.alloc_s_per_MiB = j.value("alloc_s_per_MiB", 0.0);
    p.mapped_read_Bps = j.value("mapped_read_Bps", 0.0);
    if (p.mapped_read_Bps < 0) return Status::Corruption("profile " + path + ": mapped_read_Bps must not be negative");
    // Absent from profiles written before it was measured: compressed chunks are then costed as decoded.
    p.attend_in_place_s_per_MiB = j.value("attend_in_place_s_per_MiB", std::map<std::string, double>{});
    for (auto& [k, v] : p.attend_in_place_s_per_MiB)
      if (!std::isfinite(v)) return Status::Corruption("profile " + path + ": attend_in_place_s_per_MiB of " + k + " is not finite");
    p.threads = j.value("threads", 1);
    for (auto& [k, v] : p.decode_Bps)
      if (!(v > 0)) return Status::Corruption("profile " + path + ": decode throughput of " + k + " must be positive");
    for (auto& [n, b] : p.read_Bps)
      if (!(b > 0) || n == 0) return Status::Corruption("profile " + path + ": bad read throughput entry");
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
  const double mapped_Bps = p.mapped_read_Bps > 0 ? p.mapped_read_Bps : p.ReadBps(4 << 20);
  const auto in_place = p.attend_in_place_s_per_MiB.find(codec);
  if (paths.kv_in_place && in_place != p.attend_in_place_s_per_MiB.end()) {
    // Never zero: k = floor(t_r^W / t_d^KV) must stay finite, and a compressed chunk is never
    // free (kMinInPlaceS: about one tile's dequantization).
    constexpr double kMinInPlaceS = 1e-6;
    t.t_d_kv = std::max(kMinInPlaceS, in_place->second * chunk_mib);
  } else {
    t.t_d_kv = double(chunk_bytes) / p.DecodeBps(codec) + alloc_chunk;
  }
  t.t_r_kv = paths.kv_mapped ? double(chunk_bytes) / mapped_Bps : double(chunk_bytes) / p.ReadBps(chunk_bytes) + alloc_chunk;
  const uint64_t enc = uint64_t(double(chunk_bytes) * p.Ratio(codec));
  t.t_r_kvc = double(enc) / p.ReadBps(enc) + t.t_d_kv;
  if (paths.weights_file_backed)
    t.t_r_w = double(layer_bytes) / mapped_Bps;
  else
    t.t_r_w = double(layer_bytes) / p.ReadBps(4 << 20) + p.alloc_s_per_MiB * double(layer_bytes) / 1048576.0;
  return t;
}

}  // namespace mz
