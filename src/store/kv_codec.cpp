// KvCodec factory, shared helpers, and the lossless codecs "none", "lz4" and "zstd".
//
// Lossless payload formats (after the 16-byte header of kv_codec.h, param byte 0):
//   none: the valid rows packed: for K then V, for each head h, rows 0..n_tokens-1 of head_dim fp16
//         (2 * n_kv_head * n_tokens * head_dim * 2 bytes).
//   lz4:  one LZ4 block (LZ4_compress_default) of exactly the packed bytes of "none".
//   zstd: one zstd frame (level kZstdLevel) of exactly the packed bytes of "none".
// Decode checks that the block / frame decompresses to exactly the packed size.
#include "store/kv_codec.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "store/codecs_internal.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define MZ_KVC_SIMD 1
#endif

namespace mz {
namespace kvc {

// ---------------------------------------------------------------------------------------------
// header

Status ValidateShape(const ChunkShape& s) {
  auto dim_ok = [](int v) { return v >= 1 && v <= 65535; };
  if (!dim_ok(s.n_kv_head) || !dim_ok(s.head_dim) || !dim_ok(s.chunk_tokens))
    return Status::InvalidArgument("kv codec: chunk dims out of range (n_kv_head=" + std::to_string(s.n_kv_head) +
                                   " head_dim=" + std::to_string(s.head_dim) +
                                   " chunk_tokens=" + std::to_string(s.chunk_tokens) + ")");
  if (s.n_tokens < 1 || s.n_tokens > s.chunk_tokens)
    return Status::InvalidArgument("kv codec: n_tokens=" + std::to_string(s.n_tokens) + " outside 1.." +
                                   std::to_string(s.chunk_tokens));
  if (s.raw_bytes() > (size_t(1) << 30)) return Status::InvalidArgument("kv codec: chunk larger than 1 GiB");
  return Status::Ok();
}

void WriteHeader(uint8_t* dst, uint8_t id, uint8_t param, const ChunkShape& s, uint32_t payload) {
  dst[0] = id;
  dst[1] = kKvCodecVersion;
  dst[2] = param;
  dst[3] = 0;
  Store16(dst + 4, uint16_t(s.n_kv_head));
  Store16(dst + 6, uint16_t(s.head_dim));
  Store16(dst + 8, uint16_t(s.chunk_tokens));
  Store16(dst + 10, uint16_t(s.n_tokens));
  Store32(dst + 12, payload);
}

Status CheckHeader(const uint8_t* src, size_t size, uint8_t id, uint8_t expect_param, const ChunkShape& s,
                   size_t* payload) {
  const std::string who = std::string("kv codec ") + KvCodecName(id) + ": ";
  if (size < kKvCodecHeaderBytes)
    return Status::Corruption(who + "blob of " + std::to_string(size) + " bytes is shorter than the header");
  if (src[0] != id)
    return Status::Corruption(who + "blob was made by codec id " + std::to_string(src[0]) + " (" +
                              KvCodecName(src[0]) + ")");
  if (src[1] != kKvCodecVersion)
    return Status::Corruption(who + "unsupported format version " + std::to_string(src[1]));
  if (src[2] != expect_param)
    return Status::Corruption(who + "parameter byte " + std::to_string(src[2]) + ", expected " +
                              std::to_string(expect_param));
  if (src[3] != 0) return Status::Corruption(who + "reserved header byte is not zero");
  const int h = Load16(src + 4), d = Load16(src + 6), t = Load16(src + 8), n = Load16(src + 10);
  if (h != s.n_kv_head || d != s.head_dim || t != s.chunk_tokens || n != s.n_tokens)
    return Status::Corruption(who + "shape mismatch: blob has n_kv_head=" + std::to_string(h) + " head_dim=" +
                              std::to_string(d) + " chunk_tokens=" + std::to_string(t) + " n_tokens=" +
                              std::to_string(n) + ", expected " + std::to_string(s.n_kv_head) + "/" +
                              std::to_string(s.head_dim) + "/" + std::to_string(s.chunk_tokens) + "/" +
                              std::to_string(s.n_tokens));
  const size_t p = Load32(src + 12);
  if (p != size - kKvCodecHeaderBytes)
    return Status::Corruption(who + "header says " + std::to_string(p) + " payload bytes but blob has " +
                              std::to_string(size - kKvCodecHeaderBytes) + " (truncated or padded)");
  *payload = p;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// valid rows

void GatherValid(const ChunkShape& s, const uint16_t* raw, uint16_t* packed) {
  const size_t seg = size_t(s.n_tokens) * s.head_dim, stride = size_t(s.chunk_tokens) * s.head_dim;
  for (int j = 0; j < 2 * s.n_kv_head; j++) std::memcpy(packed + j * seg, raw + j * stride, seg * 2);
}

void ScatterValid(const ChunkShape& s, const uint8_t* packed, uint16_t* dst) {
  const size_t seg = size_t(s.n_tokens) * s.head_dim, stride = size_t(s.chunk_tokens) * s.head_dim;
  for (int j = 0; j < 2 * s.n_kv_head; j++) std::memcpy(dst + j * stride, packed + j * seg * 2, seg * 2);
}

void ScatterValidInPlace(const ChunkShape& s, uint16_t* dst) {
  const size_t seg = size_t(s.n_tokens) * s.head_dim, stride = size_t(s.chunk_tokens) * s.head_dim;
  if (seg == stride) return;
  // Last segment first: segment j moves up to j*stride >= j*seg, never over a segment not yet moved.
  for (int j = 2 * s.n_kv_head - 1; j >= 1; j--) std::memmove(dst + j * stride, dst + j * seg, seg * 2);
  ZeroInvalidRows(s, dst);
}

void ZeroInvalidRows(const ChunkShape& s, uint16_t* dst) {
  const size_t seg = size_t(s.n_tokens) * s.head_dim, stride = size_t(s.chunk_tokens) * s.head_dim;
  if (seg == stride) return;
  for (int j = 0; j < 2 * s.n_kv_head; j++) std::memset(dst + j * stride + seg, 0, (stride - seg) * 2);
}

// ---------------------------------------------------------------------------------------------
// scratch

namespace {
struct ScratchBuf {
  uint8_t* p = nullptr;
  size_t n = 0;
  ~ScratchBuf() { std::free(p); }
};
thread_local ScratchBuf tls_scratch[2];
}  // namespace

uint8_t* Scratch(int slot, size_t n) {
  ScratchBuf& b = tls_scratch[slot];
  if (b.n < n) {
    std::free(b.p);
    size_t sz = (std::max(n, size_t(4096)) + 63) & ~size_t(63);
    b.p = static_cast<uint8_t*>(std::aligned_alloc(64, sz));
    b.n = b.p ? sz : 0;
  }
  return b.p;
}

// ---------------------------------------------------------------------------------------------
// arithmetic

void LoadSanitized(const uint16_t* in, int n, float* out) {
  int i = 0;
#ifdef MZ_KVC_SIMD
  const __m256 big = _mm256_set1_ps(65504.0f), nbig = _mm256_set1_ps(-65504.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    x = _mm256_andnot_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x);  // NaN -> +0
    x = _mm256_min_ps(_mm256_max_ps(x, nbig), big);              // +-inf -> +-65504
    x = _mm256_add_ps(x, zero);                                  // -0 -> +0
    _mm256_storeu_ps(out + i, x);
  }
#endif
  for (; i < n; i++) out[i] = SanitizeF16(in[i]);
}

void MinMaxRows(const float* x, int rows, int n, float* lo, float* hi) {
  std::memcpy(lo, x, size_t(n) * sizeof(float));
  std::memcpy(hi, x, size_t(n) * sizeof(float));
  for (int t = 1; t < rows; t++) {
    const float* r = x + size_t(t) * n;
    int i = 0;
#ifdef MZ_KVC_SIMD
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_loadu_ps(r + i);
      _mm256_storeu_ps(lo + i, _mm256_min_ps(_mm256_loadu_ps(lo + i), v));
      _mm256_storeu_ps(hi + i, _mm256_max_ps(_mm256_loadu_ps(hi + i), v));
    }
#endif
    for (; i < n; i++) {
      lo[i] = std::min(lo[i], r[i]);
      hi[i] = std::max(hi[i], r[i]);
    }
  }
}

void QuantizeRowAsym(const float* x, int n, const float* base, const float* step, int levels, uint8_t* q) {
  int i = 0;
#ifdef MZ_KVC_SIMD
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(float(levels));
  auto code8 = [&](int k) {
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(base + k)),
                                   _mm256_loadu_ps(step + k));
    // step == 0 only when the whole group equals base: 0/0 = NaN, and max_ps(NaN, 0) returns 0.
    const __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, zero), top));
  };
  for (; i + 16 <= n; i += 16) {
    const __m256i p16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(code8(i), code8(i + 8)), 0xd8);
    const __m128i p8 = _mm_packus_epi16(_mm256_castsi256_si128(p16), _mm256_extracti128_si256(p16, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), p8);
  }
#endif
  for (; i < n; i++) q[i] = uint8_t(QuantizeCode(x[i], base[i], step[i], 0, levels));
}

#ifdef MZ_KVC_SIMD
namespace {
// fp16(AsymDecode(q, step, lo, hi, levels)) for 8 lanes; q holds integral floats in [0, levels].
inline __m128i AsymDecode8(__m256 q, const float* step, const float* lo, const float* hi, __m256 top) {
  __m256 f = _mm256_fmadd_ps(q, _mm256_loadu_ps(step), _mm256_loadu_ps(lo));
  f = _mm256_blendv_ps(f, _mm256_loadu_ps(hi), _mm256_cmp_ps(q, top, _CMP_EQ_OQ));
  return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
}  // namespace
#endif

namespace {
// kUniform: step/lo/hi point at one value used for all n channels (q4 value groups).
template <bool kUniform>
void DequantNibblesT(const uint8_t* packed, int n, const float* step, const float* lo, const float* hi,
                     uint16_t* out) {
  int i = 0;
#ifdef MZ_KVC_SIMD
  const __m128i lo4 = _mm_set1_epi8(0x0f);
  const __m256 top = _mm256_set1_ps(15.0f);
  const __m256 us = _mm256_set1_ps(step[0]), ul = _mm256_set1_ps(lo[0]), uh = _mm256_set1_ps(hi[0]);
  auto dec8 = [&](__m256 q, int k) {
    const __m256 s8 = kUniform ? us : _mm256_loadu_ps(step + k);
    const __m256 l8 = kUniform ? ul : _mm256_loadu_ps(lo + k);
    const __m256 h8 = kUniform ? uh : _mm256_loadu_ps(hi + k);
    __m256 f = _mm256_fmadd_ps(q, s8, l8);
    f = _mm256_blendv_ps(f, h8, _mm256_cmp_ps(q, top, _CMP_EQ_OQ));
    return _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  };
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m128i q = _mm_unpacklo_epi8(_mm_and_si128(b, lo4), _mm_and_si128(_mm_srli_epi16(b, 4), lo4));
    const __m256 qa = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    const __m256 qb = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), dec8(qa, i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), dec8(qb, i + 8));
  }
#endif
  for (; i < n; i++) {
    const int q = (packed[i / 2] >> (4 * (i & 1))) & 15;
    const int k = kUniform ? 0 : i;
    out[i] = fp32_to_fp16(AsymDecode(q, step[k], lo[k], hi[k], 15));
  }
}
}  // namespace

void DequantNibbles(const uint8_t* packed, int n, const float* step, const float* lo, const float* hi,
                    uint16_t* out) {
  DequantNibblesT<false>(packed, n, step, lo, hi, out);
}

void DequantNibblesUniform(const uint8_t* packed, int n, float step, float lo, float hi, uint16_t* out) {
  DequantNibblesT<true>(packed, n, &step, &lo, &hi, out);
}

void DequantI8(const int8_t* codes, int n, int levels, const float* shift, const float* step, const float* lo,
               const float* hi, uint16_t* out) {
  int i = 0;
#ifdef MZ_KVC_SIMD
  const __m256 top = _mm256_set1_ps(float(levels)), zero = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
    __m256 qa = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), _mm256_loadu_ps(shift + i));
    __m256 qb = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8))), _mm256_loadu_ps(shift + i + 8));
    qa = _mm256_min_ps(_mm256_max_ps(qa, zero), top);
    qb = _mm256_min_ps(_mm256_max_ps(qb, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), AsymDecode8(qa, step + i, lo + i, hi + i, top));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 8), AsymDecode8(qb, step + i + 8, lo + i + 8, hi + i + 8, top));
  }
#endif
  for (; i < n; i++) {
    const int q = std::clamp(int(codes[i]) + int(shift[i]), 0, levels);
    out[i] = fp32_to_fp16(AsymDecode(q, step[i], lo[i], hi[i], levels));
  }
}

// ---------------------------------------------------------------------------------------------
// lossless codecs

namespace {

constexpr int kZstdLevel = 3;

struct ZstdContexts {
  ZSTD_CCtx* c = nullptr;
  ZSTD_DCtx* d = nullptr;
  ~ZstdContexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};
thread_local ZstdContexts tls_zstd;

class NoneCodec final : public KvCodec {
 public:
  const char* name() const override { return "none"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kNone); }
  bool lossless() const override { return true; }
  size_t MaxEncodedSize(const ChunkShape& s) const override {
    return ValidateShape(s).ok() ? kKvCodecHeaderBytes + ValidElems(s) * 2 : 0;
  }
  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    const size_t need = MaxEncodedSize(s);
    if (cap < need) return Status::InvalidArgument("kv codec none: output buffer too small");
    WriteHeader(dst, id(), 0, s, uint32_t(need - kKvCodecHeaderBytes));
    // dst may be unaligned: gather through memcpy only.
    const size_t seg = size_t(s.n_tokens) * s.head_dim, stride = size_t(s.chunk_tokens) * s.head_dim;
    uint8_t* p = dst + kKvCodecHeaderBytes;
    for (int j = 0; j < 2 * s.n_kv_head; j++) std::memcpy(p + j * seg * 2, src + j * stride, seg * 2);
    *written = need;
    return Status::Ok();
  }
  Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckPayload(s, src, size, &payload));
    std::memcpy(dst, src + kKvCodecHeaderBytes, payload);
    ScatterValidInPlace(s, dst);
    return Status::Ok();
  }
  Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckPayload(s, src, size, &payload));
    ScatterValid(s, src + kKvCodecHeaderBytes, dst);  // src may be unaligned: memcpy only
    return Status::Ok();
  }

 private:
  // The shape, the header and a payload of exactly the valid rows (*payload: its bytes).
  Status CheckPayload(const ChunkShape& s, const uint8_t* src, size_t size, size_t* payload) const {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), 0, s, payload));
    if (*payload != ValidElems(s) * 2)
      return Status::Corruption("kv codec none: payload of " + std::to_string(*payload) + " bytes, expected " +
                                std::to_string(ValidElems(s) * 2));
    return Status::Ok();
  }
};

// Base for the two byte compressors: compresses the packed valid rows (gathered into thread-local
// scratch when the chunk is partial) and decompresses straight into dst, then scatters in place.
class ByteCodec : public KvCodec {
 public:
  bool lossless() const override { return true; }
  size_t MaxEncodedSize(const ChunkShape& s) const override {
    return ValidateShape(s).ok() ? kKvCodecHeaderBytes + Bound(ValidElems(s) * 2) : 0;
  }
  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    if (cap < MaxEncodedSize(s)) return Status::InvalidArgument(std::string("kv codec ") + name() + ": output buffer too small");
    const size_t n = ValidElems(s) * 2;
    const void* in = src;
    if (s.n_tokens != s.chunk_tokens) {
      uint16_t* packed = reinterpret_cast<uint16_t*>(Scratch(0, n));
      if (!packed) return Status::NoMemory("kv codec: scratch allocation failed");
      GatherValid(s, src, packed);
      in = packed;
    }
    size_t c = 0;
    MZ_RETURN_IF_ERROR(Compress(in, n, dst + kKvCodecHeaderBytes, cap - kKvCodecHeaderBytes, &c));
    WriteHeader(dst, id(), 0, s, uint32_t(c));
    *written = kKvCodecHeaderBytes + c;
    return Status::Ok();
  }
  Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), 0, s, &payload));
    const size_t n = ValidElems(s) * 2;
    MZ_RETURN_IF_ERROR(Decompress(src + kKvCodecHeaderBytes, payload, dst, n));
    ScatterValidInPlace(s, dst);
    return Status::Ok();
  }
  Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    if (s.n_tokens == s.chunk_tokens) return Decode(s, src, size, dst);  // every row is valid
    MZ_RETURN_IF_ERROR(ValidateShape(s));
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(CheckHeader(src, size, id(), 0, s, &payload));
    const size_t n = ValidElems(s) * 2;
    uint8_t* packed = Scratch(0, n);  // decompressed apart, so dst's invalid rows are never written
    if (!packed) return Status::NoMemory("kv codec: scratch allocation failed");
    MZ_RETURN_IF_ERROR(Decompress(src + kKvCodecHeaderBytes, payload, packed, n));
    ScatterValid(s, packed, dst);
    return Status::Ok();
  }

 protected:
  virtual size_t Bound(size_t n) const = 0;
  virtual Status Compress(const void* in, size_t n, uint8_t* out, size_t cap, size_t* written) const = 0;
  // Must produce exactly n bytes into out (capacity n) or fail with Corruption.
  virtual Status Decompress(const uint8_t* in, size_t size, void* out, size_t n) const = 0;
};

class Lz4Codec final : public ByteCodec {
 public:
  const char* name() const override { return "lz4"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kLz4); }

 protected:
  size_t Bound(size_t n) const override { return size_t(LZ4_compressBound(int(n))); }
  Status Compress(const void* in, size_t n, uint8_t* out, size_t cap, size_t* written) const override {
    const int r = LZ4_compress_default(static_cast<const char*>(in), reinterpret_cast<char*>(out), int(n),
                                       int(std::min(cap, size_t(INT32_MAX))));
    if (r <= 0) return Status::Internal("kv codec lz4: compression failed");
    *written = size_t(r);
    return Status::Ok();
  }
  Status Decompress(const uint8_t* in, size_t size, void* out, size_t n) const override {
    if (size > size_t(INT32_MAX)) return Status::Corruption("kv codec lz4: payload too large");
    const int r = LZ4_decompress_safe(reinterpret_cast<const char*>(in), static_cast<char*>(out), int(size), int(n));
    if (r < 0) return Status::Corruption("kv codec lz4: malformed LZ4 block");
    if (size_t(r) != n)
      return Status::Corruption("kv codec lz4: block decompresses to " + std::to_string(r) + " bytes, expected " +
                                std::to_string(n));
    return Status::Ok();
  }
};

class ZstdCodec final : public ByteCodec {
 public:
  const char* name() const override { return "zstd"; }
  uint8_t id() const override { return uint8_t(KvCodecId::kZstd); }

 protected:
  size_t Bound(size_t n) const override { return ZSTD_compressBound(n); }
  Status Compress(const void* in, size_t n, uint8_t* out, size_t cap, size_t* written) const override {
    return ZstdCompress(in, n, out, cap, kZstdLevel, written).With("kv codec zstd");
  }
  Status Decompress(const uint8_t* in, size_t size, void* out, size_t n) const override {
    return ZstdDecompressExact(in, size, out, n).With("kv codec zstd");
  }
};

}  // namespace

std::unique_ptr<KvCodec> MakeNoneCodec() { return std::make_unique<NoneCodec>(); }
std::unique_ptr<KvCodec> MakeLz4Codec() { return std::make_unique<Lz4Codec>(); }
std::unique_ptr<KvCodec> MakeZstdCodec() { return std::make_unique<ZstdCodec>(); }

// zstd helpers for cachegen (same thread-local contexts).
Status ZstdCompress(const void* in, size_t n, uint8_t* out, size_t cap, int level, size_t* written) {
  if (!tls_zstd.c && !(tls_zstd.c = ZSTD_createCCtx())) return Status::NoMemory("kv codec zstd: no context");
  const size_t r = ZSTD_compressCCtx(tls_zstd.c, out, cap, in, n, level);
  if (ZSTD_isError(r)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(r));
  *written = r;
  return Status::Ok();
}

Status ZstdDecompressExact(const uint8_t* in, size_t size, void* out, size_t n) {
  if (!tls_zstd.d && !(tls_zstd.d = ZSTD_createDCtx())) return Status::NoMemory("kv codec zstd: no context");
  const size_t r = ZSTD_decompressDCtx(tls_zstd.d, out, n, in, size);
  if (ZSTD_isError(r)) return Status::Corruption(std::string("malformed zstd frame: ") + ZSTD_getErrorName(r));
  if (r != n)
    return Status::Corruption("zstd frame decompresses to " + std::to_string(r) + " bytes, expected " +
                              std::to_string(n));
  return Status::Ok();
}

}  // namespace kvc

// ---------------------------------------------------------------------------------------------
// factory

std::unique_ptr<KvCodec> MakeKvCodecById(uint8_t id) {
  switch (KvCodecId(id)) {
    case KvCodecId::kNone: return kvc::MakeNoneCodec();
    case KvCodecId::kQ8: return kvc::MakeQ8Codec();
    case KvCodecId::kQ4: return kvc::MakeQ4Codec();
    case KvCodecId::kCacheGen: return kvc::MakeCacheGenCodec();
    case KvCodecId::kLz4: return kvc::MakeLz4Codec();
    case KvCodecId::kZstd: return kvc::MakeZstdCodec();
  }
  return nullptr;
}

const char* KvCodecName(uint8_t id) {
  static const char* const kNames[] = {"none", "q8", "q4", "cachegen", "lz4", "zstd"};
  return id < 6 ? kNames[id] : "unknown";
}

std::vector<std::string> KvCodecNames() {
  std::vector<std::string> v;
  for (uint8_t i = 0; i < 6; i++) v.emplace_back(KvCodecName(i));
  return v;
}

std::unique_ptr<KvCodec> MakeKvCodec(const std::string& name) {
  for (uint8_t i = 0; i < 6; i++)
    if (name == KvCodecName(i)) return MakeKvCodecById(i);
  return nullptr;
}

}  // namespace mz
