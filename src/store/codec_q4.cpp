// "q4": KIVI-style 4-bit asymmetric quantization. Keys are quantized per channel (outlier channels
// get their own range), values per token; groups of 32 along the grouped axis.
//
// Payload (after the 16-byte header, param byte 0). R = ceil(head_dim / 2) bytes per packed row
// (channel 2k in the low nibble of byte k, 2k+1 in the high nibble; for odd head_dim the last high
// nibble is written 0 and ignored on decode).
//   K block, for head h, for token group g = 0..ceil(n_tokens/32)-1 (tokens 32g..min(32g+32,n)-1,
//   the last group may be partial):
//     lo[head_dim] fp16, hi[head_dim] fp16   per-channel min and max over the group's tokens
//     code[tokens in group][R]               4-bit codes
//   V block, for head h, for token t = 0..n_tokens-1:
//     range[ceil(head_dim/32)][2] fp16       (lo, hi) per group of 32 channels (the last may be partial)
//     code[R]
// Size (always exactly): n_kv_head * (ceil(n/32)*4*head_dim + n*R  +  n*(4*ceil(head_dim/32) + R)).
//
// Group encoding (x sanitized: NaN -> 0, +-inf -> +-65504, -0 -> +0): lo = min x and hi = max x are
// fp16 values stored exactly; step = (hi - lo) * fl(1/15) in f32; code = clamp(nearbyint((x - lo) /
// step), 0, 15) (0 when hi == lo). Decoding: code 15 -> hi exactly, else fp16(fma(code, step, lo))
// (code 0 -> lo exactly). Error per element <= step/2 + half an fp16 ulp of y, step = (hi - lo)/15.
// Idempotent: the decoded group has the same min and max (codes 0 and 15 decode to them, everything
// else lies between), hence the same step, and each decoded value is the fp16 nearest to its grid
// point, so it re-quantizes to the same code.
//
// Bad input: lo or hi not finite, or lo > hi, is Corruption; so every accepted blob decodes to
// finite values within [lo, hi] of their group.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "store/codecs_internal.h"

namespace mz::kvc {
namespace {

constexpr int kQ4Group = 32;

size_t Q4PayloadBytes(const ChunkShape& s) {
  const size_t n = s.n_tokens, d = s.head_dim, r = (d + 1) / 2;
  const size_t gk = (n + kQ4Group - 1) / kQ4Group, gv = (d + kQ4Group - 1) / kQ4Group;
  const size_t k = gk * 4 * d + n * r, v = n * (4 * gv + r);
  return size_t(s.n_kv_head) * (k + v);
}

// Packs codes (0..15) two per byte; odd tail high nibble zero.
void PackNibbles(const uint8_t* q, int n, uint8_t* out) {
  for (int k = 0; k < n / 2; k++) out[k] = uint8_t(q[2 * k] | (q[2 * k + 1] << 4));
  if (n & 1) out[n / 2] = q[n - 1];
}

Status BadParam(const char* what, int seg, int row) {
  return Status::Corruption(std::string("kv codec q4: bad ") + what + " (segment " + std::to_string(seg) +
                            ", row/group " + std::to_string(row) + ")");
}

class Q4Codec final : public KvCodec {
 public:
  const char* name() const override { return "q4"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kQ4); }
  bool lossless() const override { return false; }
  size_t MaxEncodedSize(const ChunkShape& s) const override {
    return ValidateShape(s).ok() ? kKvCodecHeaderBytes + Q4PayloadBytes(s) : 0;
  }

  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    size_t need = 0;
    MZ_RETURN_IF_ERROR(CheckEncodeArgs(*this, s, cap, &need));
    const int n = s.n_tokens, d = s.head_dim, r = (d + 1) / 2;
    // scratch: x[kQ4Group][d] floats, mn[d], mx[d], q[d] bytes
    float* x = reinterpret_cast<float*>(Scratch(0, (size_t(kQ4Group) + 2) * d * sizeof(float) + size_t(d)));
    if (!x) return Status::NoMemory("kv codec q4: scratch allocation failed");
    float* mn = x + size_t(kQ4Group) * d;
    float* mx = mn + d;
    uint8_t* q = reinterpret_cast<uint8_t*>(mx + d);
    WriteHeader(dst, id(), 0, s, uint32_t(need - kKvCodecHeaderBytes));
    uint8_t* p = dst + kKvCodecHeaderBytes;
    const size_t stride = size_t(s.chunk_tokens) * d;

    // K: per channel over token groups.
    for (int h = 0; h < s.n_kv_head; h++) {
      const uint16_t* in = src + h * stride;
      for (int t0 = 0; t0 < n; t0 += kQ4Group) {
        const int tg = std::min(kQ4Group, n - t0);
        for (int t = 0; t < tg; t++) LoadSanitized(in + size_t(t0 + t) * d, d, x + size_t(t) * d);
        MinMaxRows(x, tg, d, mn, mx);
        for (int c = 0; c < d; c++) {
          Store16(p + 2 * c, fp32_to_fp16(mn[c]));
          Store16(p + 2 * size_t(d) + 2 * c, fp32_to_fp16(mx[c]));
          mx[c] = AsymStep(mn[c], mx[c], 15);  // reuse as the step
        }
        p += 4 * size_t(d);
        for (int t = 0; t < tg; t++) {
          const float* row = x + size_t(t) * d;
          QuantizeRowAsym(row, d, mn, mx, 15, q);
          PackNibbles(q, d, p);
          p += r;
        }
      }
    }
    // V: per token over channel groups.
    for (int h = 0; h < s.n_kv_head; h++) {
      const uint16_t* in = src + (s.n_kv_head + h) * stride;
      for (int t = 0; t < n; t++) {
        LoadSanitized(in + size_t(t) * d, d, x);
        for (int c0 = 0; c0 < d; c0 += kQ4Group) {
          const int cg = std::min(kQ4Group, d - c0);
          float lo = x[c0], hi = x[c0];
          for (int c = c0 + 1; c < c0 + cg; c++) {
            lo = std::min(lo, x[c]);
            hi = std::max(hi, x[c]);
          }
          Store16(p, fp32_to_fp16(lo));
          Store16(p + 2, fp32_to_fp16(hi));
          p += 4;
          std::fill(mn + c0, mn + c0 + cg, lo);
          std::fill(mx + c0, mx + c0 + cg, AsymStep(lo, hi, 15));
        }
        QuantizeRowAsym(x, d, mn, mx, 15, q);
        PackNibbles(q, d, p);
        p += r;
      }
    }
    *written = need;
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
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), 0, s, &payload));
    if (payload != Q4PayloadBytes(s))
      return Status::Corruption("kv codec q4: payload of " + std::to_string(payload) + " bytes, expected " +
                                std::to_string(Q4PayloadBytes(s)));
    const int n = s.n_tokens, d = s.head_dim, r = (d + 1) / 2;
    float* sc = reinterpret_cast<float*>(Scratch(1, 3 * size_t(d) * sizeof(float)));
    if (!sc) return Status::NoMemory("kv codec q4: scratch allocation failed");
    float* mn = sc + d;
    float* mx = mn + d;
    const uint8_t* p = src + kKvCodecHeaderBytes;
    const size_t stride = size_t(s.chunk_tokens) * d;

    for (int h = 0; h < s.n_kv_head; h++) {
      uint16_t* out = dst + h * stride;
      for (int t0 = 0; t0 < n; t0 += kQ4Group) {
        const int tg = std::min(kQ4Group, n - t0);
        for (int c = 0; c < d; c++) {
          const uint16_t lb = Load16(p + 2 * c), hb = Load16(p + 2 * size_t(d) + 2 * c);
          if (!RangeOk(lb, hb, &mn[c], &mx[c])) return BadParam("key range", h, t0);
          sc[c] = AsymStep(mn[c], mx[c], 15);
        }
        p += 4 * size_t(d);
        for (int t = 0; t < tg; t++) {
          DequantNibbles(p, d, sc, mn, mx, out + size_t(t0 + t) * d);
          p += r;
        }
      }
    }
    const int ng = (d + kQ4Group - 1) / kQ4Group;
    for (int h = 0; h < s.n_kv_head; h++) {
      uint16_t* out = dst + (s.n_kv_head + h) * stride;
      for (int t = 0; t < n; t++) {
        const uint8_t* codes = p + 4 * size_t(ng);
        for (int c0 = 0; c0 < d; c0 += kQ4Group) {
          float lo, hi;
          if (!RangeOk(Load16(p), Load16(p + 2), &lo, &hi)) return BadParam("value range", s.n_kv_head + h, t);
          p += 4;
          DequantNibblesUniform(codes + c0 / 2, std::min(kQ4Group, d - c0), AsymStep(lo, hi, 15), lo, hi,
                                out + size_t(t) * d + c0);
        }
        p += r;
      }
    }
    if (zero_invalid) ZeroInvalidRows(s, dst);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<KvCodec> MakeQ4Codec() { return std::make_unique<Q4Codec>(); }

}  // namespace mz::kvc
