#include "store/q8_kv.h"

#include <cstring>
#include <vector>

#include "store/codecs_internal.h"

namespace mz {

const char* KvTypeName(KvType t) {
  switch (t) {
    case KvType::kF16: return "f16";
    case KvType::kQ8: return "q8_0";
  }
  return "unknown";
}

bool ParseKvType(const std::string& s, KvType* out) {
  if (s == "f16") *out = KvType::kF16;
  else if (s == "q8_0" || s == "q8") *out = KvType::kQ8;
  else return false;
  return true;
}

uint64_t KvChunkBytes(KvType t, int n_kv_head, int chunk_tokens, int head_dim) {
  if (t == KvType::kQ8) return q8_payload_bytes(n_kv_head, chunk_tokens, head_dim);
  return 2ull * uint64_t(n_kv_head) * uint64_t(chunk_tokens) * uint64_t(head_dim) * 2;
}

namespace {
float* RowScratch(int n) {
  thread_local std::vector<float> x;
  if (int(x.size()) < n) x.resize(size_t(n));
  return x.data();
}
}  // namespace

void Q8KvEncodeRow(const uint16_t* row, int head_dim, int8_t* codes, uint8_t* amax_le) {
  float* x = RowScratch(head_dim);
  kvc::LoadSanitized(row, head_dim, x);
  q8_store_amax(amax_le, kvc::Q8EncodeRow(x, head_dim, codes));
}

void Q8KvToF16(const ChunkShape& s, const uint8_t* q8, uint16_t* f16) {
  const int T = s.chunk_tokens, D = s.head_dim, n = s.n_tokens;
  for (int j = 0; j < 2 * s.n_kv_head; ++j) {
    const uint8_t* seg = q8_segment(q8, T, D, j);
    uint16_t* out = f16 + size_t(j) * T * D;
    for (int t = 0; t < n; ++t)
      kvc::Q8DecodeRowSimd(q8_row_codes(seg, T, D, t), D, q8_load_amax(q8_row_amax(seg, t)), out + size_t(t) * D);
  }
  kvc::ZeroInvalidRows(s, f16);
}

void Q8KvFromF16(const ChunkShape& s, const uint16_t* f16, uint8_t* q8, bool zero_invalid) {
  const int T = s.chunk_tokens, D = s.head_dim, n = s.n_tokens;
  for (int j = 0; j < 2 * s.n_kv_head; ++j) {
    uint8_t* seg = q8_segment(q8, T, D, j);
    const uint16_t* in = f16 + size_t(j) * T * D;
    for (int t = 0; t < n; ++t) Q8KvEncodeRow(in + size_t(t) * D, D, q8_row_codes(seg, T, D, t), q8_row_amax(seg, t));
    if (!zero_invalid) continue;
    std::memset(q8_row_amax(seg, n), 0, 2 * size_t(T - n));
    std::memset(q8_row_codes(seg, T, D, n), 0, size_t(T - n) * D);
  }
}

namespace {

// One fp16 chunk per thread for the conversions (grown to the largest chunk seen).
uint16_t* F16Scratch(size_t bytes) {
  thread_local std::vector<uint16_t> buf;
  if (buf.size() * 2 < bytes) buf.resize((bytes + 1) / 2);
  return buf.data();
}

// The codec of a q8 KV context (see q8_kv.h): chunks in and out are resident q8 chunks.
class Q8KvCodec final : public KvCodec {
 public:
  explicit Q8KvCodec(std::unique_ptr<KvCodec> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  uint8_t id() const override { return inner_->id(); }
  bool lossless() const override { return inner_->lossless() || identity(); }
  bool attention_reads_in_place() const override { return inner_->attention_reads_in_place(); }
  size_t MaxEncodedSize(const ChunkShape& s) const override { return inner_->MaxEncodedSize(s); }

  Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap, size_t* written) const override {
    const uint8_t* q8 = reinterpret_cast<const uint8_t*>(src);
    if (!identity()) {
      MZ_RETURN_IF_ERROR(kvc::ValidateShape(s));
      uint16_t* f16 = F16Scratch(s.raw_bytes());
      Q8KvToF16(s, q8, f16);
      return inner_->Encode(s, f16, dst, cap, written);
    }
    size_t need = 0;
    MZ_RETURN_IF_ERROR(kvc::CheckEncodeArgs(*this, s, cap, &need));
    kvc::WriteHeader(dst, id(), 0, s, uint32_t(need - kKvCodecHeaderBytes));
    uint8_t* payload = dst + kKvCodecHeaderBytes;
    const int T = s.chunk_tokens, D = s.head_dim, n = s.n_tokens;
    for (int j = 0; j < 2 * s.n_kv_head; ++j) {
      const uint8_t* in = q8_segment(q8, T, D, j);
      uint8_t* out = q8_segment(payload, n, D, j);
      std::memcpy(q8_row_amax(out, 0), q8_row_amax(in, 0), 2 * size_t(n));
      std::memcpy(q8_row_codes(out, n, D, 0), q8_row_codes(in, T, D, 0), size_t(n) * D);
    }
    *written = need;
    return Status::Ok();
  }

  Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    return DecodeImpl(s, src, size, dst, true);
  }
  // Only the valid rows' amax and codes are written; the fp16 scratch's invalid rows are never
  // read or written (the inner codec's DecodeValid, then the conversion of the valid rows).
  Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const override {
    return DecodeImpl(s, src, size, dst, false);
  }

 private:
  Status DecodeImpl(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst, bool zero_invalid) const {
    uint8_t* q8 = reinterpret_cast<uint8_t*>(dst);
    if (!identity()) {
      MZ_RETURN_IF_ERROR(kvc::ValidateShape(s).With("decoding"));
      uint16_t* f16 = F16Scratch(s.raw_bytes());
      MZ_RETURN_IF_ERROR(zero_invalid ? inner_->Decode(s, src, size, f16) : inner_->DecodeValid(s, src, size, f16));
      Q8KvFromF16(s, f16, q8, zero_invalid);
      return Status::Ok();
    }
    Status v = kvc::ValidateShape(s);
    if (!v.ok()) return Status::Corruption(v.message());
    size_t payload = 0;
    MZ_RETURN_IF_ERROR(kvc::CheckHeader(src, size, id(), 0, s, &payload));
    const int T = s.chunk_tokens, D = s.head_dim, n = s.n_tokens;
    if (payload != q8_payload_bytes(s.n_kv_head, n, D))
      return Status::Corruption("kv codec q8: payload of " + std::to_string(payload) + " bytes, expected " +
                                std::to_string(q8_payload_bytes(s.n_kv_head, n, D)));
    const uint8_t* body = src + kKvCodecHeaderBytes;
    for (int j = 0; j < 2 * s.n_kv_head; ++j) {
      const uint8_t* in = q8_segment(body, n, D, j);
      for (int t = 0; t < n; ++t) {
        const uint16_t hb = q8_load_amax(q8_row_amax(in, t));
        if (hb > 0x7bffu)
          return Status::Corruption("kv codec q8: bad row max (fp16 bits " + std::to_string(hb) + ", segment " +
                                    std::to_string(j) + ", row " + std::to_string(t) + ")");
      }
    }
    for (int j = 0; j < 2 * s.n_kv_head; ++j) {
      const uint8_t* in = q8_segment(body, n, D, j);
      uint8_t* out = q8_segment(q8, T, D, j);
      std::memcpy(q8_row_amax(out, 0), q8_row_amax(in, 0), 2 * size_t(n));
      std::memcpy(q8_row_codes(out, T, D, 0), q8_row_codes(in, n, D, 0), size_t(n) * D);
      if (!zero_invalid) continue;
      std::memset(q8_row_amax(out, n), 0, 2 * size_t(T - n));
      std::memset(q8_row_codes(out, T, D, n), 0, size_t(T - n) * D);
    }
    return Status::Ok();
  }

  bool identity() const { return inner_->id() == uint8_t(KvCodecId::kQ8); }
  std::unique_ptr<KvCodec> inner_;
};

std::unique_ptr<KvCodec> Wrap(KvType t, std::unique_ptr<KvCodec> c) {
  if (!c || t == KvType::kF16) return c;
  return std::make_unique<Q8KvCodec>(std::move(c));
}

}  // namespace

std::unique_ptr<KvCodec> MakeKvCodecFor(KvType t, const std::string& name) { return Wrap(t, MakeKvCodec(name)); }
std::unique_ptr<KvCodec> MakeKvCodecByIdFor(KvType t, uint8_t id) { return Wrap(t, MakeKvCodecById(id)); }

}  // namespace mz
