// Routing of ggml's and llama.cpp's log output. Both libraries share one logger (llama_log_set also
// sets ggml's). By default only errors reach stderr; SetLibraryLogVerbose(true) lets everything
// through (Env::Default() applies the MZ_VERBOSE setting on first use: core/ reads no settings).
// LogCapture collects the messages of the current thread while it lives, so a failed gguf parse
// can be turned into a Status carrying the library's own reason.
#pragma once
#include <string>

namespace mz {

// Installs the logger once (idempotent, thread-safe).
void InitLibraryLogging();
// Everything (true) or only errors (false, the default) reaches stderr from now on. Thread-safe.
void SetLibraryLogVerbose(bool on);

class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  // Error and warning text captured so far, newlines folded into "; ".
  std::string text() const;

 private:
  std::string buf_;
  std::string* prev_;
};

}  // namespace mz
