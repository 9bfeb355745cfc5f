// Nothing lost: the write-behind thread, Persist (a conversation to its session file), its yield to
// generations, the disk budget, Flush.
#include "pool/pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "pool/chunk_hash.h"
#include "runtime/session_file.h"

#include "pool/pool_internal.h"

namespace mz {

void Pool::QueuePersist(const std::shared_ptr<Conversation>& c) {
  {
    std::lock_guard<std::mutex> lk(wb_mu_);
    wb_queue_.push_back(c);
    wb_pending_.fetch_add(1);
  }
  wb_cv_.notify_all();
  WakeYielders();  // a write waiting for a first token goes on: another one is queued behind it
}

void Pool::WakeYielders() {
  { std::lock_guard<std::mutex> lk(yield_mu_); }  // a waiter between its check and its wait sees the change
  yield_cv_.notify_all();
}

void Pool::YieldToCalls(Conversation& c, uint64_t busy0, uint64_t* left_ns) {
  // c's context is locked by this write (Persist holds c's use_mu_): a caller that waits for that
  // lock without LockForUse (another conversation copying or borrowing c's prefix chunks) is seen
  // through foreground_waiting(), which wakes nobody: the wait is sliced (5 ms) to notice it.
  auto go_on = [&] {
    return urgent_calls_.load() == 0 || c.waiters_.load() > 0 || save_waiters_.load() > 0 ||
           wb_pending_.load() > 0 || busy_finds_.load() != busy0 || stopping_.load() ||
           (c.ctx_ && c.ctx_->foreground_waiting());
  };
  if (*left_ns == 0 || go_on()) return;
  MZ_SYNC_POINT("pool:persist_yield", 0);  // tests: a background write waits for a first token
  Env* env = model_->env();
  const uint64_t t0 = env->NowNs();
  {
    std::unique_lock<std::mutex> lk(yield_mu_);
    for (uint64_t waited = 0; waited < *left_ns && !go_on(); waited = env->NowNs() - t0)
      yield_cv_.wait_for(lk, std::chrono::nanoseconds(std::min<uint64_t>(*left_ns - waited, 5000000)), go_on);
  }
  const uint64_t d = env->NowNs() - t0;
  *left_ns = d >= *left_ns ? 0 : *left_ns - d;
  yielded_ns_.fetch_add(d);
}

bool Pool::IdleForWriteBehind(const Conversation& c, uint64_t now_ns) const {
  if (!c.ctx_ || (c.version_.load() == c.persisted_version_.load() && !c.rename_shared_.load())) return false;
  // A call in flight (a decode waiting for its turn in a batcher step with a long prompt slice, or
  // a prompt waiting behind others' prompts) is mid-reply: saving it would wait for the call and
  // then hold the conversation's lock while its caller wants the next token (session 37: at 8
  // streams the write-behind saved every stream mid-reply after each >= 2 s step).
  if (c.running_.load()) return false;
  const uint64_t last = c.last_use_ns_.load();
  return now_ns >= last && now_ns - last >= uint64_t(opts_.write_behind_idle_ms) * 1000000ull;
}

Status Pool::Persist(const std::shared_ptr<Conversation>& c, bool background, bool if_idle) {
  if (opts_.dir.empty()) return Status::Ok();
  Status st;
  bool unchanged = false;
  uint64_t yield_left = background ? uint64_t(opts_.write_behind_yield_ms) * 1000000ull : 0;
  const uint64_t busy0 = busy_finds_.load();
  std::function<void()> between;
  if (yield_left > 0) between = [&] { YieldToCalls(*c, busy0, &yield_left); };
  {
    std::unique_lock<std::mutex> use =
        background ? std::unique_lock<std::mutex>(c->use_mu_) : c->LockForUse();
    // The idle scan's choice, checked again now that no call can start: a call that ran while this
    // write waited for the lock made it busy again (its caller is likely sampling its next token).
    if (if_idle && !IdleForWriteBehind(*c, model_->env()->NowNs())) return Status::Ok();
    unchanged = c->closed_ || !c->ctx_ ||
                (c->version_.load() == c->persisted_version_.load() && !c->rename_shared_.load());
    const bool renaming = c->rename_shared_.exchange(false);  // a borrow from now on sets it again
    if (!unchanged) {
      const std::string path = StoredPath(c->id_);
      const std::string codec = opts_.persist_codec.empty() ? "q8" : opts_.persist_codec;
      // Its borrowed prefix is named, not copied: each chunk in its chunk file (written once for
      // every conversation naming it). Dedup is an optimization: if a chunk file cannot be
      // written, the conversation is stored whole.
      std::vector<uint64_t> ext;
      if (shared_ && opts_.dedup_stored) {
        std::vector<uint64_t> h;
        {
          std::lock_guard<std::mutex> lk(mu_);
          h = c->hashes_;
        }
        const int k = std::min(c->ctx_->SharedPrefixChunks(), int(h.size()));
        if (k > 0 && AcquireChunkFiles(*c->ctx_, h, k).ok()) ext.assign(h.begin(), h.begin() + k);
      }
      SessionInfo info;
      // What the file holds besides the KV (under use_mu_: they cannot change during the save).
      const int turn_mark = c->ctx_->turn_mark();
      std::vector<int32_t> saved_tokens = c->ctx_->history();
      // Readable meanwhile without use_mu_ (Pool::History, TurnMark): a request matched against
      // every conversation does not wait for this write.
      struct OnExit {
        std::function<void()> f;
        ~OnExit() { f(); }
      } published{[this, &c] {
        std::lock_guard<std::mutex> lk(mu_);
        c->persisting_ = false;
        c->persisting_history_.clear();
      }};
      {
        std::lock_guard<std::mutex> lk(mu_);
        c->persisting_ = true;
        c->persisting_history_ = saved_tokens;
        c->persisting_turn_mark_ = turn_mark;
      }
      MZ_SYNC_POINT("pool:persisting", 0);  // tests: a write under way, its conversation locked
      st = SaveSession(*c->ctx_, path, codec, &info, int(ext.size()), between);
      if (st.code() == Status::kCorruption && !info.replaced && c->ctx_->SharedPrefixChunks() > 0) {
        // A shared chunk it borrows is lost (found damaged when read for this save): computed
        // again as a call would (Conversation::Run), then saved whole; nothing of it is lost.
        TakeDamagedChunkFiles(st);
        DropChunkFileRefs(ext);
        ext.clear();
        Status hs = c->ReplaceByComputingAgainLocked(int(c->ctx_->history().size()), c->ctx_->SharedPrefixChunks(),
                                                     st.message());
        if (hs.ok()) {
          st = SaveSession(*c->ctx_, path, codec, &info, 0);
        } else {
          st = st.With("computing its tokens again: " + hs.ToString());
        }
      }
      // The file references given up: the old file's once the new one is at its path (also when
      // only the folder's fsync then failed: the new file is what a restart reads), else the new ones.
      std::vector<uint64_t> drop;
      {
        std::lock_guard<std::mutex> fl(files_mu_);
        if (info.replaced) {
          drop.swap(c->stored_external_);
          c->stored_external_ = ext;
          auto u = unremoved_refs_.find(path);  // a file that once could not be removed, replaced now
          if (u != unremoved_refs_.end()) {
            drop.insert(drop.end(), u->second.begin(), u->second.end());
            unremoved_refs_.erase(u);
          }
        } else {
          drop = ext;
        }
      }
      DropChunkFileRefs(drop);
      std::lock_guard<std::mutex> lk(mu_);
      if (info.replaced) {
        c->stored_path_ = path;
        c->stored_bytes_ = info.file_bytes;
        c->stored_tokens_ = info.n_tokens;
        c->stored_turn_mark_ = turn_mark <= info.n_tokens ? turn_mark : -1;
        c->stored_history_ = std::move(saved_tokens);
      }
      if (st.ok()) {
        c->persisted_version_ = c->version_.load();
        stats_.persists++;
        if (remote_) QueueRemoteWrite(c->id_, path);
      } else {
        stats_.persist_failures++;  // retried: the version stays unpersisted
        if (renaming) c->rename_shared_ = true;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lk(wb_mu_);  // a Commit waiting for this write (Conversation::Commit)
    c->persist_attempts_++;
  }
  wb_done_cv_.notify_all();
  if (unchanged) return Status::Ok();
  // A budget pass that stopped at this conversation (busy being written) runs again now.
  if (budget_retry_.exchange(false)) (void)EnforceBudget();
  if (!st.ok()) return st.With("persisting conversation '" + c->id_ + "'");
  return EnforceDiskBudget(c->id_);
}

Status Pool::EnforceDiskBudget(const std::string& keep) {
  if (opts_.disk_budget == 0) return Status::Ok();
  // The deleted conversations' files, each with the chunk file references it held: dropped only
  // once the file is gone (a file that could not be removed still names them).
  std::vector<std::pair<std::string, std::vector<uint64_t>>> remove;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::lock_guard<std::mutex> fl(files_mu_);
    uint64_t total = 0;
    std::vector<std::pair<uint64_t, std::shared_ptr<Conversation>>> lru;
    for (auto& kv : convs_) {
      total += kv.second->stored_bytes_;
      if (kv.first != keep && !kv.second->stored_path_.empty())
        lru.emplace_back(kv.second->last_use_unix_ms_.load(), kv.second);
    }
    // Chunk files count once; deleting a conversation frees those only it still names.
    std::unordered_map<uint64_t, int> left;
    for (const auto& f : chunk_files_) {
      total += f.second.bytes;
      left[f.first] = f.second.refs;
    }
    std::sort(lru.begin(), lru.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& e : lru) {
      if (total <= opts_.disk_budget) break;
      Conversation& c = *e.second;
      std::unique_lock<std::mutex> use(c.use_mu_, std::try_to_lock);
      if (!use.owns_lock()) continue;  // in use: not the least recently used in effect
      ReindexLocked(c, {}, 0);
      total -= c.stored_bytes_;
      for (uint64_t h : c.stored_external_)
        if (--left[h] == 0) total -= chunk_files_[h].bytes;
      remove.emplace_back(c.stored_path_, std::move(c.stored_external_));
      c.stored_external_.clear();
      c.closed_ = true;
      c.ctx_.reset();
      convs_.erase(c.id_);
      stats_.conversations_lost++;
    }
  }
  Status first;
  for (const auto& p : remove) {
    Status st = model_->env()->Remove(p.first);
    if (st.ok()) {
      DropChunkFileRefs(p.second);
      continue;
    }
    {
      std::lock_guard<std::mutex> fl(files_mu_);  // held for that path (as Delete does)
      std::vector<uint64_t>& keep = unremoved_refs_[p.first];
      keep.insert(keep.end(), p.second.begin(), p.second.end());
    }
    if (first.ok()) first = st.With("the disk budget deleting a conversation (its file and the chunk files it names stay)");
  }
  return first;
}

void Pool::WriteBehindLoop() {
  Env* env = model_->env();
  std::unique_lock<std::mutex> lk(wb_mu_);
  while (!wb_stop_) {
    wb_cv_.wait_for(lk, std::chrono::milliseconds(200));
    if (wb_stop_) break;
    std::vector<std::weak_ptr<Conversation>> q;
    q.swap(wb_queue_);
    const size_t queued = q.size();  // the rest joins below (idle ones): not counted in wb_pending_
    lk.unlock();
    // Idle conversations with changes not yet persisted join the queue.
    const uint64_t now = env->NowNs();
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto& kv : convs_)
        if (IdleForWriteBehind(*kv.second, now)) q.push_back(kv.second);
    }
    for (size_t i = 0; i < q.size(); ++i) {
      if (i < queued) wb_pending_.fetch_sub(1);  // started: a write behind it makes it stop yielding
      // failures are counted (persist_failures) and retried later
      if (auto c = q[i].lock()) Persist(c, /*background=*/true, /*if_idle=*/i >= queued);
    }
    // A budget pass that stopped at a busy idle conversation (a generation, now over) runs again.
    if (budget_retry_.exchange(false)) (void)EnforceBudget();
    lk.lock();
  }
}

Status Pool::FlushRemote() {
  MZ_RETURN_IF_ERROR(Flush());
  return remote_ ? remote_->Flush() : Status::Ok();
}

Status Pool::Flush() {
  std::vector<std::shared_ptr<Conversation>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_) all.push_back(kv.second);
  }
  Status first;
  for (auto& c : all) {
    Status st = Persist(c);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace mz
