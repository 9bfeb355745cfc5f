// Which failure a model configuration meets on a phone tier (issue 49, the field notes "The wall an
// 8B model hits on a mid-tier Android phone"): killed at load, killed when an app comes back,
// thrashing at flash speed, or none. Pure: (planned file, device tier, configuration) -> verdict.
//
// The model, from the notes. An Android phone's RAM holds the OS (2.60 of 8 GB), apps kept warm in
// the background (1.20: lmkd kills them before a foreground app), the app runtime (0.50) and this
// app's unevictable memory: compute scratch, the KV cache (allocated and first-touched whole at
// context creation) and, when llama.cpp repacks weights (use_extra_bufts, the default; --no-repack
// turns it off), every weight tensor the CPU backend has a repacked kernel for, copied into
// anonymous memory. The weights left in the file mapping are clean and evictable: the kernel gives
// them up instead of killing anyone, and reads them back from flash when a token needs them.
//   killed at load:   OS + app unevictable > RAM: even with every background app killed.
//   killed on return: OS + background apps + app unevictable > RAM: it loads on a quiet phone; when
//                     a background app comes back, the largest anonymous set on the device is the
//                     app's, and lmkd kills it.
//   thrash:           the weights a token reads from the file mapping exceed the page cache left
//                     (RAM - OS - background - app unevictable): each token re-reads at least the
//                     difference from flash.
//   fits:             none of these.
// TierConfig::give_back plans the third way instead (see there).
// Thread-safety: pure functions.
#pragma once
#include <cstdint>
#include <string>

#include "model/synth.h"

namespace mz {

// The CPU whose repack table applies (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type, at
// the pinned commit).
enum class RepackIsa {
  kArmDotprod,  // NEON + dotprod, no i8mm (the notes' Snapdragon 695): q4_0, q8_0, iq4_nl, mxfp4 (rows % 4),
                // q4_K, q5_K, q6_K (rows % 8). Not q2_K (AVX-512 only), not q3_K (no entry).
  kX86Avx2,     // AVX2: q4_0, q4_K, iq4_nl, mxfp4 (rows % 8).
};
// Whether llama.cpp copies a matrix of ggml type `type` (ggml_type_name) with `rows` rows into its
// repacked (anonymous) layout on isa.
bool RepackedByLlamaCpp(const std::string& type, int64_t rows, RepackIsa isa);

struct PhoneTier {
  double ram = 8e9;         // bytes the kernel has (MemTotal; an "8 GB" phone's is about 8e9)
  double os = 2.60e9;       // held by Android and the kernel
  double background = 1.20e9;  // apps kept warm (reclaimable by killing them, and they come back)
  double runtime = 0.50e9;  // the app's own runtime (ART heap, UI)
  double flash_Bps = 800e6; // storage read speed (the notes' UFS 2.2)
  // The notes' shares, scaled to ram: OS 32.5%, background 15%, runtime 0.50 GB.
  static PhoneTier FromRam(double ram_bytes, double flash_Bps);
};

struct TierConfig {
  bool repack = true;          // llama.cpp's default; false: --no-repack (use_extra_bufts = false)
  RepackIsa isa = RepackIsa::kArmDotprod;
  uint64_t kv_bytes = 0;       // the KV cache at the context planned (whole, at creation)
  uint64_t scratch_bytes = 0;  // compute buffers
  bool tied = false;           // token_embd is also the output head (llama.cpp then keeps a second, repacked copy)
  // The third way (issue 49 (b), docs/residency.md "Repacked weights"; mzcache's
  // MZ_WEIGHTS_REPACKED holds layers this way): weights repacked while memory allows and given back one layer at a time under
  // pressure, each to its file form. With repack, the app is then killed only when its memory
  // without the weights does not fit; with the background apps back it keeps the front layers
  // repacked that fit, and thrashes only when all the weights a token reads exceed the memory left
  // for weights, whatever their form.
  bool give_back = false;
  double repack_Bps = 0;       // repack throughput for re-making a layer (0: not known)
};

enum class TierFailure { kFits, kThrash, kKilledOnReturn, kKilledAtLoad };
const char* TierFailureName(TierFailure f);  // "fits", "thrash", "killed on return", "killed at load"

struct TierVerdict {
  TierFailure failure = TierFailure::kFits;
  double weights_anon = 0;     // weight bytes copied into anonymous memory (repacked)
  double weights_file = 0;     // weight bytes left in the file mapping
  double streamed_file = 0;    // of those, read in full by every token (all but an untied token_embd)
  double app_unevictable = 0;  // runtime + scratch + KV + weights_anon
  double quiet_demand = 0;     // os + app_unevictable
  double busy_demand = 0;      // quiet_demand + background
  double page_cache = 0;       // ram - busy_demand (may be < 0)
  double reread_per_token = 0; // streamed_file - page_cache when > 0: bytes from flash per token, at least
  // give_back only: layers (0..n_layer-1) kept repacked with the background apps back and on a quiet
  // phone, and the seconds to re-make one average layer (read at flash speed + repack; 0 if unknown).
  int n_layer = 0, repacked_layers_busy = 0, repacked_layers_quiet = 0;
  double remake_layer_s = 0;
  std::string why;             // one line with the numbers that decide it
};

TierVerdict ClassifyOnTier(const ModelFilePlan& plan, const PhoneTier& tier, const TierConfig& cfg);

}  // namespace mz
