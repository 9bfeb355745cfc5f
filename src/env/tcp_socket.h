// The POSIX side of Env::ConnectTcp (env/env.h): a TCP connection with bounded waits, and its
// reads and writes (the remote tier's Redis connections, plain or under TLS: store/tls_stream.h
// runs TLS over this Socket). Only env_posix.cpp calls it; everything else connects through an
// Env, so that tests inject faults (FaultEnv::fail_connects_after, fail_socket_reads_after).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "env/env.h"

namespace mz {

// Env::ConnectTcp's contract: host (a name or an IP literal) resolved with getaddrinfo, every
// address tried in turn with a non-blocking connect waited for by poll (at most timeout_ms each);
// then blocking with SO_RCVTIMEO / SO_SNDTIMEO of timeout_ms, TCP_NODELAY, close-on-exec. Writes
// use MSG_NOSIGNAL (a closed peer is EPIPE, not SIGPIPE). kIOError naming host:port and the last
// address's cause.
Status ConnectTcpPosix(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out);

}  // namespace mz
