// Live q8 KV ("q8_0" KV type): a context whose resident KV chunks are q8 blocks, written as tokens
// are produced and read in place by the attention kernel, so resident KV takes about half the
// memory of fp16 KV (2 * n_kv_head * (2 + head_dim) bytes per token and layer instead of
// 2 * n_kv_head * head_dim * 2).
//
// Resident q8 chunk: one allocation laid out as the q8 codec's payload (kernels/q8_block.h) with
// rows = chunk_tokens (its capacity), i.e. 2 * n_kv_head segments (K heads, then V heads), each
// amax[chunk_tokens] (fp16) then code[chunk_tokens][head_dim] (int8). Rows >= the valid token count
// hold zeros or stale rows of a truncated context; nothing reads them (the kernel reads rows below
// n_kv only, the codecs below the shape's n_tokens only).
//
// Row arithmetic: a new K or V row (f32 from the graph) is first rounded to fp16 exactly as the fp16
// KV path stores it, then encoded as the q8 codec encodes an fp16 row (sanitize, amax, codes). So a
// q8 chunk holds byte for byte what the q8 codec makes of the fp16 chunk an fp16 context would have
// written from the same K/V values.
//
// KvCodec over q8 chunks (MakeKvCodecFor): the UnitTable and session files hand codecs the chunk in
// its resident form. For a q8 context they use an adapter with the inner codec's name, id, blob
// format and MaxEncodedSize:
//   q8 (the identity): Encode copies the valid rows into the q8 codec blob (rows = n_tokens), no
//     arithmetic; Decode checks the blob as the q8 codec does and copies its rows back. The blob is
//     byte-identical to the q8 codec's encoding of the fp16 decode of the chunk (q8 is idempotent).
//   none / lz4 / zstd (lossless): the chunk is decoded to fp16 (the q8 decode), encoded by the inner
//     codec; Decode decodes to fp16 and re-encodes q8. Exact: q8 re-encoding a decoded row gives
//     the same bytes, so an evicted and restored chunk equals the chunk before.
//   q4 / cachegen (lossy): the same conversion; the restored chunk is the q8 encoding of the lossy
//     codec's output (the q4 / cachegen error on top of the q8 error).
// Blobs are the ordinary codec blobs either way, so a session or swap blob does not depend on the
// KV type of the context that wrote it: loading a session into a context of the other KV type
// converts (an fp16 context gets the q8 decode; a q8 context the q8 encoding of the fp16 rows).
//
// Thread-safety: stateless functions; the adapter is immutable and keeps thread_local scratch (one
// fp16 chunk, allocated on a thread's first use), like the codecs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "store/kv_codec.h"

namespace mz {

// The KV type of a context's resident chunks (stable values: the C API's MZ_KV_* and session headers).
enum class KvType : uint8_t { kF16 = 0, kQ8 = 1 };

// "f16" / "q8_0" ("unknown" otherwise).
const char* KvTypeName(KvType t);
// "f16" or "q8_0" (also "q8"); false for anything else.
bool ParseKvType(const std::string& s, KvType* out);

// Bytes of one resident chunk (K and V) of the given type and geometry.
uint64_t KvChunkBytes(KvType t, int n_kv_head, int chunk_tokens, int head_dim);

// Encodes one row of head_dim fp16 values (bits) as the q8 codec does: writes head_dim codes and
// the row's amax (fp16 little-endian, 2 bytes at amax_le). Thread-safe.
void Q8KvEncodeRow(const uint16_t* row, int head_dim, int8_t* codes, uint8_t* amax_le);

// Decodes rows [0, s.n_tokens) of every segment of a resident q8 chunk (rows = s.chunk_tokens) into
// the fp16 chunk layout (s.raw_bytes()); rows past n_tokens are written as zero. REQUIRES every valid
// row's amax is a finite non-negative fp16 (the process wrote it).
void Q8KvToF16(const ChunkShape& s, const uint8_t* q8, uint16_t* f16);
// Encodes rows [0, s.n_tokens) of an fp16 chunk into a resident q8 chunk; rows past n_tokens are
// zero (amax 0, codes 0), or with zero_invalid false left as they are (never written). Reads only
// the valid rows of f16.
void Q8KvFromF16(const ChunkShape& s, const uint16_t* f16, uint8_t* q8, bool zero_invalid = true);

// The codec `name` for chunks of KV type t: the plain codec for kF16, the adapter described above
// for kQ8 (Encode's src and Decode's dst are then resident q8 chunks of KvChunkBytes bytes, passed
// as uint16_t* as the UnitTable holds every chunk). nullptr if the name / id is unknown.
std::unique_ptr<KvCodec> MakeKvCodecFor(KvType t, const std::string& name);
std::unique_ptr<KvCodec> MakeKvCodecByIdFor(KvType t, uint8_t id);

}  // namespace mz
