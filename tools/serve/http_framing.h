// What Debian's cpp-httplib 0.11.4 (a compiled library: libcpp-httplib.so.0.11) gets wrong about
// HTTP/1.1 message framing, and the server's answers to it (issue 46). Thread-safe: pure functions.
//   - Content-Length that is not a plain decimal number (negative, signs, junk): httplib parses it
//     with strtoull, so "-5" becomes 2^64-5, it then waits the read timeout for that many bytes
//     and answers 413. BadFraming refuses it with 400 before any body is read.
//   - Content-Length together with Transfer-Encoding (request smuggling's shape, RFC 9112 6.1:
//     a server MAY reject it and MUST close the connection after): httplib reads the chunks and
//     ignores the length. BadFraming refuses it with 400.
//   - pipelined requests: httplib reads a request through a 4 KiB buffer that it throws away with
//     the request, so a second request sent before the first's response is lost and the
//     connection waits the keep-alive timeout. It cannot be fixed from outside the library: the
//     server answers one request per connection instead (set_keep_alive_max_count(1): every
//     response says "Connection: close" and the connection closes right after it), which RFC 9112
//     9.3.2 allows and which tells a pipelining client to send the rest again.
//   - half-close: see http_framing.cpp (httplib::detail::is_socket_alive is replaced).
#pragma once

#include <httplib.h>

#include <string>

namespace mz::cli::serve_app {

// Checks the request's framing headers before its body is read (httplib's pre-routing handler
// runs before it). "" if they are fine, else the 400's message. Never throws.
std::string BadFraming(const httplib::Request& req);

}  // namespace mz::cli::serve_app
