// Memory plan: the peak memory a run will need, estimated before it starts, set against what the
// process may use (issue 24 §2 "Fail at start, not later"; field notes "The memory budget").
//
// Peak resident set of a run that fills n_ctx tokens with every unit resident (nothing evicted):
//   weights       every weight unit's region (tensor bytes + page-alignment slack). File-backed
//                 (page-cache mappings: the kernel can reclaim them, a run that does not fit
//                 thrashes) or anonymous (nothing to reclaim without swap: a run that does not fit
//                 is killed).
//   kv            the KV cache at n_ctx tokens, in whole chunks as the KvCache allocates them
//                 (ceil(n_ctx / chunk_tokens) chunks per layer). f16: 2*n_layer*n_kv_head*head_dim*2
//                 bytes per token; q8_0 (kernels/q8_block.h: one fp16 amax + head_dim int8 codes per
//                 row): 2*n_layer*n_kv_head*(2+head_dim) bytes per token.
//   compute       the forward pass's buffers for one ubatch of min(n_ubatch, n_ctx) tokens: ggml's
//                 graph allocation (the largest per-layer graph: gate, up and their SwiGLU product
//                 [n_ff, n] f32 live together, plus the residual and norm [n_embd, n]), the matmul
//                 work buffer (the activations converted for the weight type), the residual stream
//                 and one row of logits (and the head graph's [n_vocab] output).
//   swap_stack    0: the in-memory swap stack only ever holds KV that left RAM, compressed (ratio
//                 < 1), so it lowers the resident set below this all-resident peak, never above.
//   overhead      the process before the model (its resident set when the plan is made: the
//                 program, libraries, heap) + the tokenizer (llama.cpp's vocabulary, per token) +
//                 the model's metadata; or, once the model is loaded (at context creation), the
//                 process's resident set minus its resident weights.
// The limits the peak is set against (each 0 when unknown): the memory cgroup limit (v2
// memory.max, v1 memory.limit_in_bytes), what the system can give (MemAvailable + the process's own
// anonymous resident set: the file pages it maps are already counted in MemAvailable) and a budget
// the caller sets. The peak fits when it is at most the smallest of the known limits.
//
// All reads of the machine go through Env::ReadSmallFile (/proc/meminfo, /proc/self/status,
// /proc/self/cgroup, /sys/fs/cgroup/...), so a FaultEnv fakes them in tests. Stateless; every
// function is thread-safe. The figures were calibrated on this engine's CPU backend (docs/plan.md
// has the measured check: within 5% of the measured peak RSS).
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"
#include "env/env.h"
#include "model/hparams.h"
#include "store/q8_kv.h"

namespace mz {

class Model;

// KvType, KvTypeName and ParseKvType: store/q8_kv.h (one definition: the context's resident KV type).

// What the estimate needs of a model: its shape and its weights.
struct PlanShape {
  HParams hp;
  uint64_t weight_bytes = 0;   // resident bytes of all weight units (region bytes)
  uint64_t weight_params = 0;  // tensor elements (tied embeddings once): for the bits per weight
  int weight_type = 0;         // ggml type of most matrix bytes (the matmul work buffer's input type)
  bool weights_file_backed = true;
};
// The shape of a loaded (or parsed, ModelOptions::load_weights = false) model; file_backed as
// the model holds its weights.
PlanShape ShapeOfModel(const Model& m);

struct PlanRequest {
  int n_ctx = 8192;
  int chunk_tokens = 256;
  int n_ubatch = 512;
  KvType kv_type = KvType::kF16;
  // Resident set of the process that is not the model's: when the model is not loaded yet, the
  // process's VmRSS now (ReadSelfMemory) + EstimateModelOverhead; once it is, VmRSS minus the
  // resident weights.
  uint64_t overhead = 0;
};

struct MemoryEstimate {
  uint64_t weights = 0;
  bool weights_file_backed = true;
  uint64_t kv = 0;
  uint64_t compute = 0;
  uint64_t swap_stack = 0;
  uint64_t overhead = 0;
  uint64_t peak() const { return weights + kv + compute + swap_stack + overhead; }
};

// KV bytes one token costs over all layers (before chunk rounding).
uint64_t KvBytesPerToken(const HParams& hp, KvType t);
// KV bytes of n_ctx tokens allocated in whole chunks of chunk_tokens.
uint64_t KvBytes(const HParams& hp, KvType t, int n_ctx, int chunk_tokens);
// Compute buffers of one ubatch of n tokens (see the header comment).
uint64_t ComputeBytes(const PlanShape& s, int n);
// Tokenizer and model metadata held once the model is loaded (per vocabulary token, calibrated).
uint64_t EstimateModelOverhead(const PlanShape& s);
MemoryEstimate EstimatePeak(const PlanShape& s, const PlanRequest& r);

// A process's memory now (/proc/<pid>/status): VmRSS, RssAnon (anonymous), RssFile (file-backed:
// page-cache pages it maps, e.g. weights mapped from the model file), VmHWM. Fields the kernel
// does not report stay 0.
struct SelfMemory {
  uint64_t rss = 0, rss_anon = 0, rss_file = 0, hwm = 0;
};
// This process's. False if unreadable (*out untouched).
bool ReadSelfMemory(Env* env, SelfMemory* out);
// Process pid's (0: this process), through env. False if unreadable (the process has exited, or
// no VmRSS line: a kernel thread or a zombie); *out untouched then.
bool ReadProcessMemory(Env* env, int pid, SelfMemory* out);

struct MemoryLimits {
  uint64_t cgroup_limit = 0;   // the process's memory cgroup limit (0: none or unreadable)
  std::string cgroup_path;     // the file it came from
  uint64_t mem_available = 0;  // /proc/meminfo MemAvailable (0: unreadable)
  uint64_t mem_total = 0;      // /proc/meminfo MemTotal
  uint64_t self_anon = 0;      // RssAnon of this process
  uint64_t budget = 0;         // the caller's budget (0: none)
  // What the process may use in all: MemAvailable + self_anon when known.
  uint64_t system_cap() const { return mem_available ? mem_available + self_anon : 0; }
  // The smallest known limit (0: nothing known: everything fits).
  uint64_t effective() const;
  // Which one that is: "cgroup limit", "MemAvailable", "memory budget" ("" if none).
  const char* binding() const;
};
// Reads the limits through env. Never fails: what cannot be read is 0.
MemoryLimits ReadMemoryLimits(Env* env, uint64_t budget);

// The largest context (a multiple of chunk_tokens, at most max_ctx) whose peak is at most
// (1 - margin) * limit; 0 if not even one chunk fits.
int LargestContext(const PlanShape& s, PlanRequest r, uint64_t limit, double margin, int max_ctx);

// The refusal: kNoMemory when e.peak() exceeds the effective limit, with a message naming the
// peak and its parts, the limit, and what would fit: the largest context at this memory, the same
// with q8_0 KV (when r is f16), and a smaller quant (q4_0 weights, estimated from the bits per
// weight) when even the smallest context does not fit. Ok when it fits or no limit is known.
Status CheckFits(const PlanShape& s, const PlanRequest& r, const MemoryLimits& lim);

}  // namespace mz
