#include "env/socket_read.h"

#include <errno.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace mz {

Status ReadSocket(int fd, char* buf, size_t cap, size_t* got) {
  *got = 0;
  while (true) {
    const ssize_t n = ::read(fd, buf, cap);
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

}  // namespace mz
