// The Partial Offload baseline's eviction (paper §6.1): layer-granular, uncompressed. Whole layers
// (weights and every KV chunk of the layer) go to storage (KV raw, weights dropped) until the
// requested bytes are released. Its restore reloads everything sequentially before prefill, so the
// order does not matter for it; we take layers rear-first.
#pragma once
#include "policy/hybrid_swap.h"

namespace mz {

PolicyOutput PlanPartialOffload(const PolicyInput& in);

}  // namespace mz
