// Private helpers shared by the KV codecs (src/store/codec_*.cpp) and their tests. Not a public API.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/q8_block.h"
#include "store/kv_codec.h"

static_assert(std::endian::native == std::endian::little, "KV codec formats assume a little-endian host");

namespace mz::kvc {

// ---- factories (one per codec file) ----
std::unique_ptr<KvCodec> MakeNoneCodec();
std::unique_ptr<KvCodec> MakeLz4Codec();
std::unique_ptr<KvCodec> MakeZstdCodec();
std::unique_ptr<KvCodec> MakeQ8Codec();
std::unique_ptr<KvCodec> MakeQ4Codec();
std::unique_ptr<KvCodec> MakeCacheGenCodec();

// ---- header ----
// InvalidArgument unless 1 <= dims <= 65535, 1 <= n_tokens <= chunk_tokens, raw_bytes() <= 1 GiB.
Status ValidateShape(const ChunkShape& s);

// The shared start of Encode: ValidateShape(s), then cap >= codec.MaxEncodedSize(s) (else
// InvalidArgument "kv codec <name>: output buffer too small"). On Ok, *need = MaxEncodedSize(s).
inline Status CheckEncodeArgs(const KvCodec& codec, const ChunkShape& s, size_t cap, size_t* need) {
  MZ_RETURN_IF_ERROR(ValidateShape(s));
  *need = codec.MaxEncodedSize(s);
  if (cap < *need) return Status::InvalidArgument(std::string("kv codec ") + codec.name() + ": output buffer too small");
  return Status::Ok();
}
// Writes the 16-byte header (see kv_codec.h).
void WriteHeader(uint8_t* dst, uint8_t id, uint8_t param, const ChunkShape& s, uint32_t payload);
// Checks size >= 16, id, version, param (== expect_param), reserved, shape fields, and that
// size == 16 + payload. Returns Corruption naming the offending field; on success *payload is set.
Status CheckHeader(const uint8_t* src, size_t size, uint8_t id, uint8_t expect_param, const ChunkShape& s,
                   size_t* payload);

inline void Store16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v); p[1] = uint8_t(v >> 8); }
inline uint16_t Load16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
inline void Store32(uint8_t* p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = uint8_t(v >> (8 * i)); }
inline uint32_t Load32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// ---- valid-row gather / scatter (row segment j of 2*n_kv_head: n_tokens*head_dim elements) ----
// Copies the valid rows of a raw chunk into a contiguous buffer (2*H*n*D elements).
void GatherValid(const ChunkShape& s, const uint16_t* raw, uint16_t* packed);
// dst holds the packed valid rows at its start (2*H*n*D elements); spreads them in place into the
// raw layout and zero-fills the invalid rows.
void ScatterValidInPlace(const ChunkShape& s, uint16_t* dst);
// Copies packed valid rows (2*H*n*D elements, any alignment) into their rows of the raw layout;
// writes nothing else of dst (the invalid rows are left as they are).
void ScatterValid(const ChunkShape& s, const uint8_t* packed, uint16_t* dst);
// Zero-fills rows n_tokens..chunk_tokens-1 of every head of both blocks.
void ZeroInvalidRows(const ChunkShape& s, uint16_t* dst);
inline size_t ValidElems(const ChunkShape& s) {
  return 2 * size_t(s.n_kv_head) * size_t(s.n_tokens) * size_t(s.head_dim);
}

// ---- zstd with thread-local contexts ----
Status ZstdCompress(const void* in, size_t n, uint8_t* out, size_t cap, int level, size_t* written);
// Corruption unless the frame decompresses to exactly n bytes (out has capacity n).
Status ZstdDecompressExact(const uint8_t* in, size_t size, void* out, size_t n);

// ---- thread-local scratch ----
// A per-thread byte buffer (slot 0 or 1) of at least n bytes, 64-byte aligned. Valid until the same
// thread asks for the same slot again.
uint8_t* Scratch(int slot, size_t n);

// ---- lossy-codec arithmetic (shared so every codec is idempotent for the same reason) ----
//
// Every lossy codec stores its quantization range as exact fp16 data values (q8: the row's max |x|;
// q4 / cachegen: the group's min and max), derives the f32 step from them, and decodes the extreme
// codes to exactly those stored values. Re-encoding decoded data therefore finds the same extremes,
// the same step and (because each decoded value is the fp16 nearest to its grid point, hence no
// farther from it than the original value was) the same codes: Encode(Decode(Encode(x))) == Encode(x).
// All of this assumes the default floating-point environment (round to nearest even), which the
// runtime never changes; FTZ/DAZ do not matter (no f32 intermediate here is subnormal).

// Finite canonical value of an fp16: NaN -> +0, +-inf -> +-65504, -0 -> +0.
inline float SanitizeF16(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u) {
    if (h & 0x3ffu) return 0.0f;
    return (h & 0x8000u) ? -65504.0f : 65504.0f;
  }
  return fp16_to_fp32(h) + 0.0f;  // -0 + +0 = +0
}
// Code of x on the grid base + k*step: clamp(nearbyint((x - base) / step), lo, hi); 0 when step == 0.
inline int QuantizeCode(float x, float base, float step, int lo, int hi) {
  if (step == 0.0f) return std::clamp(0, lo, hi);
  float q = std::nearbyint((x - base) / step);
  if (q > float(hi)) q = float(hi);
  if (q < float(lo)) q = float(lo);
  return int(q);
}
// q8 step of a row whose max |x| is amax (an fp16 value): q8_step (kernels/q8_block.h, where the q8
// layout and arithmetic are defined), amax * fl(1/127). Code +-127 decodes to fp16(+-127 * step) ==
// +-amax exactly (the f32 product is within 3 f32 ulps of amax).
inline float Q8Step(float amax) { return q8_step(amax); }
// Asymmetric step for `levels` intervals over [lo, hi] (fp16 values, lo <= hi).
inline float AsymStep(float lo, float hi, int levels) { return (hi - lo) * (1.0f / float(levels)); }
// Stored (lo, hi) range from a blob: both finite and lo <= hi (else false = corrupt).
inline bool RangeOk(uint16_t lo_bits, uint16_t hi_bits, float* lo, float* hi) {
  if ((lo_bits & 0x7c00u) == 0x7c00u || (hi_bits & 0x7c00u) == 0x7c00u) return false;
  *lo = fp16_to_fp32(lo_bits);
  *hi = fp16_to_fp32(hi_bits);
  return *lo <= *hi;
}
// Asymmetric decode (scalar reference of the DequantNibbles / DequantI8 kernels): code q in
// [0, levels]; the top code decodes to hi exactly, the others to fp16(fma(q, step, lo)) (fma: one f32
// rounding, independent of compiler contraction), code 0 therefore to lo exactly.
inline float AsymDecode(int q, float step, float lo, float hi, int levels) {
  return q == levels ? hi : fp16_to_fp32(fp32_to_fp16(std::fma(float(q), step, lo)));
}

// ---- row conversions (AVX2+F16C when compiled with them, same results either way) ----
// out[i] = SanitizeF16(in[i]).
void LoadSanitized(const uint16_t* in, int n, float* out);
// Column-wise min / max of rows x[0..rows)[0..n) (row stride n; sanitized input, rows >= 1).
void MinMaxRows(const float* x, int rows, int n, float* lo, float* hi);
// q[i] = QuantizeCode(x[i], base[i], step[i], 0, levels) for sanitized x (levels <= 255).
void QuantizeRowAsym(const float* x, int n, const float* base, const float* step, int levels, uint8_t* q);

// out[i] = fp16(AsymDecode(q_i, step[i], lo[i], hi[i], 15)) where q_i is the i-th 4-bit code of
// `packed` (channel 2k in the low nibble of byte k, 2k+1 in the high nibble).
void DequantNibbles(const uint8_t* packed, int n, const float* step, const float* lo, const float* hi,
                    uint16_t* out);
// Same with one (step, lo, hi) for all n channels. REQUIRES: packed starts at an even channel.
void DequantNibblesUniform(const uint8_t* packed, int n, float step, float lo, float hi, uint16_t* out);
// out[i] = fp16(AsymDecode(q_i, step[i], lo[i], hi[i], levels)), q_i = clamp(codes[i] + shift[i], 0,
// levels) (shift holds small non-negative integers as floats).
void DequantI8(const int8_t* codes, int n, int levels, const float* shift, const float* step, const float* lo,
               const float* hi, uint16_t* out);

// ---- q8 internals exposed for tests ----
// Row quantizer: returns the fp16 bits of the row's max |x| (x sanitized) and writes the codes.
uint16_t Q8EncodeRow(const float* x, int n, int8_t* codes);
// Decode of one q8 row with stored max amax_bits (REQUIRES: a finite non-negative fp16):
// out[i] = fp16(codes[i] * Q8Step(amax)), codes clamped to [-127, 127].
void Q8DecodeRowScalar(const int8_t* codes, int n, uint16_t amax_bits, uint16_t* out);
void Q8DecodeRowSimd(const int8_t* codes, int n, uint16_t amax_bits, uint16_t* out);  // = scalar without AVX2
bool Q8HasSimd();
// Whole-blob q8 decode forcing the scalar row kernel (the codec's Decode uses the SIMD one).
Status Q8DecodeScalar(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst);

// ---- cachegen internals exposed for tests ----
// Tokens per delta group (per-channel lo/hi ranges are stored once per group).
inline constexpr int kCacheGenGroup = 64;
// Delta bit width for a layer: 6 in the first third of the layers, 5 in the second, 4 in the last.
int CacheGenBits(int layer, int n_layer);

}  // namespace mz::kvc
