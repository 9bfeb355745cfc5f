#include "policy/tier_failure.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

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

namespace {

// The layer of a tensor name "blk.N...." (-1 for the others).
int LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::atoi(name.c_str() + 4);
}

// The third way (TierConfig::give_back).
TierVerdict ClassifyGiveBack(const ModelFilePlan& plan, const PhoneTier& tier, const TierConfig& cfg) {
  TierVerdict v;
  std::vector<double> layer_anon;  // repackable bytes per layer
  for (const PlannedTensor& t : plan.tensors) {
    const bool embd = t.name == "token_embd.weight";
    if (!embd || cfg.tied) v.streamed_file += double(t.bytes);  // every token reads it, in some form
    v.weights_file += double(t.bytes);
    if (t.ne1 <= 1 || (embd && !cfg.tied) || !RepackedByLlamaCpp(t.type, t.ne1, cfg.isa)) continue;
    const int l = LayerOf(t.name);
    if (l < 0) continue;  // the output head stays in its file form in this plan (part of `rest` below)
    if (int(layer_anon.size()) <= l) layer_anon.resize(size_t(l) + 1, 0.0);
    layer_anon[size_t(l)] += double(t.bytes);
  }
  v.n_layer = int(layer_anon.size());
  const double base = tier.runtime + double(cfg.scratch_bytes) + double(cfg.kv_bytes);
  // Front layers first, as far as `room` goes: the repacked set, in bytes, and its layer count.
  auto keep = [&](double room, int* layers) {
    double used = 0;
    *layers = 0;
    for (double b : layer_anon) {
      if (used + b > room) break;
      used += b;
      ++*layers;
    }
    return used;
  };
  const double room_quiet = tier.ram - tier.os - base, room_busy = room_quiet - tier.background;
  double total_layers = 0;
  for (double b : layer_anon) total_layers += b;
  if (v.n_layer > 0 && cfg.repack_Bps > 0)
    v.remake_layer_s = total_layers / v.n_layer / tier.flash_Bps + total_layers / v.n_layer / cfg.repack_Bps;
  // Repacked layers take the place of their file form, so what a token reads stays streamed_file;
  // the rest of it (the head, norms, matrices with no repacked kernel) keeps its room first.
  const double rest = v.streamed_file - total_layers;
  const double anon_busy = keep(std::max(0.0, room_busy - rest), &v.repacked_layers_busy);
  keep(std::max(0.0, room_quiet - rest), &v.repacked_layers_quiet);
  v.weights_anon = anon_busy;
  v.weights_file -= anon_busy;
  v.app_unevictable = base + anon_busy;
  v.quiet_demand = tier.os + base;
  v.busy_demand = v.quiet_demand + tier.background;
  v.page_cache = tier.ram - v.busy_demand;  // for the weights, in either form
  const double G = 1e9;
  char buf[320];
  if (v.quiet_demand > tier.ram) {
    v.failure = TierFailure::kKilledAtLoad;
    std::snprintf(buf, sizeof buf, "without any weights the app needs %.2f GB with the OS: more than %.2f GB RAM",
                  v.quiet_demand / G, tier.ram / G);
  } else if (v.busy_demand > tier.ram) {
    v.failure = TierFailure::kKilledOnReturn;
    std::snprintf(buf, sizeof buf, "without any weights the app needs %.2f GB with the background apps back: more than %.2f GB",
                  v.busy_demand / G, tier.ram / G);
  } else if (v.streamed_file > v.page_cache) {
    v.failure = TierFailure::kThrash;
    v.reread_per_token = v.streamed_file - v.page_cache;
    std::snprintf(buf, sizeof buf,
                  "%.2f GB of weights per token in %.2f GB: at least %.2f GB from flash per token; %d of %d layers "
                  "repacked with the background apps back, %d on a quiet phone",
                  v.streamed_file / G, v.page_cache / G, v.reread_per_token / G, v.repacked_layers_busy, v.n_layer,
                  v.repacked_layers_quiet);
  } else {
    v.failure = TierFailure::kFits;
    std::snprintf(buf, sizeof buf, "%d of %d layers repacked with the background apps back, %d on a quiet phone",
                  v.repacked_layers_busy, v.n_layer, v.repacked_layers_quiet);
  }
  v.why = buf;
  return v;
}

}  // namespace

TierVerdict ClassifyOnTier(const ModelFilePlan& plan, const PhoneTier& tier, const TierConfig& cfg) {
  if (cfg.give_back && cfg.repack) return ClassifyGiveBack(plan, tier, cfg);
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
