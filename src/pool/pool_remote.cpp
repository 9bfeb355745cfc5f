// The pool's side of its remote tier (pool/remote_tier.h): what is fetched from the fleet's store
// becomes local stored files and chunk files, so the pool's own paths (open a stored conversation,
// resolve its chunk files, compute again what fails verification) do the rest.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "policy/remote_fetch.h"
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
  if (shared_ && !need.empty()) {
    RemoteTier* rt = remote_.get();
    shared_->SetFileGate([rt](uint64_t h, uint64_t gen, int l) { return rt->AwaitLayer(h, gen, l); });
  }
  const int L = int(model_->hparams().n_layer);
  const uint64_t head_bytes = 4096 + 4 * uint64_t(T) + 32 * uint64_t(L) + 8;  // header, index (one chunk per layer)
  std::vector<std::string> heads;
  std::vector<uint64_t> lengths;
  if (shared_) remote_->FetchChunkHeads(need, head_bytes, &heads, &lengths);
  else heads.assign(need.size(), std::string());  // no store to borrow them: computed again
  struct Ready {
    uint64_t hash;
    std::string path;
    RemoteTier::StreamJob job;
  };
  std::vector<Ready> ready;
  for (size_t i = 0; i < need.size(); ++i) {
    if (heads[i].empty()) continue;  // missing or damaged (counted): the conversation is computed again
    const int c = int(std::find(ext.begin(), ext.end(), need[i]) - ext.begin());
    char name[64];  // unique: another fetch of the same chunk may be writing its own copy
    std::snprintf(name, sizeof name, "/swap/~remote-%016llx-%llu.mzk", static_cast<unsigned long long>(need[i]),
                  static_cast<unsigned long long>(++swap_seq_));
    Ready rd{need[i], opts_.dir + name, {}};
    rd.job.hash = need[i];
    std::unique_ptr<SessionReader> cr;
    Status cs = env->Open(rd.path, OpenMode::kCreateTrunc, false, &rd.job.file);
    if (cs.ok()) cs = rd.job.file->Write(heads[i].data(), heads[i].size(), 0);
    if (cs.ok()) cs = rd.job.file->Truncate(lengths[i]);
    if (cs.ok()) cs = SessionReader::Open(*model_, T, rd.path, &cr);
    if (cs.ok() && (int(cr->tokens().size()) != T || cr->n_chunks() != 1 || cr->codec_id() != r->codec_id() ||
                    !std::equal(cr->tokens().begin(), cr->tokens().end(), r->tokens().begin() + size_t(c) * size_t(T))))
      cs = Status::Corruption("remote chunk holds other tokens");
    for (int l = 0; cs.ok() && l < L; ++l) {
      SharedChunkStore::FilePlace p;
      int enc = 0;
      cr->ChunkPlace(l, 0, &p.off, &p.size, &p.hash, &enc);
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
    ready.push_back(std::move(rd));
  }
  // The stored file's chunk file references, and the fetched files in place (a chunk file another
  // persist wrote meanwhile is kept: the same chunk), each streamed in under its file's gen.
  std::vector<RemoteTier::StreamJob> jobs;
  {
    std::lock_guard<std::mutex> fl(files_mu_);
    for (uint64_t h : ext) chunk_files_[h].refs++;
    for (auto& f : ready) {
      ChunkFile& cf = chunk_files_[f.hash];
      if (cf.on_disk || cf.writing || !env->Rename(f.path, ChunkPath(f.hash)).ok()) {
        f.job.file.reset();
        env->Remove(f.path);
        continue;
      }
      FileInfo fi;
      cf.on_disk = true;
      cf.rewrite = false;
      cf.bytes = env->StatPath(ChunkPath(f.hash), &fi).ok() ? fi.size : 0;
      cf.gen = ++file_gen_seq_;
      f.job.gen = cf.gen;
      jobs.push_back(std::move(f.job));
    }
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

int Pool::RemotePrefix(const std::vector<uint64_t>& h, const int32_t* tokens, int local_depth, KvType kv_type,
                       const DeviceProfile& profile, double compute_s_per_token, uint64_t est_chunk_bytes,
                       std::vector<std::unique_ptr<SessionReader>>* readers) {
  readers->clear();
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

}  // namespace mz
