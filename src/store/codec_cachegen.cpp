// "cachegen": CacheGen-style delta coding. Within a chunk, for each (block, head), the first valid
// token is an anchor stored at 8 bits (a q8 row); every other token is stored as a delta against
// the decoded anchor, quantized with a layer-aware bit budget b (CacheGenBits: 6 bits in the first
// third of the layers, 5 in the second, 4 in the last, since early layers are the most sensitive),
// and the whole quantized stream is entropy coded with zstd (level kLevel; its Huffman literal
// coder does the entropy coding, anchor-centred codes concentrate near 0).
//
// Header param byte = b; Decode requires b == CacheGenBits(s.layer, s.n_layer). L = 2^b - 1 levels.
// Payload (after the 16-byte header) = one zstd frame whose content P is two sections (side data
// first, so zstd's per-block Huffman tables see homogeneous bytes). With segments = (block, head)
// pairs in order (K heads 0..H-1, then V heads 0..H-1) and token groups g over tokens 1..n_tokens-1
// in groups of kGroup (the last may be partial; none when n_tokens == 1):
//   side section, for each segment:
//     anchor_amax fp16, anchor_code[head_dim] int8   token 0 as a q8 row (see codec_q8.cpp)
//     for each group g: lo[head_dim] fp16, hi[head_dim] fp16   per-channel min / max over the group
//   code section, for each segment, for each token 1..n_tokens-1:
//     delta[head_dim] int8 in [-L, L]
// |P| = 2*n_kv_head*((2 + head_dim + ceil((n-1)/kGroup)*4*head_dim) + (n-1)*head_dim); the frame
// must decompress to exactly |P| bytes.
//
// Delta encoding of channel c in a group (x sanitized as in q8, a = decoded anchor value): the
// quantization grid is lo + k*step, step = (hi - lo) * fl(1/L), k in [0, L]; the anchor's grid
// position ka = clamp(nearbyint((a - lo) / step), 0, L) (derived, not stored); the stored delta is
// k - ka, i.e. about (x - a) / step. Decoding: k = clamp(delta + ka, 0, L); k == L -> hi exactly,
// else fp16(fma(k, step, lo)). Error per element <= step/2 + half an fp16 ulp of y. Idempotent:
// the anchor row is a q8 row (idempotent), so re-encoding sees the same a; each group's min and
// max decode exactly (k = 0, L), so it sees the same lo, hi, step and ka; and every decoded value
// is the fp16 nearest to its grid point, so it re-quantizes to the same k (see codecs_internal.h).
//
// Bad input: a malformed zstd frame or wrong content size is Corruption; an anchor amax or a group
// range that is not finite (or lo > hi) is Corruption; deltas are clamped to the grid. So every
// accepted blob decodes to finite values.
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "store/codecs_internal.h"

namespace mz::kvc {

int CacheGenBits(int layer, int n_layer) {
  if (3 * layer < n_layer) return 6;
  if (3 * layer < 2 * n_layer) return 5;
  return 4;
}

namespace {

constexpr int kGroup = kCacheGenGroup;
constexpr int kLevel = 1;

// Per (block, head) segment: side bytes (anchor + ranges) and code bytes.
size_t SideBytes(const ChunkShape& s) {
  const size_t d = s.head_dim, m = size_t(s.n_tokens) - 1, g = (m + kGroup - 1) / kGroup;
  return 2 + d + g * 4 * d;
}
size_t CodeBytes(const ChunkShape& s) { return (size_t(s.n_tokens) - 1) * s.head_dim; }
size_t RawPayloadBytes(const ChunkShape& s) { return 2 * size_t(s.n_kv_head) * (SideBytes(s) + CodeBytes(s)); }

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
    const int bits = CacheGenBits(s.layer, s.n_layer), levels = (1 << bits) - 1;
    const int n = s.n_tokens, d = s.head_dim;
    const size_t plen = RawPayloadBytes(s);
    uint8_t* P = Scratch(0, plen);
    // floats: x[kGroup][d], a[d], lo[d], hi[d]; then the anchor as fp16 [d], shifts [d]
    float* x = reinterpret_cast<float*>(Scratch(1, (size_t(kGroup) + 3) * d * sizeof(float) + 3 * size_t(d)));
    if (!P || !x) return Status::NoMemory("kv codec cachegen: scratch allocation failed");
    float* a = x + size_t(kGroup) * d;
    float* lo = a + d;
    float* hi = lo + d;
    uint16_t* a16 = reinterpret_cast<uint16_t*>(hi + d);
    uint8_t* ishift = reinterpret_cast<uint8_t*>(a16 + d);
    uint8_t* p = P;                               // side section: anchors and ranges
    uint8_t* pb = P + 2 * s.n_kv_head * SideBytes(s);  // code section
    for (int j = 0; j < 2 * s.n_kv_head; j++) {
      const uint16_t* in = src + size_t(j) * s.chunk_tokens * d;
      // anchor
      LoadSanitized(in, d, x);
      int8_t* acodes = reinterpret_cast<int8_t*>(p + 2);
      const uint16_t amax = Q8EncodeRow(x, d, acodes);
      Store16(p, amax);
      Q8DecodeRowSimd(acodes, d, amax, a16);
      for (int c = 0; c < d; c++) a[c] = fp16_to_fp32(a16[c]);
      p += 2 + size_t(d);
      // delta groups
      for (int t0 = 1; t0 < n; t0 += kGroup) {
        const int tg = std::min(kGroup, n - t0);
        for (int t = 0; t < tg; t++) LoadSanitized(in + size_t(t0 + t) * d, d, x + size_t(t) * d);
        MinMaxRows(x, tg, d, lo, hi);
        for (int c = 0; c < d; c++) {
          Store16(p + 2 * c, fp32_to_fp16(lo[c]));
          Store16(p + 2 * size_t(d) + 2 * c, fp32_to_fp16(hi[c]));
          hi[c] = AsymStep(lo[c], hi[c], levels);  // reuse as the step
          ishift[c] = uint8_t(QuantizeCode(a[c], lo[c], hi[c], 0, levels));
        }
        p += 4 * size_t(d);
        for (int t = 0; t < tg; t++) {
          const float* row = x + size_t(t) * d;
          QuantizeRowAsym(row, d, lo, hi, levels, pb);
          for (int c = 0; c < d; c++) pb[c] = uint8_t(pb[c] - ishift[c]);  // int8 delta k - ka (mod 256)
          pb += d;
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
    return DecodeImpl(s, src, size, dst, true);
  }
  Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    return DecodeImpl(s, src, size, dst, false);
  }

 private:
  Status DecodeImpl(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst, bool zero_invalid) const {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    MZ_RETURN_IF_ERROR(CheckLayer(s));
    const int bits = CacheGenBits(s.layer, s.n_layer), levels = (1 << bits) - 1;
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), uint8_t(bits), s, &payload));
    const int n = s.n_tokens, d = s.head_dim;
    const size_t plen = RawPayloadBytes(s);
    uint8_t* P = Scratch(0, plen);
    float* a = reinterpret_cast<float*>(Scratch(1, 5 * size_t(d) * sizeof(float)));
    if (!P || !a) return Status::NoMemory("kv codec cachegen: scratch allocation failed");
    float* step = a + d;
    float* lo = step + d;
    float* hi = lo + d;
    float* shift = hi + d;
    MZ_RETURN_IF_ERROR(ZstdDecompressExact(src + kKvCodecHeaderBytes, payload, P, plen).With("kv codec cachegen"));
    const uint8_t* p = P;
    const uint8_t* pb = P + 2 * s.n_kv_head * SideBytes(s);
    for (int j = 0; j < 2 * s.n_kv_head; j++) {
      uint16_t* out = dst + size_t(j) * s.chunk_tokens * d;
      const uint16_t amax = Load16(p);
      if (amax > 0x7bffu)
        return Status::Corruption("kv codec cachegen: bad anchor row max (segment " + std::to_string(j) + ")");
      Q8DecodeRowSimd(reinterpret_cast<const int8_t*>(p + 2), d, amax, out);
      for (int c = 0; c < d; c++) a[c] = fp16_to_fp32(out[c]);
      p += 2 + size_t(d);
      for (int t0 = 1; t0 < n; t0 += kGroup) {
        const int tg = std::min(kGroup, n - t0);
        for (int c = 0; c < d; c++) {
          if (!RangeOk(Load16(p + 2 * c), Load16(p + 2 * size_t(d) + 2 * c), &lo[c], &hi[c]))
            return Status::Corruption("kv codec cachegen: bad group range (segment " + std::to_string(j) +
                                      ", token " + std::to_string(t0) + ", channel " + std::to_string(c) + ")");
          step[c] = AsymStep(lo[c], hi[c], levels);
          shift[c] = float(QuantizeCode(a[c], lo[c], step[c], 0, levels));
        }
        p += 4 * size_t(d);
        for (int t = 0; t < tg; t++) {
          DequantI8(reinterpret_cast<const int8_t*>(pb), d, levels, shift, step, lo, hi, out + size_t(t0 + t) * d);
          pb += d;
        }
      }
    }
    if (zero_invalid) ZeroInvalidRows(s, dst);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<KvCodec> MakeCacheGenCodec() { return std::make_unique<CacheGenCodec>(); }

}  // namespace mz::kvc
