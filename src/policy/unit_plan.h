// The vocabulary shared by the eviction policies and the unit table: which unit (UnitRef), in which
// state (UnitState), and a plan of placements (Plan). Policies (src/policy) produce Plans from unit
// sizes, times and states; the unit table (memory/unit_table.h) applies them and is the only code
// that changes a unit's state. Plain types with no dependencies, so a policy never needs the memory
// layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mz {

// The states of a unit (memory/unit_table.h describes each and the valid transitions).
enum class UnitState : uint8_t {
  kResident = 0,
  kKvMemCompressed = 1,
  kKvStorageRaw = 2,
  kKvStorageCompressed = 3,
  kWeightsDropped = 4,
  // A KV chunk borrowed from a pool's store of shared chunks (memory/shared_chunks.h) and not
  // installed in this context: its bytes are the store's (held once for every borrower, in
  // whichever tier the store keeps them). Restoring it attaches it. Never a policy's target.
  kKvShared = 5,
};
constexpr int kNumUnitStates = 6;
const char* UnitStateName(UnitState s);

// A unit: weight unit `layer` (-1: the base unit: embeddings + output head) or KV chunk
// (layer, chunk).
struct UnitRef {
  enum Kind : uint8_t { kWeights = 0, kKv = 1 };
  Kind kind = kWeights;
  int layer = 0;  // weights: -1 = base unit
  int chunk = 0;  // KV only
  static UnitRef Weights(int layer) { return {kWeights, layer, 0}; }
  static UnitRef Kv(int layer, int chunk) { return {kKv, layer, chunk}; }
  bool operator==(const UnitRef& o) const { return kind == o.kind && layer == o.layer && chunk == o.chunk; }
};
// "weights[3]", "weights[base]", "kv[2,5]".
std::string UnitName(const UnitRef& u);

// Move `unit` to state `target`; a Plan is applied in order (UnitTable::Apply).
struct Placement {
  UnitRef unit;
  UnitState target = UnitState::kResident;
};
using Plan = std::vector<Placement>;

}  // namespace mz
