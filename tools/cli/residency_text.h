// The residency report (memory/residency_report.h) as text and JSON for the CLI: chat's /memory
// and /memory units, and run --residency-json.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "memory/residency_report.h"

namespace mz::cli {

// Lines (each "  ..." and newline-terminated) summing up what the kernel holds of what the context
// counts resident, the smaps totals, and the warning (prefixed "  WARNING: ") when weights mapped
// from the model file fell out of the page cache.
std::string ResidencySummaryText(const ResidencyReport& r);
// One line per unit: name, mzcache state, backing, MiB held, % in RAM (mincore), % of its file
// copy cached, and smaps Rss/Pss of its VMAs ("shared" when the VMA holds more than the unit).
std::string ResidencyTableText(const ResidencyReport& r);
// The whole report: {"summary": {...}, "units": [{...}, ...]}, sizes in bytes.
nlohmann::json ResidencyJson(const ResidencyReport& r);

}  // namespace mz::cli
