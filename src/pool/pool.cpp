#include "pool/pool.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>

#include "pool/chunk_hash.h"
#include "pool/shared_budget.h"
#include "runtime/session_file.h"
#include "store/kv_codec.h"

namespace mz {
namespace {

constexpr const char* kStoredSuffix = ".mzs";

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (char ch : id)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) return false;
  return true;
}

bool EndsWith(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Where layer l of a chunk file's one chunk lies (SessionReader::ChunkPlace of chunk 0).
void PlaceOf(const SessionReader& r, int l, SharedChunkStore::FilePlace* p, int* enc_tokens) {
  r.ChunkPlace(l, 0, &p->off, &p->size, &p->hash, enc_tokens);
}

// A conversation's own RAM: borrowed shared chunks are the store's, counted once by the pool.
uint64_t RamOf(const MemoryReport& r) { return r.kv_resident + r.stack_mapped; }

}  // namespace

// ---- Conversation ----

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

Status Conversation::PrefixLocked(const int32_t* tokens, int n, int* consumed) {
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
  // The remote tier (shared by a fleet) may hold a longer run: its chunks are fetched and verified
  // (a chunk file's bytes each) and fill the store instead.
  std::vector<std::unique_ptr<SessionReader>> remote_readers;
  if (pool_->remote_ && depth < int(h.size())) {
    const int k = pool_->RemotePrefix(h, tokens, depth, ctx_->kv().geometry().kv_type, &remote_readers);
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
  if (!ctx_->BorrowShared(tokens, depth, pool_->shared_, mine).ok()) {
    ctx_->Truncate(0);
    return Status::Ok();
  }
  *consumed = n_prefix;
  shared_chunks_ = depth;
  std::lock_guard<std::mutex> lk(pool_->mu_);
  pool_->stats_.prefix_chunks_reused += uint64_t(depth);
  return Status::Ok();
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
    int before = 0;
    for (bool computed_again = false;;) {
      int consumed = 0;
      before = int(ctx_->history().size());  // these tokens stay as they are
      const bool was_empty = before == 0;
      if (was_empty && pool_->opts_.share_prefixes) MZ_RETURN_IF_ERROR(PrefixLocked(tokens, n, &consumed));
      const int shared_before = ctx_->SharedPrefixChunks();
      Status st = WithWeightsLocked([&] {
        if (pipeline && !all_logits) return ctx_->RestoreGenerate(tokens + consumed, n - consumed, po, stats);
        return ctx_->Decode(tokens + consumed, n - consumed, all_logits);
      });
      if (st.ok()) break;
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
  if (pool_->batcher_) {
    // Once per batcher step: the first call returning after a step runs the pass.
    const uint64_t step = pool_->batcher_->steps();
    uint64_t seen = pool_->budget_step_.load();
    if (seen == step || !pool_->budget_step_.compare_exchange_strong(seen, step)) return Status::Ok();
  }
  return pool_->EnforceBudget();
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

// ---- Pool ----

Pool::~Pool() {
  if (in_group_) group_->Remove(this);  // waits for a shared-budget pass under way
  StopWatchingPressure();
  {
    std::lock_guard<std::mutex> lk(wb_mu_);
    wb_stop_ = true;
  }
  stopping_ = true;
  WakeYielders();
  wb_cv_.notify_all();
  wb_done_cv_.notify_all();
  if (wb_thread_.joinable()) wb_thread_.join();
  Flush();  // every changed conversation is persisted (errors were counted in persist_failures)
  if (remote_ && !remote_->Stats().degraded) (void)remote_->Flush();  // bounded by the store's timeouts
}

Status Pool::Open(Model* model, const PoolOptions& opts, std::unique_ptr<Pool>* out) {
  if (!model) return Status::InvalidArgument("Pool::Open: no model");
  if (!opts.persist_codec.empty() && !MakeKvCodec(opts.persist_codec))
    return Status::InvalidArgument("unknown persist codec '" + opts.persist_codec + "'");
  if (!opts.remote.url.empty() && !opts.remote.store) {  // refused before anything is created
    if (opts.dir.empty()) return Status::InvalidArgument("a remote tier needs a folder (PoolOptions::dir)");
    RemoteUrl u;
    MZ_RETURN_IF_ERROR(ParseRemoteUrl(opts.remote.url, &u).With("the remote tier"));
  }
  std::unique_ptr<Pool> p(new Pool(model, opts));
  MZ_RETURN_IF_ERROR(p->Init());
  *out = std::move(p);
  return Status::Ok();
}

std::string Pool::StoredPath(const std::string& id) const { return opts_.dir + "/" + id + kStoredSuffix; }

Status Pool::NewContext(const std::string& id, std::shared_ptr<Context>* out, const std::string& suffix) {
  ContextOptions o = opts_.context;
  o.shared_weights = true;
  o.segment_cache = arena_;
  o.batcher = batcher_;
  if (!opts_.dir.empty() && o.swap_path.empty())
    o.swap_path = opts_.dir + "/swap/" + id + suffix + ".swap";
  else if (!o.swap_path.empty())
    o.swap_path += "." + id + suffix;  // one swap file per conversation
  auto ctx = std::make_shared<Context>(model_, o);
  MZ_RETURN_IF_ERROR(ctx->Init());
  *out = std::move(ctx);
  return Status::Ok();
}

Status Pool::Init() {
  Env* env = model_->env();
  stats_.memory_budget = opts_.memory_budget;
  stats_.disk_budget = opts_.disk_budget;
  if (group_ && opts_.memory_budget != 0)
    return Status::InvalidArgument("a pool in a shared budget has no memory_budget of its own (set it to 0)");
  uint64_t arena = group_ ? 0 : opts_.load_arena_bytes;
  if (arena == PoolOptions::kAutoArena)
    arena = opts_.memory_budget > 0 ? std::min<uint64_t>(uint64_t(256) << 20, opts_.memory_budget / 8) : 0;
  if (arena >= CompressedStack::kDefaultSegmentBytes) {
    arena_cap_ = arena;
    arena_ = std::make_shared<SegmentCache>(env, CompressedStack::kDefaultSegmentBytes, arena);
  }
  const int T = opts_.context.kv_chunk_tokens;
  if (!opts_.dir.empty()) {
    MZ_RETURN_IF_ERROR(env->MakeDir(opts_.dir + "/swap"));
    MZ_RETURN_IF_ERROR(env->MakeDir(opts_.dir + "/chunks"));
    // Swap files are scratch of a running process: a previous process's are garbage.
    std::vector<std::string> names;
    MZ_RETURN_IF_ERROR(env->ListDir(opts_.dir + "/swap", &names));
    for (const auto& n : names) env->Remove(opts_.dir + "/swap/" + n);
    MZ_RETURN_IF_ERROR(env->ListDir(opts_.dir, &names));
    std::sort(names.begin(), names.end());
    int unreadable = 0;  // stored files that could not be read: the chunk files they name are unknown
    for (const auto& n : names) {
      const std::string path = opts_.dir + "/" + n;
      if (EndsWith(n, std::string(kStoredSuffix) + ".tmp")) {
        env->Remove(path);  // a write interrupted by a crash: the previous file (if any) is whole
        continue;
      }
      if (!EndsWith(n, kStoredSuffix)) continue;
      const std::string id = n.substr(0, n.size() - std::string(kStoredSuffix).size());
      std::unique_ptr<SessionReader> r;
      Status st = ValidId(id) ? SessionReader::Open(*model_, T, path, &r)
                              : Status::InvalidArgument("not a valid conversation name");
      if (!st.ok()) {
        damaged_.push_back({path, st.message()});
        if (ValidId(id)) unreadable++;  // a file of ours that may name chunk files
        continue;
      }
      FileInfo fi;
      env->StatPath(path, &fi);
      auto c = std::shared_ptr<Conversation>(new Conversation(this, id));
      c->stored_path_ = path;
      c->stored_bytes_ = r->file_bytes();
      c->stored_tokens_ = int(r->tokens().size());
      c->last_use_unix_ms_ = uint64_t(fi.mtime_ns / 1000000);
      if (r->n_external() > 0) {  // the chunk files it names
        std::vector<uint64_t> ext =
            ChainHashes(model_->identity().header_hash, r->tokens().data(), r->n_external() * T, T);
        for (uint64_t h : ext) chunk_files_[h].refs++;
        c->stored_external_ = std::move(ext);
      }
      convs_[id] = c;
      ReindexLocked(*c, r->tokens(), 0);
    }
    // Chunk files: those no stored file names (a crash between writing one and the session file
    // naming it, or after the last file naming it was replaced) and interrupted writes go.
    MZ_RETURN_IF_ERROR(env->ListDir(opts_.dir + "/chunks", &names));
    for (const auto& n : names) {
      const std::string path = opts_.dir + "/chunks/" + n;
      uint64_t h = 0;
      const bool ours = n.size() == 16 + 4 && EndsWith(n, ".mzk") &&
                        std::all_of(n.begin(), n.begin() + 16, [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)); });
      if (ours) h = std::stoull(n.substr(0, 16), nullptr, 16);
      auto it = ours ? chunk_files_.find(h) : chunk_files_.end();
      if (it == chunk_files_.end()) {
        // Named by no file read: removed, unless a stored file could not be read (it may name it;
        // kept untracked, and removed at a later Open once every stored file reads).
        if ((ours && unreadable == 0) || n.find(".mzk.tmp") != std::string::npos) env->Remove(path);
        continue;
      }
      FileInfo fi;
      if (env->StatPath(path, &fi).ok()) {
        it->second.on_disk = true;
        it->second.bytes = fi.size;
        it->second.gen = ++file_gen_seq_;
      }
    }
    // Named but missing: written again when next named (a conversation naming it is computed again).
    for (const auto& f : chunk_files_)
      if (!f.second.on_disk) stats_.chunk_files_damaged++;
  }
  stats_.n_damaged = int(damaged_.size());
  ContextOptions wo = opts_.context;
  wo.n_ctx = T;  // never holds KV: the pool's handle on the weight units
  wo.shared_weights = true;
  weights_ctx_ = std::make_shared<Context>(model_, wo);
  MZ_RETURN_IF_ERROR(weights_ctx_->Init());
  if (opts_.batch) {
    BatcherOptions bo;
    bo.n_threads = opts_.context.n_threads;
    bo.n_ubatch = opts_.context.n_ubatch;
    bo.max_seqs = std::min(opts_.batch_max_seqs, bo.n_ubatch);
    bo.prefill_slice = opts_.batch_prefill_slice;
    bo.min_prefill_slice = std::min(bo.min_prefill_slice, bo.prefill_slice);
    bo.itl_factor = opts_.batch_itl_factor;
    MZ_RETURN_IF_ERROR(Batcher::Create(model_, bo, &batcher_).With("the pool's batcher"));
  }
  if (opts_.share_prefixes) {
    SharedChunkOptions so;
    so.codec = opts_.context.kv_codec;
    so.direct_io = opts_.context.direct_io;
    if (!opts_.dir.empty()) {
      so.swap_path = opts_.dir + "/swap/~shared.swap";  // '~': no conversation's name (ValidId)
    } else if (!opts_.context.swap_path.empty()) {
      so.swap_path = opts_.context.swap_path + ".shared";
    } else {
      std::string t;
      MZ_RETURN_IF_ERROR(env->GetEnvVar("TMPDIR", &t).With("choosing the shared chunks' swap folder"));
      so.swap_path = (t.empty() ? std::string("/var/tmp") : t) + "/mzcache-shared-" +
                     std::to_string(reinterpret_cast<uintptr_t>(this)) + ".swap";
    }
    shared_ = std::make_shared<SharedChunkStore>(env, weights_ctx_->kv().geometry(), so);
    MZ_RETURN_IF_ERROR(shared_->Init());
  }
  if (!opts_.dir.empty()) {
    MZ_RETURN_IF_ERROR(env->StartThread([this] { WriteBehindLoop(); }, &wb_thread_));
  }
  if (!opts_.remote.url.empty() || opts_.remote.store) {
    if (opts_.dir.empty()) return Status::InvalidArgument("a remote tier needs a folder (PoolOptions::dir)");
    MZ_RETURN_IF_ERROR(RemoteTier::Open(*model_, T, opts_.persist_codec.empty() ? "q8" : opts_.persist_codec,
                                        opts_.remote, [this](uint64_t h) { return ChunkPath(h); }, &remote_)
                           .With("the remote tier"));
  }
  if (group_) {
    group_->Add(this);
    in_group_ = true;
  }
  return Status::Ok();
}

Status Pool::GatherShared(const std::vector<uint64_t>& h, const int32_t* tokens, int depth,
                          const std::function<Status(int, int, uint16_t*)>& fill,
                          std::vector<SharedChunkStore::Ref>* refs, int* got) {
  refs->clear();
  *got = 0;
  if (!shared_) return Status::Ok();
  const KvGeometry& g = shared_->geometry();
  const int L = g.n_layer, T = g.chunk_tokens;
  Env* env = model_->env();
  std::vector<std::vector<SharedChunkStore::Ref>> per_chunk;  // [c][l]
  auto release = [&](const std::vector<SharedChunkStore::Ref>& v) {
    for (auto r : v)
      if (r) shared_->Release(r);
  };
  Status st;
  for (int c = 0; c < depth && c < int(h.size()) && st.ok(); ++c) {
    const uint64_t parent = c ? h[size_t(c) - 1] : 0;
    const int32_t* ct = tokens + size_t(c) * size_t(T);
    std::vector<SharedChunkStore::Ref> row(size_t(L), nullptr);
    bool missing = false;
    for (int l = 0; l < L && st.ok() && !missing; ++l) {
      row[size_t(l)] = shared_->Find(h[size_t(c)], parent, ct, l);
      if (row[size_t(l)]) continue;
      if (!fill) {
        missing = true;
        break;
      }
      auto* mem = static_cast<uint16_t*>(env->MapAnon(g.chunk_bytes()));
      if (!mem) {
        st = Status::NoMemory("a shared KV chunk");
        break;
      }
      st = fill(l, c, mem);
      if (!st.ok()) {
        env->Unmap(mem, g.chunk_bytes());
        break;
      }
      st = shared_->Insert(h[size_t(c)], parent, ct, c, l, mem, &row[size_t(l)]);  // takes mem
    }
    if (!st.ok() || missing) {
      release(row);
      break;
    }
    per_chunk.push_back(std::move(row));
  }
  if (!st.ok()) {
    for (auto& row : per_chunk) release(row);
    return st;
  }
  const int n = int(per_chunk.size());
  refs->assign(size_t(L) * size_t(n), nullptr);
  for (int c = 0; c < n; ++c)
    for (int l = 0; l < L; ++l) (*refs)[size_t(l) * size_t(n) + size_t(c)] = per_chunk[size_t(c)][size_t(l)];
  *got = n;
  return Status::Ok();
}

void Pool::ReindexLocked(Conversation& c, const std::vector<int32_t>& history, int keep_tokens) {
  const int T = opts_.context.kv_chunk_tokens;
  const size_t keep = std::min({c.hashes_.size(), size_t(std::max(0, keep_tokens)) / size_t(T), history.size() / size_t(T)});
  for (size_t i = keep; i < c.hashes_.size(); ++i) {
    auto range = index_.equal_range(c.hashes_[i]);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second == c.id_) {
        index_.erase(it);
        break;
      }
  }
  c.hashes_.resize(keep);
  ExtendChainHashes(model_->identity().header_hash, history.data(), int(history.size()), T, &c.hashes_);
  for (size_t i = keep; i < c.hashes_.size(); ++i) index_.emplace(c.hashes_[i], c.id_);
}

Status Pool::OpenConversation(const std::string& id, std::shared_ptr<Conversation>* out) {
  if (!ValidId(id))
    return Status::InvalidArgument("conversation name '" + id +
                                   "': use 1-128 letters, digits, '-', '_' or '.', not starting with '.'");
  std::shared_ptr<Conversation> c;
  if (remote_) {
    bool here;
    {
      std::lock_guard<std::mutex> lk(mu_);
      here = convs_.count(id) > 0;
    }
    if (!here) MZ_RETURN_IF_ERROR(FetchRemoteConversation(id));  // a miss leaves a new conversation to make
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) it = convs_.emplace(id, std::shared_ptr<Conversation>(new Conversation(this, id))).first;
    c = it->second;
  }
  {
    std::unique_lock<std::mutex> use = c->LockForUse();
    Status st = c->EnsureOpenLocked();
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      // A new conversation that could not start is forgotten; a stored one stays stored.
      if (c->stored_path_.empty() && convs_.count(id) && convs_[id] == c) convs_.erase(id);
      return st;
    }
    Env* env = model_->env();
    c->last_use_ns_ = env->NowNs();
    last_use_ns_ = c->last_use_ns_.load();
    if (c->last_use_unix_ms_ == 0) c->last_use_unix_ms_ = env->WallClockMs();
  }
  *out = c;
  return EnforceBudget();
}

Status Pool::Close(const std::string& id) {
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
  }
  if (opts_.dir.empty()) return Delete(id);  // nowhere to keep it
  MZ_RETURN_IF_ERROR(Persist(c));
  std::unique_lock<std::mutex> use = c->LockForUse();
  if (c->closed_) return Status::Ok();
  if (c->version_.load() != c->persisted_version_.load())  // changed after the persist above: persist again
    return Status::Busy("conversation '" + id + "' changed while closing: close it again");
  auto fresh = std::shared_ptr<Conversation>(new Conversation(this, id));
  std::shared_ptr<Context> old;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fresh->hashes_ = c->hashes_;
    fresh->stored_path_ = c->stored_path_;
    fresh->stored_bytes_ = c->stored_bytes_;
    fresh->stored_tokens_ = c->stored_tokens_;
    fresh->last_use_unix_ms_ = c->last_use_unix_ms_.load();
    fresh->shared_chunks_ = c->shared_chunks_;
    {
      std::lock_guard<std::mutex> fl(files_mu_);  // after mu_ (the lock order)
      fresh->stored_external_.swap(c->stored_external_);
    }
    convs_[id] = fresh;
    c->closed_ = true;
    old = std::move(c->ctx_);
  }
  old.reset();  // the context (its memory and swap file) goes once no eviction pass holds it
  return Status::Ok();
}

Status Pool::Delete(const std::string& id) {
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
  }
  std::unique_lock<std::mutex> use = c->LockForUse();
  std::shared_ptr<Context> old;
  std::string path;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ReindexLocked(*c, {}, 0);
    path = c->stored_path_;
    c->closed_ = true;
    old = std::move(c->ctx_);
    auto it = convs_.find(id);
    if (it != convs_.end() && it->second == c) convs_.erase(it);
  }
  old.reset();
  // A file that cannot be removed keeps naming its chunk files: their references stay, held for
  // that path until a file replaces it there (Persist) or the next Open counts them again, and the
  // error is returned.
  Status st = path.empty() ? Status::Ok() : model_->env()->Remove(path);
  std::vector<uint64_t> drop;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    drop.swap(c->stored_external_);
    if (!st.ok()) {
      std::vector<uint64_t>& keep = unremoved_refs_[path];
      keep.insert(keep.end(), drop.begin(), drop.end());
      drop.clear();
    }
  }
  DropChunkFileRefs(drop);
  if (remote_) remote_->DeleteConversation(id);  // else another server (or this one) would bring it back
  return st.With("deleting conversation '" + id + "'");
}

bool Pool::TryReportShared(Context& ctx, MemoryReport* out) {
  std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  return wl.owns_lock() && ctx.TryReport(out);
}

bool Pool::AllWeightsResident() const {
  for (int u = 0; u < model_->n_units(); ++u)
    if (!model_->unit(u).resident()) return false;
  return true;
}

bool Pool::MeasureInMemory(uint64_t* in_memory_out, uint64_t* idle_swap_out) {
  uint64_t in_memory = 0;
  uint64_t idle_swap = 0;  // in-memory swap segments of the idle conversations (what can refill the arena)
  {
    // Reports read the shared weight units: not while a generation restores them.
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    if (!wl.owns_lock()) return false;
    MemoryReport wr;
    if (!weights_ctx_->TryReport(&wr)) return false;
    in_memory = wr.weights_resident;
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t newest = 0, newest_swap = 0;
    for (auto& kv : convs_) {
      Conversation& c = *kv.second;
      if (!c.ctx_) continue;
      c.ctx_->TryReport(&c.last_report_);  // busy: the last known figures (weights lock held)
      in_memory += RamOf(c.last_report_);
      // In a shared budget its compute buffers count too (an idle model gives them back).
      if (group_) in_memory += c.ctx_->compute_buffer_bytes();
      idle_swap += c.last_report_.stack_mapped;
      if (c.last_use_ns_.load() >= newest) {
        newest = c.last_use_ns_.load();
        newest_swap = c.last_report_.stack_mapped;
      }
    }
    idle_swap -= std::min(idle_swap, newest_swap);  // the conversation in use is not evicted for the arena
  }
  if (shared_) in_memory += shared_->Report().resident_bytes;  // shared chunks, once
  if (batcher_) in_memory += batcher_->compute_buffer_bytes();  // the one set of compute buffers
  last_in_memory_ = in_memory + (arena_ ? arena_->bytes() : 0);
  *in_memory_out = in_memory;
  if (idle_swap_out) *idle_swap_out = idle_swap;
  return true;
}

uint64_t Pool::InMemoryForBudget() {
  uint64_t m = 0;
  if (!MeasureInMemory(&m, nullptr)) return last_in_memory_.load();
  return last_in_memory_.load();
}

Status Pool::WeightsTiers(WeightsTierReport* out) {
  std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  if (!wl.owns_lock()) {  // a generation restores them: the last figures
    std::lock_guard<std::mutex> lk(mu_);
    *out = last_tiers_;
    return Status::Ok();
  }
  WeightsTierReport r;
  for (int u = 0; u < model_->n_units(); ++u) {
    const WeightUnit& w = model_->unit(u);
    r.units++;
    r.total += w.region_bytes;
    if (w.resident()) {
      r.units_resident++;
      r.resident += w.region_bytes;
    }
  }
  r.dropped = r.total - r.resident;
  if (r.dropped > 0) r.dropped_cached = std::min(r.dropped, model_->DroppedBytesCached());
  std::lock_guard<std::mutex> lk(mu_);
  last_tiers_ = r;
  *out = r;
  return Status::Ok();
}

bool Pool::ModelInUse() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& kv : convs_)
    if (kv.second->running_.load() || kv.second->InUse()) return true;
  return false;
}

Status Pool::EvictIdleModel(uint64_t bytes, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  Status st = EvictLocked(bytes, freed, /*spare_active=*/true, /*idle_only=*/true, /*whole=*/true);
  if (*freed >= bytes) return st;
  // Then the idle conversations' compute buffers (their next call allocates them again).
  std::vector<std::shared_ptr<Context>> idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_)
      if (kv.second->ctx_ && !kv.second->InUse()) idle.push_back(kv.second->ctx_);
  }
  uint64_t released = 0;
  for (auto& c : idle) {
    if (*freed + released >= bytes) break;
    uint64_t f = 0;
    if (c->TryReleaseComputeBuffers(&f).ok()) released += f;  // busy: a call came meanwhile
  }
  *freed += released;
  std::lock_guard<std::mutex> lk(mu_);
  stats_.bytes_evicted += released;
  return st;
}

Status Pool::EvictWeightsOnly(uint64_t bytes, uint64_t* freed) {
  *freed = 0;
  std::lock_guard<std::mutex> ev(evict_mu_);
  // Only while no conversation computes: a generation holds the weights lock shared.
  std::unique_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
  if (!wl.owns_lock()) return Status::Ok();
  Status st = weights_ctx_->EvictBytes(bytes, freed, nullptr, EvictScope::kAll);
  if (st.code() == Status::kBusy) st = Status::Ok();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.bytes_evicted += *freed;
  return st;
}

Status Pool::EvictOwn(uint64_t bytes, bool pressure, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  return EvictLocked(bytes, freed, /*spare_active=*/!pressure);
}

Status Pool::EnforceBudget() {
  if (group_) return in_group_ ? group_->Enforce() : Status::Ok();
  if (opts_.memory_budget == 0) return Status::Ok();
  if (arena_ && arena_resume_ns_.load() != 0) {
    // The arena off since an Evict (pressure) comes back kArenaPauseNs after the last one (under
    // evict_mu_, as Evict turns it off).
    std::unique_lock<std::mutex> ev(evict_mu_, std::try_to_lock);
    const uint64_t resume = arena_resume_ns_.load();
    if (ev.owns_lock() && resume != 0 && model_->env()->NowNs() >= resume) {
      arena_resume_ns_ = 0;
      arena_->SetCap(arena_cap_);
    }
  }
  uint64_t in_memory = 0;
  uint64_t idle_swap = 0;
  if (!MeasureInMemory(&in_memory, &idle_swap)) return Status::Ok();  // that generation's own call enforces afterwards
  const uint64_t arena = arena_ ? arena_->bytes() : 0;
  if (in_memory + arena <= opts_.memory_budget) return Status::Ok();
  std::unique_lock<std::mutex> ev(evict_mu_, std::try_to_lock);
  if (!ev.owns_lock()) return Status::Ok();  // a pass is under way
  const uint64_t over = in_memory + arena - opts_.memory_budget;
  uint64_t freed = 0;
  // Counted as a budget eviction when it gave back anything (PoolStats::evict_budget).
  auto count = [this](uint64_t bytes) {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evict_budget++;
    stats_.evict_budget_bytes += bytes;
  };
  if (!arena_) {
    Status st = EvictLocked(over, &freed, /*spare_active=*/true);
    count(freed);
    return st;
  }
  // 1. Idle conversations, least recently used first, also for room to keep a full load arena
  // (the swap segments they free go into it). 2. The arena keeps what fits beside what is still
  // held. 3. Still over with the arena empty: the usual pass (the conversation in use, then the
  // weights), and the arena again keeps only what fits.
  // Only in-memory swap segments refill it: resident KV an eviction frees goes to the OS, so no
  // idle conversation goes to storage for room the arena would not get.
  const uint64_t refill = std::min(arena_->cap() > arena ? arena_->cap() - arena : 0, idle_swap);
  Status st = EvictLocked(over + refill, &freed, /*spare_active=*/true, /*idle_only=*/true);
  uint64_t held = in_memory > freed ? in_memory - freed : 0;
  arena_->TrimTo(opts_.memory_budget > held ? opts_.memory_budget - held : 0);
  if (held <= opts_.memory_budget) {
    count(freed);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evictions++;  // one pass (the idle-only step does not count itself)
    return st;
  }
  uint64_t more = 0;
  Status s2 = EvictLocked(held - opts_.memory_budget, &more, /*spare_active=*/true);
  count(freed + more);
  held = held > more ? held - more : 0;
  arena_->TrimTo(opts_.memory_budget > held ? opts_.memory_budget - held : 0);
  return st.ok() ? s2 : st;
}

Status Pool::Evict(uint64_t bytes, uint64_t* freed) {
  uint64_t f = 0;
  Status st = EvictUncounted(bytes, &f);
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.evict_manual++;
    stats_.evict_manual_bytes += f;
  }
  if (freed) *freed = f;
  return st;
}

Status Pool::EvictConversation(const std::string& id, uint64_t* freed) {
  *freed = 0;
  std::shared_ptr<Conversation> c;
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
    ctx = c->ctx_;
  }
  if (!ctx) return Status::Ok();  // stored only: nothing in RAM
  std::lock_guard<std::mutex> ev(evict_mu_);
  uint64_t f = 0;
  Status st;
  {
    // The planner reads the weight units' states: not while a generation moves them (waited for;
    // a generation on this very conversation makes EvictBytes return kBusy instead).
    std::shared_lock<std::shared_mutex> wl(weights_mu_);
    st = ctx->EvictBytes(~uint64_t(0), &f, nullptr, EvictScope::kKvOnly);
    if (st.ok() || st.code() == Status::kBusy) {
      Status d = ctx->DetachShared(nullptr);
      if (st.ok() && d.code() == Status::kBusy) st = d;
    }
    TryReportShared(*ctx, &c->last_report_);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.evict_conversation++;
  stats_.evict_conversation_bytes += f;
  stats_.bytes_evicted += f;
  *freed = f;
  return st.With("evicting conversation '" + id + "'");
}

Status Pool::RestoreConversation(const std::string& id, uint64_t* restored) {
  *restored = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!convs_.count(id)) return Status::InvalidArgument("no conversation '" + id + "'");
  }
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it != convs_.end() && it->second->ctx_) c = it->second;
  }
  // A stored-only one is opened (its file becomes its storage tier); an open one is not (opening
  // would wait for a call running on it).
  if (!c) MZ_RETURN_IF_ERROR(OpenConversation(id, &c));
  uint64_t got = 0;
  Status st;
  bool weights_all = false;
  {
    std::shared_lock<std::shared_mutex> sl(weights_mu_);
    weights_all = AllWeightsResident();
  }
  if (!weights_all) {
    // The weights given back come first; they move only under the exclusive lock, which a
    // generation holds shared: not waited for (kBusy: that generation restores what it needs).
    std::unique_lock<std::shared_mutex> xl(weights_mu_, std::try_to_lock);
    if (!xl.owns_lock()) return Status::Busy("restoring conversation '" + id + "': a generation holds the weights");
    uint64_t w = 0;
    st = weights_ctx_->TryRestoreUpTo(~uint64_t(0), &w, /*yield=*/false);
    got += w;
  }
  std::shared_ptr<Context> ctx;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ctx = c->ctx_;
  }
  if (st.ok() && ctx) {
    std::shared_lock<std::shared_mutex> sl(weights_mu_);
    uint64_t k = 0;
    st = ctx->TryRestoreUpTo(~uint64_t(0), &k, /*yield=*/false);
    got += k;
    TryReportShared(*ctx, &c->last_report_);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (got > 0) stats_.conversation_restores++;
    stats_.conversation_restored_bytes += got;
  }
  *restored = got;
  return st.With("restoring conversation '" + id + "'");
}

Status Pool::EvictUncounted(uint64_t bytes, uint64_t* freed) {
  std::lock_guard<std::mutex> ev(evict_mu_);
  uint64_t f = 0;
  Status st;
  if (arena_) {
    // The load arena first: memory given back at once, nothing of any conversation moves. While
    // this pass runs, segments the conversations free go to the OS, not into the arena.
    const uint64_t a = arena_->bytes();
    f = arena_->TrimTo(a > bytes ? a - bytes : 0);
    if (f < bytes) {
      // The arena stays off (segments freed go to the OS, also those a running call frees) until
      // a budget pass kArenaPauseNs after the last such eviction: not refilled under pressure.
      arena_->SetCap(0);
      arena_resume_ns_ = model_->env()->NowNs() + kArenaPauseNs;
      uint64_t g = 0;
      st = EvictLocked(bytes - f, &g);
      f += g;
    }
  } else {
    st = EvictLocked(bytes, &f);
  }
  if (freed) *freed = f;
  return st;
}

Status Pool::EvictLocked(uint64_t bytes, uint64_t* freed, bool spare_active, bool idle_only, bool whole) {
  *freed = 0;
  struct Victim {
    bool in_use;
    uint64_t last_use;
    std::shared_ptr<Context> ctx;
  };
  std::vector<Victim> order;
  int in_use = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_)
      if (kv.second->ctx_) {
        const bool u = kv.second->InUse();
        in_use += u;
        order.push_back({u, kv.second->last_use_ns_.load(), kv.second->ctx_});
      }
  }
  // 1. idle conversations, least recently used first; then those in use, least recently used
  // first; 2. the most recently used one (last).
  std::sort(order.begin(), order.end(), [](const Victim& a, const Victim& b) {
    return a.in_use != b.in_use ? b.in_use : a.last_use < b.last_use;
  });
  // Several streams mid-turn: a budget pass takes none of them, nor the weights they all read.
  const bool spare_in_use = spare_active && in_use >= 2;
  Status first_err;
  uint64_t total = 0;
  bool deferred = false, spared_in_use = false;
  {
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);  // the planner reads weight states
    if (wl.owns_lock()) {
      bool idle_busy = false;
      // Shared chunks that no conversation has attached go to the store's storage (each counted
      // once; attached ones are pinned: a generation may read them).
      auto evict_shared = [&] {
        if (!shared_ || total >= bytes) return;
        uint64_t f = 0;
        Status st = shared_->Evict(bytes - total, &f);
        total += f;
        if (!st.ok() && first_err.ok()) first_err = st;
      };
      for (size_t i = 0; i < order.size(); ++i) {
        if (total >= bytes || (idle_only && !whole && i + 1 == order.size())) break;
        const auto& v = order[i];
        if (whole && v.in_use) continue;  // a call came meanwhile: that model is in use again
        // An idle conversation goes out whole, its in-memory swap included: the swap is a stack
        // whose segments come back only once it is empty, so moving part of it frees nothing.
        // It lets its borrowed shared chunks go too (detached: its next call attaches them).
        // The most recently used one (last) gives only what is still needed, after the shared
        // chunks nobody holds attached.
        const bool idle = whole || i + 1 < order.size();
        if (spare_in_use && v.in_use) {
          spared_in_use = true;
          break;
        }
        if (!idle && spare_active && idle_busy) {
          deferred = true;  // not the conversation in use: the busy one goes once it is free
          break;
        }
        if (!idle) {
          evict_shared();
          if (total >= bytes) break;
        }
        uint64_t f = 0;
        Status st = v.ctx->EvictBytes(idle ? ~uint64_t(0) : bytes - total, &f, nullptr, EvictScope::kKvOnly);
        total += f;
        if (st.code() == Status::kBusy && idle) {
          idle_busy = true;
          busy_finds_.fetch_add(1);  // a write of it paused for generations goes on
          WakeYielders();
        }
        if (!st.ok() && st.code() != Status::kBusy && first_err.ok()) first_err = st;
        if (idle || total < bytes) {
          if (v.ctx->DetachShared(nullptr).code() == Status::kBusy && idle) idle_busy = true;
          if (!idle) evict_shared();
        }
      }
      // A model nobody uses: its shared chunks go too, once its conversations let them go.
      if (whole) evict_shared();
    }
  }
  if (spared_in_use) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.budget_spared_in_use++;
    stats_.bytes_evicted += total;
    *freed = total;
    return first_err;
  }
  if (deferred) {
    budget_retry_ = true;
    std::lock_guard<std::mutex> lk(mu_);
    stats_.budget_deferred++;
    stats_.bytes_evicted += total;
    *freed = total;
    return first_err;
  }
  // 3. weights, only while no conversation computes.
  if (total < bytes && !idle_only) {
    std::unique_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    if (wl.owns_lock()) {
      uint64_t f = 0;
      Status st = weights_ctx_->EvictBytes(bytes - total, &f, nullptr, EvictScope::kAll);
      total += f;
      if (!st.ok() && st.code() != Status::kBusy && first_err.ok()) first_err = st;
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_only) stats_.evictions++;
    stats_.bytes_evicted += total;
  }
  *freed = total;
  return first_err;
}

bool Pool::LlmBytes(uint64_t* llm, uint64_t* resident) {
  uint64_t layers = 0;  // region sizes are fixed at load: no lock needed
  for (int u = 0; u < model_->n_units(); ++u)
    if (u != model_->base_unit()) layers += model_->unit(u).region_bytes;
  bool fresh = false;
  uint64_t weights_ram = 0, base = 0, kv_total = 0, kv_ram = 0;
  {
    // Reports read the shared weight units' state: not while a generation moves them.
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    MemoryReport wr;
    if (wl.owns_lock() && weights_ctx_->TryReport(&wr)) {
      fresh = true;
      weights_ram = wr.weights_resident;
      const WeightUnit& b = model_->unit(model_->base_unit());
      base = b.resident() ? b.region_bytes : 0;
    } else {
      weights_ram = layers;  // unknown now: assume resident (the KV figures still count)
    }
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_) {
      Conversation& c = *kv.second;
      if (!c.ctx_) continue;
      if (!(fresh && c.ctx_->TryReport(&c.last_report_))) fresh = false;  // busy: the last known figures
      kv_total += c.last_report_.kv_total;
      kv_ram += RamOf(c.last_report_);
    }
  }
  if (shared_) {  // shared chunks, once
    const SharedChunkReport sr = shared_->Report();
    kv_total += uint64_t(sr.units) * shared_->geometry().chunk_bytes();
    kv_ram += sr.resident_bytes;
  }
  *llm = layers + kv_total;
  const uint64_t in_mem = weights_ram + kv_ram;
  *resident = std::min(in_mem > base ? in_mem - base : 0, *llm);
  return fresh;
}

Status Pool::OnPressure(const PressureEvent& ev, uint64_t* freed) {
  if (freed) *freed = 0;
  const bool trim = ev.source == "onTrimMemory";  // mz_pool_on_trim_memory's events
  {
    std::lock_guard<std::mutex> lk(mu_);
    (trim ? stats_.trim_events : stats_.pressure_events)++;
  }
  if (group_ && in_group_) {  // every model together, in the shared budget's order
    uint64_t f = 0;
    Status st = group_->OnPressure(ev, &f);
    if (freed) *freed = f;
    std::lock_guard<std::mutex> lk(mu_);
    if (f > 0) (trim ? stats_.evict_trim : stats_.evict_pressure)++;
    (trim ? stats_.evict_trim_bytes : stats_.evict_pressure_bytes) += f;
    return st;
  }
  uint64_t llm = 0, resident = 0;
  LlmBytes(&llm, &resident);
  AmountDecision d;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    ++pressure_gen_;  // odd: an eviction is on its way (restore-ahead ticks skip)
    d = amount_.OnEvent(ev, llm, resident);
  }
  Status st;
  if (d.evict_bytes > 0) {
    // Critical, with no floor: everything (units move whole, and compression frees less than a
    // unit's size: a byte count would stop one unit short).
    const bool all = ev.level == PressureLevel::kCritical && amount_.options().critical_to_floor &&
                     amount_.options().floor_points <= 0;
    uint64_t f = 0;
    st = EvictUncounted(all ? ~uint64_t(0) : d.evict_bytes, &f);
    if (freed) *freed = f;
    std::lock_guard<std::mutex> lk(mu_);
    (trim ? stats_.evict_trim : stats_.evict_pressure)++;
    (trim ? stats_.evict_trim_bytes : stats_.evict_pressure_bytes) += f;
  }
  std::lock_guard<std::mutex> lk(pressure_mu_);
  ++pressure_gen_;
  return st;
}

bool Pool::RestoreAheadTick(PressureSource* src, HeadroomWindow* window, PoolPressureAction* act) {
  Env* env = model_->env();
  uint64_t gen0 = 0;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    gen0 = pressure_gen_;
  }
  if (gen0 & 1) return false;  // an eviction runs: its figures are not settled
  uint64_t llm = 0, resident = 0;
  // Stale figures (a conversation busy generating, the weights moving) could say "all resident"
  // for a conversation whose KV was evicted since, and the policy would stop asking: skip the tick.
  if (!LlmBytes(&llm, &resident)) return false;
  const uint64_t now = env->NowNs();
  AmountDecision d;
  AmountOptions o;
  {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    // Figures read before an eviction that ran meanwhile would say "resident" and stop the policy
    // asking for good: skip this tick.
    if (pressure_gen_ != gen0) return false;
    d = amount_.Tick(now, llm, resident);
    o = amount_.options();
  }
  if (!d.restore_now) {
    window->Reset();  // the next restore-ahead starts a new stability window
    return false;
  }
  uint64_t budget = 0;
  if (window->Sample(src, now, o, &budget) != HeadroomWindow::Verdict::kRestore) return false;
  if (opts_.memory_budget > 0) {
    const uint64_t in_mem = Stats().in_memory;
    budget = std::min(budget, opts_.memory_budget > in_mem ? opts_.memory_budget - in_mem : 0);
  }
  if (group_) budget = std::min(budget, group_->Headroom());  // never past the shared budget
  if (budget == 0) return false;
  *act = PoolPressureAction();
  act->event.time_ns = now;
  act->event.source = "restore-ahead";
  Status st;
  uint64_t got_all = 0;
  // 1. Weights: they move only under the exclusive weights lock, never waited for (their state is
  // read under the lock too: a generation may be restoring them).
  bool weights_all = false;
  {
    std::shared_lock<std::shared_mutex> sl(weights_mu_, std::try_to_lock);
    if (!sl.owns_lock()) return false;  // a generation restores them: it restores what it needs
    weights_all = AllWeightsResident();
  }
  if (!weights_all) {
    std::unique_lock<std::shared_mutex> xl(weights_mu_, std::try_to_lock);
    if (!xl.owns_lock()) return false;  // a generation runs: it restores what it needs
    uint64_t got = 0;
    st = weights_ctx_->TryRestoreUpTo(budget, &got, o.restore_yields);
    if (st.code() == Status::kBusy) st = Status::Ok();
    got_all += got;
    budget -= std::min(budget, got);
    if (!AllWeightsResident()) budget = 0;  // the KV waits for the front weights
  }
  // 2. The open conversations' KV, most recently used first. All weights are resident and stay
  // so under the shared lock, so a conversation's restore moves only its own KV.
  if (st.ok() && budget > 0) {
    std::shared_lock<std::shared_mutex> sl(weights_mu_, std::try_to_lock);
    if (sl.owns_lock() && AllWeightsResident()) {
      std::vector<std::pair<uint64_t, std::shared_ptr<Context>>> mru;
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& kv : convs_) {
          Conversation& c = *kv.second;
          const MemoryReport& m = c.last_report_;
          if (c.ctx_ && (m.kv_total > m.kv_resident || m.kv_shared > m.kv_shared_attached))
            mru.emplace_back(c.last_use_ns_.load(), c.ctx_);
        }
      }
      std::sort(mru.begin(), mru.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      // The shared_ptr keeps a context that is closed meanwhile alive until its slice ends (its
      // memory then goes with it); a call arriving on it makes the slice stop early (yield).
      for (auto& e : mru) {
        if (budget == 0) break;
        uint64_t got = 0;
        Status s2 = e.second->TryRestoreUpTo(budget, &got, o.restore_yields);
        if (s2.code() == Status::kBusy) s2 = Status::Ok();  // generating: it restores itself
        got_all += got;
        budget -= std::min(budget, got);
        if (!s2.ok()) {
          st = s2;
          break;
        }
      }
    }
  }
  window->Took(got_all);
  act->restored = got_all;
  act->status = st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.restored_ahead += got_all;
    for (auto& kv : convs_)  // the figures Stats and the budget read
      if (kv.second->ctx_) TryReportShared(*kv.second->ctx_, &kv.second->last_report_);
  }
  if (!st.ok()) {
    std::lock_guard<std::mutex> lk(pressure_mu_);
    amount_.RestoreGaveUp();
  }
  act->in_memory = Stats().in_memory;
  return got_all > 0 || !st.ok();
}

Status Pool::WatchPressure(const PoolPressureOptions& opts, std::string* why) {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (watch_src_ && watch_ended_.load()) {  // the last watch ended on its source's error: replaced
    watch_src_->Stop();
    if (watch_thread_.joinable()) watch_thread_.join();
    watch_src_.reset();
  }
  if (watch_src_) return Status::Busy("the pool already watches pressure (stop it first)");
  watch_ended_ = false;
  Env* env = model_->env();
  std::unique_ptr<PressureSource> src;
  MZ_RETURN_IF_ERROR(CreatePressureSource(env, opts.source, &src, why));
  if (opts.wrap_source) src = opts.wrap_source(std::move(src));
  if (!src) return Status::InvalidArgument("wrap_source returned no source");
  MZ_RETURN_IF_ERROR(src->Start());
  {
    std::lock_guard<std::mutex> pl(pressure_mu_);
    amount_ = AmountPolicy(opts.amount);
    if (group_) group_->SetAmount(opts.amount);
  }
  PressureSource* raw = src.get();
  auto on_action = opts.on_action;
  const bool ahead = opts.amount.restore_ahead == AmountOptions::RestoreAhead::kBackground;
  const int wait_ms = ahead ? std::clamp(opts.tick_ms, 1, 1000) : 1000;
  Status st = env->StartThread(
      [this, raw, on_action, ahead, wait_ms] {
        HeadroomWindow window;  // this thread's alone
        bool restoring = false;  // the last tick restored: check again at once
        for (;;) {
          PressureEvent ev;
          Status w = raw->Wait(restoring ? 0 : wait_ms, &ev);
          if (w.code() == Status::kTimeout) {
            restoring = false;
            PoolPressureAction act;
            if (ahead && RestoreAheadTick(raw, &window, &act)) {
              restoring = act.status.ok();
              if (on_action) on_action(act);
            }
            continue;
          }
          window.Reset();  // an event: free memory is not calm
          PoolPressureAction act;
          if (!w.ok()) {
            if (w.code() == Status::kCancelled) return;  // StopWatchingPressure
            act.status = w;                              // e.g. the watched cgroup was removed
            watch_ended_ = true;                         // a new WatchPressure may replace it
            if (on_action) on_action(act);
            return;
          }
          act.event = ev;
          act.status = OnPressure(ev, &act.freed);
          act.in_memory = Stats().in_memory;
          if (on_action) on_action(act);
        }
      },
      &watch_thread_);
  if (!st.ok()) {
    src->Stop();
    return st.With("starting the pool's pressure watch");
  }
  watch_src_ = std::move(src);
  return Status::Ok();
}

void Pool::StopWatchingPressure() {
  std::lock_guard<std::mutex> lk(watch_mu_);
  if (!watch_src_) return;
  watch_src_->Stop();
  if (watch_thread_.joinable()) watch_thread_.join();
  watch_src_.reset();
}

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

Status Pool::Persist(const std::shared_ptr<Conversation>& c, bool background) {
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

std::string Pool::ChunkPath(uint64_t hash) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.mzk", static_cast<unsigned long long>(hash));
  return opts_.dir + "/chunks/" + name;
}

Status Pool::AcquireChunkFiles(Context& ctx, const std::vector<uint64_t>& h, int k) {
  const std::string codec = opts_.persist_codec.empty() ? "q8" : opts_.persist_codec;
  const KvGeometry& g = ctx.kv().geometry();
  const int T = g.chunk_tokens;
  const std::vector<int32_t> hist = ctx.history();
  if (int(hist.size()) < k * T || int(h.size()) < k)
    return Status::Internal("chunk files: the conversation is shorter than its shared prefix");
  std::unique_lock<std::mutex> fl(files_mu_);
  for (int c = 0; c < k; ++c) chunk_files_[h[size_t(c)]].refs++;  // held from now: no last drop unlinks it
  Status st;
  // Rounds: write the files nobody is writing, then wait for those another persist is writing (one
  // writer per file: its temporary name is per path); a file whose writer failed is taken over.
  for (;;) {
    std::vector<int> write;
    bool others = false;
    for (int c = 0; c < k; ++c) {
      ChunkFile& f = chunk_files_[h[size_t(c)]];
      if (f.on_disk && !f.rewrite) continue;
      if (f.writing) {
        others = true;
      } else {
        f.writing = true;
        f.gen = ++file_gen_seq_;
        write.push_back(c);
      }
    }
    if (write.empty() && !others) break;
    if (write.empty()) {
      files_cv_.wait(fl);
      continue;
    }
    std::vector<uint64_t> gens;
    for (int c : write) gens.push_back(chunk_files_[h[size_t(c)]].gen);
    fl.unlock();
    std::vector<std::pair<int, uint64_t>> done;  // (chunk, bytes) in place
    for (size_t i = 0; i < write.size(); ++i) {
      const int c = write[i];
      const int32_t* ct = hist.data() + size_t(c) * size_t(T);
      const std::string path = ChunkPath(h[size_t(c)]);
      SessionInfo info;
      std::vector<SharedChunkStore::FilePlace> places(size_t(g.n_layer));
      st = SaveChunkFile(*model_, g, path, codec, ct,
                         [&](int l, uint16_t* dst) { return ctx.ReadKvChunk(hist.data(), (c + 1) * T, l, c, dst); }, &info,
                         &places);
      if (info.replaced) done.emplace_back(c, info.file_bytes);  // at its path, even if not yet durable
      if (!st.ok()) break;
      // The store's units of this chunk get the file as their durable copy (an eviction of a unit
      // then writes nothing when the codecs agree).
      // Every unit takes it, also one with a copy in an older file at this path (replaced).
      (void)shared_->AdoptFile(h[size_t(c)], c ? h[size_t(c) - 1] : 0, ct, c, path, info.codec, places, nullptr,
                               gens[i], /*replace=*/true);
    }
    fl.lock();
    for (const auto& d : done) {
      ChunkFile& f = chunk_files_[h[size_t(d.first)]];
      f.on_disk = true;
      f.rewrite = false;
      f.bytes = d.second;
    }
    for (int c : write) chunk_files_[h[size_t(c)]].writing = false;
    files_cv_.notify_all();
    if (!st.ok()) break;
  }
  if (!st.ok()) {
    for (int c = 0; c < k; ++c) {  // give back what this call took
      auto it = chunk_files_.find(h[size_t(c)]);
      if (it != chunk_files_.end() && --it->second.refs == 0 && !it->second.writing) {
        if (it->second.on_disk) model_->env()->Remove(ChunkPath(it->first));
        chunk_files_.erase(it);
      }
    }
  }
  return st;
}

void Pool::DropChunkFileRefs(const std::vector<uint64_t>& hashes) {
  if (hashes.empty()) return;
  std::lock_guard<std::mutex> fl(files_mu_);
  for (uint64_t h : hashes) {
    auto it = chunk_files_.find(h);
    if (it == chunk_files_.end() || --it->second.refs > 0) continue;
    // Unlinked under files_mu_: a persist that takes a new reference meanwhile writes the file
    // again after this (the store's open descriptor keeps the old bytes readable).
    if (it->second.on_disk) model_->env()->Remove(ChunkPath(h));
    chunk_files_.erase(it);
  }
}

void Pool::ChunkFileDamaged(uint64_t hash, const std::string& why, uint64_t gen) {
  bool counted = false;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    auto it = chunk_files_.find(hash);
    if (it == chunk_files_.end() || it->second.writing || !it->second.on_disk) return;  // known, or being replaced
    if (gen != 0 && gen != it->second.gen) return;  // an older file at that path, already replaced
    // A damaged file is useless (its named tokens are computed again): removed, so that the next
    // persist naming the chunk writes it again. If it cannot be removed it is still written again
    // (replaced by rename).
    (void)model_->env()->Remove(ChunkPath(hash));
    it->second.on_disk = false;
    it->second.bytes = 0;
    counted = true;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (counted) stats_.chunk_files_damaged++;
  (void)why;
}

void Pool::RewriteChunkFiles(const std::vector<uint64_t>& hashes) {
  std::lock_guard<std::mutex> fl(files_mu_);
  for (uint64_t h : hashes) {
    auto it = chunk_files_.find(h);
    if (it != chunk_files_.end()) it->second.rewrite = true;
  }
}

void Pool::TakeDamagedChunkFiles(const Status& st) {
  if (!shared_ || st.code() != Status::kCorruption) return;
  for (const auto& lf : shared_->TakeLostFiles()) ChunkFileDamaged(lf.hash, st.message(), lf.gen);
}

Status Pool::ResolveExternal(const SessionReader& r, std::shared_ptr<SharedChunkStore>* store,
                             std::vector<SharedChunkStore::Ref>* refs) {
  refs->clear();
  if (!shared_ || opts_.dir.empty())
    return Status::InvalidArgument("the file names shared chunk files, and this pool keeps no shared chunks");
  const KvGeometry& g = shared_->geometry();
  const int T = g.chunk_tokens, L = g.n_layer, k = r.n_external();
  const std::vector<int32_t>& tokens = r.tokens();
  const std::vector<uint64_t> h = ChainHashes(model_->identity().header_hash, tokens.data(), k * T, T);
  std::vector<std::vector<SharedChunkStore::Ref>> rows;  // [c][l]
  auto release = [&] {
    for (auto& row : rows)
      for (auto ref : row)
        if (ref) shared_->Release(ref);
  };
  for (int c = 0; c < k; ++c) {
    const uint64_t parent = c ? h[size_t(c) - 1] : 0;
    const int32_t* ct = tokens.data() + size_t(c) * size_t(T);
    std::vector<SharedChunkStore::Ref> row(size_t(L), nullptr);
    bool all = true;
    for (int l = 0; l < L && all; ++l) all = (row[size_t(l)] = shared_->Find(h[size_t(c)], parent, ct, l)) != nullptr;
    if (!all) {
      for (auto ref : row)
        if (ref) shared_->Release(ref);
      row.clear();
      const std::string path = ChunkPath(h[size_t(c)]);
      uint64_t gen = 0;  // the file at path now (a rewrite meanwhile makes a finding about it stale)
      {
        std::lock_guard<std::mutex> fl(files_mu_);
        auto it = chunk_files_.find(h[size_t(c)]);
        if (it != chunk_files_.end()) gen = it->second.gen;
      }
      std::unique_ptr<SessionReader> cr;
      Status st = SessionReader::Open(*model_, T, path, &cr, g.kv_type);
      if (st.ok() && (int(cr->tokens().size()) != T || cr->n_chunks() != 1 ||
                      !std::equal(cr->tokens().begin(), cr->tokens().end(), ct)))
        st = Status::Corruption("chunk file " + path + " holds other tokens");
      std::vector<SharedChunkStore::FilePlace> places(static_cast<size_t>(L));
      if (st.ok()) {
        for (int l = 0; l < L && st.ok(); ++l) {
          int enc = 0;
          PlaceOf(*cr, l, &places[size_t(l)], &enc);
          if (enc != T) st = Status::Corruption("chunk file " + path + ": layer " + std::to_string(l) + " is not a full chunk");
        }
      }
      if (st.ok()) st = shared_->AdoptFile(h[size_t(c)], parent, ct, c, path, cr->codec(), places, &row, gen);
      if (!st.ok()) {
        // Missing (nothing at its path) or failing a check: written again when next named.
        FileInfo fi;
        if (st.code() == Status::kCorruption || !model_->env()->StatPath(path, &fi).ok())
          ChunkFileDamaged(h[size_t(c)], st.message(), gen);
        release();
        return st.With("shared chunk " + std::to_string(c));
      }
    }
    rows.push_back(std::move(row));
  }
  refs->assign(size_t(L) * size_t(k), nullptr);
  for (int c = 0; c < k; ++c)
    for (int l = 0; l < L; ++l) (*refs)[size_t(l) * size_t(k) + size_t(c)] = rows[size_t(c)][size_t(l)];
  *store = shared_;
  return Status::Ok();
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
      for (auto& kv : convs_) {
        Conversation& c = *kv.second;
        if (!c.ctx_ || (c.version_.load() == c.persisted_version_.load() && !c.rename_shared_.load()) ||
            now - c.last_use_ns_.load() < uint64_t(opts_.write_behind_idle_ms) * 1000000ull)
          continue;
        q.push_back(kv.second);
      }
    }
    for (size_t i = 0; i < q.size(); ++i) {
      if (i < queued) wb_pending_.fetch_sub(1);  // started: a write behind it makes it stop yielding
      if (auto c = q[i].lock()) Persist(c, /*background=*/true);  // failures are counted (persist_failures) and retried later
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

PoolStats Pool::Stats() {
  PoolStats s;
  MemoryReport wr;
  bool have_w = false;
  {
    std::shared_lock<std::shared_mutex> wl(weights_mu_, std::try_to_lock);
    if (wl.owns_lock()) have_w = weights_ctx_->TryReport(&wr);
  }
  std::lock_guard<std::mutex> lk(mu_);
  s = stats_;
  if (have_w) {
    s.weights_total = wr.weights_total;
    s.weights_resident = wr.weights_resident;
  }
  s.n_conversations = int(convs_.size());
  s.n_damaged = int(damaged_.size());
  s.kv_resident = s.kv_mem_compressed = s.kv_storage = s.stored_bytes = 0;
  for (auto& kv : convs_) {
    Conversation& c = *kv.second;
    s.stored_bytes += c.stored_bytes_;
    if (!c.ctx_) continue;
    s.n_open++;
    if (!opts_.dir.empty() && c.version_.load() != c.persisted_version_.load()) s.unsaved++;
    TryReportShared(*c.ctx_, &c.last_report_);
    s.kv_resident += c.last_report_.kv_resident;
    s.kv_mem_compressed += c.last_report_.stack_mapped;
    s.kv_storage += c.last_report_.kv_storage_raw + c.last_report_.kv_storage_compressed;
  }
  {
    std::lock_guard<std::mutex> fl(files_mu_);  // after mu_ (the lock order)
    for (const auto& f : chunk_files_) {
      if (!f.second.on_disk) continue;
      s.chunk_files++;
      s.chunk_file_bytes += f.second.bytes;
      s.chunk_file_refs += uint64_t(f.second.refs);
    }
  }
  s.stored_bytes += s.chunk_file_bytes;
  if (shared_) s.shared = shared_->Report();
  if (arena_) {
    s.arena_bytes = arena_->bytes();
    s.arena_cap = arena_->cap();
    s.arena_reused = arena_->reused_bytes();
  }
  s.persist_yielded_s = double(yielded_ns_.load()) * 1e-9;
  for (auto& kv : convs_) s.in_use += kv.second->InUse();
  if (batcher_) s.batch = batcher_->Stats();
  s.in_memory = s.weights_resident + s.kv_resident + s.kv_mem_compressed + s.shared.resident_bytes + s.arena_bytes +
                s.batch.compute_buffer_bytes;
  if (remote_) s.remote = remote_->Stats();
  return s;
}

Status Pool::Report(const std::string& id, ConversationReport* out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = convs_.find(id);
  if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
  Conversation& c = *it->second;
  ConversationReport r;
  r.id = c.id_;
  r.open = c.ctx_ != nullptr;
  if (c.ctx_) {
    r.busy = !TryReportShared(*c.ctx_, &c.last_report_);
    const MemoryReport& m = c.last_report_;
    r.n_tokens = c.n_tokens_.load();
    r.kv_resident = m.kv_resident;
    r.kv_mem_compressed = m.stack_mapped;
    r.kv_storage = m.kv_storage_raw + m.kv_storage_compressed;
    r.kv_shared = m.kv_shared;
    r.shared_chunks = m.n_kv_chunks[int(UnitState::kKvShared)] / std::max(1, c.ctx_->kv().geometry().n_layer);
  } else {
    r.n_tokens = c.stored_tokens_;
  }
  r.stored_bytes = c.stored_bytes_;
  r.stored_tokens = c.stored_tokens_;
  {
    std::lock_guard<std::mutex> fl(files_mu_);  // after mu_ (the lock order)
    r.stored_external = int(c.stored_external_.size());
  }
  r.last_use_unix_ms = c.last_use_unix_ms_.load();
  if (!c.ctx_) r.shared_chunks = c.shared_chunks_;
  *out = r;
  return Status::Ok();
}

std::vector<ConversationReport> Pool::List() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& kv : convs_) ids.push_back(kv.first);
  }
  std::vector<ConversationReport> out;
  for (const auto& id : ids) {
    ConversationReport r;
    if (Report(id, &r).ok()) out.push_back(r);
  }
  return out;
}

Status Pool::History(const std::string& id, std::vector<int32_t>* out) {
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
  }
  std::unique_lock<std::mutex> use(c->use_mu_, std::try_to_lock);
  if (!use.owns_lock()) return Status::Busy("conversation '" + id + "' is in use");
  if (c->closed_) return Status::InvalidArgument("conversation '" + id + "' was closed or deleted");
  if (c->ctx_) {
    *out = c->ctx_->history();
    return Status::Ok();
  }
  std::string path;
  {
    std::lock_guard<std::mutex> lk(mu_);
    path = c->stored_path_;
  }
  if (path.empty()) {
    out->clear();
    return Status::Ok();
  }
  std::unique_ptr<SessionReader> r;
  MZ_RETURN_IF_ERROR(SessionReader::Open(*model_, opts_.context.kv_chunk_tokens, path, &r));
  *out = r->tokens();
  return Status::Ok();
}

std::vector<DamagedFile> Pool::Damaged() {
  std::lock_guard<std::mutex> lk(mu_);
  return damaged_;
}

}  // namespace mz
