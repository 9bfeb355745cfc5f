// "cachegen": CacheGen-style delta coding. Within a chunk, for each (block, head), the first valid
// token is an anchor stored at 8 bits (a q8 row); every other token is stored as a delta against
// the decoded anchor, quantized with a layer-aware bit budget b (CacheGenBits: 6 bits in the first
// third of the layers, 5 in the second, 4 in the last, since early layers are the most sensitive),
// and the whole quantized stream is entropy coded with zstd (level kLevel).
//
// Header param byte = b; Decode requires b == CacheGenBits(s.layer, s.n_layer).
// Payload (after the 16-byte header) = one zstd frame whose content P is, for block in (K, V), for
// head h in 0..n_kv_head-1:
//   anchor_scale fp16, anchor_code[head_dim] int8             token 0 as a q8 row (see codec_q8.cpp)
//   for token group g over tokens 1..n_tokens-1 in groups of 32 (the last may be partial):
//     scale[head_dim] fp16                                    per-channel delta scale over the group
//     code[tokens in group][head_dim] int8 in [-Q, Q]          Q = 2^(b-1) - 1
// |P| = 2 * n_kv_head * (2 + head_dim + ceil((n-1)/32) * 2 * head_dim + (n-1) * head_dim); the frame
// must decompress to exactly |P| bytes.
//
// Delta encoding of channel c in a group (x sanitized as in q8, a = decoded anchor value): the
// scale h is the smallest fp16 such that fp16(fma(+-Q, h, a)) reaches max(x, a) and min(x, a)
// (SearchScale); code = clamp(nearbyint((x - a) / h), -Q, Q); decoded y = fp16(fma(code, h, a)).
// Error per element <= h/2 + half an fp16 ulp, h ~= max |x - a| / Q. Idempotent: the anchor row is
// a q8 row (idempotent), so the re-encode sees the same a, and the delta scales follow the same
// minimal-h argument as q4.
//
// Bad input: a malformed zstd frame or wrong content size is Corruption; an anchor scale outside
// q8's valid range, or a delta scale that is negative, non-finite or makes fp16(a +- Q*h) overflow,
// is Corruption; codes outside [-Q, Q] are clamped. So every accepted blob decodes to finite values.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "swap/codecs_internal.h"

namespace mz::kvc {

int CacheGenBits(int layer, int n_layer) {
  if (3 * layer < n_layer) return 6;
  if (3 * layer < 2 * n_layer) return 5;
  return 4;
}

namespace {

constexpr int kGroup = 32;
constexpr int kLevel = 1;

size_t SegmentBytes(const ChunkShape& s) {
  const size_t d = s.head_dim, m = size_t(s.n_tokens) - 1, g = (m + kGroup - 1) / kGroup;
  return 2 + d + g * 2 * d + m * d;
}
size_t RawPayloadBytes(const ChunkShape& s) { return 2 * size_t(s.n_kv_head) * SegmentBytes(s); }

Status CheckLayer(const ChunkShape& s) {
  if (s.n_layer < 1 || s.layer < 0 || s.layer >= s.n_layer)
    return Status::InvalidArgument("kv codec cachegen: layer " + std::to_string(s.layer) + " outside [0, " +
                                   std::to_string(s.n_layer) + ")");
  return Status::Ok();
}

class CacheGenCodec final : public KvCodec {
 public:
  const char* name() const override { return "cachegen"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kCacheGen); }
  bool lossless() const override { return false; }
  size_t MaxEncodedSize(const ChunkShape& s) const override {
    return ValidateShape(s).ok() ? kKvCodecHeaderBytes + ZSTD_compressBound(RawPayloadBytes(s)) : 0;
  }

  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    MZ_RETURN_IF_ERROR(CheckLayer(s));
    if (cap < MaxEncodedSize(s)) return Status::InvalidArgument("kv codec cachegen: output buffer too small");
    const int bits = CacheGenBits(s.layer, s.n_layer), qmax = (1 << (bits - 1)) - 1;
    const int n = s.n_tokens, d = s.head_dim;
    const size_t plen = RawPayloadBytes(s);
    uint8_t* P = Scratch(0, plen);
    // floats: x[kGroup][d], a[d], lo[d], hi[d]; then anchor fp16 row [d]
    float* x = reinterpret_cast<float*>(Scratch(1, (size_t(kGroup) + 3) * d * sizeof(float) + 2 * size_t(d)));
    if (!P || !x) return Status::NoMemory("kv codec cachegen: scratch allocation failed");
    float* a = x + size_t(kGroup) * d;
    float* lo = a + d;
    float* hi = lo + d;
    uint16_t* a16 = reinterpret_cast<uint16_t*>(hi + d);
    uint8_t* p = P;
    for (int j = 0; j < 2 * s.n_kv_head; j++) {
      const uint16_t* in = src + size_t(j) * s.chunk_tokens * d;
      // anchor
      LoadSanitized(in, d, x);
      int8_t* acodes = reinterpret_cast<int8_t*>(p + 2);
      const uint16_t ahb = Q8EncodeRow(x, d, acodes);
      Store16(p, ahb);
      Q8DecodeRowSimd(acodes, d, ahb, a16);
      for (int c = 0; c < d; c++) a[c] = fp16_to_fp32(a16[c]);
      p += 2 + size_t(d);
      // delta groups
      for (int t0 = 1; t0 < n; t0 += kGroup) {
        const int tg = std::min(kGroup, n - t0);
        for (int t = 0; t < tg; t++) LoadSanitized(in + size_t(t0 + t) * d, d, x + size_t(t) * d);
        for (int c = 0; c < d; c++) lo[c] = hi[c] = a[c];
        for (int t = 0; t < tg; t++)
          for (int c = 0; c < d; c++) {
            lo[c] = std::min(lo[c], x[size_t(t) * d + c]);
            hi[c] = std::max(hi[c], x[size_t(t) * d + c]);
          }
        for (int c = 0; c < d; c++) {
          const uint16_t hb = SearchScale(a[c], lo[c], hi[c], qmax, qmax);
          Store16(p + 2 * c, hb);
          lo[c] = fp16_to_fp32(hb);  // reuse as the scale
        }
        p += 2 * size_t(d);
        for (int t = 0; t < tg; t++) {
          const float* row = x + size_t(t) * d;
          int8_t* codes = reinterpret_cast<int8_t*>(p);
          for (int c = 0; c < d; c++) codes[c] = int8_t(QuantizeCode(row[c], a[c], lo[c], qmax, qmax));
          p += d;
        }
      }
    }
    size_t c = 0;
    MZ_RETURN_IF_ERROR(
        ZstdCompress(P, plen, dst + kKvCodecHeaderBytes, cap - kKvCodecHeaderBytes, kLevel, &c).With("kv codec cachegen"));
    WriteHeader(dst, id(), uint8_t(bits), s, uint32_t(c));
    *written = kKvCodecHeaderBytes + c;
    return Status::Ok();
  }

  Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    MZ_RETURN_IF_ERROR(CheckLayer(s));
    const int bits = CacheGenBits(s.layer, s.n_layer), qmax = (1 << (bits - 1)) - 1;
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), uint8_t(bits), s, &payload));
    const int n = s.n_tokens, d = s.head_dim;
    const size_t plen = RawPayloadBytes(s);
    uint8_t* P = Scratch(0, plen);
    float* a = reinterpret_cast<float*>(Scratch(1, 2 * size_t(d) * sizeof(float)));
    if (!P || !a) return Status::NoMemory("kv codec cachegen: scratch allocation failed");
    float* sc = a + d;
    MZ_RETURN_IF_ERROR(ZstdDecompressExact(src + kKvCodecHeaderBytes, payload, P, plen).With("kv codec cachegen"));
    const uint8_t* p = P;
    for (int j = 0; j < 2 * s.n_kv_head; j++) {
      uint16_t* out = dst + size_t(j) * s.chunk_tokens * d;
      const uint16_t ahb = Load16(p);
      if (ahb > kQ8MaxScaleBits)
        return Status::Corruption("kv codec cachegen: bad anchor scale (segment " + std::to_string(j) + ")");
      Q8DecodeRowSimd(reinterpret_cast<const int8_t*>(p + 2), d, ahb, out);
      for (int c = 0; c < d; c++) a[c] = fp16_to_fp32(out[c]);
      p += 2 + size_t(d);
      for (int t0 = 1; t0 < n; t0 += kGroup) {
        const int tg = std::min(kGroup, n - t0);
        for (int c = 0; c < d; c++) {
          const uint16_t hb = Load16(p + 2 * c);
          if (!ScaleOk(hb, a[c], qmax, qmax))
            return Status::Corruption("kv codec cachegen: bad delta scale (segment " + std::to_string(j) +
                                      ", token " + std::to_string(t0) + ", channel " + std::to_string(c) + ")");
          sc[c] = fp16_to_fp32(hb);
        }
        p += 2 * size_t(d);
        for (int t = 0; t < tg; t++) {
          DequantI8(reinterpret_cast<const int8_t*>(p), d, qmax, sc, a, out + size_t(t0 + t) * d);
          p += d;
        }
      }
    }
    ZeroInvalidRows(s, dst);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<KvCodec> MakeCacheGenCodec() { return std::make_unique<CacheGenCodec>(); }

}  // namespace mz::kvc
