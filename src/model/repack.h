// Repack: ggml's repacked CPU weight layout (the CPU device's extra buffer type "CPU_REPACK", what
// llama.cpp's default loader copies weights into), used per weight unit by Model (the third way of
// issue 49: docs/residency.md "Repacked weights").
//
// ggml decides per tensor whether this CPU has a repacked kernel for it (on AVX2: Q4_0, Q4_K,
// IQ4_NL, MXFP4 -> 8x8 interleaved; on NEON + dotprod also Q5_K, Q6_K, Q8_0; rows a multiple of 4
// or 8). A repacked tensor has the same byte size as the file's, its blocks interleaved; matmuls
// on it run the repacked kernel when the tensor's buffer is of the CPU_REPACK type and its `extra`
// holds the kernel traits (ggml-cpu dispatches on exactly those two fields).
//
// How mzcache uses it: the bytes live in memory mzcache maps itself (Env::MapAnon, so that
// dropping a unit returns them to the OS through Env::Unmap, not to malloc), and each repacked
// tensor's `buffer` is RepackTagBuffer(): a 64-byte CPU_REPACK buffer shared by every tensor of the
// process, which carries the buffer type and the set_tensor (repack) function but not the bytes.
// Nothing in ggml's CPU path checks that a tensor's data lies inside its buffer for these tensors
// (the graph allocator skips tensors that have data; set_tensor writes to tensor->data).
//
// Thread-safety: all functions are thread-safe (the tag buffer is made once and never changes).
#pragma once
#include <cstdint>

struct ggml_tensor;
struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace mz {

// The CPU device's CPU_REPACK buffer type, or nullptr where this ggml has none.
ggml_backend_buffer_type* RepackBufferType();
// The shared tag buffer described above (nullptr where there is no CPU_REPACK type or ggml could
// not allocate 64 bytes). Owned by the process; never freed.
ggml_backend_buffer* RepackTagBuffer();
// True if this CPU has a repacked kernel for t (its type and shape): a matrix used only by
// GGML_OP_MUL_MAT. Leaves t unchanged.
bool CanRepack(ggml_tensor* t);
// Points t at `data` (ggml_nbytes(t) bytes, 32-byte aligned as ggml's TENSOR_ALIGNMENT, writable) in the repacked layout and
// writes src (ggml_nbytes(t) bytes in the file's layout) there, repacked: the read + repack of
// re-making a layer. CanRepack(t) must be true (ggml aborts otherwise). Single-threaded (ggml
// repacks on the calling thread).
void RepackInto(ggml_tensor* t, void* data, const void* src);
// Undoes RepackInto's binding (data, buffer, extra cleared). The bytes are the caller's.
void UnbindRepacked(ggml_tensor* t);

}  // namespace mz
