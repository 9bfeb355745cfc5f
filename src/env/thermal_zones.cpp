#include "env/thermal_zones.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>

namespace mz {
namespace {

std::string Trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// "thermal_zone12" -> 12; false for any other name (cooling_deviceN, ...).
bool ZoneIndex(const std::string& name, long* idx) {
  static const std::string kPrefix = "thermal_zone";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  long v = 0;
  for (size_t i = kPrefix.size(); i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || v > 1000000) return false;
    v = v * 10 + (name[i] - '0');
  }
  *idx = v;
  return true;
}

// "trip_point_3_temp" -> 3; false otherwise.
bool TripIndex(const std::string& name, long* idx) {
  static const std::string kPrefix = "trip_point_", kSuffix = "_temp";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return false;
  const std::string mid = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  long v = 0;
  for (char c : mid) {
    if (!std::isdigit(static_cast<unsigned char>(c)) || v > 1000000) return false;
    v = v * 10 + (c - '0');
  }
  *idx = v;
  return true;
}

}  // namespace

bool ThermalZone::ThrottleTrip(double* temp_c) const {
  double passive = std::numeric_limits<double>::infinity(), other = passive;
  for (const ThermalTrip& t : trips) {
    if (t.type == "passive") passive = std::min(passive, t.temp_c);
    else if (t.type == "hot" || t.type == "critical") other = std::min(other, t.temp_c);
  }
  const double v = passive < std::numeric_limits<double>::infinity() ? passive : other;
  if (v == std::numeric_limits<double>::infinity()) return false;
  *temp_c = v;
  return true;
}

Status ParseMilliCelsius(const std::string& text, double* temp_c) {
  const std::string t = Trim(text);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '-' || t[i] == '+')) neg = t[i++] == '-';
  if (i == t.size() || t.size() - i > 12) return Status::InvalidArgument("\"" + t + "\" is not a temperature in millidegrees");
  long long v = 0;
  for (; i < t.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(t[i])))
      return Status::InvalidArgument("\"" + t + "\" is not a temperature in millidegrees");
    v = v * 10 + (t[i] - '0');
  }
  *temp_c = double(neg ? -v : v) / 1000.0;
  return Status::Ok();
}

Status ReadThermalZones(Env* env, ThermalReading* out, const std::string& root, const std::string& type_filter) {
  *out = ThermalReading();
  std::vector<std::string> names;
  Status st = env->ListDir(root, &names);
  if (!st.ok()) {
    // No thermal class at all: no sensors (a VM, a container without /sys). Not an error.
    if (st.message().find(std::strerror(ENOENT)) != std::string::npos) return Status::Ok();
    return st;
  }
  std::vector<std::pair<long, std::string>> zones;
  for (const std::string& n : names) {
    long idx = 0;
    if (ZoneIndex(n, &idx)) zones.push_back({idx, n});
  }
  std::sort(zones.begin(), zones.end());  // thermal_zone2 before thermal_zone10
  for (const auto& z : zones) {
    const std::string dir = root + "/" + z.second;
    ThermalZone zone;
    zone.name = z.second;
    std::string text;
    if (env->ReadSmallFile(dir + "/type", &text).ok()) zone.type = Trim(text);
    if (!type_filter.empty() && zone.type.find(type_filter) == std::string::npos) continue;
    Status ts = env->ReadSmallFile(dir + "/temp", &text);
    if (ts.ok()) ts = ParseMilliCelsius(text, &zone.temp_c);
    if (!ts.ok()) {
      out->notes.push_back(zone.name + " (" + zone.type + "): temp: " + ts.message() + "; zone left out");
      continue;
    }
    std::vector<std::string> files;
    if (env->ListDir(dir, &files).ok()) {
      std::vector<std::pair<long, std::string>> trips;
      for (const std::string& f : files) {
        long k = 0;
        if (TripIndex(f, &k)) trips.push_back({k, f});
      }
      std::sort(trips.begin(), trips.end());
      for (const auto& tp : trips) {
        ThermalTrip trip;
        std::string tt;
        Status s1 = env->ReadSmallFile(dir + "/" + tp.second, &tt);
        if (s1.ok()) s1 = ParseMilliCelsius(tt, &trip.temp_c);
        std::string ty;
        Status s2 = env->ReadSmallFile(dir + "/trip_point_" + std::to_string(tp.first) + "_type", &ty);
        if (!s1.ok() || !s2.ok()) {
          out->notes.push_back(zone.name + ": trip point " + std::to_string(tp.first) + ": " +
                               (!s1.ok() ? s1.message() : s2.message()) + "; ignored");
          continue;
        }
        trip.type = Trim(ty);
        zone.trips.push_back(trip);
      }
    }
    out->zones.push_back(std::move(zone));
  }
  return Status::Ok();
}

}  // namespace mz
