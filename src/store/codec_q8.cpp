// "q8": FlexGen-style symmetric int8, one fp16 scale per [head][token] row of head_dim values, for
// both K and V. The default swap codec: 1.97x smaller than fp16 at head_dim 128; relative RMS error
// ~0.7% on Gaussian rows, ~1.8% on key rows with 10x outlier channels (the row max sets the step).
//
// Payload (after the 16-byte header, param byte 0): the q8 layout of kernels/q8_block.h, which the
// attention kernel reads in place, with rows = n_tokens: for block in (K, V), for head h in
// 0..n_kv_head-1, amax[n_tokens] (fp16 little-endian) then code[n_tokens][head_dim] (int8 in
// [-127, 127]). Size: exactly q8_payload_bytes = 2 * n_kv_head * n_tokens * (2 + head_dim) bytes.
//
// Encoding a row x (sanitized: NaN -> 0, +-inf -> +-65504, -0 -> +0): amax = max |x| (an fp16 value,
// stored exactly); step = q8_step(amax) = amax * fl(1/127) in f32; code = q8_quantize(x, step) =
// clamp(nearbyint(x / step), -127, 127), all zero when amax == 0. Decoding: y = q8_dequantize(code,
// step) = fp16(code * step), one f32 multiply and one round-to-nearest-even conversion, so the SIMD
// (F16C) paths here agree bit for bit with the scalar definitions in q8_block.h.
// Error per element <= step/2 + half an fp16 ulp of y (step = amax/127, not rounded to fp16).
//
// Idempotence: codes +-127 decode to exactly +-amax (127 * step is within 3 f32 ulps of amax), so the
// decoded row has the same amax and the same step; every other decoded value is the fp16 nearest to
// its grid point code*step, hence no farther from it than the original value was (<= step/2), and
// re-quantizes to the same code. Checked exhaustively over every (amax, code) pair by the tests.
//
// Bad input: an amax that is negative or not finite is Corruption; a code of -128 (never written by
// the encoder) decodes as -127; so every accepted blob decodes to finite values with |y| <= amax.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "store/codecs_internal.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define MZ_KVC_SIMD 1
#endif

namespace mz::kvc {

uint16_t Q8EncodeRow(const float* x, int n, int8_t* codes) {
  float amax = 0.0f;
  int i = 0;
#ifdef MZ_KVC_SIMD
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float l : lanes) amax = std::max(amax, l);
#endif
  for (; i < n; i++) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.0f) {
    std::memset(codes, 0, size_t(n));
    return 0;
  }
  const float step = q8_step(amax);
  i = 0;
#ifdef MZ_KVC_SIMD
  const __m256 vs = _mm256_set1_ps(step), hi = _mm256_set1_ps(float(kQ8MaxCode)), lo = _mm256_set1_ps(-float(kQ8MaxCode));
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 b = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i + 8), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    a = _mm256_min_ps(_mm256_max_ps(a, lo), hi);
    b = _mm256_min_ps(_mm256_max_ps(b, lo), hi);
    __m256i ia = _mm256_cvtps_epi32(a), ib = _mm256_cvtps_epi32(b);  // exact: already integral
    __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(ia, ib), 0xd8);  // 16 x int16 in order
    __m128i p8 = _mm_packs_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), p8);
  }
#endif
  for (; i < n; i++) codes[i] = int8_t(q8_quantize(x[i], step));
  return fp32_to_fp16(amax);  // exact: amax is an fp16 value
}

void Q8DecodeRowScalar(const int8_t* codes, int n, uint16_t amax_bits, uint16_t* out) {
  q8_dequantize_row(codes, n, amax_bits, out);
}

void Q8DecodeRowSimd(const int8_t* codes, int n, uint16_t amax_bits, uint16_t* out) {
#ifdef MZ_KVC_SIMD
  const __m256 vs = _mm256_set1_ps(q8_step_of_bits(amax_bits));
  const __m128i m127 = _mm_set1_epi8(-kQ8MaxCode);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128i q = _mm_max_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)), m127);
    __m256 a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vs);
    __m256 b = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), vs);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  if (i < n) Q8DecodeRowScalar(codes + i, n - i, amax_bits, out + i);
#else
  Q8DecodeRowScalar(codes, n, amax_bits, out);
#endif
}

bool Q8HasSimd() {
#ifdef MZ_KVC_SIMD
  return true;
#else
  return false;
#endif
}

namespace {

size_t Q8PayloadBytes(const ChunkShape& s) { return q8_payload_bytes(s.n_kv_head, s.n_tokens, s.head_dim); }

using RowDecoder = void (*)(const int8_t*, int, uint16_t, uint16_t*);

Status Q8DecodeWith(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst, RowDecoder row,
                    bool zero_invalid = true) {
  MZ_RETURN_IF_ERROR(ValidateShape(s));
  size_t payload = 0;
  MZ_RETURN_IF_ERROR(CheckHeader(src, size, uint8_t(KvCodecId::kQ8), 0, s, &payload));
  if (payload != Q8PayloadBytes(s))
    return Status::Corruption("kv codec q8: payload of " + std::to_string(payload) + " bytes, expected " +
                              std::to_string(Q8PayloadBytes(s)));
  const int n = s.n_tokens, d = s.head_dim;
  const uint8_t* body = src + kKvCodecHeaderBytes;
  for (int j = 0; j < 2 * s.n_kv_head; j++) {  // (block, head) segments in order
    const uint8_t* seg = q8_segment(body, n, d, j);
    uint16_t* out = dst + size_t(j) * s.chunk_tokens * d;
    for (int t = 0; t < n; t++) {
      const uint16_t hb = q8_load_amax(q8_row_amax(seg, t));
      if (hb > 0x7bffu)
        return Status::Corruption("kv codec q8: bad row max (fp16 bits " + std::to_string(hb) + ", segment " +
                                  std::to_string(j) + ", row " + std::to_string(t) + ")");
      row(q8_row_codes(seg, n, d, t), d, hb, out + size_t(t) * d);
    }
  }
  if (zero_invalid) ZeroInvalidRows(s, dst);
  return Status::Ok();
}

class Q8Codec final : public KvCodec {
 public:
  const char* name() const override { return "q8"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kQ8); }
  bool lossless() const override { return false; }
  bool attention_reads_in_place() const override { return true; }
  size_t MaxEncodedSize(const ChunkShape& s) const override {
    return ValidateShape(s).ok() ? kKvCodecHeaderBytes + Q8PayloadBytes(s) : 0;
  }
  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    size_t need = 0;
    MZ_RETURN_IF_ERROR(CheckEncodeArgs(*this, s, cap, &need));
    const int n = s.n_tokens, d = s.head_dim;
    float* x = reinterpret_cast<float*>(Scratch(0, size_t(d) * sizeof(float)));
    if (!x) return Status::NoMemory("kv codec q8: scratch allocation failed");
    WriteHeader(dst, id(), 0, s, uint32_t(need - kKvCodecHeaderBytes));
    uint8_t* payload = dst + kKvCodecHeaderBytes;
    for (int j = 0; j < 2 * s.n_kv_head; j++) {
      const uint16_t* in = src + size_t(j) * s.chunk_tokens * d;
      uint8_t* seg = q8_segment(payload, n, d, j);
      for (int t = 0; t < n; t++) {
        LoadSanitized(in + size_t(t) * d, d, x);
        q8_store_amax(q8_row_amax(seg, t), Q8EncodeRow(x, d, q8_row_codes(seg, n, d, t)));
      }
    }
    *written = need;
    return Status::Ok();
  }
  Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    return Q8DecodeWith(s, src, size, dst, &Q8DecodeRowSimd);
  }
  Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    return Q8DecodeWith(s, src, size, dst, &Q8DecodeRowSimd, /*zero_invalid=*/false);
  }
};

}  // namespace

Status Q8DecodeScalar(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) {
  return Q8DecodeWith(s, src, size, dst, &Q8DecodeRowScalar);
}

std::unique_ptr<KvCodec> MakeQ8Codec() { return std::make_unique<Q8Codec>(); }

}  // namespace mz::kvc
