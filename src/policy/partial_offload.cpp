#include "policy/partial_offload.h"

namespace mz {

PolicyOutput PlanPartialOffload(const PolicyInput& in) {
  PolicyOutput out;
  auto emit = [&](const UnitRef& u, UnitState to, uint64_t freed) {
    out.plan.push_back({u, to});
    out.steps.push_back({{u, to}, Stage::kNone, freed, 0, 0});
    out.est_freed += freed;
  };
  for (int l = in.n_layer - 1; l >= 0 && out.est_freed < in.bytes; --l) {
    for (int c = in.n_chunks - 1; c >= 0; --c)
      if (in.state(UnitRef::Kv(l, c)) == UnitState::kResident) emit(UnitRef::Kv(l, c), UnitState::kKvStorageRaw, in.chunk_bytes);
    if (in.state(UnitRef::Weights(l)) == UnitState::kResident)
      emit(UnitRef::Weights(l), UnitState::kWeightsDropped, in.layer_bytes[size_t(l)]);
  }
  if (out.est_freed < in.bytes && in.state(UnitRef::Weights(-1)) == UnitState::kResident)
    emit(UnitRef::Weights(-1), UnitState::kWeightsDropped, in.base_bytes);
  return out;
}

}  // namespace mz
