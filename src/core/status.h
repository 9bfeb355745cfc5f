// Status: the error value every internal operation returns (LevelDB style). No exceptions cross
// subsystem boundaries; the C API maps Code to mz_status.
#pragma once
#include <string>
#include <utility>

namespace mz {

class Status {
 public:
  // Values mirror enum mz_status in include/mzcache.h.
  enum Code : int {
    kOk = 0,
    kInvalidArgument = -1,
    kIOError = -2,
    kCorruption = -3,
    kUnsupported = -4,
    kNoMemory = -5,
    kNoSpace = -6,
    kBusy = -7,
    kContextFull = -8,
    kModelChanged = -9,
    kTimeout = -10,     // a bounded wait ended with nothing to report (not a failure by itself)
    kCancelled = -11,   // the operation was stopped by its owner (e.g. PressureSource::Stop)
    kInternal = -100,
  };

  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(kInvalidArgument, std::move(m)); }
  static Status IOError(std::string m) { return Status(kIOError, std::move(m)); }
  static Status Corruption(std::string m) { return Status(kCorruption, std::move(m)); }
  static Status Unsupported(std::string m) { return Status(kUnsupported, std::move(m)); }
  static Status NoMemory(std::string m) { return Status(kNoMemory, std::move(m)); }
  static Status NoSpace(std::string m) { return Status(kNoSpace, std::move(m)); }
  static Status Busy(std::string m) { return Status(kBusy, std::move(m)); }
  static Status ContextFull(std::string m) { return Status(kContextFull, std::move(m)); }
  static Status ModelChanged(std::string m) { return Status(kModelChanged, std::move(m)); }
  static Status Timeout(std::string m) { return Status(kTimeout, std::move(m)); }
  static Status Cancelled(std::string m) { return Status(kCancelled, std::move(m)); }
  static Status Internal(std::string m) { return Status(kInternal, std::move(m)); }
  // errno-derived I/O status: ENOSPC/EDQUOT become kNoSpace, ENOMEM kNoMemory, the rest kIOError.
  static Status FromErrno(int err, const std::string& what);

  bool ok() const { return code_ == kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;
  // Prefix the message with context ("loading blk.3: ...") keeping the code.
  Status With(const std::string& context) const {
    return ok() ? *this : Status(code_, context + ": " + msg_);
  }

 private:
  Status(Code c, std::string m) : code_(c), msg_(std::move(m)) {}
  Code code_ = kOk;
  std::string msg_;
};

const char* StatusCodeName(Status::Code c);

}  // namespace mz

#define MZ_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::mz::Status _st = (expr);          \
    if (!_st.ok()) return _st;          \
  } while (0)
