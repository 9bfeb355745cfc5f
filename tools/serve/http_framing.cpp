#include "tools/serve/http_framing.h"

#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <cerrno>

namespace mz::cli::serve_app {

std::string BadFraming(const httplib::Request& req) {
  const bool has_length = req.has_header("Content-Length"), has_te = req.has_header("Transfer-Encoding");
  if (has_length && has_te)
    return "a request with both Content-Length and Transfer-Encoding is refused (RFC 9112 6.1)";
  if (req.get_header_value_count("Content-Length") > 1) return "more than one Content-Length header";
  if (has_length) {
    const std::string v = req.get_header_value("Content-Length");
    if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos)
      return "Content-Length must be a non-negative decimal number";
  }
  if (has_te && strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0)
    return "the only Transfer-Encoding accepted is chunked";
  return "";
}

}  // namespace mz::cli::serve_app

// Half-close. httplib 0.11.4 asks is_socket_alive(sock) before every write (SocketStream::write
// and is_writable), and its answer is "no" as soon as a read would return end of file: a client
// that sent its whole request and then shut down its writing side (shutdown(SHUT_WR), `nc -N`)
// never gets the response it waits for, although the turn is computed. The library calls this
// function through its PLT, so the definition below, in the executable, replaces the library's
// (ELF symbol interposition; the executable exports it because the library references it).
// End of file only means the peer sends nothing more; it may still read. A socket is dead when
// it has an error (a reset: the peer closed it and refused data, or the write fails with EPIPE),
// which is what the next write after a real close meets: a client that disconnects mid-stream is
// still noticed, one chunk later than before (the write after the first unanswered one).
// If a later httplib stops calling it through the PLT, tests/serve_abuse.py's half_close case
// fails. It applies to the whole executable: an httplib::Client in mzcache (there is none) would
// no longer see that a kept-alive connection was closed by its server before reusing it.
namespace httplib::detail {
bool is_socket_alive(int sock);
bool is_socket_alive(int sock) {
  pollfd p{sock, POLLIN, 0};
  const int n = poll(&p, 1, 0);
  if (n < 0) return errno != EBADF;
  if (n == 0) return true;  // nothing to read, no error
  if (p.revents & (POLLERR | POLLNVAL | POLLHUP)) return false;  // POLLHUP: reset, or closed both ways
  char c;
  const ssize_t r = recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r >= 0) return true;  // data, or end of file: the peer may still read
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}
}  // namespace httplib::detail
