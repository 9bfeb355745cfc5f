// Private helpers shared by the KV codecs (src/swap/codec_*.cpp) and their tests. Not a public API.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/attention.h"  // fp16_to_fp32 / fp32_to_fp16
#include "swap/kv_codec.h"

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
// InvalidArgument unless 1 <= dims <= 65535, 1 <= n_tokens <= chunk_tokens, raw_bytes() < 2^31.
Status ValidateShape(const ChunkShape& s);
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
// A per-thread byte buffer (slot 0 or 1) of at least n bytes, 32-byte aligned. Valid until the same
// thread asks for the same slot again.
uint8_t* Scratch(int slot, size_t n);

// ---- lossy-codec arithmetic (shared so every codec is idempotent for the same reason) ----
// Finite canonical value of an fp16: NaN -> +0, +-inf -> +-65504, -0 -> +0.
inline float SanitizeF16(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u) {
    if (h & 0x3ffu) return 0.0f;
    return (h & 0x8000u) ? -65504.0f : 65504.0f;
  }
  return fp16_to_fp32(h) + 0.0f;  // -0 + +0 = +0
}
// fp16 rounding of f, returned as float.
inline float RoundF16(float f) { return fp16_to_fp32(fp32_to_fp16(f)); }
// Decoded value of code q with scale h (fp16 value) around centre a (fp16 value): fp16(fma(q, h, a)).
// Encoder and decoder use exactly this expression (fma: one rounding, no dependence on contraction).
inline float Dequant(float q, float h, float a) { return RoundF16(std::fma(q, h, a)); }

// Scale selection. Returns the fp16 bits of the smallest non-negative fp16 h for which the extreme
// codes reach the data range: Dequant(qpos, h, a) >= hi and Dequant(-qneg, h, a) <= lo, searched
// among the h for which both extremes decode finite; if no such h covers the range, the largest
// such h (values outside are then clamped to the extreme codes). REQUIRES: a, lo, hi finite fp16
// values, lo <= a <= hi, qpos >= 1, qneg >= 0 (qneg == 0 requires lo == a).
// Why minimal-h makes the codecs idempotent: re-encoding decoded data sees the extremes
// Dequant(+-qmax, h, a), which still satisfy the cover test at h, while every h' < h failed it for
// the original (no larger) extremes -- so the same h is chosen again; and since decoded values sit
// within half an fp16 ulp (< h/2) of q*h + a, they re-quantize to the same codes.
uint16_t SearchScale(float a, float lo, float hi, int qpos, int qneg);
// Code of x for centre a and scale h: clamp(nearbyint((x - a) / h), -qneg, qpos); 0 when h == 0.
inline int QuantizeCode(float x, float a, float h, int qpos, int qneg) {
  if (h == 0.0f) return 0;
  float q = std::nearbyint((x - a) / h);
  if (q > float(qpos)) q = float(qpos);
  if (q < -float(qneg)) q = -float(qneg);
  return int(q);
}
// True if an fp16 scale from a blob is usable: finite, sign clear, and both extreme codes decode
// finite around a.
inline bool ScaleOk(uint16_t hb, float a, int qpos, int qneg) {
  if (hb >= 0x7c00u) return false;  // inf/NaN or sign bit set
  float h = fp16_to_fp32(hb);
  return std::isfinite(Dequant(float(qpos), h, a)) && std::isfinite(Dequant(-float(qneg), h, a));
}

// ---- row conversions (AVX2+F16C when compiled with them, same results either way) ----
// out[i] = SanitizeF16(in[i]).
void LoadSanitized(const uint16_t* in, int n, float* out);
// out[i] = fp32_to_fp16(in[i]).
void StoreF16(const float* in, int n, uint16_t* out);

// out[i] = fp32_to_fp16(fma(code_i, scale[i], base[i])) where code_i is the i-th 4-bit code of
// `packed` (channel 2k in the low nibble of byte k, 2k+1 in the high nibble).
void DequantNibbles(const uint8_t* packed, int n, const float* scale, const float* base, uint16_t* out);
// Same for int8 codes clamped to [-qmax, qmax].
void DequantI8(const int8_t* codes, int n, int qmax, const float* scale, const float* base, uint16_t* out);

// ---- q8 internals exposed for tests ----
// Largest valid q8 row scale (fp16 bits of 515.5: 127 * 515.5 rounds to 65472, still finite).
inline constexpr uint16_t kQ8MaxScaleBits = 0x6007;
// Row quantizer: returns the scale bits for row x[0..n) and writes codes.
uint16_t Q8EncodeRow(const float* x, int n, int8_t* codes);
// Decode of one q8 row: out[i] = fp16(codes[i] * scale), codes clamped to [-127, 127].
void Q8DecodeRowScalar(const int8_t* codes, int n, uint16_t scale_bits, uint16_t* out);
void Q8DecodeRowSimd(const int8_t* codes, int n, uint16_t scale_bits, uint16_t* out);  // = scalar without AVX2
bool Q8HasSimd();
// Whole-blob q8 decode forcing the scalar row kernel (the codec's Decode uses the SIMD one).
Status Q8DecodeScalar(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst);

// ---- cachegen internals exposed for tests ----
// Delta bit width for a layer: 6 in the first third of the layers, 5 in the second, 4 in the last.
int CacheGenBits(int layer, int n_layer);

}  // namespace mz::kvc
