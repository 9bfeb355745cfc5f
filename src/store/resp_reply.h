// One reply of a Redis pipeline, read so that a bulk string (GET, GETRANGE: the remote tier's
// chunks) goes from the socket straight into its std::string. hiredis 0.14's own path
// (redisGetReply) reads 16 KiB per read(), appends every read to the reader's sds buffer (grown
// in 1 MiB steps past 1 MiB, so a 16 MiB value is reallocated and copied about 16 times), copies
// the finished bulk into a reply object, and the caller copied it once more: the remote tier's
// reads ran at 77-127 MB/s of a loopback Redis that serves 1.5 GB/s (session 35, docs/fleet.md).
// Every other reply (status, error, integer, nil, array) still goes through hiredis's reader.
// Only with hiredis (MZ_HAVE_HIREDIS): store/remote_kv.cpp's RedisKv uses it.
#pragma once
#if MZ_HAVE_HIREDIS
#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"

namespace mz {

struct RedisReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// A reply: a bulk string's bytes in `bulk` (reply null then), else hiredis's reply object.
struct RespReply {
  RedisReplyPtr reply;
  std::string bulk;
  bool is_bulk() const { return !reply; }
};

// Reads at most cap (>= 1) bytes into buf, at least 1: *got >= 1 on success; an error otherwise
// (kIOError: closed by the peer, timed out, reset). RedisKv's reads its connection's Env socket
// (Socket::ReadSome: plain TCP, or TLS's decrypted stream, store/tls_stream.h).
using RespSource = std::function<Status(char* buf, size_t cap, size_t* got)>;

// Bulk lengths above this are refused as malformed (Redis's own limit, proto-max-bulk-len, is
// 512 MiB by default).
constexpr uint64_t kRespMaxBulk = uint64_t(1) << 32;

// The next reply of the connection whose hiredis reader is r: from the bytes r holds first, then
// from src. A bulk string's header ("$<len>\r\n") is parsed here and its payload and CRLF are read
// from src into out->bulk in reads as large as what remains of it (the reader's buffer never holds
// more of it than came with an earlier read); any other reply is fed to r and parsed by hiredis
// (redisReaderFeed, redisReaderGetReply) in reads of up to 64 KiB. Bytes of later replies stay in
// r for the next call. Uses hiredis 0.14's public reader fields (buf, pos, len, ridx, rstack).
// Errors (the connection is then out of step: the caller must drop it): src's error; kIOError
// "malformed reply" (a bulk length that is not a number or above kRespMaxBulk, a payload not
// followed by CRLF, hiredis's protocol errors); kNoMemory when the payload cannot be allocated.
// *out is then unspecified. Not thread-safe: one caller per reader.
Status ReadRespReply(redisReader* r, const RespSource& src, RespReply* out);

}  // namespace mz
#endif  // MZ_HAVE_HIREDIS
