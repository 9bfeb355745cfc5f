#include "policy/unit_plan.h"

namespace mz {

const char* UnitStateName(UnitState s) {
  switch (s) {
    case UnitState::kResident: return "resident";
    case UnitState::kKvMemCompressed: return "kv-mem-compressed";
    case UnitState::kKvStorageRaw: return "kv-storage-raw";
    case UnitState::kKvStorageCompressed: return "kv-storage-compressed";
    case UnitState::kWeightsDropped: return "weights-dropped";
    case UnitState::kKvShared: return "kv-shared";
  }
  return "?";
}

std::string UnitName(const UnitRef& u) {
  if (u.kind == UnitRef::kWeights) return u.layer < 0 ? "weights[base]" : "weights[" + std::to_string(u.layer) + "]";
  return "kv[" + std::to_string(u.layer) + "," + std::to_string(u.chunk) + "]";
}

}  // namespace mz
