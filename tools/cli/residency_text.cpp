#include "tools/cli/residency_text.h"

#include <cstdarg>
#include <cstdio>

namespace mz::cli {
namespace {

std::string Fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string Fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

double MiB(uint64_t b) { return double(b) / 1048576.0; }
double Pct(uint64_t part, uint64_t whole) { return whole ? 100.0 * double(part) / double(whole) : 100.0; }

uint64_t Counted(const mz_residency_summary& s) {
  return s.weights_file_counted + s.weights_anon_counted + s.kv_counted + s.kv_compressed_counted;
}
uint64_t InRam(const mz_residency_summary& s) {
  return s.weights_file_in_ram + s.weights_anon_in_ram + s.kv_in_ram + s.kv_compressed_in_ram;
}
const char* StateName(int32_t s) {
  switch (s) {
    case MZ_STATE_RESIDENT: return "resident";
    case MZ_STATE_KV_MEM_COMPRESSED: return "kv-mem-compressed";
    case MZ_STATE_KV_STORAGE_RAW: return "kv-storage-raw";
    case MZ_STATE_KV_STORAGE_COMPRESSED: return "kv-storage-compressed";
    case MZ_STATE_WEIGHTS_DROPPED: return "weights-dropped";
  }
  return "?";
}
const char* BackingName(int32_t b) {
  switch (b) {
    case MZ_BACKING_NONE: return "none";
    case MZ_BACKING_ANONYMOUS: return "anonymous";
    case MZ_BACKING_MODEL_FILE: return "model-file";
    case MZ_BACKING_SWAP_FILE: return "swap-file";
  }
  return "?";
}
// "weights[3]", "weights[base]", "kv[2,5]".
std::string UnitName(const mz_unit_residency& u) {
  if (u.kind == MZ_UNIT_WEIGHTS) return u.layer < 0 ? "weights[base]" : "weights[" + std::to_string(u.layer) + "]";
  return "kv[" + std::to_string(u.layer) + "," + std::to_string(u.chunk) + "]";
}

}  // namespace

int MeasureResidency(mz_context* ctx, bool with_smaps, Residency* out) {
  *out = Residency{};
  // The unit count can change between the sizing call and the filling one (a KV chunk added by a
  // decode on another thread): retry until the buffer held every unit.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int32_t n = mz_residency_report(ctx, with_smaps, &out->summary, nullptr, 0);
    if (n < 0) return n;
    out->units.resize(size_t(n) + 16);
    const int32_t m = mz_residency_report(ctx, with_smaps, &out->summary, out->units.data(), int32_t(out->units.size()));
    if (m < 0) {
      *out = Residency{};
      return m;
    }
    if (size_t(m) <= out->units.size()) {
      out->units.resize(size_t(m));
      return MZ_OK;
    }
  }
  *out = Residency{};
  return MZ_ERR_BUSY;
}

std::string ResidencySummaryText(const Residency& r) {
  const mz_residency_summary& s = r.summary;
  std::string t;
  t += Fmt("  kernel (mincore): %.1f of %.1f MiB counted resident are in RAM (%.1f%%)\n", MiB(InRam(s)),
           MiB(Counted(s)), Pct(InRam(s), Counted(s)));
  t += Fmt("    weights mapped from the model file %.1f/%.1f MiB, anonymous %.1f/%.1f MiB; KV resident %.1f/%.1f MiB, "
           "compressed in memory %.1f/%.1f MiB\n",
           MiB(s.weights_file_in_ram), MiB(s.weights_file_counted), MiB(s.weights_anon_in_ram),
           MiB(s.weights_anon_counted), MiB(s.kv_in_ram), MiB(s.kv_counted), MiB(s.kv_compressed_in_ram),
           MiB(s.kv_compressed_counted));
  if (s.smaps_ok)
    t += Fmt("  smaps: %d VMAs of %.1f MiB hold the units: Rss %.1f MiB, Pss %.1f MiB, Anonymous %.1f MiB, Swap %.1f MiB\n",
             s.n_vmas, MiB(s.vma_bytes), MiB(s.vma_rss), MiB(s.vma_pss), MiB(s.vma_anonymous), MiB(s.vma_swap));
  else
    t += "  smaps: unavailable (" + std::string(s.smaps_error) + ")\n";
  if (s.warn) t += "  WARNING: " + std::string(s.warning) + "\n";
  return t;
}

std::string ResidencyTableText(const Residency& r) {
  std::string t = Fmt("  %-14s %-21s %-10s %9s %7s %7s %9s %9s %s\n", "unit", "state", "backing", "held MiB", "in RAM",
                      "cached", "Rss MiB", "Pss MiB", "VMAs");
  for (const mz_unit_residency& u : r.units) {
    std::string state = StateName(u.state);
    if (u.lost) state += " (lost)";
    const std::string in_ram = u.counted_bytes ? Fmt("%.0f%%", Pct(u.in_ram_bytes, u.counted_bytes)) : "-";
    const std::string cached = u.file_bytes ? Fmt("%.0f%%", Pct(u.file_cached_bytes, u.file_bytes)) : "-";
    std::string vmas = "-";
    if (u.n_vmas) vmas = Fmt("%d%s", u.n_vmas, u.vma_bytes > u.held_bytes ? Fmt(" shared (%.1f MiB)", MiB(u.vma_bytes)).c_str() : " own");
    t += Fmt("  %-14s %-21s %-10s %9.2f %7s %7s %9s %9s %s%s\n", UnitName(u).c_str(), state.c_str(),
             BackingName(u.backing), MiB(u.held_bytes), in_ram.c_str(), cached.c_str(),
             u.n_vmas ? Fmt("%.2f", MiB(u.vma_rss)).c_str() : "-", u.n_vmas ? Fmt("%.2f", MiB(u.vma_pss)).c_str() : "-",
             vmas.c_str(),
             u.kind == MZ_UNIT_WEIGHTS && u.backing == MZ_BACKING_MODEL_FILE && u.counted_bytes > u.in_ram_bytes
                 ? "  <- out of page cache"
                 : "");
  }
  return t;
}

nlohmann::json ResidencyJson(const Residency& r) {
  const mz_residency_summary& s = r.summary;
  nlohmann::json j;
  j["summary"] = {{"counted", Counted(s)},
                  {"in_ram", InRam(s)},
                  {"weights_file_counted", s.weights_file_counted},
                  {"weights_file_in_ram", s.weights_file_in_ram},
                  {"weights_anon_counted", s.weights_anon_counted},
                  {"weights_anon_in_ram", s.weights_anon_in_ram},
                  {"kv_counted", s.kv_counted},
                  {"kv_in_ram", s.kv_in_ram},
                  {"kv_compressed_counted", s.kv_compressed_counted},
                  {"kv_compressed_in_ram", s.kv_compressed_in_ram},
                  {"weight_units_out_of_page_cache", s.weight_units_out_of_page_cache},
                  {"weights_out_of_page_cache", s.weights_out_of_page_cache},
                  {"warn", s.warn},
                  {"warning", std::string(s.warning)},
                  {"smaps_ok", s.smaps_ok},
                  {"smaps_error", std::string(s.smaps_error)},
                  {"n_vmas", s.n_vmas},
                  {"vma_bytes", s.vma_bytes},
                  {"vma_rss", s.vma_rss},
                  {"vma_pss", s.vma_pss},
                  {"vma_anonymous", s.vma_anonymous},
                  {"vma_swap", s.vma_swap}};
  nlohmann::json units = nlohmann::json::array();
  for (const mz_unit_residency& u : r.units)
    units.push_back({{"unit", UnitName(u)},
                     {"kind", u.kind == MZ_UNIT_WEIGHTS ? "weights" : "kv"},
                     {"layer", u.layer},
                     {"chunk", u.kind == MZ_UNIT_WEIGHTS ? -1 : u.chunk},
                     {"state", StateName(u.state)},
                     {"lost", u.lost != 0},
                     {"backing", BackingName(u.backing)},
                     {"bytes", u.bytes},
                     {"held_bytes", u.held_bytes},
                     {"counted_bytes", u.counted_bytes},
                     {"in_ram_bytes", u.in_ram_bytes},
                     {"file_bytes", u.file_bytes},
                     {"file_cached_bytes", u.file_cached_bytes},
                     {"n_vmas", u.n_vmas},
                     {"vma_bytes", u.vma_bytes},
                     {"vma_rss", u.vma_rss},
                     {"vma_pss", u.vma_pss},
                     {"vma_anonymous", u.vma_anonymous},
                     {"vma_swap", u.vma_swap}});
  j["units"] = units;
  return j;
}

}  // namespace mz::cli
