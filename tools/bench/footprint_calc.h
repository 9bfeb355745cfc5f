// KV bytes of model shapes computed from their hyper-parameters alone (no file needed), for
// `bench footprint` and `plan --recommend`. Weight bytes are not computed here: they come from the
// library's planner, PlanModelFile (src/model/synth.h), which holds the one copy of the recipes.
// tests/test_bench_tools.cpp checks both against synthesized files and contexts.
#pragma once
#include <cstdint>

#include "model/synth.h"

namespace mz::cli {

// fp16 K + V bytes of `tokens` tokens over all layers: 2 x n_layer x n_kv_head x head_dim x 2 x tokens.
inline uint64_t KvBytesFor(const ModelSpec& s, uint64_t tokens) {
  return 2ull * uint64_t(s.n_layer) * uint64_t(s.n_head_kv) * uint64_t(s.head_dim) * 2ull * tokens;
}

}  // namespace mz::cli
