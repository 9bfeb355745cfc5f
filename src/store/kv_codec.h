// KvCodec: pluggable encoders for evicted KV chunks (the in-memory / on-disk swap of mzCache).
//
// A KV chunk is one layer's K and V for `chunk_tokens` tokens, exactly as KvCache stores it: the K
// block followed by the V block, each head-major [n_kv_head][chunk_tokens][head_dim] IEEE fp16
// (uint16_t bits). Only the first n_tokens token rows of every head are valid; encoders never read
// rows past n_tokens and decoders write them as zero (+0.0).
//
// Every encoded blob starts with the same 16-byte little-endian header:
//   off size field
//     0    1 codec id (KvCodec::id())
//     1    1 format version (kKvCodecVersion; decoders reject any other value)
//     2    1 codec parameter (cachegen: delta bit width; 0 for every other codec)
//     3    1 reserved, 0
//     4    2 n_kv_head
//     6    2 head_dim
//     8    2 chunk_tokens
//    10    2 n_tokens
//    12    4 payload bytes (the blob is exactly 16 + payload bytes long)
// followed by the codec's payload (formats documented in each codec's .cpp file). Decode validates
// every header field against the ChunkShape it is given and returns Status::Corruption on any
// mismatch, so a blob is only ever decoded into the geometry it was made from.
//
// Codecs: "none"(0) raw valid rows, "q8"(1) int8 per token row (default), "q4"(2) KIVI-style 4-bit
// (keys per channel, values per token), "cachegen"(3) anchor + layer-aware delta quantization +
// zstd, "lz4"(4) and "zstd"(5) lossless byte compressors of the raw fp16 rows.
//
// Lossy codecs (q8, q4, cachegen) first map inputs to finite values deterministically: NaN -> +0,
// +-inf -> +-65504, -0 -> +0. They are idempotent: Encode(Decode(Encode(x))) is byte-identical to
// Encode(x), so repeated swap-out / swap-in cycles never accumulate error, and they decode any
// payload (even a corrupted one that passes the structural checks) to finite values only.
// Lossless codecs round-trip the valid rows bit-exactly (NaN payloads included).
//
// Integrity: codecs detect structural corruption (bad header, wrong size, malformed compressed
// stream, out-of-range parameters); they do not checksum payload bytes, that is the container's
// job (swap file / session headers).
//
// Buffers: src and dst of a call must not overlap; no alignment is required of any of them. Encode
// writes only [dst, dst + MaxEncodedSize(s)), Decode only [dst, dst + raw_bytes()).
//
// SIMD: the hot loops use AVX2/F16C/FMA when the build enables them (MZ_AVX2); every SIMD kernel
// has a scalar twin computing the same IEEE operations, so blobs and decoded chunks are
// bit-identical whichever path made them.
//
// Thread-safety: codec objects are immutable; Encode/Decode/MaxEncodedSize may run concurrently on
// one object from any number of threads. Codecs that need scratch memory or zstd contexts keep them
// thread_local (allocated on a thread's first use, grown to the largest chunk seen, freed at thread
// exit), so steady-state calls do not allocate.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace mz {

struct ChunkShape {
  int n_kv_head = 0, chunk_tokens = 0, head_dim = 0;
  int n_tokens = 0;          // valid token rows (1..chunk_tokens)
  int layer = 0, n_layer = 0;  // for layer-aware codecs (cachegen needs 0 <= layer < n_layer)
  // Raw chunk size in bytes: K and V blocks of n_kv_head * chunk_tokens * head_dim fp16 each.
  size_t raw_bytes() const { return 2 * size_t(n_kv_head) * size_t(chunk_tokens) * size_t(head_dim) * 2; }
  // Elements of one block (K or V).
  size_t block_elems() const { return size_t(n_kv_head) * size_t(chunk_tokens) * size_t(head_dim); }
};

// Encoded header size and format version (see the table above).
inline constexpr size_t kKvCodecHeaderBytes = 16;
inline constexpr uint8_t kKvCodecVersion = 1;

// Stable codec ids (stored in swap / session headers; never renumber).
enum class KvCodecId : uint8_t { kNone = 0, kQ8 = 1, kQ4 = 2, kCacheGen = 3, kLz4 = 4, kZstd = 5 };

class KvCodec {
 public:
  virtual ~KvCodec() = default;
  virtual const char* name() const = 0;  // "none", "q8", "q4", "cachegen", "lz4", "zstd"
  virtual uint8_t id() const = 0;         // none=0, q8=1, q4=2, cachegen=3, lz4=4, zstd=5
  virtual bool lossless() const = 0;
  // The attention kernel reads this codec's payload in place (kernels/attention.h,
  // KvLayerView::q8_chunks), so a chunk held compressed need not be decoded before compute: q8 only.
  // The one predicate for it (UnitTable, the policy's restore paths, `mzcache profile`).
  virtual bool attention_reads_in_place() const { return false; }
  // Upper bound of the encoded size (header included) for ANY input of shape s; 0 if s is invalid.
  // q8, q4 and none always produce exactly this many bytes. Non-decreasing in n_tokens (and
  // independent of layer), so the bound for a full chunk covers every partial chunk of the geometry.
  virtual size_t MaxEncodedSize(const ChunkShape& s) const = 0;
  // Encodes src (a raw chunk of s.raw_bytes(); only the valid rows are read) into dst.
  // kInvalidArgument if s is invalid (dims < 1 or > 65535, n_tokens outside 1..chunk_tokens,
  // raw_bytes() > 1 GiB, cachegen layer outside [0, n_layer)) or cap < MaxEncodedSize(s).
  // On success *written is the blob size. Thread-safe.
  virtual Status Encode(const ChunkShape& s, const uint16_t* src, uint8_t* dst, size_t cap,
                        size_t* written) const = 0;
  // Decodes exactly `size` bytes from src into dst (s.raw_bytes(); invalid rows zero-filled).
  // Malformed or truncated input, or a blob made for another shape / codec, returns
  // Status::Corruption with a message saying what is wrong; never reads src past size or dst past
  // raw_bytes(). On error dst contents are unspecified. Thread-safe.
  virtual Status Decode(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const = 0;
  // Decode that writes only the valid rows: every byte of dst outside the first n_tokens rows of
  // each head (of both blocks) is left as it was, never written (a page holding only invalid rows
  // is never touched). Into memory whose invalid rows read as zero (a fresh anonymous mapping) the
  // chunk is Decode's, bit for bit: what a restore of a partial chunk uses, so its cost follows
  // n_tokens rather than chunk_tokens. Same checks, errors, buffers and thread-safety as Decode.
  virtual Status DecodeValid(const ChunkShape& s, const uint8_t* src, size_t size, uint16_t* dst) const = 0;
};

std::unique_ptr<KvCodec> MakeKvCodec(const std::string& name);  // nullptr if unknown
std::unique_ptr<KvCodec> MakeKvCodecById(uint8_t id);            // nullptr if unknown
std::vector<std::string> KvCodecNames();                          // in id order
// Name of a codec id or "unknown" (for messages).
const char* KvCodecName(uint8_t id);

}  // namespace mz
