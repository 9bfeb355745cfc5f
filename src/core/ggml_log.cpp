#include "core/ggml_log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "ggml.h"
#include "llama.h"

namespace mz {
namespace {

thread_local std::string* t_capture = nullptr;
std::atomic<bool> g_verbose{false};

void LogCallback(ggml_log_level level, const char* text, void*) {
  if (t_capture) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_CONT)
      t_capture->append(text);
    return;
  }
  if (g_verbose.load(std::memory_order_relaxed) || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

void SetLibraryLogVerbose(bool on) { g_verbose.store(on, std::memory_order_relaxed); }

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
