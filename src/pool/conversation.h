// Conversation: one conversation of a Pool (pool/pool.h), the handle its callers hold. Its calls
// (conversation.cpp) run under its own lock; the pool owns its state's other half (the fields
// marked "under the pool's mu_" / "files_mu_") and moves its memory (pool_budget.cpp).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/context.h"

namespace mz {

class Pool;

class Conversation {
 public:
  const std::string& id() const { return id_; }
  // As Context::Decode / RestoreGenerate, within this conversation. An empty conversation first
  // reuses the longest stored or open prefix (PoolOptions::share_prefixes). After the call the pool
  // enforces its memory budget. kInvalidArgument once closed or deleted.
  Status Decode(const int32_t* tokens, int n, bool all_logits);
  Status RestoreGenerate(const int32_t* tokens, int n, const PipelineOptions& po, RestoreGenerateStats* stats);
  Status Truncate(int n_keep);
  // The end of a turn: the conversation is persisted by the write-behind thread (or now, without
  // write_behind). Returns the persist error in the synchronous case. With write-behind it first
  // waits for the previous commit's write to end (at once in a chat, where a turn takes longer
  // than a write): the stored file is never more than one committed turn behind, so a kill -9
  // loses at most the turn in flight (a failed write ends the wait: it is counted, retried).
  Status Commit();
  int n_tokens();
  // Where the last turn's prompt ended (Context::turn_mark): set by the app during a turn, before
  // its Commit, and persisted with the conversation's stored file (and its remote copy), so it
  // survives a restart and reaches another server of a fleet. kInvalidArgument once closed or
  // deleted, or unless 0 <= n <= n_tokens(). The conversation is changed (persisted again).
  Status SetTurnMark(int n);
  // Logits row of the last Decode/RestoreGenerate (nullptr if none or out of range); valid until
  // the next call on this conversation.
  const float* logits(int row);
  int n_logit_rows();
  // Stops this conversation's call in flight at its next batch step (PoolOptions::batch): it
  // returns kCancelled and the conversation is as before that call; the others in the batch go
  // on. A call that starts afterwards is not affected. Never waits; any thread.
  void Cancel();
  // In use: a call runs on it, or it generated since its last Commit (a restore_generate, or a
  // one-token decode: a reply under way; a plain prefill opens no turn) and its last call ended
  // less than write_behind_idle_ms ago (mid-reply between tokens). The budget pass spares every
  // conversation in use when two or more are (Pool, "Memory budget").
  bool InUse();
  // What this conversation's last Decode or RestoreGenerate spent besides its restore and compute
  // (several models under one budget): the room pass before the restore (idle models giving back
  // for what the call brings back), its seconds and bytes (with SharedBudget::room_behind(), the
  // seconds of measuring and handing over, and the bytes handed to the budget's thread), and the seconds the budget pass after
  // the call took inside it (0 when handed to the budget's thread: SharedBudget::pass_after_return,
  // or when another call of the same batcher step runs it). Of the last call that succeeded; any
  // thread.
  struct CallTimes {
    double room_s = 0;
    uint64_t room_bytes = 0;
    double pass_s = 0;
  };
  CallTimes last_call() {
    std::lock_guard<std::mutex> lk(call_mu_);
    return last_call_;
  }
  // The context, for read-only helpers (a sampler reads logits through it). nullptr once closed.
  // Do not call its mutating methods: the pool would not see the change.
  Context* context();

 private:
  friend class Pool;
  explicit Conversation(Pool* p, std::string id) : pool_(p), id_(std::move(id)) {}
  // REQUIRES use_mu_. Makes the context exist (a stored conversation is loaded).
  Status EnsureOpenLocked();
  // REQUIRES use_mu_. fn (a compute on this conversation's context) under the pool's weights lock: shared while every
  // weight unit is resident, exclusive when some must be restored.
  Status WithWeightsLocked(const std::function<Status()>& fn);
  // REQUIRES use_mu_, an empty context. Borrows the longest shared prefix of tokens (the pool's own,
  // or, remote true, the remote tier's when longer: Pool::RemotePrefix): *consumed tokens borrowed
  // (0: none; every failure of this optimization computes everything).
  Status PrefixLocked(const int32_t* tokens, int n, bool remote, int* consumed);
  // REQUIRES use_mu_. A stored copy of this conversation failed verification (why): a new context
  // computes tokens again (under the weights lock), reported in the pool's Damaged() and counted
  // (PoolStats::recomputed); the conversation is marked changed (persisted again). On success *out
  // is the new context (the caller installs it); on error nothing changed.
  Status ComputeAgainLocked(const std::vector<int32_t>& tokens, const std::string& why, std::shared_ptr<Context>* out);
  // REQUIRES use_mu_. After ComputeAgainLocked, once the context it replaces is gone (its
  // references to a lost chunk with it): ctx's first `shared` chunks are borrowed from the shared
  // store again (added from ctx where the store lacks them) and their chunk files are written again
  // by the next persist (RewriteChunkFiles). A failure (a unit another borrower still holds as
  // lost, memory) keeps ctx's own copies: held twice, never wrong.
  void ShareAgainLocked(Context& ctx, int shared);
  // REQUIRES use_mu_. The context is replaced by a new one that computed its first keep_tokens
  // tokens again (ComputeAgainLocked), then shares its first `shared` chunks again
  // (ShareAgainLocked). On error the context is unchanged.
  Status ReplaceByComputingAgainLocked(int keep_tokens, int shared, const std::string& why);
  // Decode (pipeline false) or RestoreGenerate, with the prefix reuse and the weights lock.
  Status Run(const int32_t* tokens, int n, const PipelineOptions& po, RestoreGenerateStats* stats, bool all_logits,
             bool pipeline);
  // After a change of the history whose first keep_tokens tokens stayed as they were.
  void AfterChangeLocked(int keep_tokens);

  Pool* pool_;
  const std::string id_;
  std::mutex use_mu_;                  // one call at a time on this conversation
  std::shared_ptr<Context> ctx_;       // written under use_mu_ and pool mu_; read under either
  bool closed_ = false;                // closed or deleted: calls fail (under use_mu_)
  std::atomic<uint64_t> version_{0};   // history changes (written under use_mu_)
  std::atomic<int> n_tokens_{0};       // history length (written under use_mu_)
  std::atomic<uint64_t> persisted_version_{0};
  std::atomic<uint64_t> committed_version_{0};  // version_ at the last Commit
  // Foreground callers waiting for use_mu_ (LockForUse): a background write of this conversation
  // paused for other calls (Pool::YieldToCalls) goes on when one waits.
  std::atomic<int> waiters_{0};
  // Another conversation borrowed chunks this one computed (now in the shared store): its stored
  // file holds its own copy, so the write-behind writes it again (naming their chunk files) once it
  // has been idle write_behind_idle_ms, as a change would be.
  std::atomic<bool> rename_shared_{false};
  std::unique_lock<std::mutex> LockForUse();
  std::atomic<uint64_t> persist_attempts_{0};   // Persist attempts ended (under the pool's wb_mu_)
  std::atomic<uint64_t> last_use_ns_{0};     // Env clock
  std::atomic<bool> turn_open_{false};       // generated since the last Commit
  std::atomic<bool> running_{false};         // a generation call runs on it
  std::atomic<uint64_t> last_use_unix_ms_{0};
  int shared_chunks_ = 0;
  std::mutex call_mu_;                 // guards last_call_
  CallTimes last_call_;
  // Under the pool's mu_:
  std::vector<uint64_t> hashes_;       // chained hashes of its full chunks (the prefix index's view)
  std::string stored_path_;            // session file ("" if never stored)
  uint64_t stored_bytes_ = 0;
  int stored_tokens_ = 0;
  int stored_turn_mark_ = -1;          // the stored file's turn mark (-1: none)
  // The stored file's tokens, kept from its last read or write so that a server matching requests
  // (Pool::History) reads no file (4 bytes a token; not counted in the memory budget).
  std::vector<int32_t> stored_history_;
  // While Persist holds use_mu_ to write it (nothing can change its history meanwhile): its history
  // and turn mark, so that Pool::History / TurnMark (a server matching a request against every
  // conversation) read them instead of waiting for the write.
  bool persisting_ = false;
  std::vector<int32_t> persisting_history_;
  int persisting_turn_mark_ = -1;
  MemoryReport last_report_;           // last known (a busy context is not waited for)
  bool dirty_queued_ = false;
  // Under the pool's files_mu_: the chunk files its stored file names (its first chunks' hashes).
  std::vector<uint64_t> stored_external_;
};

}  // namespace mz
