#include "pool/eviction_order.h"

#include <algorithm>
#include <numeric>

namespace mz {

std::vector<EvictStep> PlanEviction(const std::vector<EvictCandidate>& cands, const EvictionMode& mode) {
  // Idle first, then in use; least recently used first within each (stable: ties keep their order).
  std::vector<int> order(cands.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return cands[a].in_use != cands[b].in_use ? cands[b].in_use : cands[a].last_use_ns < cands[b].last_use_ns;
  });
  int in_use = 0;
  for (const EvictCandidate& c : cands) in_use += c.in_use;
  // Several streams mid-turn: a budget pass takes none of them, nor the weights they all read.
  const bool spare_in_use = mode.budget && in_use >= 2;
  std::vector<EvictStep> plan;
  const size_t n = order.size();
  for (size_t i = 0; i < n; ++i) {
    const bool last = i + 1 == n;  // the most recently used conversation (in use, if any is)
    if (mode.idle_only && !mode.whole && last) break;
    const int c = order[i];
    if (mode.whole && cands[c].in_use) continue;  // a call came meanwhile: that model is in use again
    if (spare_in_use && cands[c].in_use) {
      plan.push_back({EvictStep::kStopSparedInUse, -1});
      return plan;
    }
    // An idle conversation goes out whole, its in-memory swap included: the swap is a stack whose
    // segments come back only once it is empty, so moving part of it frees nothing.
    if (mode.whole || !last) {
      plan.push_back({EvictStep::kConversationWhole, c});
      continue;
    }
    // The most recently used one gives only what is still needed, after the shared chunks nobody
    // holds attached; then its own borrowed chunks go, and the shared chunks again.
    if (mode.budget) plan.push_back({EvictStep::kStopIfIdleBusy, -1});
    plan.push_back({EvictStep::kSharedChunks, -1});
    plan.push_back({EvictStep::kConversationPart, c});
    plan.push_back({EvictStep::kDetachShared, c});
    plan.push_back({EvictStep::kSharedChunks, -1});
  }
  // A model nobody uses: its shared chunks go too, once its conversations let them go.
  if (mode.whole) plan.push_back({EvictStep::kSharedChunks, -1});
  if (!mode.idle_only) plan.push_back({EvictStep::kWeights, -1});
  return plan;
}

}  // namespace mz
