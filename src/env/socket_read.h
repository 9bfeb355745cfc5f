// One blocking read(2) from a connected socket that another library owns (hiredis's Redis
// connection), for readers that parse its byte stream themselves (store/resp_reply). The socket's
// own receive timeout (SO_RCVTIMEO) bounds the wait. This is the only place outside the Env that
// reads a socket: the stream is not a file the Env fakes; tests fake it one level up (RespSource).
#pragma once
#include <cstddef>

#include "core/status.h"

namespace mz {

// Reads at most cap bytes (cap > 0) into buf; *got = bytes read (> 0 on success). Errors, as
// kIOError naming the cause: the peer closed the connection, the receive timeout expired, or the
// OS error. EINTR is retried.
Status ReadSocket(int fd, char* buf, size_t cap, size_t* got);

}  // namespace mz
