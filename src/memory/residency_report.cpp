#include "memory/residency_report.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace mz {

const char* BackingName(Backing b) {
  switch (b) {
    case Backing::kNone: return "none";
    case Backing::kAnonymous: return "anonymous";
    case Backing::kModelFile: return "model-file";
    case Backing::kSwapFile: return "swap-file";
  }
  return "?";
}

namespace {

std::string MiB(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / 1048576.0);
  return buf;
}

Status WeightUnitResidency(const Model& model, int u, UnitResidency* r) {
  const WeightUnit& w = model.unit(u);
  r->unit = UnitRef::Weights(w.layer);
  r->bytes = w.region_bytes;
  r->state = w.resident() ? UnitState::kResident : UnitState::kWeightsDropped;
  if (w.resident()) {
    r->held_bytes = w.region_bytes;
    r->addr = uint64_t(reinterpret_cast<uintptr_t>(w.region));
    r->backing = w.backing == WeightMemory::kAnonymous ? Backing::kAnonymous : Backing::kModelFile;
    MZ_RETURN_IF_ERROR(model.UnitInRam(u, &r->in_ram_bytes, &r->counted_bytes));
  }
  return model.UnitFileCached(u, &r->file_cached_bytes, &r->file_bytes);
}

Status KvChunkResidency(Env* env, const KvCache& kv, const UnitTable& table, int l, int c, UnitResidency* r) {
  const KvChunkMemory m = table.LocateKv(l, c);
  const std::string name = UnitName(UnitRef::Kv(l, c));
  r->unit = UnitRef::Kv(l, c);
  r->state = m.state;
  r->lost = m.lost;
  r->bytes = kv.geometry().chunk_bytes();
  if (m.addr && m.bytes) {
    r->held_bytes = m.bytes;
    r->addr = uint64_t(reinterpret_cast<uintptr_t>(m.addr));
    r->backing = m.mapped_from_swap ? Backing::kSwapFile : Backing::kAnonymous;
    const uint64_t page = env->PageSize();
    r->counted_bytes = AlignUp(r->addr + m.bytes, page) - AlignDown(r->addr, page);
    MZ_RETURN_IF_ERROR(env->ResidentBytes(m.addr, m.bytes, &r->in_ram_bytes).With(name));
  }
  if (m.stored_file) {
    r->file_bytes = m.stored_len;
    MZ_RETURN_IF_ERROR(env->CachedBytes(m.stored_file, m.stored_off, m.stored_len, &r->file_cached_bytes).With(name));
  }
  return Status::Ok();
}

void Summarize(ResidencyReport* r) {
  ResidencySummary& s = r->summary;
  for (const UnitResidency& u : r->units) {
    if (u.unit.kind == UnitRef::kWeights) {
      if (u.backing == Backing::kModelFile) {
        s.weights_file_counted += u.counted_bytes;
        s.weights_file_in_ram += u.in_ram_bytes;
        if (u.missing() > 0) {
          s.weight_units_out_of_page_cache++;
          s.weights_out_of_page_cache += u.missing();
        }
      } else if (u.backing == Backing::kAnonymous) {
        s.weights_anon_counted += u.counted_bytes;
        s.weights_anon_in_ram += u.in_ram_bytes;
      }
    } else if (u.state == UnitState::kResident) {
      s.kv_counted += u.counted_bytes;
      s.kv_in_ram += u.in_ram_bytes;
    } else {
      s.kv_compressed_counted += u.counted_bytes;
      s.kv_compressed_in_ram += u.in_ram_bytes;
    }
  }
  s.warn = s.weight_units_out_of_page_cache > 0;
  if (s.warn)
    s.warning = std::to_string(s.weight_units_out_of_page_cache) + " weight unit" +
                (s.weight_units_out_of_page_cache == 1 ? "" : "s") + " mapped from the model file lost " +
                MiB(s.weights_out_of_page_cache) + " of " + MiB(s.weights_file_counted) +
                " from the page cache (reclaimed by the kernel): a decode faults them back from storage a page "
                "at a time, every token; a restore (or restore_generate, which reconciles) reads them back ahead";
}

}  // namespace

void AttributeSmaps(const std::vector<SmapsVma>& vmas, ResidencyReport* r) {
  ResidencySummary& s = r->summary;
  std::set<size_t> seen;  // VMAs overlapping some unit, for the totals (each once)
  for (UnitResidency& u : r->units) {
    u.n_vmas = 0;
    u.vma_bytes = u.vma_rss = u.vma_pss = u.vma_anonymous = u.vma_swap = 0;
    if (!u.addr || !u.held_bytes) continue;
    const uint64_t end = u.addr + u.held_bytes;
    for (size_t i = FirstVmaEndingAfter(vmas, u.addr); i < vmas.size() && vmas[i].start < end; ++i) {
      const SmapsVma& v = vmas[i];
      u.n_vmas++;
      u.vma_bytes += v.end - v.start;
      u.vma_rss += v.rss;
      u.vma_pss += v.pss;
      u.vma_anonymous += v.anonymous;
      u.vma_swap += v.swap;
      seen.insert(i);
    }
  }
  s.n_vmas = int(seen.size());
  s.vma_bytes = s.vma_rss = s.vma_pss = s.vma_anonymous = s.vma_swap = 0;
  for (size_t i : seen) {
    s.vma_bytes += vmas[i].end - vmas[i].start;
    s.vma_rss += vmas[i].rss;
    s.vma_pss += vmas[i].pss;
    s.vma_anonymous += vmas[i].anonymous;
    s.vma_swap += vmas[i].swap;
  }
}

Status BuildResidencyReport(Env* env, const Model& model, const KvCache& kv, const UnitTable& table, bool with_smaps,
                            ResidencyReport* out) {
  *out = ResidencyReport();
  // smaps first: the units' addresses cannot change meanwhile (the caller holds the context).
  std::vector<SmapsVma> vmas;
  if (with_smaps) {
    Status st = ReadSmaps(env, &vmas);
    out->summary.smaps_ok = st.ok();
    if (!st.ok()) out->summary.smaps_error = st.ToString();
  } else {
    out->summary.smaps_error = "not read (asked without smaps)";
  }
  // Layer units first, the base unit (the model's last) after them.
  for (int u = 0; u < model.n_units(); ++u) {
    UnitResidency r;
    MZ_RETURN_IF_ERROR(WeightUnitResidency(model, u, &r));
    out->units.push_back(r);
  }
  for (int l = 0; l < kv.geometry().n_layer; ++l)
    for (int c = 0; c < kv.n_chunks(); ++c) {
      UnitResidency r;
      MZ_RETURN_IF_ERROR(KvChunkResidency(env, kv, table, l, c, &r));
      out->units.push_back(r);
    }
  Summarize(out);
  if (out->summary.smaps_ok) AttributeSmaps(vmas, out);
  return Status::Ok();
}

}  // namespace mz
