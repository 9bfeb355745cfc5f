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

void Router::Put(const std::string& id, std::vector<int32_t> history, int prompt_end) {
  std::lock_guard<std::mutex> lk(mu_);
  Entry& e = entries_[id];
  e.prompt_end = std::clamp(prompt_end, 0, int(history.size()));
  e.history = std::move(history);
}

Router::Claim Router::Acquire(const std::vector<int32_t>& prompt, const std::string& new_id) {
  return Acquire(prompt, new_id, Wait());
}

Router::Claim Router::Acquire(const std::vector<int32_t>& prompt, const std::string& new_id, Wait wait) {
  std::unique_lock<std::mutex> lk(mu_);
  const auto start = std::chrono::steady_clock::now();
  Claim best;
  size_t best_common = 0;
  bool found = false;
  for (;;) {
    bool claimed_busy = false, claimed_releasing = false;  // a claimed conversation it continues
    for (auto& [id, e] : entries_) {
      if (e.damaged || (routable_ && !routable_(id))) continue;
      const size_t common = CommonPrefix(e.history, prompt);
      if (common < size_t(e.prompt_end)) continue;  // it diverges before its last reply: not this one
      if (e.busy) {
        // A conversation with no history yet (a first turn running) is no one's to wait for.
        if (!e.history.empty()) (e.releasing ? claimed_releasing : claimed_busy) = true;
        continue;
      }
      if (!found || common > best_common) {
        found = true;
        best_common = common;
        best.id = id;
      }
    }
    if (found || (!claimed_busy && !claimed_releasing)) break;
    const auto now = std::chrono::steady_clock::now();
    const auto until = start + wait.busy + (claimed_releasing ? wait.releasing : std::chrono::milliseconds(0));
    if (now >= until) break;
    freed_.wait_until(lk, until);
  }
  if (found) {
    best.keep = Keep(best_common, prompt);
    entries_[best.id].busy = true;
    best.expected = entries_[best.id].history;
    return best;
  }
  best.id = new_id;
  best.is_new = true;
  Entry& e = entries_[new_id];
  e = Entry();
  e.busy = true;
  return best;
}

bool Router::AcquireId(const std::string& id, const std::vector<int32_t>& prompt, Claim* out, std::string* why) {
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
  out->keep = Keep(CommonPrefix(e.history, prompt), prompt);
  out->expected = e.history;
  e.busy = true;
  return true;
}

void Router::Release(const std::string& id, std::vector<int32_t> history, int prompt_end) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Entry& e = entries_[id];
    e.prompt_end = std::clamp(prompt_end, 0, int(history.size()));
    e.history = std::move(history);
    e.busy = e.releasing = false;
  }
  freed_.notify_all();
}

void Router::Abandon(const std::string& id, bool damaged) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    it->second.busy = it->second.releasing = false;
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

int Router::PromptEnd(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? -1 : it->second.prompt_end;
}

}  // namespace mz::serve
