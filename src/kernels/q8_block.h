// The q8 KV layout and its arithmetic, defined once. The q8 codec (store/codec_q8.cpp) writes and
// decodes it; the attention kernel (kernels/attention*.cpp) reads it in place. Any SIMD twin of the
// functions below must perform exactly the same IEEE operations (and so give the same bits).
//
// Row: the head_dim values of one token of one kv head, K or V. Symmetric int8, one scale per row.
// Segment: the K (or V) rows [0, rows) of one kv head, stored as
//   amax[rows]            fp16 little-endian: the row's max |x| (a finite, non-negative fp16 value;
//                         the row's step is derived from it, see q8_step)
//   code[rows][head_dim]  int8, two's complement, in [-127, 127] (-128 is never written by the
//                         encoder and decodes as -127)
// Payload of one chunk (what follows the codec's 16-byte header): 2 * n_kv_head segments in order
// K head 0..n_kv_head-1, then V head 0..n_kv_head-1 (segment j = block * n_kv_head + head), all with
// the same `rows` (the chunk's encoded tokens). Size: 2 * n_kv_head * rows * (2 + head_dim) bytes.
//
// Arithmetic (default floating-point environment: round to nearest even):
//   step   = amax * fl(1/127), in f32 (not rounded to fp16)
//   encode = clamp(nearbyint(x / step), -127, 127) for a sanitized x (finite, |x| <= amax);
//            every code is 0 when amax == 0
//   decode = fp16(code * step): one f32 multiply, one round-to-nearest-even conversion to fp16
// Codes +-127 decode to exactly +-amax, so re-encoding a decoded row reproduces it (store/codec_q8.cpp).
// Header-only, no state, thread-safe.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/fp16.h"

namespace mz {

inline constexpr int kQ8MaxCode = 127;
inline constexpr float kQ8InvMaxCode = 1.0f / 127.0f;

// ---- layout ----

// Bytes of one segment of `rows` rows.
inline size_t q8_segment_bytes(int rows, int head_dim) {
  return static_cast<size_t>(rows) * (2 + static_cast<size_t>(head_dim));
}
// Bytes of one chunk's payload (2 * n_kv_head segments).
inline size_t q8_payload_bytes(int n_kv_head, int rows, int head_dim) {
  return 2 * static_cast<size_t>(n_kv_head) * q8_segment_bytes(rows, head_dim);
}
// Segment `seg` (block * n_kv_head + head) of a payload whose segments hold `rows` rows.
inline const uint8_t* q8_segment(const uint8_t* payload, int rows, int head_dim, int seg) {
  return payload + static_cast<size_t>(seg) * q8_segment_bytes(rows, head_dim);
}
inline uint8_t* q8_segment(uint8_t* payload, int rows, int head_dim, int seg) {
  return payload + static_cast<size_t>(seg) * q8_segment_bytes(rows, head_dim);
}
// Row t's amax (fp16 little-endian, 2 bytes) inside a segment.
inline const uint8_t* q8_row_amax(const uint8_t* segment, int t) { return segment + 2 * static_cast<size_t>(t); }
inline uint8_t* q8_row_amax(uint8_t* segment, int t) { return segment + 2 * static_cast<size_t>(t); }
// Row t's head_dim codes inside a segment of `rows` rows.
inline const int8_t* q8_row_codes(const uint8_t* segment, int rows, int head_dim, int t) {
  return reinterpret_cast<const int8_t*>(segment + 2 * static_cast<size_t>(rows)) + static_cast<size_t>(t) * head_dim;
}
inline int8_t* q8_row_codes(uint8_t* segment, int rows, int head_dim, int t) {
  return reinterpret_cast<int8_t*>(segment + 2 * static_cast<size_t>(rows)) + static_cast<size_t>(t) * head_dim;
}
inline uint16_t q8_load_amax(const uint8_t* amax_le) {
  return static_cast<uint16_t>(amax_le[0] | (amax_le[1] << 8));
}
inline void q8_store_amax(uint8_t* amax_le, uint16_t bits) {
  amax_le[0] = static_cast<uint8_t>(bits);
  amax_le[1] = static_cast<uint8_t>(bits >> 8);
}

// ---- arithmetic ----

// Step of a row whose max |x| is amax (an fp16 value).
inline float q8_step(float amax) { return amax * kQ8InvMaxCode; }
inline float q8_step_of_bits(uint16_t amax_bits) { return q8_step(fp16_to_fp32(amax_bits)); }

// Code of a sanitized x for a row with step > 0.
inline int q8_quantize(float x, float step) {
  float q = std::nearbyint(x / step);
  if (q > static_cast<float>(kQ8MaxCode)) q = static_cast<float>(kQ8MaxCode);
  if (q < -static_cast<float>(kQ8MaxCode)) q = -static_cast<float>(kQ8MaxCode);
  return static_cast<int>(q);
}

// fp16 bits of the decoded value of `code` (-128 read as -127).
inline uint16_t q8_dequantize(int8_t code, float step) {
  return fp32_to_fp16(static_cast<float>(std::max<int>(code, -kQ8MaxCode)) * step);
}

// Encodes one row of n sanitized values (finite, -0 already +0): writes n codes and returns the fp16
// bits of the row's amax. The scalar definition; the codec's SIMD encoder gives the same result.
inline uint16_t q8_quantize_row(const float* x, int n, int8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    std::memset(codes, 0, static_cast<size_t>(n));
    return 0;
  }
  const float step = q8_step(amax);
  for (int i = 0; i < n; ++i) codes[i] = static_cast<int8_t>(q8_quantize(x[i], step));
  return fp32_to_fp16(amax);  // exact: amax is an fp16 value
}

// Decodes one row to fp16: out[i] = q8_dequantize(codes[i], step of amax_bits). REQUIRES amax_bits
// is a finite non-negative fp16 (the codec rejects other blobs as corrupt).
inline void q8_dequantize_row(const int8_t* codes, int n, uint16_t amax_bits, uint16_t* out) {
  const float step = q8_step_of_bits(amax_bits);
  for (int i = 0; i < n; ++i) out[i] = q8_dequantize(codes[i], step);
}

// Decodes rows [0, n_rows) of head_dim values to f32, as the attention kernel reads them: the fp16
// decode above, then fp16 -> f32 (exact). codes: row r at codes + r * head_dim; amax_le: row r's amax
// at amax_le + 2 * r; dst: [n_rows][head_dim].
inline void q8_dequantize_rows_f32(const int8_t* codes, const uint8_t* amax_le, int n_rows, int head_dim, float* dst) {
  for (int r = 0; r < n_rows; ++r) {
    const float step = q8_step_of_bits(q8_load_amax(amax_le + 2 * static_cast<size_t>(r)));
    const int8_t* c = codes + static_cast<size_t>(r) * head_dim;
    float* o = dst + static_cast<size_t>(r) * head_dim;
    for (int d = 0; d < head_dim; ++d) o[d] = fp16_to_fp32(q8_dequantize(c[d], step));
  }
}

}  // namespace mz
