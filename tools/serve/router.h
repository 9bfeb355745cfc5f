// Which conversation of the pool a request continues.
//
// OpenAI's chat API is stateless: every request resends the whole history. The router keeps, for
// every conversation of the pool, its token history and where its last prompt ended (the start of
// the last reply), and sends a request to the conversation it continues:
//   - the one, not in use by another request, whose common prefix with the request's prompt reaches
//     at least its last prompt's end (the request repeats that conversation up to its last reply,
//     which the client may resend re-tokenized, edited or not at all); the longest such prefix wins.
//     Only the tokens past the common prefix are computed; the conversation is cut back to it;
//   - otherwise a new conversation. The pool then reuses another conversation's matching full
//     chunks (a shared system prompt), and no existing conversation is cut: a request that edits
//     an earlier message forks, it never rewrites someone else's history.
// A conversation named explicitly (the "conversation" extension) is continued whatever the match,
// and only conversations the routable predicate accepts (the server: the ids it made itself) are
// matched implicitly: a conversation a client named is reached by its name only.
// Pure bookkeeping (no I/O): the server feeds it the pool's histories. Thread-safe (one mutex).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace mz::serve {

class Router {
 public:
  // routable: which conversations implicit requests may be routed to (default: all).
  explicit Router(std::function<bool(const std::string&)> routable = nullptr) : routable_(std::move(routable)) {}
  struct Claim {
    std::string id;
    int keep = 0;         // tokens of the conversation kept (the common prefix, < prompt size)
    bool is_new = false;  // a conversation the router did not know
    std::vector<int32_t> expected;  // the history the router knows for it (the caller checks the
                                    // pool still holds exactly this before cutting anything)
  };
  // Sets what the router knows of conversation id (at start, from the pool and the turn marks).
  // prompt_end is clamped to the history's size.
  void Put(const std::string& id, std::vector<int32_t> history, int prompt_end);
  // How long Acquire waits for a conversation the prompt continues that is in use (default: not at
  // all, it forks at once). A client that drops a stream and sends the same history again at once
  // finds its conversation still claimed by the turn being cancelled: rather than fork (and
  // recompute everything), the request waits up to `releasing` for a claim marked Releasing to end,
  // and up to `busy` for any other claim on a conversation it continues (its turn may not have
  // noticed yet that its client is gone: it learns it at its next write) to end or be marked.
  struct Wait {
    std::chrono::milliseconds busy{0}, releasing{0};
  };
  // Claims the conversation prompt continues, or a new one named new_id (see above). prompt must
  // not be empty. The claim lasts until Release or Abandon. Blocks at most wait.busy +
  // wait.releasing (only while a conversation it continues is claimed).
  Claim Acquire(const std::vector<int32_t>& prompt, const std::string& new_id, Wait wait);
  Claim Acquire(const std::vector<int32_t>& prompt, const std::string& new_id);  // no wait
  // Marks conversation id's claim as ending (its client is gone, its turn stops): requests that
  // continue it wait for it (Wait::releasing) instead of forking. No effect if it is not claimed.
  void Releasing(const std::string& id);
  // Claims conversation id (created if unknown). false: in use by another request, or damaged
  // (*why says which).
  bool AcquireId(const std::string& id, const std::vector<int32_t>& prompt, Claim* out, std::string* why);
  // Ends a claim after a turn: the conversation's history now and where this turn's prompt ended.
  void Release(const std::string& id, std::vector<int32_t> history, int prompt_end);
  // Ends a claim without a turn. damaged: the conversation failed (a storage error, a corrupt
  // stored chunk): it is never matched again (it stays in the pool, listed, for the operator).
  void Abandon(const std::string& id, bool damaged);
  // The pool deleted it (disk budget, DELETE): forgotten.
  void Forget(const std::string& id);
  size_t size();
  int PromptEnd(const std::string& id);  // -1 if unknown

 private:
  struct Entry {
    std::vector<int32_t> history;
    int prompt_end = 0;
    bool busy = false, damaged = false, releasing = false;
  };
  const std::function<bool(const std::string&)> routable_;
  std::mutex mu_;
  std::condition_variable freed_;  // a claim ended or was marked releasing
  std::map<std::string, Entry> entries_;
};

// Length of the common prefix of a and b.
size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace mz::serve
