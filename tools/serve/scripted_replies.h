// A TEST HOOK of `mzcache serve`: scripted model output (hidden option --test-scripted-replies FILE).
//
// The tests of tool calling need a model that writes tool calls, and the test models' weights are
// random. With this hook each chat/completion turn, in the order the turns start, replaces the text
// the model would sample with the next reply of FILE (a JSON array of strings). The reply is
// tokenized (special tokens parsed) and its tokens go through the turn exactly as sampled ones do:
// streamed, stop strings and max_tokens applied, decoded into the conversation and committed, so the
// conversation stays consistent with what the client saw. Once every reply is used, turns sample
// again. It cannot be reached from a request: it is read once at start, from the command line only,
// and the server refuses to start with it unless bound to loopback.
// Thread-safety: Next is safe from any thread.
#pragma once
#include <atomic>
#include <optional>
#include <string>
#include <vector>

namespace mz::serve {

class ScriptedReplies {
 public:
  // Reads FILE; false with *error on an unreadable file or one that is not a JSON array of strings.
  bool Load(const std::string& path, std::string* error);
  bool empty() const { return replies_.empty(); }
  // The next reply, or nothing once all were used (or none was loaded).
  std::optional<std::string> Next();

 private:
  std::vector<std::string> replies_;
  std::atomic<size_t> next_{0};
};

}  // namespace mz::serve
