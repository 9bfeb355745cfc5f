#include "env/tcp_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace mz {
namespace tcp_socket {

class PosixSocket final : public Socket {
 public:
  PosixSocket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  ~PosixSocket() override { ::close(fd_); }

  Status WriteAll(const void* buf, size_t n) override {
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
      const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= size_t(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::IOError("timed out sending to " + peer_);
      return Status::IOError("sending to " + peer_ + ": " + (w < 0 ? std::strerror(errno) : "nothing sent"));
    }
    return Status::Ok();
  }

  Status ReadSome(void* buf, size_t cap, size_t* got) override {
    *got = 0;
    while (true) {
      const ssize_t n = ::recv(fd_, buf, cap, 0);
      if (n > 0) {
        *got = size_t(n);
        return Status::Ok();
      }
      if (n == 0) return Status::IOError("the server closed the connection");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::IOError("timed out waiting for a reply");
      return Status::IOError(std::string("reading a reply: ") + std::strerror(errno));
    }
  }

  const std::string& peer() const override { return peer_; }

 private:
  int fd_;
  std::string peer_;
};

// One address: a non-blocking connect waited for at most timeout_ms, then blocking with timeouts.
// The connected descriptor, or -1 with *why set.
int ConnectOne(const addrinfo* a, uint32_t timeout_ms, std::string* why) {
  const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
  if (fd < 0) {
    *why = std::strerror(errno);
    return -1;
  }
  int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
  if (r != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    do r = ::poll(&p, 1, int(timeout_ms));
    while (r < 0 && errno == EINTR);
    if (r == 0) {
      *why = "timed out connecting";
      ::close(fd);
      return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (r < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    r = err ? -1 : 0;
    errno = err;
  }
  if (r != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  timeval tv{time_t(timeout_ms / 1000), suseconds_t((timeout_ms % 1000) * 1000)};
  const int one = 1;
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace tcp_socket

Status ConnectTcpPosix(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) {
  out->reset();
  const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  if (timeout_ms == 0) return Status::InvalidArgument("connecting to " + where + ": the timeout must be > 0");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string ps = std::to_string(port);
  const int g = ::getaddrinfo(host.c_str(), ps.c_str(), &hints, &res);
  if (g != 0) return Status::IOError("connecting to " + where + ": " + ::gai_strerror(g));
  std::string why = "no address";
  int fd = -1;
  for (const addrinfo* a = res; a && fd < 0; a = a->ai_next) fd = tcp_socket::ConnectOne(a, timeout_ms, &why);
  ::freeaddrinfo(res);
  if (fd < 0) return Status::IOError("connecting to " + where + ": " + why);
  out->reset(new tcp_socket::PosixSocket(fd, where));
  return Status::Ok();
}

}  // namespace mz
