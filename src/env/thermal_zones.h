// Thermal zones: the temperatures the kernel exposes under /sys/class/thermal (thermal_zoneN/type,
// temp in millidegrees Celsius, trip_point_K_temp / trip_point_K_type), read through an Env so tests
// serve a fake tree with FaultEnv. Used by the sustained mode (runtime/sustained.h) to step compute
// threads down before the platform's governor throttles.
//
// "No sensors" is a normal state, not an error: a VM (this project's measuring machine) or a phone
// whose vendor exposes no zone to apps has no /sys/class/thermal or no zone in it; ReadThermalZones
// then returns OK with no zone, and callers fall back to the tokens/s drift signal.
//
// Thread-safety: pure functions over their inputs (ReadThermalZones only reads files).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"

namespace mz {

constexpr const char* kSysThermalRoot = "/sys/class/thermal";

struct ThermalTrip {
  std::string type;    // "passive" (the governor starts throttling), "active" (a fan), "hot", "critical"
  double temp_c = 0;   // degrees Celsius
};

struct ThermalZone {
  std::string name;    // the directory, "thermal_zone3"
  std::string type;    // what it measures, e.g. "cpu-1-0-usr", "skin-therm", "x86_pkg_temp"
  double temp_c = 0;   // degrees Celsius, as read
  std::vector<ThermalTrip> trips;  // in trip_point order; malformed ones left out (see notes)
  // The temperature at which the platform starts to throttle this zone: its lowest "passive" trip
  // point, else its lowest "hot" or "critical" one (fans, "active", cool rather than throttle);
  // false when the zone has none of them.
  bool ThrottleTrip(double* temp_c) const;
};

struct ThermalReading {
  std::vector<ThermalZone> zones;  // readable zones, in directory order (thermal_zone0, 1, ..)
  // One line per zone left out or trip point ignored, with the reason ("thermal_zone2: temp
  // \"abc\" is not a temperature in millidegrees"): a malformed file never fails the read.
  std::vector<std::string> notes;
};

// Parses one sysfs temperature ("45000\n", millidegrees Celsius, may be negative) into degrees.
// kInvalidArgument (quoting the text) for anything else.
Status ParseMilliCelsius(const std::string& text, double* temp_c);

// Reads every thermal_zoneN under root whose type contains type_filter (empty: all zones). A
// missing root (ENOENT) is OK with no zone (no sensors). A zone whose temp cannot be read or
// parsed (some drivers return EAGAIN or EINVAL while the sensor is off) is left out with a note;
// a malformed trip point is ignored with a note. Failure: the Env's error listing an existing root
// (EACCES, EIO); *out is then empty.
Status ReadThermalZones(Env* env, ThermalReading* out, const std::string& root = kSysThermalRoot,
                        const std::string& type_filter = "");

}  // namespace mz
