// Conversation: one conversation of a pool (pool/conversation.h): its calls, prefix reuse and turns.
#include "pool/conversation.h"
#include "pool/pool.h"

#include <algorithm>
#include <chrono>

#include "core/sync_point.h"
#include "pool/chunk_hash.h"
#include "runtime/session_file.h"

#include "pool/pool_internal.h"

namespace mz {

Status Conversation::EnsureOpenLocked() {
  if (closed_) return Status::InvalidArgument("conversation '" + id_ + "' was closed or deleted");
  if (ctx_) return Status::Ok();
  std::shared_ptr<Context> ctx;
  MZ_RETURN_IF_ERROR(pool_->NewContext(id_, &ctx));
  std::string path;
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    path = stored_path_;
  }
  if (!path.empty()) {
    // The stored file becomes the storage tier (read as restored), unless the ablation asks for
    // the whole read at open. OpenSessionAsStorage refuses a file whose codec is not the
    // context's (kInvalidArgument, context unchanged): such a file is read whole.
    const bool as_storage = pool_->opts_.stored_as_storage;
    // A version-2 file's first chunks are named, not held: borrowed from the store, which reads
    // them from their chunk files (Pool::ResolveExternal).
    Status ext_error;
    bool computed_again = false;
    ExternalChunkResolver resolve = [&](const SessionReader& r, std::shared_ptr<SharedChunkStore>* store,
                                        std::vector<SharedChunkStore::Ref>* refs) {
      Status e = pool_->ResolveExternal(r, store, refs);
      if (!e.ok()) ext_error = e;
      return e;
    };
    Status st = as_storage ? OpenSessionAsStorage(*ctx, path, nullptr, resolve) : LoadSession(*ctx, path, nullptr, resolve);
    if (as_storage && st.code() == Status::kInvalidArgument && ext_error.ok())
      st = LoadSession(*ctx, path, nullptr, resolve);
    if (!st.ok() && (!ext_error.ok() || st.code() == Status::kCorruption)) {
      // A chunk file it names is missing or damaged (or, read whole, a payload fails its checksum
      // in a file that names chunk files): its tokens are computed again (nothing lost, never a
      // wrong chunk), and the damage is reported. A file of its own only keeps the error.
      std::unique_ptr<SessionReader> r;
      const int T = ctx->kv().geometry().chunk_tokens;
      if (SessionReader::Open(*pool_->model_, T, path, &r).ok() && (!ext_error.ok() || r->n_external() > 0)) {
        if (ext_error.ok()) pool_->TakeDamagedChunkFiles(st);
        const std::string why = (ext_error.ok() ? st : ext_error).message();
        ctx.reset();  // its swap file's name is the new context's
        st = ComputeAgainLocked(r->tokens(), why, &ctx);
        if (st.ok()) ShareAgainLocked(*ctx, r->n_external());
        computed_again = true;
        if (!st.ok()) st = st.With("computing again the tokens of conversation '" + id_ + "'");
      }
    }
    if (!st.ok()) {
      if (st.code() == Status::kCorruption) {  // reported like a file found damaged at start
        std::lock_guard<std::mutex> lk(pool_->mu_);
        pool_->damaged_.push_back({path, st.message()});
      }
      return st.With("opening conversation '" + id_ + "'");
    }
    // Chunks the shared store holds (another conversation borrows them) are borrowed instead of
    // the file's copies: held once in RAM. Only what is found; nothing is copied into the store.
    if (pool_->shared_ && !computed_again) {
      const std::vector<int32_t>& hist = ctx->history();
      const int T = ctx->kv().geometry().chunk_tokens;
      const std::vector<uint64_t> h =
          ChainHashes(pool_->model_->identity().header_hash, hist.data(), int(hist.size()), T);
      std::vector<SharedChunkStore::Ref> refs;
      int got = 0;
      if (pool_->GatherShared(h, hist.data(), int(h.size()), nullptr, &refs, &got).ok() && got > 0)
        (void)ctx->BorrowShared(hist.data(), got, pool_->shared_, refs);  // a failure keeps the file's copies
    }
  }
  std::lock_guard<std::mutex> lk(pool_->mu_);
  ctx_ = std::move(ctx);
  pool_->TryReportShared(*ctx_, &last_report_);
  n_tokens_ = int(ctx_->history().size());
  return Status::Ok();
}

Status Conversation::ComputeAgainLocked(const std::vector<int32_t>& tokens, const std::string& why,
                                        std::shared_ptr<Context>* out) {
  std::shared_ptr<Context> ctx;
  // A name of its own for its swap file: the context it replaces may still exist.
  // '~' is in no conversation name (ValidId): never another conversation's swap file.
  MZ_RETURN_IF_ERROR(pool_->NewContext(id_, &ctx, ctx_ ? "~" + std::to_string(++pool_->swap_seq_) : std::string()));
  if (!tokens.empty())
    MZ_RETURN_IF_ERROR(WithWeightsLocked([&] { return ctx->Decode(tokens.data(), int(tokens.size()), false); }));
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    pool_->damaged_.push_back({stored_path_.empty() ? id_ : stored_path_, why + " (its tokens were computed again)"});
    pool_->stats_.recomputed++;
  }
  version_++;  // not what its stored file holds any more: persisted again
  *out = std::move(ctx);
  return Status::Ok();
}

Status Conversation::ReplaceByComputingAgainLocked(int keep_tokens, int shared, const std::string& why) {
  std::vector<int32_t> hist = ctx_->history();
  hist.resize(std::min(hist.size(), size_t(keep_tokens)));
  std::shared_ptr<Context> fresh;
  MZ_RETURN_IF_ERROR(ComputeAgainLocked(hist, why, &fresh));
  std::shared_ptr<Context> old;
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    old = std::move(ctx_);
    ctx_ = std::move(fresh);
  }
  old.reset();  // its references to the lost chunk go first: the chunk can be shared again
  ShareAgainLocked(*ctx_, shared);
  shared_chunks_ = ctx_->SharedPrefixChunks();
  return Status::Ok();
}

void Conversation::ShareAgainLocked(Context& ctx, int shared) {
  const std::vector<int32_t> tokens = ctx.history();
  const int T = ctx.kv().geometry().chunk_tokens;
  shared = std::min(shared, int(tokens.size()) / T);
  if (!pool_->shared_ || shared <= 0) return;
  const std::vector<uint64_t> h = ChainHashes(pool_->model_->identity().header_hash, tokens.data(), shared * T, T);
  // Which of the chunk files naming them is damaged is known only for the first found: every one
  // is written again by the next persist naming it (the same bytes when it was whole).
  pool_->RewriteChunkFiles(h);
  std::vector<SharedChunkStore::Ref> refs;
  int got = 0;
  Status gs = pool_->GatherShared(
      h, tokens.data(), shared,
      [&](int l, int c, uint16_t* dst) { return ctx.ReadKvChunk(tokens.data(), shared * T, l, c, dst); }, &refs, &got);
  if (gs.ok() && got > 0) (void)ctx.BorrowShared(tokens.data(), got, pool_->shared_, refs);
}

Status Conversation::PrefixLocked(const int32_t* tokens, int n, bool remote, int* consumed) {
  *consumed = 0;
  const int T = ctx_->kv().geometry().chunk_tokens;
  const int max_chunks = (n - 1) / T;  // at least one token is computed (its logits are wanted)
  if (max_chunks <= 0) return Status::Ok();
  const std::vector<uint64_t> h = ChainHashes(pool_->model_->identity().header_hash, tokens, max_chunks * T, T);
  std::shared_ptr<Context> src_ctx;
  std::shared_ptr<Conversation> src_conv;  // the open source (its stored file may hold its own copy)
  std::string src_path;
  int depth = 0;
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    for (int k = int(h.size()) - 1; k >= 0 && depth == 0; --k) {
      auto range = pool_->index_.equal_range(h[size_t(k)]);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == id_) continue;
        auto c = pool_->convs_.find(it->second);
        if (c == pool_->convs_.end()) continue;
        // An open conversation serves from memory (any tier); else its stored file.
        if (c->second->ctx_) {
          src_ctx = c->second->ctx_;
          src_conv = c->second;
          src_path.clear();
          depth = k + 1;
          break;
        }
        if (!c->second->stored_path_.empty() && src_path.empty()) {
          src_path = c->second->stored_path_;
          depth = k + 1;
        }
      }
    }
  }
  // The remote tier (shared by a fleet) may hold a longer run: its chunks stream in (borrowed at
  // once, restored front layers first by this call's restore while their layers arrive), or, fetched
  // whole (PoolOptions::remote.stream_prefix false), are verified and fill the store instead.
  std::vector<std::unique_ptr<SessionReader>> remote_readers;
  std::vector<SharedChunkStore::Ref> remote_refs;
  if (remote && pool_->remote_ && depth < int(h.size())) {
    // A chunk's stored bytes before any was fetched: every layer's KV at the stored codec's ratio.
    const KvGeometry& g = ctx_->kv().geometry();
    const std::string codec = pool_->opts_.persist_codec.empty() ? "q8" : pool_->opts_.persist_codec;
    const uint64_t est = uint64_t(double(g.f16_chunk_bytes()) * double(g.n_layer) * ctx_->profile().Ratio(codec));
    const double s_per_token =
        ctx_->compute_s_per_token() > 0 ? ctx_->compute_s_per_token() : pool_->prefill_s_per_token_.load();
    const int k = pool_->RemotePrefix(h, tokens, depth, g.kv_type, ctx_->profile(), s_per_token, est,
                                      &remote_readers, &remote_refs);
    if (k > depth) {
      depth = k;
      src_ctx.reset();
      src_conv.reset();
      src_path.clear();
    } else {
      remote_readers.clear();
    }
  }
  if (depth == 0) return Status::Ok();
  const int n_prefix = depth * T;
  // This context borrows the run's units (refs: one reference each, given up on failure).
  auto borrow = [&](const std::vector<SharedChunkStore::Ref>& refs) {
    if (!ctx_->BorrowShared(tokens, depth, pool_->shared_, refs).ok()) {
      ctx_->Truncate(0);
      return Status::Ok();
    }
    *consumed = n_prefix;
    shared_chunks_ = depth;
    std::lock_guard<std::mutex> lk(pool_->mu_);
    pool_->stats_.prefix_chunks_reused += uint64_t(depth);
    return Status::Ok();
  };
  // Streamed: borrowed as they are (a unit whose layer is not in yet waits at the store's file
  // gate when restored; one that never arrives whole fails the call with kCorruption: Run
  // computes the tokens again without the remote tier).
  if (!remote_refs.empty()) return borrow(remote_refs);
  std::unique_ptr<SessionReader> reader;
  if (!src_ctx && remote_readers.empty()) {
    // Decoded into this context's resident form (q8_0 KV: q8 chunks), as the store holds them.
    MZ_RETURN_IF_ERROR(SessionReader::Open(*pool_->model_, T, src_path, &reader, ctx_->kv().geometry().kv_type));
    if (int(reader->tokens().size()) < n_prefix || !std::equal(tokens, tokens + n_prefix, reader->tokens().begin()))
      return Status::Ok();  // a hash collision or a file replaced since: compute everything
  }
  // The chunks the store lacks are copied into it once, from the source in whichever tier it
  // holds them (ReadKvChunk confirms the source still starts with these tokens).
  std::vector<SharedChunkStore::Ref> mine;
  std::map<int, std::unique_ptr<SessionReader>> chunk_readers;
  int got = 0;
  Status st = pool_->GatherShared(
      h, tokens, depth,
      [&](int l, int c, uint16_t* dst) {
        if (!remote_readers.empty()) return remote_readers[size_t(c)]->ReadChunk(l, 0, dst);
        if (src_ctx) return src_ctx->ReadKvChunk(tokens, n_prefix, l, c, dst);
        if (c >= reader->n_external()) return reader->ReadChunk(l, c, dst);
        // Named by the stored file, held in its chunk file (dedup_stored).
        std::unique_ptr<SessionReader>& cr = chunk_readers[c];
        if (!cr) {
          MZ_RETURN_IF_ERROR(SessionReader::Open(*pool_->model_, T, pool_->ChunkPath(h[size_t(c)]), &cr,
                                                 ctx_->kv().geometry().kv_type));
          if (int(cr->tokens().size()) != T || cr->n_chunks() != 1 ||
              !std::equal(cr->tokens().begin(), cr->tokens().end(), tokens + size_t(c) * size_t(T)))
            return Status::Corruption("chunk file " + pool_->ChunkPath(h[size_t(c)]) + " holds other tokens");
        }
        return cr->ReadChunk(l, 0, dst);
      },
      &mine, &got);
  // Reuse is an optimization: on any failure the caller computes every token (the error is not
  // the request's).
  if (!st.ok() || got != depth) return Status::Ok();
  if (src_ctx) {
    // The source borrows them too, its own copies freed: the chunks are held once. A chunk it
    // cannot attach (the store cannot restore it) stays its own copy: held twice, never wrong.
    std::vector<SharedChunkStore::Ref> theirs = mine;
    for (auto r : theirs) pool_->shared_->AddRef(r);
    // Its stored file, written before, holds its own copy of them: written again (write-behind)
    // naming their chunk files, so that they are stored once too.
    if (src_ctx->BorrowShared(tokens, depth, pool_->shared_, theirs).ok() && pool_->opts_.dedup_stored)
      src_conv->rename_shared_ = true;
  }
  return borrow(mine);
}

void Conversation::AfterChangeLocked(int keep_tokens) {
  version_++;
  n_tokens_ = int(ctx_->history().size());
  Env* env = pool_->model_->env();
  last_use_ns_ = env->NowNs();
  pool_->last_use_ns_ = last_use_ns_.load();
  last_use_unix_ms_ = env->WallClockMs();
  std::lock_guard<std::mutex> lk(pool_->mu_);
  pool_->ReindexLocked(*this, ctx_->history(), keep_tokens);
  pool_->TryReportShared(*ctx_, &last_report_);
}

std::unique_lock<std::mutex> Conversation::LockForUse() {
  std::unique_lock<std::mutex> use(use_mu_, std::try_to_lock);
  if (use.owns_lock()) return use;
  waiters_.fetch_add(1);
  pool_->WakeYielders();
  use.lock();
  waiters_.fetch_sub(1);
  return use;
}

Status Conversation::Decode(const int32_t* tokens, int n, bool all_logits) {
  return Run(tokens, n, PipelineOptions(), nullptr, all_logits, /*pipeline=*/false);
}

Status Conversation::RestoreGenerate(const int32_t* tokens, int n, const PipelineOptions& po,
                                     RestoreGenerateStats* stats) {
  return Run(tokens, n, po, stats, false, /*pipeline=*/true);
}

Status Conversation::Run(const int32_t* tokens, int n, const PipelineOptions& po, RestoreGenerateStats* stats,
                         bool all_logits, bool pipeline) {
  if (!tokens || n <= 0) return Status::InvalidArgument("no tokens");
  double room_s = 0;
  uint64_t room_bytes = 0;
  {
    std::unique_lock<std::mutex> use = LockForUse();
    // A first token (restore and prefill): the write-behind waits between chunks meanwhile.
    struct Urgent {
      Pool* p;
      bool on;
      ~Urgent() {
        if (on && p->urgent_calls_.fetch_sub(1) == 1) p->WakeYielders();
      }
    } urgent{pool_, pipeline || n > 1};
    if (urgent.on) pool_->urgent_calls_.fetch_add(1);
    struct Running {
      std::atomic<bool>& r;
      ~Running() { r = false; }
    } running{running_};
    running_ = true;
    MZ_RETURN_IF_ERROR(EnsureOpenLocked());
    // Several models under one budget: room first. What this call will restore (its model's
    // weights given back, its KV) is counted before the restore, and the idle models give back
    // for it now, so that a switch never holds both models; the pass after the call settles what
    // the call grew. Its error is not the call's (that pass reports the budget's).
    const uint64_t room0 = pool_->model_->env()->NowNs();
    (void)pool_->MakeRoomForCall(*this, &room_bytes);
    room_s = double(pool_->model_->env()->NowNs() - room0) * 1e-9;
    MZ_SYNC_POINT("conversation:before_restore", 0);  // tests: room made, nothing restored yet
    int before = 0;
    for (bool computed_again = false;;) {
      int consumed = 0;
      before = int(ctx_->history().size());  // these tokens stay as they are
      const bool was_empty = before == 0;
      // Made again after a shared chunk failed (computed_again): not from the remote tier, whose
      // copy may be what failed.
      if (was_empty && pool_->opts_.share_prefixes)
        MZ_RETURN_IF_ERROR(PrefixLocked(tokens, n, /*remote=*/!computed_again, &consumed));
      const int shared_before = ctx_->SharedPrefixChunks();
      Status st = WithWeightsLocked([&] {
        if (pipeline && !all_logits) return ctx_->RestoreGenerate(tokens + consumed, n - consumed, po, stats);
        return ctx_->Decode(tokens + consumed, n - consumed, all_logits);
      });
      if (st.ok()) {
        // The pool's latest measured prefill rate: a new conversation's context has none yet when
        // it decides whether to fetch a remote prefix (RemotePrefix).
        if (ctx_->compute_s_per_token() > 0) pool_->prefill_s_per_token_.store(ctx_->compute_s_per_token());
        break;
      }
      if (was_empty && consumed > 0) {
        ctx_->Truncate(0);
        shared_chunks_ = 0;
      }
      if (st.code() == Status::kCorruption) {
        pool_->TakeDamagedChunkFiles(st);
        if (shared_before > 0 && !computed_again) {
          // A shared chunk it borrows failed its checksum when read (its chunk file or the store's
          // swap): that chunk stays lost for every borrower, so this conversation's tokens are
          // computed again without it, and the call is made again (nothing lost).
          Status hs = ReplaceByComputingAgainLocked(before, shared_before, st.message());
          if (hs.ok()) {
            computed_again = true;
            continue;
          }
          st = st.With("computing its tokens again: " + hs.ToString());
        }
        // A stored chunk failed its checksum when read (its file is this conversation's storage
        // tier): reported like a file found damaged at start, once; the file stays.
        std::lock_guard<std::mutex> lk(pool_->mu_);
        bool known = false;
        for (const auto& d : pool_->damaged_) known = known || d.path == stored_path_;
        if (!known && !stored_path_.empty()) pool_->damaged_.push_back({stored_path_, st.message()});
      }
      return st;
    }
    // A reply under way: the turn's prompt (restore_generate) or a generated token (a one-token
    // decode). A plain prefill (a longer decode) opens no turn: it is idle once it returns.
    if (pipeline || n == 1) turn_open_ = true;
    AfterChangeLocked(before);
  }
  CallTimes times{room_s, room_bytes, 0};
  auto note = [&] {
    std::lock_guard<std::mutex> lk(call_mu_);
    last_call_ = times;
  };
  if (pool_->batcher_) {
    // Once per batcher step: the first call returning after a step runs the pass.
    const uint64_t step = pool_->batcher_->steps();
    uint64_t seen = pool_->budget_step_.load();
    if (seen == step || !pool_->budget_step_.compare_exchange_strong(seen, step)) {
      note();
      return Status::Ok();
    }
  }
  // In a shared budget with pass_after_return, handed to the budget's thread (the logits are
  // ready now; SharedBudget's header says what the budget guarantees meanwhile).
  Status st = pool_->EnforceAfterCall(&times.pass_s);
  note();
  return st;
}

void Conversation::Cancel() {
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    ctx = ctx_;
  }
  if (ctx) ctx->Cancel();
}

bool Conversation::InUse() {
  if (running_.load()) return true;
  if (!turn_open_.load()) return false;
  const uint64_t now = pool_->model_->env()->NowNs();
  return now - last_use_ns_.load() < uint64_t(pool_->opts_.write_behind_idle_ms) * 1000000ull;
}

Status Conversation::WithWeightsLocked(const std::function<Status()>& fn) {
  // Weights: shared while all are resident (others may compute too); exclusive when this
  // generation must restore some (nobody else reads them meanwhile).
  std::shared_lock<std::shared_mutex> sl(pool_->weights_mu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> xl(pool_->weights_mu_, std::defer_lock);
  {
    // A restore-ahead slice holding the weights (Pool::RestoreAheadTick) stops after its
    // units in flight for this call instead of running to its end.
    Context::ForegroundIntent intent(pool_->weights_ctx_.get());
    sl.lock();
    if (!pool_->AllWeightsResident()) {
      sl.unlock();
      xl.lock();
    }
  }
  return fn();
}

Status Conversation::Truncate(int n_keep) {
  std::unique_lock<std::mutex> use = LockForUse();
  MZ_RETURN_IF_ERROR(EnsureOpenLocked());
  if (n_keep < 0) return Status::InvalidArgument("n_keep < 0");
  if (n_keep >= int(ctx_->history().size())) return Status::Ok();
  ctx_->Truncate(n_keep);
  if (n_keep < shared_chunks_ * ctx_->kv().geometry().chunk_tokens)
    shared_chunks_ = n_keep / ctx_->kv().geometry().chunk_tokens;
  AfterChangeLocked(n_keep);
  return Status::Ok();
}

Status Conversation::Commit() {
  turn_open_ = false;  // the turn ended: idle for the budget pass (InUse)
  if (pool_->opts_.dir.empty()) return Status::Ok();
  std::shared_ptr<Conversation> self;
  {
    std::lock_guard<std::mutex> lk(pool_->mu_);
    auto it = pool_->convs_.find(id_);
    if (it == pool_->convs_.end() || it->second.get() != this)
      return Status::InvalidArgument("conversation '" + id_ + "' was closed or deleted");
    self = it->second;
  }
  if (pool_->opts_.write_behind) {
    // At most one turn behind: the previous commit's write (queued, or running) ends first, so a
    // kill -9 loses at most the turn committed last. A failed write ends the wait too (it is
    // counted in persist_failures and retried; the loss may then be larger, and that is reported).
    const uint64_t prev = committed_version_.load();
    if (prev > persisted_version_.load()) {
      pool_->save_waiters_.fetch_add(1);  // a write paused for generations goes on (YieldToCalls)
      pool_->WakeYielders();
      std::unique_lock<std::mutex> lk(pool_->wb_mu_);
      const uint64_t attempts = persist_attempts_.load();
      pool_->wb_done_cv_.wait(lk, [&] {
        return persisted_version_.load() >= prev || persist_attempts_.load() != attempts || pool_->wb_stop_;
      });
      pool_->save_waiters_.fetch_sub(1);
    }
    committed_version_ = version_.load();
    turn_open_ = false;
    pool_->QueuePersist(self);
    return Status::Ok();
  }
  turn_open_ = false;
  return pool_->Persist(self);
}

Status Conversation::SetTurnMark(int n) {
  std::unique_lock<std::mutex> use = LockForUse();
  if (closed_) return Status::InvalidArgument("conversation '" + id_ + "' was closed or deleted");
  MZ_RETURN_IF_ERROR(EnsureOpenLocked());
  if (ctx_->turn_mark() == n) return Status::Ok();
  MZ_RETURN_IF_ERROR(ctx_->SetTurnMark(n));
  version_++;  // persisted again (the mark is part of the stored file)
  return Status::Ok();
}

int Conversation::n_tokens() {
  std::unique_lock<std::mutex> use = LockForUse();
  if (ctx_) return int(ctx_->history().size());
  std::lock_guard<std::mutex> lk(pool_->mu_);
  return stored_tokens_;
}

const float* Conversation::logits(int row) {
  std::unique_lock<std::mutex> use = LockForUse();
  return ctx_ ? ctx_->logits(row) : nullptr;
}

int Conversation::n_logit_rows() {
  std::unique_lock<std::mutex> use = LockForUse();
  return ctx_ ? ctx_->n_logit_rows() : 0;
}

Context* Conversation::context() {
  std::unique_lock<std::mutex> use = LockForUse();
  return ctx_.get();
}

}  // namespace mz
