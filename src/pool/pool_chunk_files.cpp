// Shared prefix chunks stored once (PoolOptions::dedup_stored): the chunk files <dir>/chunks/<hash>.mzk,
// their references from stored conversations, damage found in them, and the resolver that reads them.
#include "pool/pool.h"

#include <algorithm>
#include <cstdio>

#include "pool/chunk_hash.h"
#include "runtime/session_file.h"

#include "pool/pool_internal.h"

namespace mz {

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
      Status st = AdoptChunkFile(h, tokens.data(), c, path, gen, &row);
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

Status Pool::AdoptChunkFile(const std::vector<uint64_t>& h, const int32_t* tokens, int c, const std::string& path,
                            uint64_t gen, std::vector<SharedChunkStore::Ref>* row) {
  row->clear();
  const KvGeometry& g = shared_->geometry();
  const int T = g.chunk_tokens, L = g.n_layer;
  const int32_t* ct = tokens + size_t(c) * size_t(T);
  std::unique_ptr<SessionReader> cr;
  Status st = SessionReader::Open(*model_, T, path, &cr, g.kv_type);
  if (st.ok() && (int(cr->tokens().size()) != T || cr->n_chunks() != 1 || !std::equal(cr->tokens().begin(), cr->tokens().end(), ct)))
    st = Status::Corruption("chunk file " + path + " holds other tokens");
  std::vector<SharedChunkStore::FilePlace> places(static_cast<size_t>(L));
  for (int l = 0; l < L && st.ok(); ++l) {
    int enc = 0;
    pool_internal::PlaceOf(*cr, l, &places[size_t(l)], &enc);
    if (enc != T) st = Status::Corruption("chunk file " + path + ": layer " + std::to_string(l) + " is not a full chunk");
  }
  if (st.ok()) st = shared_->AdoptFile(h[size_t(c)], c ? h[size_t(c) - 1] : 0, ct, c, path, cr->codec(), places, row, gen);
  if (!st.ok()) row->clear();
  return st;
}

}  // namespace mz
