#include "store/resp_reply.h"

#if MZ_HAVE_HIREDIS
#include <hiredis/sds.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace mz {
namespace resp_reply {

constexpr size_t kFeedBytes = 64 << 10;  // one read for hiredis's reader
constexpr size_t kMaxHeader = 16;        // "$" + 12 digits (kRespMaxBulk has 10) + CRLF, with room

size_t Pending(const redisReader* r) { return r->len - r->pos; }

// n bytes of r's buffer taken by the caller: the cursor moves; an emptied buffer is reset, a
// long-consumed prefix dropped (as hiredis's redisReaderGetReply does), so it never grows with
// the bytes that passed through it. (sds.h's inline sdssetlen only: hiredis 0.14 declares its
// other sds functions without C linkage for C++.)
void Consume(redisReader* r, size_t n) {
  r->pos += n;
  const size_t rest = r->len - r->pos;
  if (rest == 0 || r->pos >= kFeedBytes) {
    std::memmove(r->buf, r->buf + r->pos, rest);
    sdssetlen(r->buf, rest);
    r->buf[rest] = '\0';
    r->pos = 0;
    r->len = rest;
  }
}

// One read of up to kFeedBytes from src, appended to r's buffer.
Status Feed(redisReader* r, const RespSource& src) {
  char buf[kFeedBytes];
  size_t got = 0;
  MZ_RETURN_IF_ERROR(src(buf, sizeof buf, &got));
  if (redisReaderFeed(r, buf, got) != REDIS_OK) return Status::NoMemory("a Redis reply buffer");
  return Status::Ok();
}

// At a reply boundary: no reply started in r (hiredis sets rstack[0].type -1 when it was asked
// for one with no bytes yet).
bool AtBoundary(const redisReader* r) { return r->ridx == -1 || (r->ridx == 0 && r->rstack[0].type < 0); }

Status Malformed(const std::string& why) { return Status::IOError("malformed Redis reply: " + why); }

// The bulk string whose header is at r's cursor (complete: hdr bytes, CRLF included), of len bytes.
Status ReadBulk(redisReader* r, const RespSource& src, size_t hdr, uint64_t len, RespReply* out) {
  const size_t total = size_t(len) + 2;  // the payload and its CRLF
  try {
    out->bulk.resize(total);
  } catch (const std::bad_alloc&) {
    return Status::NoMemory("a Redis reply of " + std::to_string(len) + " bytes");
  }
  const size_t take = std::min(Pending(r) - hdr, total);
  std::memcpy(out->bulk.data(), r->buf + r->pos + hdr, take);
  Consume(r, hdr + take);
  for (size_t have = take; have < total;) {
    size_t got = 0;
    MZ_RETURN_IF_ERROR(src(out->bulk.data() + have, total - have, &got));
    have += got;
  }
  if (out->bulk[total - 2] != '\r' || out->bulk[total - 1] != '\n')
    return Malformed("a bulk string of " + std::to_string(len) + " bytes not followed by CRLF");
  out->bulk.resize(size_t(len));
  return Status::Ok();
}

}  // namespace resp_reply

Status ReadRespReply(redisReader* r, const RespSource& src, RespReply* out) {
  using namespace resp_reply;
  out->reply.reset();
  out->bulk.clear();
  while (true) {
    if (Pending(r) == 0) {
      MZ_RETURN_IF_ERROR(Feed(r, src));
      continue;
    }
    const char* p = r->buf + r->pos;
    if (AtBoundary(r) && p[0] == '$') {
      const size_t n = std::min(Pending(r), kMaxHeader);
      const char* cr = static_cast<const char*>(std::memchr(p, '\r', n));
      if (!cr || size_t(cr - p) + 1 >= n) {  // no complete "\r\n" yet
        if (n == kMaxHeader) return Malformed("a bulk string's length line is too long");
        MZ_RETURN_IF_ERROR(Feed(r, src));
        continue;
      }
      if (cr[1] != '\n') return Malformed("a bulk string's length line does not end in CRLF");
      if (cr - p == 3 && p[1] == '-' && p[2] == '1') {
        // nil: hiredis makes its reply object (below)
      } else {
        if (cr - p < 2) return Malformed("a bulk string without a length");
        uint64_t len = 0;
        for (const char* d = p + 1; d < cr; ++d) {
          if (*d < '0' || *d > '9') return Malformed("a bulk string's length is not a number");
          len = len * 10 + uint64_t(*d - '0');
        }
        if (len > kRespMaxBulk) return Malformed("a bulk string of " + std::to_string(len) + " bytes");
        return ReadBulk(r, src, size_t(cr - p) + 2, len, out);
      }
    }
    void* reply = nullptr;
    if (redisReaderGetReply(r, &reply) != REDIS_OK) return Malformed(r->errstr);
    if (reply) {
      out->reply.reset(static_cast<redisReply*>(reply));
      return Status::Ok();
    }
    MZ_RETURN_IF_ERROR(Feed(r, src));
  }
}

}  // namespace mz
#endif  // MZ_HAVE_HIREDIS
