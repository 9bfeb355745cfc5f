// Hybrid swap eviction (paper Algorithm 1) and the eviction orders, as pure planning: the policy
// sees unit sizes, per-unit restoration times and the current states, and returns a Plan (ordered
// placements) that frees at least the requested bytes (estimated). It performs no I/O; the
// UnitTable applies the plan. Deterministic for a given input (random-out takes a seed).
//
// Stages (N_KV = resident KV chunks, N_W = resident weight layers, k = floor(t_r^W / t_d^KV),
// T = N_W_total * k):
//   KVonly  (N_KV > T)            KV chunks to the in-memory compressed stack or raw to storage,
//                                 whichever path's predicted restoration time stays lower (the
//                                 split is then inversely proportional to t_d^KV and t_r^KV);
//   KVandW  (0 < N_KV <= T, N_W)  drop a weight layer (storage path), then compress KV chunks into
//                                 memory until the in-memory path's time catches up (k or k+1 per
//                                 layer: keeps the paths within one unit's time of each other);
//   Wonly   (N_KV = 0, N_W > 0)   drop the remaining weight layers, then the base unit;
//   CompKV  (nothing else left)   move compressed KV from the in-memory stack to storage.
// Order: backward-out takes the rearmost remaining unit of the needed kind (the paper's policy);
// forward-out the frontmost (LRU-like); random-out a seeded random layer order.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "policy/device_profile.h"
#include "policy/unit_plan.h"

namespace mz {

enum class EvictOrder { kBackwardOut, kForwardOut, kRandomOut };
const char* EvictOrderName(EvictOrder o);

enum class Stage { kKvOnly, kKvAndW, kWOnly, kCompKv, kNone };
const char* StageName(Stage s);

struct PolicyInput {
  int n_layer = 0;
  int n_chunks = 0;                   // KV chunks per layer
  std::vector<uint64_t> layer_bytes;  // weight bytes per layer [n_layer]
  uint64_t base_bytes = 0;
  uint64_t chunk_bytes = 0;           // raw KV chunk
  double ratio = 0.5;                 // compressed / raw for the codec
  UnitTimes t;
  std::function<UnitState(const UnitRef&)> state;  // current state of every unit
  uint64_t bytes = 0;                 // RAM to release
  EvictOrder order = EvictOrder::kBackwardOut;
  uint64_t seed = 1;                  // random-out
  bool parallel_paths = true;         // false: a single path (storage only) for the Fig. 12 ablation
  // Plan KV chunks only: weight units are left where they are (a pool's conversation, whose weights
  // are shared with other conversations and evicted by the pool alone). Resident weights then
  // count as not there for the stages, so the plan is KVonly, then CompKV.
  bool kv_only = false;
};

struct PlanStep {
  Placement placement;
  Stage stage;
  uint64_t est_freed;          // RAM this step releases (estimate)
  double mem_path_s, sto_path_s;  // predicted restoration time of each path after the step
};

struct PolicyOutput {
  Plan plan;
  std::vector<PlanStep> steps;
  uint64_t est_freed = 0;
  double mem_path_s = 0, sto_path_s = 0;  // predicted restoration times after the plan
};

PolicyOutput PlanHybridSwap(const PolicyInput& in);

}  // namespace mz
