#include "tools/serve/router.h"

#include <algorithm>

namespace mz::serve {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + ptrdiff_t(n), b.begin()).first - a.begin());
}

namespace {
int Keep(size_t common, const std::vector<int32_t>& prompt) {
  // At least one prompt token is computed: its logits give the first reply token.
  return int(std::min(common, prompt.size() - 1));
}
}  // namespace

void Router::Put(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  entries_[id];
}

Router::Claim Router::Acquire(const std::vector<int32_t>& prompt, const std::string& new_id) {
  return Acquire(prompt, new_id, Wait());
}

namespace {
bool StartsWith(const std::vector<int32_t>& v, const std::vector<int32_t>& prefix) {
  return !prefix.empty() && v.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), v.begin());
}
}  // namespace

Router::Claim Router::Acquire(const std::vector<int32_t>& prompt, const std::string& new_id, Wait wait) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    // The candidates and the claims the prompt continues, under the lock; the pool's histories
    // read without it.
    std::vector<std::string> candidates;
    bool claimed_busy = false, claimed_releasing = false;
    for (auto& [id, e] : entries_) {
      if (e.damaged || (routable_ && !routable_(id))) continue;
      if (e.busy) {
        if (!e.claim_new && StartsWith(prompt, e.claim_prompt)) (e.releasing ? claimed_releasing : claimed_busy) = true;
        continue;
      }
      candidates.push_back(id);
    }
    lk.unlock();
    Claim best;
    size_t best_common = 0;
    bool found = false;
    std::vector<int32_t> history;
    for (const std::string& id : candidates) {
      int mark = -1;
      if (!lookup_ || !lookup_(id, &history, &mark)) continue;
      const size_t common = CommonPrefix(history, prompt);
      const size_t end = mark < 0 ? history.size() : std::min(size_t(mark), history.size());
      // The turn's last prompt token may merge with its reply's first when the client's resent
      // history is tokenized again (Qwen: the prompt's closing "\n" and a reply that starts with
      // "\n" become one "\n\n" token): a history equal up to the token before its mark is this
      // conversation (that one token is computed again).
      const size_t need = mark > 0 && end == size_t(mark) ? end - 1 : end;
      if (common < need) continue;  // it diverges before its last reply: not this one
      if (!found || common > best_common) {
        found = true;
        best_common = common;
        best.id = id;
        best.expected = history;
      }
    }
    lk.lock();
    if (found) {
      auto it = entries_.find(best.id);
      if (it == entries_.end() || it->second.busy || it->second.damaged) continue;  // changed while we looked: match again
      Entry& e = it->second;
      best.keep = Keep(best_common, prompt);
      e.busy = true;
      e.claim_new = false;
      e.claim_prompt = prompt;
      return best;
    }
    const auto now = std::chrono::steady_clock::now();
    const auto until = start + wait.busy + (claimed_releasing ? wait.releasing : std::chrono::milliseconds(0));
    if ((!claimed_busy && !claimed_releasing) || now >= until) break;
    freed_.wait_until(lk, until);
  }
  Claim fresh;
  fresh.id = new_id;
  fresh.is_new = true;
  Entry& e = entries_[new_id];
  e = Entry();
  e.busy = true;
  e.claim_new = true;
  e.claim_prompt = prompt;
  return fresh;
}

bool Router::AcquireId(const std::string& id, const std::vector<int32_t>& prompt, Claim* out, std::string* why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.busy) {
      *why = "conversation '" + id + "' is in use by another request";
      return false;
    }
    if (it != entries_.end() && it->second.damaged) {
      *why = "conversation '" + id + "' is damaged (an earlier request failed on it)";
      return false;
    }
    out->id = id;
    out->is_new = it == entries_.end();
    Entry& e = entries_[id];
    e.busy = true;
    e.claim_new = out->is_new;
    e.claim_prompt = prompt;
  }
  out->expected.clear();
  int mark = -1;
  if (!out->is_new && lookup_ && !lookup_(id, &out->expected, &mark)) out->expected.clear();
  out->keep = Keep(CommonPrefix(out->expected, prompt), prompt);
  return true;
}

void Router::Release(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Entry& e = entries_[id];
    e.busy = e.releasing = e.claim_new = false;
    e.claim_prompt.clear();
  }
  freed_.notify_all();
}

void Router::Abandon(const std::string& id, bool damaged) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    it->second.busy = it->second.releasing = it->second.claim_new = false;
    it->second.claim_prompt.clear();
    if (damaged) it->second.damaged = true;
  }
  freed_.notify_all();
}

void Router::Releasing(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second.busy) return;
    it->second.releasing = true;
  }
  freed_.notify_all();
}

void Router::Forget(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.erase(id);
  }
  freed_.notify_all();
}

size_t Router::size() {
  std::lock_guard<std::mutex> lk(mu_);
  return entries_.size();
}

bool Router::Knows(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  return entries_.count(id) > 0;
}

}  // namespace mz::serve
