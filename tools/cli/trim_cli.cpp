#include "tools/cli/trim_cli.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "tools/common.h"

namespace mz::cli {
namespace {

const char* LevelName(int level) {
  switch (level) {
    case MZ_TRIM_MEMORY_RUNNING_MODERATE: return "RUNNING_MODERATE";
    case MZ_TRIM_MEMORY_RUNNING_LOW: return "RUNNING_LOW";
    case MZ_TRIM_MEMORY_RUNNING_CRITICAL: return "RUNNING_CRITICAL";
    case MZ_TRIM_MEMORY_UI_HIDDEN: return "UI_HIDDEN";
    case MZ_TRIM_MEMORY_BACKGROUND: return "BACKGROUND";
    case MZ_TRIM_MEMORY_MODERATE: return "MODERATE";
    case MZ_TRIM_MEMORY_COMPLETE: return "COMPLETE";
    default: return "";
  }
}

}  // namespace

int TrimLevelArg(const std::string& arg) {
  std::string a;
  for (char c : arg) a += char(std::toupper(static_cast<unsigned char>(c)));
  for (int l : {5, 10, 15, 20, 40, 60, 80})
    if (a == LevelName(l)) return l;
  if (a.empty() || a.size() > 3) return -1;
  for (char c : a)
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  const int v = std::atoi(a.c_str());
  return v <= 100 ? v : -1;
}

void ChatTrim(mz_context* ctx, int level) {
  mz_memory_report before{}, after{};
  mz_get_memory_report(ctx, &before);
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = mz_on_trim_memory(ctx, level);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  mz_get_memory_report(ctx, &after);
  const uint64_t given = before.in_memory > after.in_memory ? before.in_memory - after.in_memory : 0;
  std::fprintf(stderr, "  onTrimMemory(%d%s%s): gave back %s in %.3f s; in memory %s (%.0f%% of the footprint), of it KV %s%s%s\n",
               level, *LevelName(level) ? " " : "", LevelName(level), MibText(given).c_str(), dt,
               MibText(after.in_memory).c_str(), 100.0 * after.remaining, MibText(after.kv_resident).c_str(),
               rc == MZ_OK ? "" : rc == MZ_ERR_BUSY ? " (queued behind a generation)" : "; ",
               rc == MZ_OK || rc == MZ_ERR_BUSY ? "" : mz_status_str(rc));
}

void ChatTrimCommand(mz_context* ctx, const std::string& verb, const std::string& arg) {
  if (verb == "/background") {
    for (int l : {MZ_TRIM_MEMORY_UI_HIDDEN, MZ_TRIM_MEMORY_BACKGROUND, MZ_TRIM_MEMORY_COMPLETE}) ChatTrim(ctx, l);
    std::fprintf(stderr, "  back in the foreground: the next turn restores front layers first, overlapped with its "
                         "prefill (/restore: all at once now)\n");
    return;
  }
  const int level = TrimLevelArg(arg);
  if (level < 0) {
    std::fprintf(stderr, "usage: /trim LEVEL (a number 0-100 or ui_hidden, background, moderate, complete, "
                         "running_moderate, running_low, running_critical)\n");
    return;
  }
  ChatTrim(ctx, level);
}

}  // namespace mz::cli
