#include "policy/restore_rates.h"

#include <algorithm>

namespace mz {

const char* RestoreKindName(RestoreKind k) {
  switch (k) {
    case RestoreKind::kMappedWeights: return "mapped weights";
    case RestoreKind::kMappedKv: return "mapped KV";
    case RestoreKind::kDirectRead: return "direct reads";
  }
  return "?";
}

bool RestoreRates::Note(RestoreKind k, const RestoreSample& s) {
  const int i = int(k);
  if (i < 0 || i >= kRestoreKinds || s.bytes == 0 || s.bytes < min_bytes_ || !(s.wall_s > 0)) return false;
  const double wall = s.wall_s / double(s.bytes);
  double cpu;
  if (s.cpu_known) cpu = std::min(wall, std::max(0.0, s.cpu_s / double(s.bytes)));
  else cpu = k == RestoreKind::kDirectRead ? 0.0 : wall;
  std::lock_guard<std::mutex> lk(mu_);
  RestoreRate& r = r_[i];
  if (r.samples == 0) {
    r.wall_s_per_byte = wall;
    r.cpu_s_per_byte = cpu;
  } else {
    r.wall_s_per_byte = 0.5 * r.wall_s_per_byte + 0.5 * wall;
    r.cpu_s_per_byte = 0.5 * r.cpu_s_per_byte + 0.5 * cpu;
  }
  ++r.samples;
  return true;
}

RestoreRate RestoreRates::Get(RestoreKind k) const {
  const int i = int(k);
  if (i < 0 || i >= kRestoreKinds) return RestoreRate();
  std::lock_guard<std::mutex> lk(mu_);
  return r_[i];
}

}  // namespace mz
