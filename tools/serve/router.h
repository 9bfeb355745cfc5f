// Which conversation of the pool a request continues.
//
// OpenAI's chat API is stateless: every request resends the whole history. The router sends a
// request to the conversation it continues:
//   - the one, not in use by another request, whose common prefix with the request's prompt reaches
//     at least its turn mark (where its last prompt ended: the request repeats that conversation up
//     to its last reply, which the client may resend re-tokenized, edited or not at all); the
//     longest such prefix wins. Only the tokens past the common prefix are computed; the
//     conversation is cut back to it;
//   - otherwise a new conversation. The pool then reuses another conversation's matching full
//     chunks (a shared system prompt), and no existing conversation is cut: a request that edits
//     an earlier message forks, it never rewrites someone else's history.
// A conversation named explicitly (the "conversation" extension) is continued whatever the match,
// and only conversations the routable predicate accepts (the server: the ids it made itself) are
// matched implicitly: a conversation a client named is reached by its name only.
// The router holds claims, not data: each conversation's history and turn mark are the pool's
// (mz_pool_conversation_tokens, mz_pool_conversation_turn_mark; kept in the pool's crash-safe
// files), read through `lookup` when a request is matched. Its only copy of tokens is a claimed
// request's own prompt, while the claim lasts. Thread-safe (one mutex, never held during a lookup).
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
  // lookup(id, &history, &turn_mark): the pool's history of conversation id and its turn mark (-1:
  // none: then only a request extending the whole history continues it). false: unreadable now
  // (the conversation is then not matched by this request). Called without the router's lock, from
  // the threads that call Acquire / AcquireId.
  using Lookup = std::function<bool(const std::string& id, std::vector<int32_t>* history, int* turn_mark)>;
  // routable: which conversations implicit requests may be routed to (default: all).
  explicit Router(Lookup lookup, std::function<bool(const std::string&)> routable = nullptr)
      : lookup_(std::move(lookup)), routable_(std::move(routable)) {}
  struct Claim {
    std::string id;
    int keep = 0;         // tokens of the conversation kept (the common prefix, < prompt size)
    bool is_new = false;  // a conversation the router did not know
    std::vector<int32_t> expected;  // the history lookup gave for it (the caller checks the pool
                                    // still holds exactly this before cutting anything)
  };
  // The router learns that conversation id exists (at start: every conversation of the pool).
  void Put(const std::string& id);
  // How long Acquire waits for a conversation the prompt continues that is in use (default: not at
  // all, it forks at once). A client that drops a stream and sends the same history again at once
  // finds its conversation still claimed by the turn being cancelled: rather than fork (and
  // recompute everything), the request waits up to `releasing` for a claim marked Releasing to end,
  // and up to `busy` for any other claim on a conversation it continues (its turn may not have
  // noticed yet that its client is gone: it learns it at its next write) to end or be marked. A
  // claimed conversation "is continued" by a prompt that starts with the claiming request's prompt;
  // a conversation's first turn is never waited for.
  struct Wait {
    std::chrono::milliseconds busy{0}, releasing{0};
  };
  // Claims the conversation prompt continues, or a new one named new_id (see above). prompt must
  // not be empty. The claim lasts until Release or Abandon. Blocks at most wait.busy +
  // wait.releasing (only while a conversation it continues is claimed), plus the lookups.
  Claim Acquire(const std::vector<int32_t>& prompt, const std::string& new_id, Wait wait);
  Claim Acquire(const std::vector<int32_t>& prompt, const std::string& new_id);  // no wait
  // Marks conversation id's claim as ending (its client is gone, its turn stops): requests that
  // continue it wait for it (Wait::releasing) instead of forking. No effect if it is not claimed.
  void Releasing(const std::string& id);
  // Claims conversation id (created if unknown). false: in use by another request, or damaged
  // (*why says which). out->keep: the common prefix with the history lookup gives (0 if none).
  bool AcquireId(const std::string& id, const std::vector<int32_t>& prompt, Claim* out, std::string* why);
  // Ends a claim after a turn (the pool now holds the conversation's new history and turn mark).
  void Release(const std::string& id);
  // Ends a claim without a turn. damaged: the conversation failed (a storage error, a corrupt
  // stored chunk): it is never matched again (it stays in the pool, listed, for the operator).
  void Abandon(const std::string& id, bool damaged);
  // The pool deleted it (disk budget, DELETE): forgotten.
  void Forget(const std::string& id);
  size_t size();
  bool Knows(const std::string& id);

 private:
  struct Entry {
    bool busy = false, damaged = false, releasing = false;
    bool claim_new = false;               // the claim is the conversation's first turn
    std::vector<int32_t> claim_prompt;    // while busy: the claiming request's prompt
  };
  const Lookup lookup_;
  const std::function<bool(const std::string&)> routable_;
  std::mutex mu_;
  std::condition_variable freed_;  // a claim ended or was marked releasing
  std::map<std::string, Entry> entries_;
};

// Length of the common prefix of a and b.
size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace mz::serve
