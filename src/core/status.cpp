#include "core/status.h"

#include <cerrno>
#include <cstring>

namespace mz {

Status Status::FromErrno(int err, const std::string& what) {
  std::string m = what + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT: return NoSpace(m);
    case ENOMEM: return NoMemory(m);
    case EINVAL: return IOError(m);
    default: return IOError(m);
  }
}

const char* StatusCodeName(Status::Code c) {
  switch (c) {
    case Status::kOk: return "ok";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kIOError: return "I/O error";
    case Status::kCorruption: return "corrupt data";
    case Status::kUnsupported: return "unsupported";
    case Status::kNoMemory: return "out of memory";
    case Status::kNoSpace: return "no space left";
    case Status::kBusy: return "busy";
    case Status::kContextFull: return "context full";
    case Status::kModelChanged: return "model file changed";
    case Status::kTimeout: return "timed out";
    case Status::kCancelled: return "cancelled";
    case Status::kInternal: return "internal error";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code_)) + ": " + msg_;
}

}  // namespace mz
