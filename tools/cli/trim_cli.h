// chat's /trim LEVEL and /background: Android's onTrimMemory levels as the app receives them
// (mz_on_trim_memory in include/mzcache.h, docs/android.md "Backgrounding"), typed at the chat
// prompt. /background plays what an app going to the background receives: UI_HIDDEN (20), then
// BACKGROUND (40), then COMPLETE (80), and prints after each what was given back and what stays.
#pragma once
#include <string>

#include "mzcache.h"

namespace mz::cli {

// The level of a /trim argument: a number (0..100) or a name (ui_hidden, background, moderate,
// complete, running_moderate, running_low, running_critical; case-insensitive). -1 if neither.
int TrimLevelArg(const std::string& arg);
// One onTrimMemory(level) on ctx; prints one line to stderr: the level, the bytes given back, what
// the context holds in RAM after it and of that its KV (anonymous memory). Never fatal.
void ChatTrim(mz_context* ctx, int level);
// /trim LEVEL (usage printed for a bad one) and /background (the three levels in order, then how
// the return comes back: the next turn restores front layers first, overlapped with its prefill).
void ChatTrimCommand(mz_context* ctx, const std::string& verb, const std::string& arg);

}  // namespace mz::cli
