// CPU attention over a chunked fp16 KV cache: single-pass online softmax, causal mask, GQA, any
// number of query tokens (prefill and decode). K/V are read in place from the chunk pointers (no
// gather into a contiguous copy). Meant to run inside a ggml custom op: every one of the `nth`
// threads calls attention_chunked(..., ith, nth) and the function splits the work itself; each
// thread writes a disjoint set of output rows, there are no barriers and no shared mutable state.
//
// Files: attention.cpp (dispatch, scalar path, reference), attention_avx2.cpp, attention_neon.cpp,
// attention_impl.h (what they share). The q8 layout read in place is kernels/q8_block.h.
#pragma once
#include <cstdint>

#include "kernels/fp16.h"  // fp16_to_fp32 / fp32_to_fp16, which callers of the kernel use with it

namespace mz {

// One layer's KV cache as chunks. Chunk c holds tokens [c*chunk_tokens, (c+1)*chunk_tokens).
// Layout inside one chunk, both K and V: head-major [n_kv_head][chunk_tokens][head_dim], IEEE fp16
// (uint16_t bits). k_chunks[c] / v_chunks[c] point at the start of chunk c's K / V block. Only
// tokens < n_kv are valid; bytes past n_kv in the last chunk are garbage and never read.
// The view does not own anything; the chunks must stay alive and unmodified during the call.
struct KvLayerView {
  const uint16_t* const* k_chunks;
  const uint16_t* const* v_chunks;
  int n_chunks;
  int chunk_tokens;
  int n_kv_head;
  int head_dim;
  int n_kv;  // valid tokens in the cache (must cover every key any query may see)
  // Optional compressed chunks (nullptr: every chunk is fp16). When q8_chunks[c] is non-null, chunk
  // c is held compressed in memory by the q8 codec and k_chunks[c] / v_chunks[c] are not read:
  // q8_chunks[c] points at the codec's payload (past its 16-byte header; layout in kernels/q8_block.h)
  // with q8_rows[c] encoded token rows, which must cover every key of chunk c any query may see. The
  // kernel dequantizes each tile exactly as the codec decodes (q8_dequantize, then fp16 -> f32), so
  // attending over a q8 chunk gives bit-identical output to decoding it first and attending over
  // the fp16 copy. The payload is trusted (the process wrote it; no validation here).
  const uint8_t* const* q8_chunks = nullptr;
  const int* q8_rows = nullptr;
};

// The f32 value of element (row t, dim d) of one q8 segment (K or V of one kv head) with `rows`
// rows: what decoding the chunk and converting fp16 -> f32 gives. For tests and references.
float q8_element(const uint8_t* segment, int rows, int head_dim, int t, int d);

struct AttnArgs {
  const float* q;  // [n_tokens][n_head][head_dim] f32, contiguous (ggml ne0=head_dim, ne1=n_head, ne2=n_tokens)
  float* out;      // same shape and layout as q; must not alias q
  int n_tokens;
  int n_head;      // multiple of n_kv_head; q head h uses kv head h / (n_head / n_kv_head) (llama.cpp convention)
  int pos0;        // absolute position of query token 0; query i sits at pos0 + i and attends keys [0, pos0 + i]
  float scale;     // usually 1/sqrt(head_dim)
};

// Preconditions (checked with assert in debug builds): n_tokens >= 1, pos0 >= 0,
// pos0 + n_tokens <= n_kv <= n_chunks * chunk_tokens, head_dim % 8 == 0, n_head % n_kv_head == 0.
//
// Computes the rows of `out` owned by thread ith of nth (0 <= ith < nth). Calling it for every ith in
// [0, nth), concurrently or sequentially, computes all of `out`; the partition depends only on the
// shapes and nth, never on timing. Work items are (kv head, head sub-group, query-token block) and
// are dealt to threads in a snake order so causal prefill stays balanced.
// Uses AVX2+FMA+F16C when the kernel is compiled with them (__AVX2__ && __F16C__ && __FMA__), NEON on
// AArch64 (__aarch64__ && __ARM_NEON), else the scalar path (chosen at compile time). Thread-safe;
// keeps a thread_local scratch buffer (allocated on a thread's first call, grown only if head_dim
// grows), so steady-state calls do not allocate.
void attention_chunked(const AttnArgs& a, const KvLayerView& kv, int ith, int nth);

// Always-compiled portable scalar implementation with the same contract (same ith/nth split).
void attention_chunked_scalar(const AttnArgs& a, const KvLayerView& kv, int ith, int nth);

// Naive reference: gathers K/V to f32, full softmax in double. Single-threaded, allocates. Tests only.
void attention_reference(const AttnArgs& a, const KvLayerView& kv);

// True when attention_chunked runs a SIMD path (AVX2 or NEON) in this build.
bool attention_chunked_has_simd();

}  // namespace mz
