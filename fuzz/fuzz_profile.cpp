// Fuzz target: the device-profile JSON (DeviceProfile::Load), served from memory by a FaultEnv
// fake file. Contract checked: any text is rejected with a Status or gives a profile whose derived
// unit times are finite and non-negative, and which saves and loads back.
#include <cmath>
#include <cstdint>
#include <string>

#include "env/fault_env.h"
#include "fuzz_util.h"
#include "policy/device_profile.h"
#include "policy/hybrid_swap.h"
#include "policy/partial_offload.h"
#include "store/kv_codec.h"

namespace {
mz::FaultEnv* g_env = nullptr;
const char* kPath = "/mzfuzz/profile.json";
const char* kSaved = "/mzfuzz/saved.json";

void CheckTimes(const mz::UnitTimes& t, const std::string& what) {
  for (double v : {t.t_d_kv, t.t_r_kv, t.t_r_kvc, t.t_r_w})
    if (!std::isfinite(v) || v < 0)
      mz::fuzz::Fail("unit time not finite/non-negative: " + what + ": t_d_kv " + std::to_string(t.t_d_kv) +
                     " t_r_kv " + std::to_string(t.t_r_kv) + " t_r_kvc " + std::to_string(t.t_r_kvc) + " t_r_w " +
                     std::to_string(t.t_r_w));
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_env = new mz::FaultEnv(mz::Env::Default());
  g_env->HideRealFilesUnder("/mzfuzz/");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  g_env->SetFakeFile(kPath, std::string(reinterpret_cast<const char*>(data), size));
  mz::DeviceProfile p;
  mz::Status st = mz::DeviceProfile::Load(kPath, &p, g_env);
  if (!st.ok()) return 0;
  for (uint64_t b : {uint64_t(0), uint64_t(1), uint64_t(4096), uint64_t(1) << 20, uint64_t(1) << 40}) {
    double r = p.ReadBps(b), m = p.MappedReadBps(b);
    (void)r;
    (void)m;
  }
  (void)p.SaturatingRequest();
  for (const std::string& c : mz::KvCodecNames()) {
    (void)p.DecodeBps(c);
    (void)p.Ratio(c);
    for (int paths = 0; paths < 8; ++paths) {
      mz::RestorePaths rp;
      rp.weights_file_backed = paths & 1;
      rp.kv_mapped = paths & 2;
      rp.kv_in_place = paths & 4;
      CheckTimes(mz::DeriveUnitTimes(p, c, 1 << 20, 32 << 20, rp), c);
    }
  }
  // The policy plans over what the profile derives (as Context::MakePolicyInput does), for a
  // 4-layer model with 4 chunks per layer, everything resident, asked for half of it.
  for (const char* codec : {"q8", "cachegen"}) {
    mz::PolicyInput in;
    in.n_layer = 4;
    in.n_chunks = 4;
    in.layer_bytes.assign(4, uint64_t(3) << 20);
    in.base_bytes = uint64_t(40) << 20;
    in.chunk_bytes = uint64_t(128) << 10;
    in.ratio = p.Ratio(codec);
    mz::RestorePaths rp;
    rp.weights_file_backed = true;
    rp.kv_in_place = std::string(codec) == "q8";
    in.t = mz::DeriveUnitTimes(p, codec, in.chunk_bytes, in.layer_bytes[0], rp);
    in.state = [](const mz::UnitRef&) { return mz::UnitState::kResident; };
    in.bytes = uint64_t(8) << 20;
    (void)mz::PlanHybridSwap(in);
    (void)mz::PlanPartialOffload(in);
  }
  // A profile that loaded saves and loads back.
  g_env->SetFakeFile(std::string(kSaved) + ".tmp", "");
  g_env->SetFakeFile(kSaved, "");
  st = p.Save(kSaved, g_env);
  if (!st.ok()) mz::fuzz::Fail("a loaded profile does not save: " + st.ToString());
  mz::DeviceProfile q;
  st = mz::DeviceProfile::Load(kSaved, &q, g_env);
  if (!st.ok()) mz::fuzz::Fail("a saved profile does not load back: " + st.ToString());
  return 0;
}
