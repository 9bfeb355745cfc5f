// Fuzz target: what the swap path parses on read. A swapped-out KV chunk comes back as a codec
// blob (16-byte header + payload) read from the swap file (or the in-memory stack, or a session
// file) and decoded. Input layout:
//   byte 0     codec id (mod 6)
//   bytes 1-6  chunk shape: n_kv_head 1..4, head_dim 1..128, chunk_tokens 1..64, n_tokens
//              (mod chunk_tokens, +1), n_layer 1..4, layer 0..4 (may be out of range)
//   byte 7     bit 0: the harness writes a header valid for this shape and codec in front of the
//              payload (so the payload parsers are reached); bits 1-7: which bit of the blob to
//              flip on the swap file for the corruption check
//   rest       the blob (or the payload when bit 0 is set)
// Contracts checked (store/kv_codec.h): Decode never reads or writes out of bounds (ASan), an
// accepted lossy blob decodes to finite values only, rows past n_tokens decode as +0, and an
// accepted blob re-encodes, and for lossy codecs Encode(Decode(Encode(x))) == Encode(x). The blob
// also goes through a SwapFile (write, padded read, checksum) and a flipped bit is detected.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "env/env.h"
#include "fuzz_util.h"
#include "store/kv_codec.h"
#include "store/swap_file.h"

namespace {
std::unique_ptr<mz::KvCodec>* g_codecs = nullptr;
mz::SwapFile* g_swap = nullptr;

void Put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void Put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

bool Finite16(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

void SwapRoundTrip(const std::vector<uint8_t>& blob, unsigned flip) {
  if (blob.empty()) return;
  mz::SwapExtent e;
  mz::Status st = g_swap->Write(blob.data(), blob.size(), &e);
  if (!st.ok()) mz::fuzz::Fail("swap write: " + st.ToString());
  void* buf = std::aligned_alloc(mz::kDirectIoAlign, e.len);
  st = g_swap->ReadPadded(e, buf);
  if (!st.ok() || std::memcmp(buf, blob.data(), blob.size()) != 0) mz::fuzz::Fail("swap round trip: " + st.ToString());
  // One bit flipped on the file: the padded read must report corruption.
  const uint64_t at = flip % blob.size();
  uint8_t b = blob[at] ^ uint8_t(1u << (flip % 8));
  st = g_swap->file()->Write(&b, 1, e.off + at);
  if (!st.ok()) mz::fuzz::Fail("harness: flip write " + st.ToString());
  st = g_swap->ReadPadded(e, buf);
  if (st.code() != mz::Status::kCorruption) mz::fuzz::Fail("a flipped bit on the swap file went undetected");
  std::free(buf);
  g_swap->Free(e);
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_codecs = new std::unique_ptr<mz::KvCodec>[6];
  for (uint8_t i = 0; i < 6; ++i) g_codecs[i] = mz::MakeKvCodecById(i);
  std::unique_ptr<mz::SwapFile> sf;
  mz::Status st = mz::SwapFile::Create(mz::Env::Default(), mz::fuzz::ScratchPath("swap"), /*direct=*/false, &sf);
  if (!st.ok()) mz::fuzz::Fail("harness: swap file " + st.ToString());
  g_swap = sf.release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  const mz::KvCodec& codec = *g_codecs[data[0] % 6];
  mz::ChunkShape s;
  s.n_kv_head = 1 + data[1] % 4;
  s.head_dim = 1 + data[2] % 128;
  s.chunk_tokens = 1 + data[3] % 64;
  s.n_tokens = 1 + data[4] % s.chunk_tokens;
  s.n_layer = 1 + data[5] % 4;
  s.layer = data[6] % 5;
  const bool make_header = data[7] & 1;
  const unsigned flip = data[7] >> 1;
  data += 8;
  size -= 8;
  std::vector<uint8_t> blob;
  if (make_header) {
    blob.resize(mz::kKvCodecHeaderBytes);
    blob[0] = codec.id();
    blob[1] = mz::kKvCodecVersion;
    blob[2] = size ? data[0] % 16 : 0;  // cachegen's delta bit width; others must reject non-zero
    if (codec.id() != uint8_t(mz::KvCodecId::kCacheGen)) blob[2] = 0;
    blob[3] = 0;
    Put16(&blob[4], uint16_t(s.n_kv_head));
    Put16(&blob[6], uint16_t(s.head_dim));
    Put16(&blob[8], uint16_t(s.chunk_tokens));
    Put16(&blob[10], uint16_t(s.n_tokens));
    Put32(&blob[12], uint32_t(size));
  }
  blob.insert(blob.end(), data, data + size);

  SwapRoundTrip(blob, flip);

  // Exactly-sized buffers: ASan sees any read past the blob or write past the raw chunk.
  std::unique_ptr<uint8_t[]> src(new uint8_t[blob.size()]);
  if (!blob.empty()) std::memcpy(src.get(), blob.data(), blob.size());
  const size_t raw = s.raw_bytes();
  std::unique_ptr<uint16_t[]> dst(new uint16_t[raw / 2]);
  mz::Status st = codec.Decode(s, src.get(), blob.size(), dst.get());
  if (!st.ok()) {
    // A shape cachegen cannot take (layer outside [0, n_layer)) is the caller's error, not the blob's.
    const bool bad_shape = codec.id() == uint8_t(mz::KvCodecId::kCacheGen) && s.layer >= s.n_layer;
    if (st.code() != (bad_shape ? mz::Status::kInvalidArgument : mz::Status::kCorruption))
      mz::fuzz::Fail("Decode error is not " + std::string(bad_shape ? "kInvalidArgument" : "kCorruption") + ": " + st.ToString());
    return 0;
  }
  // Rows past n_tokens are +0; a lossy codec's values are finite.
  const size_t block = s.block_elems();
  for (size_t b = 0; b < 2; ++b)
    for (int h = 0; h < s.n_kv_head; ++h)
      for (int t = 0; t < s.chunk_tokens; ++t)
        for (int d = 0; d < s.head_dim; ++d) {
          const uint16_t v = dst[b * block + (size_t(h) * s.chunk_tokens + t) * s.head_dim + d];
          if (t >= s.n_tokens && v != 0) mz::fuzz::Fail(std::string(codec.name()) + ": row past n_tokens not zero");
          if (!codec.lossless() && !Finite16(v)) mz::fuzz::Fail(std::string(codec.name()) + ": decoded a non-finite value");
        }
  // Accepted blobs re-encode; lossy codecs are idempotent from there on.
  const size_t cap = codec.MaxEncodedSize(s);
  std::vector<uint8_t> e1(cap), e2(cap);
  size_t n1 = 0, n2 = 0;
  st = codec.Encode(s, dst.get(), e1.data(), cap, &n1);
  if (!st.ok()) mz::fuzz::Fail(std::string(codec.name()) + ": decoded chunk does not re-encode: " + st.ToString());
  if (codec.lossless()) return 0;
  std::unique_ptr<uint16_t[]> dec2(new uint16_t[raw / 2]);
  st = codec.Decode(s, e1.data(), n1, dec2.get());
  if (!st.ok()) mz::fuzz::Fail(std::string(codec.name()) + ": own blob does not decode: " + st.ToString());
  st = codec.Encode(s, dec2.get(), e2.data(), cap, &n2);
  if (!st.ok() || n1 != n2 || std::memcmp(e1.data(), e2.data(), n1) != 0)
    mz::fuzz::Fail(std::string(codec.name()) + ": Encode(Decode(Encode(x))) != Encode(x)");
  return 0;
}
