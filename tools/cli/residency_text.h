// The residency report of the C API (mz_residency_report in include/mzcache.h) as text and JSON for
// the CLI: chat's /memory and /memory units, and run --residency-json.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mzcache.h"

namespace mz::cli {

// A context's residency report: the summary and every unit.
struct Residency {
  mz_residency_summary summary{};
  std::vector<mz_unit_residency> units;
};
// Measures ctx with mz_residency_report (with_smaps: also /proc/self/smaps). Returns MZ_OK or its
// negative status (mz_last_error says why); *out is then empty.
int MeasureResidency(mz_context* ctx, bool with_smaps, Residency* out);

// Lines (each "  ..." and newline-terminated) summing up what the kernel holds of what the context
// counts resident, the smaps totals, and the warning (prefixed "  WARNING: ") when weights mapped
// from the model file fell out of the page cache.
std::string ResidencySummaryText(const Residency& r);
// One line per unit: name, mzcache state, backing, MiB held, % in RAM (mincore), % of its file
// copy cached, and smaps Rss/Pss of its VMAs ("shared" when the VMA holds more than the unit).
std::string ResidencyTableText(const Residency& r);
// The whole report: {"summary": {...}, "units": [{...}, ...]}, sizes in bytes.
nlohmann::json ResidencyJson(const Residency& r);

}  // namespace mz::cli
