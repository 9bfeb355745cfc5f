// The pool's lifecycle, its folder index, prefix sharing, and conversations' open / close /
// delete (pool/pool.h). The other rooms: pool_budget.cpp, pool_pressure.cpp, pool_write_behind.cpp,
// pool_chunk_files.cpp, pool_report.cpp, pool_remote.cpp, conversation.cpp.
#include "pool/pool.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

#include "pool/chunk_hash.h"
#include "pool/shared_budget.h"
#include "runtime/session_file.h"
#include "store/kv_codec.h"

#include "pool/pool_internal.h"

namespace mz {

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

std::string Pool::StoredPath(const std::string& id) const {
  return opts_.dir + "/" + id + pool_internal::kStoredSuffix;
}

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
      if (pool_internal::EndsWith(n, std::string(pool_internal::kStoredSuffix) + ".tmp")) {
        env->Remove(path);  // a write interrupted by a crash: the previous file (if any) is whole
        continue;
      }
      if (!pool_internal::EndsWith(n, pool_internal::kStoredSuffix)) continue;
      const std::string id = n.substr(0, n.size() - std::string(pool_internal::kStoredSuffix).size());
      std::unique_ptr<SessionReader> r;
      Status st = pool_internal::ValidId(id) ? SessionReader::Open(*model_, T, path, &r)
                              : Status::InvalidArgument("not a valid conversation name");
      if (!st.ok()) {
        damaged_.push_back({path, st.message()});
        if (pool_internal::ValidId(id)) unreadable++;  // a file of ours that may name chunk files
        continue;
      }
      FileInfo fi;
      env->StatPath(path, &fi);
      auto c = std::shared_ptr<Conversation>(new Conversation(this, id));
      c->stored_path_ = path;
      c->stored_bytes_ = r->file_bytes();
      c->stored_tokens_ = int(r->tokens().size());
      c->stored_turn_mark_ = r->turn_mark();
      c->stored_history_ = r->tokens();
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
    // Chunk files marked partial (their layers were arriving from the remote tier when the process
    // died: a marker pool_internal::kPartialPrefix lists them, pool_remote.cpp) are removed, then
    // the marker. A removal that fails keeps the marker: that file is not taken as a chunk file now
    // (named but missing: its tokens are computed again) and goes at a later start. A marker that
    // does not read (cut short by the crash while it was written) named no file placed yet.
    const std::string partial_prefix = pool_internal::kPartialPrefix;
    std::set<std::string> partial;  // chunk file names marked partial: not chunk files at this start
    for (const auto& n : names) {
      if (n.compare(0, partial_prefix.size(), partial_prefix) != 0) continue;
      const std::string marker = opts_.dir + "/chunks/" + n;
      std::string list;
      bool all = true;
      if (env->ReadSmallFile(marker, &list).ok()) {
        for (size_t at = 0, nl; (nl = list.find('\n', at)) != std::string::npos; at = nl + 1) {
          if (nl - at != 16) continue;  // not a hash line
          const std::string chunk = list.substr(at, 16) + ".mzk";
          partial.insert(chunk);
          FileInfo fi;
          const std::string cpath = opts_.dir + "/chunks/" + chunk;
          if (!env->StatPath(cpath, &fi).ok()) continue;  // never placed
          if (env->Remove(cpath).ok()) stats_.partial_chunk_files_removed++;
          else all = false;
        }
      }
      if (all) (void)env->Remove(marker);
    }
    for (const auto& n : names) {
      if (partial.count(n) || n.compare(0, partial_prefix.size(), partial_prefix) == 0) continue;
      const std::string path = opts_.dir + "/chunks/" + n;
      uint64_t h = 0;
      const bool ours = n.size() == 16 + 4 && pool_internal::EndsWith(n, ".mzk") &&
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
  if (!pool_internal::ValidId(id))
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
    fresh->stored_turn_mark_ = c->stored_turn_mark_;
    fresh->stored_history_ = c->stored_history_;
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

}  // namespace mz
