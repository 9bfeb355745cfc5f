#include "policy/hybrid_swap.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace mz {

const char* EvictOrderName(EvictOrder o) {
  switch (o) {
    case EvictOrder::kBackwardOut: return "backward-out";
    case EvictOrder::kForwardOut: return "forward-out";
    case EvictOrder::kRandomOut: return "random-out";
  }
  return "?";
}

const char* StageName(Stage s) {
  switch (s) {
    case Stage::kKvOnly: return "KVonly";
    case Stage::kKvAndW: return "KVandW";
    case Stage::kWOnly: return "Wonly";
    case Stage::kCompKv: return "CompKV";
    case Stage::kNone: return "none";
  }
  return "?";
}

PolicyOutput PlanHybridSwap(const PolicyInput& in) {
  PolicyOutput out;
  const int L = in.n_layer, C = in.n_chunks;
  // Layer visiting order for eviction.
  std::vector<int> layers(size_t(std::max(0, L)));
  std::iota(layers.begin(), layers.end(), 0);
  if (in.order == EvictOrder::kBackwardOut) std::reverse(layers.begin(), layers.end());
  if (in.order == EvictOrder::kRandomOut) {
    std::mt19937_64 rng(in.seed);
    std::shuffle(layers.begin(), layers.end(), rng);
  }
  // Simulated state.
  std::vector<std::vector<UnitState>> kv(static_cast<size_t>(L), std::vector<UnitState>(static_cast<size_t>(C)));
  std::vector<bool> w(static_cast<size_t>(L));
  bool base = !in.kv_only && in.state(UnitRef::Weights(-1)) == UnitState::kResident;
  int n_kv = 0, n_w = 0;
  double mem_s = 0, sto_s = 0;
  for (int l = 0; l < L; ++l) {
    const bool resident = in.state(UnitRef::Weights(l)) == UnitState::kResident;
    w[size_t(l)] = resident && !in.kv_only;
    if (w[size_t(l)]) ++n_w;
    else if (!resident) sto_s += in.t.t_r_w;
    for (int c = 0; c < C; ++c) {
      UnitState s = in.state(UnitRef::Kv(l, c));
      kv[size_t(l)][size_t(c)] = s;
      if (s == UnitState::kResident) ++n_kv;
      else if (s == UnitState::kKvMemCompressed) mem_s += in.t.t_d_kv;
      else if (s == UnitState::kKvStorageRaw) sto_s += in.t.t_r_kv;
      else if (s != UnitState::kKvShared) sto_s += in.t.t_r_kvc;  // a borrowed chunk is the store's
    }
  }
  if (!base && !in.kv_only) sto_s += in.t.t_r_w * double(in.base_bytes) / double(std::max<uint64_t>(1, in.layer_bytes.empty() ? 1 : in.layer_bytes[0]));
  // k = floor(t_r^W / t_d^KV). Only T = L * k against n_kv (<= L * C) matters, so k is capped at
  // C + 1 before the conversion to int: with an extreme (but accepted) device profile the quotient
  // exceeded INT_MAX, an undefined conversion (found by fuzz/fuzz_profile.cpp). NaN counts as 0.
  const double kq = in.t.t_d_kv > 0 ? std::floor(in.t.t_r_w / in.t.t_d_kv) : 0.0;
  const int k = kq >= double(C) + 1 ? C + 1 : kq > 0 ? int(kq) : 0;
  const int T = in.parallel_paths ? L * k : 0;
  // Compressed size of a chunk, at most the raw size (a ratio above 1 would make the freed estimate
  // chunk_bytes - comp wrap around); computed in double and clamped before the conversion.
  const uint64_t comp = uint64_t(std::min(double(in.chunk_bytes), std::max(0.0, double(in.chunk_bytes) * in.ratio)));

  // Within the layer order, chunks rear-first (backward) or front-first.
  auto next_kv = [&](UnitState from, int* ol, int* oc) {
    for (int l : layers) {
      for (int i = 0; i < C; ++i) {
        const int c = in.order == EvictOrder::kForwardOut ? i : C - 1 - i;
        if (kv[size_t(l)][size_t(c)] == from) {
          *ol = l, *oc = c;
          return true;
        }
      }
    }
    return false;
  };
  auto next_w = [&](int* ol) {
    for (int l : layers)
      if (w[size_t(l)]) {
        *ol = l;
        return true;
      }
    return false;
  };
  auto emit = [&](const UnitRef& u, UnitState to, Stage st, uint64_t freed) {
    out.plan.push_back({u, to});
    out.steps.push_back({{u, to}, st, freed, mem_s, sto_s});
    out.est_freed += freed;
  };
  auto kv_to = [&](int l, int c, UnitState to, Stage st) {
    kv[size_t(l)][size_t(c)] = to;
    --n_kv;
    if (to == UnitState::kKvMemCompressed) {
      mem_s += in.t.t_d_kv;
      emit(UnitRef::Kv(l, c), to, st, in.chunk_bytes - comp);
    } else {
      sto_s += in.t.t_r_kv;
      emit(UnitRef::Kv(l, c), to, st, in.chunk_bytes);
    }
  };

  while (out.est_freed < in.bytes) {
    int l = 0, c = 0;
    if (n_kv > T && next_kv(UnitState::kResident, &l, &c)) {
      // KVonly: the path whose predicted time stays lower takes the chunk.
      const bool to_mem = in.parallel_paths && mem_s + in.t.t_d_kv <= sto_s + in.t.t_r_kv;
      kv_to(l, c, to_mem ? UnitState::kKvMemCompressed : UnitState::kKvStorageRaw, Stage::kKvOnly);
    } else if (n_kv > 0 && n_w > 0 && next_w(&l)) {
      // KVandW: one weight layer to storage, then KV into memory until the memory path catches up.
      w[size_t(l)] = false;
      --n_w;
      sto_s += in.t.t_r_w;
      emit(UnitRef::Weights(l), UnitState::kWeightsDropped, Stage::kKvAndW, in.layer_bytes[size_t(l)]);
      while (n_kv > 0 && mem_s + in.t.t_d_kv <= sto_s + 0.5 * in.t.t_d_kv && next_kv(UnitState::kResident, &l, &c))
        kv_to(l, c, UnitState::kKvMemCompressed, Stage::kKvAndW);
    } else if (n_kv > 0 && next_kv(UnitState::kResident, &l, &c)) {
      // Weights already gone (or no weights): KV goes where it restores fastest.
      const bool to_mem = in.parallel_paths && mem_s + in.t.t_d_kv <= sto_s + in.t.t_r_kv;
      kv_to(l, c, to_mem ? UnitState::kKvMemCompressed : UnitState::kKvStorageRaw, Stage::kKvOnly);
    } else if (n_w > 0 && next_w(&l)) {
      w[size_t(l)] = false;
      --n_w;
      sto_s += in.t.t_r_w;
      emit(UnitRef::Weights(l), UnitState::kWeightsDropped, Stage::kWOnly, in.layer_bytes[size_t(l)]);
    } else if (next_kv(UnitState::kKvMemCompressed, &l, &c)) {
      kv[size_t(l)][size_t(c)] = UnitState::kKvStorageCompressed;
      mem_s -= in.t.t_d_kv;
      sto_s += in.t.t_r_kvc;
      emit(UnitRef::Kv(l, c), UnitState::kKvStorageCompressed, Stage::kCompKv, comp);
    } else if (base) {
      // The base unit (embeddings, output head) goes last: the first and last thing compute needs,
      // and outside "remaining in memory" as the paper counts it.
      base = false;
      emit(UnitRef::Weights(-1), UnitState::kWeightsDropped, Stage::kCompKv, in.base_bytes);
    } else {
      break;  // everything is already out of RAM
    }
  }
  out.mem_path_s = mem_s;
  out.sto_path_s = sto_s;
  return out;
}

}  // namespace mz
