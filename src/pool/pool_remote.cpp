// The pool's side of its remote tier (pool/remote_tier.h): what is fetched from the fleet's store
// becomes local stored files and chunk files, so the pool's own paths (open a stored conversation,
// resolve its chunk files, compute again what fails verification) do the rest.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "policy/remote_fetch.h"
#include "pool/pool_internal.h"
#include "pool/chunk_hash.h"
#include "pool/pool.h"
#include "env/env.h"
#include "runtime/session_file.h"

namespace mz {

void Pool::QueueRemoteWrite(const std::string& id, const std::string& path) { remote_->QueueWrite(id, path); }

Status Pool::FetchRemoteConversation(const std::string& id) {
  std::lock_guard<std::mutex> fetch(remote_fetch_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (convs_.count(id)) return Status::Ok();  // fetched (or made) meanwhile
  }
  std::string man;
  remote_->FetchManifest(id, &man);
  if (man.empty()) return Status::Ok();  // none, damaged or unreachable: a new conversation
  Env* env = model_->env();
  const int T = opts_.context.kv_chunk_tokens;
  // Scratch names in the swap folder (emptied at every Open): '~' is in no conversation's name.
  const std::string tmp = opts_.dir + "/swap/~remote-" + id + ".mzs";
  Status st = env->WriteSmallFile(tmp, man, true);
  std::unique_ptr<SessionReader> r;
  if (st.ok()) st = SessionReader::Open(*model_, T, tmp, &r);
  if (!st.ok()) {
    env->Remove(tmp);
    if (st.code() == Status::kCorruption) remote_->CountDamaged();
    return Status::Ok();  // a manifest that does not read: computed from the request instead
  }
  const int k = r->n_external();
  const std::vector<uint64_t> ext = ChainHashes(model_->identity().header_hash, r->tokens().data(), k * T, T);
  // The chunks this pool has no file of, fetched in one pipeline; each verified as a chunk file of
  // exactly its tokens before it takes its place.
  std::vector<uint64_t> need;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    for (uint64_t h : ext) {
      auto it = chunk_files_.find(h);
      if (it == chunk_files_.end() || (!it->second.on_disk && !it->second.writing)) need.push_back(h);
    }
  }
  // Streamed: the chunks' heads (session header and index) first, in one pipeline; each checked
  // as a chunk file of exactly its tokens and put in place at its full length, then their layers
  // arrive on the remote tier's stream thread, front layers first, while the conversation is
  // restored (the shared store waits at its file gate for a layer not in yet; a layer that never
  // arrives whole makes its units lost: the conversation is computed again, never a wrong chunk).
  // Without a shared store to borrow them, none: the conversation is computed again.
  std::vector<int> need_c;
  for (uint64_t x : need) need_c.push_back(int(std::find(ext.begin(), ext.end(), x) - ext.begin()));
  std::vector<RemoteHead> ready;
  StreamRemoteHeads(need, need_c, r->tokens().data(), r->codec(), &ready);
  // The files arriving at their chunk files' paths are marked partial first: one marker file in
  // chunks/ listing their hashes (pool_internal::kPartialPrefix), removed by the stream once every
  // one is whole, so that a crash meanwhile leaves nothing a restart takes for a chunk file (Init
  // removes them). Not written: none placed (the conversation's tokens are computed again).
  auto marker = std::make_shared<RemoteTier::StreamJob::Marker>();
  if (!ready.empty()) {
    char name[64];
    std::snprintf(name, sizeof name, "/chunks/%s%llu", pool_internal::kPartialPrefix,
                  static_cast<unsigned long long>(++swap_seq_));
    marker->path = opts_.dir + name;
    std::string list;
    for (const auto& f : ready) {
      char line[24];
      std::snprintf(line, sizeof line, "%016llx\n", static_cast<unsigned long long>(f.job.hash));
      list += line;
    }
    if (!env->WriteSmallFile(marker->path, list, true).ok()) {
      for (auto& f : ready) env->Remove(f.path);
      ready.clear();
    }
  }
  // The stored file's chunk file references, and the fetched files in place (a chunk file another
  // persist wrote meanwhile is kept: the same chunk), each streamed in under its file's gen.
  std::vector<RemoteTier::StreamJob> jobs;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    for (uint64_t h : ext) chunk_files_[h].refs++;
    for (auto& f : ready) {
      ChunkFile& cf = chunk_files_[f.job.hash];
      if (cf.on_disk || cf.writing || !env->Rename(f.path, ChunkPath(f.job.hash)).ok()) {
        f.job.file.reset();
        env->Remove(f.path);
        continue;
      }
      FileInfo fi;
      cf.on_disk = true;
      cf.rewrite = false;
      cf.bytes = env->StatPath(ChunkPath(f.job.hash), &fi).ok() ? fi.size : 0;
      cf.gen = ++file_gen_seq_;
      f.job.gen = cf.gen;
      f.job.marker = marker;
      jobs.push_back(std::move(f.job));
    }
    marker->left = int(jobs.size());
    if (jobs.empty() && !marker->path.empty()) env->Remove(marker->path);
    remote_->StreamChunks(std::move(jobs));  // registered before any reader can find the files
  }
  const std::string path = StoredPath(id);
  st = env->Rename(tmp, path);
  if (!st.ok()) {
    env->Remove(tmp);
    DropChunkFileRefs(ext);
    return st.With("placing conversation '" + id + "' fetched from the remote tier");
  }
  auto c = std::shared_ptr<Conversation>(new Conversation(this, id));
  c->stored_path_ = path;
  c->stored_bytes_ = r->file_bytes();
  c->stored_tokens_ = int(r->tokens().size());
  c->stored_turn_mark_ = r->turn_mark();
  c->stored_history_ = r->tokens();
  c->last_use_unix_ms_ = env->WallClockMs();
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    c->stored_external_ = ext;
  }
  std::lock_guard<std::mutex> lk(mu_);
  convs_[id] = c;
  ReindexLocked(*c, r->tokens(), 0);
  return Status::Ok();
}

void Pool::StreamRemoteHeads(const std::vector<uint64_t>& hashes, const std::vector<int>& index,
                             const int32_t* tokens, const std::string& codec, std::vector<RemoteHead>* out) {
  out->clear();
  if (!shared_ || hashes.empty()) return;  // no store to borrow them: computed again
  RemoteTier* rt = remote_.get();
  shared_->SetFileGate([rt](uint64_t h, uint64_t gen, int l) { return rt->AwaitLayer(h, gen, l); });
  Env* env = model_->env();
  const int T = opts_.context.kv_chunk_tokens;
  const int L = int(model_->hparams().n_layer);
  const uint64_t head_bytes = 4096 + 4 * uint64_t(T) + 32 * uint64_t(L) + 8;  // header, index (one chunk per layer)
  std::vector<std::string> heads;
  std::vector<uint64_t> lengths;
  remote_->FetchChunkHeads(hashes, head_bytes, &heads, &lengths);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (heads[i].empty()) continue;  // missing or damaged (counted): its tokens are computed again
    const int c = index[i];
    char name[64];  // unique: another fetch of the same chunk may be writing its own copy
    std::snprintf(name, sizeof name, "/swap/~remote-%016llx-%llu.mzk", static_cast<unsigned long long>(hashes[i]),
                  static_cast<unsigned long long>(++swap_seq_));
    RemoteHead rd;
    rd.index = c;
    rd.path = opts_.dir + name;
    rd.job.hash = hashes[i];
    std::unique_ptr<SessionReader> cr;
    Status cs = env->Open(rd.path, OpenMode::kCreateTrunc, false, &rd.job.file);
    if (cs.ok()) cs = rd.job.file->Write(heads[i].data(), heads[i].size(), 0);
    if (cs.ok()) cs = rd.job.file->Truncate(lengths[i]);
    if (cs.ok()) cs = SessionReader::Open(*model_, T, rd.path, &cr);
    if (cs.ok() && (int(cr->tokens().size()) != T || cr->n_chunks() != 1 || cr->codec() != codec ||
                    !std::equal(cr->tokens().begin(), cr->tokens().end(), tokens + size_t(c) * size_t(T))))
      cs = Status::Corruption("remote chunk holds other tokens");
    for (int l = 0; cs.ok() && l < L; ++l) {
      SharedChunkStore::FilePlace p;
      int enc = 0;
      pool_internal::PlaceOf(*cr, l, &p, &enc);
      if (enc != T || p.off < heads[i].size()) cs = Status::Corruption("remote chunk: layer " + std::to_string(l) + " misplaced");
      rd.job.layers.push_back(p);
    }
    cr.reset();
    if (!cs.ok()) {
      rd.job.file.reset();
      env->Remove(rd.path);
      if (cs.code() == Status::kCorruption) remote_->CountDamaged();
      continue;
    }
    out->push_back(std::move(rd));
  }
}

int Pool::RemotePrefix(const std::vector<uint64_t>& h, const int32_t* tokens, int local_depth, KvType kv_type,
                       const DeviceProfile& profile, double compute_s_per_token, uint64_t est_chunk_bytes,
                       std::vector<std::unique_ptr<SessionReader>>* readers, std::vector<SharedChunkStore::Ref>* refs) {
  readers->clear();
  refs->clear();
  const int k = remote_->LongestPrefix(h);
  if (k <= local_depth) return 0;
  // Fetch, or compute the tokens beyond local_depth again: planned by the pure policy, applied here.
  {
    const RemoteTierStats rs = remote_->Stats();
    RemoteFetchInput in;
    const uint64_t chunk_bytes = rs.chunks_fetched > 0 ? rs.bytes_fetched / rs.chunks_fetched : est_chunk_bytes;
    in.bytes = chunk_bytes * uint64_t(k);
    in.tokens = (k - local_depth) * opts_.context.kv_chunk_tokens;
    in.compute_s_per_token = compute_s_per_token;
    if (profile.remote_read_Bps > 0) {
      in.remote_Bps = profile.remote_read_Bps;
      in.first_byte_s = profile.remote_first_byte_s;
    } else if (rs.fetch_s > 0 && rs.bytes_fetched > 0) {
      in.remote_Bps = double(rs.bytes_fetched) / rs.fetch_s;  // learned: round trips included
    }
    const RemoteFetchPlan plan = PlanRemoteFetch(in);
    if (!plan.fetch) {
      remote_->CountSkippedSlower(uint64_t(k - local_depth));
      return 0;
    }
  }
  if (opts_.remote.stream_prefix && shared_) return StreamRemotePrefix(h, tokens, k, local_depth, refs);
  std::vector<std::string> blobs;
  remote_->FetchChunks(std::vector<uint64_t>(h.begin(), h.begin() + k), &blobs);
  Env* env = model_->env();
  const int T = opts_.context.kv_chunk_tokens;
  const std::string codec = opts_.persist_codec.empty() ? "q8" : opts_.persist_codec;
  for (int c = 0; c < k; ++c) {
    if (blobs[size_t(c)].empty()) break;  // missing or damaged (counted): the run ends before it
    char name[64];  // unique: another conversation may fetch the same chunk at once
    std::snprintf(name, sizeof name, "/swap/~remote-%016llx-%llu.mzk", static_cast<unsigned long long>(h[size_t(c)]),
                  static_cast<unsigned long long>(++swap_seq_));
    const std::string path = opts_.dir + name;
    std::unique_ptr<SessionReader> cr;
    Status cs = env->WriteSmallFile(path, blobs[size_t(c)], true);
    if (cs.ok()) cs = SessionReader::Open(*model_, T, path, &cr, kv_type);
    env->Remove(path);  // the reader keeps it open
    if (cs.ok() && (int(cr->tokens().size()) != T || cr->n_chunks() != 1 || cr->codec() != codec ||
                    !std::equal(cr->tokens().begin(), cr->tokens().end(), tokens + size_t(c) * size_t(T))))
      cs = Status::Corruption("remote chunk holds other tokens");
    if (!cs.ok()) {
      if (cs.code() == Status::kCorruption) remote_->CountDamaged();
      break;
    }
    readers->push_back(std::move(cr));
  }
  const int got = int(readers->size());
  if (got <= local_depth) {
    readers->clear();
    return 0;
  }
  remote_->CountPrefix(uint64_t(got));
  return got;
}

int Pool::StreamRemotePrefix(const std::vector<uint64_t>& h, const int32_t* tokens, int k, int local_depth,
                             std::vector<SharedChunkStore::Ref>* refs) {
  const int T = opts_.context.kv_chunk_tokens;
  const int L = int(model_->hparams().n_layer);
  const std::string codec = opts_.persist_codec.empty() ? "q8" : opts_.persist_codec;
  Env* env = model_->env();
  std::vector<std::vector<SharedChunkStore::Ref>> rows(static_cast<size_t>(k));  // [c][l]; empty: not (yet) held
  auto release = [&](std::vector<SharedChunkStore::Ref>& row) {
    for (auto r : row)
      if (r) shared_->Release(r);
    row.clear();
  };
  // What this pool holds already (the shared store's units, else its chunk file) is borrowed from
  // there; only the rest comes from the remote tier.
  std::vector<uint64_t> need;
  std::vector<int> need_c;
  for (int c = 0; c < k; ++c) {
    const uint64_t parent = c ? h[size_t(c) - 1] : 0;
    const int32_t* ct = tokens + size_t(c) * size_t(T);
    std::vector<SharedChunkStore::Ref>& row = rows[size_t(c)];
    row.assign(size_t(L), nullptr);
    bool all = true;
    for (int l = 0; l < L && all; ++l) all = (row[size_t(l)] = shared_->Find(h[size_t(c)], parent, ct, l)) != nullptr;
    if (all) continue;
    release(row);
    uint64_t gen = 0;
    {
      std::lock_guard<std::mutex> fl(files_mu_);
      auto it = chunk_files_.find(h[size_t(c)]);
      if (it != chunk_files_.end() && it->second.on_disk && !it->second.writing) gen = it->second.gen;
    }
    if (gen != 0 && AdoptChunkFile(h, tokens, c, ChunkPath(h[size_t(c)]), gen, &row).ok()) continue;
    need.push_back(h[size_t(c)]);
    need_c.push_back(c);
  }
  std::vector<RemoteHead> heads;
  StreamRemoteHeads(need, need_c, tokens, codec, &heads);
  // A chunk whose head failed ends the run: the ones after it are not streamed.
  int stop = k;
  for (int c : need_c)
    if (std::none_of(heads.begin(), heads.end(), [c](const RemoteHead& hd) { return hd.index == c; })) stop = std::min(stop, c);
  for (auto it = heads.begin(); it != heads.end();) {
    if (it->index < stop) {
      ++it;
      continue;
    }
    it->job.file.reset();
    env->Remove(it->path);
    it = heads.erase(it);
  }
  // Each under a file gen of its own (never a chunk file's), registered with the stream before the
  // store can read it; the file is adopted by the store, which keeps it open, and unlinked at once:
  // nothing of it is left on disk after a crash, and a persist naming the chunk writes its chunk
  // file as for any shared chunk.
  std::vector<RemoteTier::StreamJob> jobs;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    for (auto& hd : heads) hd.job.gen = ++file_gen_seq_;
  }
  std::vector<std::pair<int, std::string>> placed;  // (chunk, path)
  std::vector<uint64_t> gens;
  for (auto& hd : heads) {
    placed.emplace_back(hd.index, hd.path);
    gens.push_back(hd.job.gen);
    jobs.push_back(std::move(hd.job));
  }
  remote_->StreamChunks(std::move(jobs));
  for (size_t i = 0; i < placed.size(); ++i) {
    std::vector<SharedChunkStore::Ref>& row = rows[size_t(placed[i].first)];
    Status st = AdoptChunkFile(h, tokens, placed[i].first, placed[i].second, gens[i], &row);
    if (!st.ok() && st.code() == Status::kCorruption) remote_->CountDamaged();
    env->Remove(placed[i].second);
  }
  // The run: the chunks held from its start, up to the first one that is not.
  int got = 0;
  while (got < k && !rows[size_t(got)].empty()) ++got;
  for (int c = got; c < k; ++c) release(rows[size_t(c)]);
  if (got <= local_depth) {
    for (int c = 0; c < got; ++c) release(rows[size_t(c)]);
    return 0;
  }
  refs->assign(size_t(L) * size_t(got), nullptr);
  for (int c = 0; c < got; ++c)
    for (int l = 0; l < L; ++l) (*refs)[size_t(l) * size_t(got) + size_t(c)] = rows[size_t(c)][size_t(l)];
  remote_->CountPrefix(uint64_t(got));
  return got;
}

}  // namespace mz
