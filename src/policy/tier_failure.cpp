#include "policy/tier_failure.h"

#include <cstdio>

namespace mz {

bool RepackedByLlamaCpp(const std::string& t, int64_t rows, RepackIsa isa) {
  if (isa == RepackIsa::kArmDotprod) {
    if (t == "q4_0" || t == "q8_0" || t == "iq4_nl" || t == "mxfp4") return rows % 4 == 0;
    if (t == "q4_K" || t == "q5_K" || t == "q6_K") return rows % 8 == 0;
    return false;
  }
  if (t == "q4_0" || t == "q4_K" || t == "iq4_nl" || t == "mxfp4") return rows % 8 == 0;
  return false;
}

PhoneTier PhoneTier::FromRam(double ram, double flash_Bps) {
  PhoneTier t;
  t.ram = ram;
  t.os = 0.325 * ram;
  t.background = 0.15 * ram;
  t.runtime = 0.50e9;
  t.flash_Bps = flash_Bps;
  return t;
}

const char* TierFailureName(TierFailure f) {
  switch (f) {
    case TierFailure::kFits: return "fits";
    case TierFailure::kThrash: return "thrash";
    case TierFailure::kKilledOnReturn: return "killed on return";
    case TierFailure::kKilledAtLoad: return "killed at load";
  }
  return "?";
}

TierVerdict ClassifyOnTier(const ModelFilePlan& plan, const PhoneTier& tier, const TierConfig& cfg) {
  TierVerdict v;
  for (const PlannedTensor& t : plan.tensors) {
    if (t.ne1 <= 1) {  // norms and rope factors: tiny, stay in the file mapping
      v.weights_file += double(t.bytes);
      v.streamed_file += double(t.bytes);
      continue;
    }
    const bool embd = t.name == "token_embd.weight";
    // token_embd is read by GET_ROWS, which no repacked kernel serves: it stays file-backed. A tied
    // one is also the output head: llama.cpp loads it a second time for the head's matmul
    // (TENSOR_DUPLICATED), into the repacked buffer when the type has a kernel.
    const bool head_copy = embd && cfg.tied;
    const bool repacked = cfg.repack && RepackedByLlamaCpp(t.type, t.ne1, cfg.isa);
    if (!embd && repacked) {
      v.weights_anon += double(t.bytes);
      continue;
    }
    v.weights_file += double(t.bytes);
    if (!embd) v.streamed_file += double(t.bytes);
    if (head_copy) {
      if (repacked) v.weights_anon += double(t.bytes);
      else v.streamed_file += double(t.bytes);
    }
  }
  v.app_unevictable = tier.runtime + double(cfg.scratch_bytes) + double(cfg.kv_bytes) + v.weights_anon;
  v.quiet_demand = tier.os + v.app_unevictable;
  v.busy_demand = v.quiet_demand + tier.background;
  v.page_cache = tier.ram - v.busy_demand;
  const double G = 1e9;
  char buf[320];
  if (v.quiet_demand > tier.ram) {
    v.failure = TierFailure::kKilledAtLoad;
    std::snprintf(buf, sizeof buf,
                  "unevictable %.2f GB (OS %.2f + app %.2f, of it %.2f repacked weights, %.2f KV) > %.2f GB RAM with "
                  "every background app killed",
                  v.quiet_demand / G, tier.os / G, v.app_unevictable / G, v.weights_anon / G, cfg.kv_bytes / G,
                  tier.ram / G);
  } else if (v.busy_demand > tier.ram) {
    v.failure = TierFailure::kKilledOnReturn;
    std::snprintf(buf, sizeof buf,
                  "loads on a quiet phone (%.2f of %.2f GB unevictable) but not with the %.2f GB of background apps "
                  "back (%.2f GB): lmkd kills the largest anonymous set, the app's %.2f GB",
                  v.quiet_demand / G, tier.ram / G, tier.background / G, v.busy_demand / G, v.app_unevictable / G);
  } else if (v.streamed_file > v.page_cache) {
    v.failure = TierFailure::kThrash;
    v.reread_per_token = v.streamed_file - v.page_cache;
    std::snprintf(buf, sizeof buf,
                  "%.2f GB of file-backed weights read per token, %.2f GB of page cache left: at least %.2f GB from "
                  "flash per token (%.1f s at %.0f MB/s)",
                  v.streamed_file / G, v.page_cache / G, v.reread_per_token / G, v.reread_per_token / tier.flash_Bps,
                  tier.flash_Bps / 1e6);
  } else {
    v.failure = TierFailure::kFits;
    std::snprintf(buf, sizeof buf, "%.2f GB unevictable with background apps, %.2f GB file-backed in %.2f GB of page cache",
                  v.busy_demand / G, v.streamed_file / G, v.page_cache / G);
  }
  v.why = buf;
  return v;
}

}  // namespace mz
