#include "core/ggml_log.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "ggml.h"
#include "llama.h"

namespace mz {
namespace {

thread_local std::string* t_capture = nullptr;

void LogCallback(ggml_log_level level, const char* text, void*) {
  if (t_capture) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_CONT)
      t_capture->append(text);
    return;
  }
  static const bool verbose = [] {
    const char* v = std::getenv("MZ_VERBOSE");
    return v && *v && *v != '0';
  }();
  if (verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

void InitLibraryLogging() {
  static std::once_flag once;
  std::call_once(once, [] {
    llama_log_set(LogCallback, nullptr);
    ggml_log_set(LogCallback, nullptr);
  });
}

LogCapture::LogCapture() : prev_(t_capture) {
  InitLibraryLogging();
  t_capture = &buf_;
}
LogCapture::~LogCapture() { t_capture = prev_; }

std::string LogCapture::text() const {
  std::string out;
  for (char c : buf_) {
    if (c == '\n') {
      if (!out.empty() && out.back() != ' ') out += "; ";
    } else {
      out += c;
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

}  // namespace mz
