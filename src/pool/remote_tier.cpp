#include "pool/remote_tier.h"

#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "model/model.h"
#include "pool/chunk_hash.h"
#include "runtime/session_file.h"

namespace mz {
namespace {

constexpr char kEnvMagic[8] = {'M', 'Z', 'R', 'B', '0', '0', '0', '1'};
#pragma pack(push, 1)
struct Envelope {
  char magic[8];
  uint32_t kind, reserved;
  uint64_t model, key_hash, length, payload_hash;
};
#pragma pack(pop)

std::string Hex16(uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
  return b;
}

std::string Trim(std::string s) {
  const size_t nl = s.find_first_of("\r\n");
  if (nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

Status RemoteTier::Open(const Model& model, int chunk_tokens, const std::string& codec, const RemoteTierOptions& opts,
                        std::function<std::string(uint64_t)> chunk_path, std::unique_ptr<RemoteTier>* out) {
  std::unique_ptr<RemoteTier> t(new RemoteTier());
  t->model_ = &model;
  t->T_ = chunk_tokens;
  const HParams& hp = model.hparams();
  t->g_.n_layer = int(hp.n_layer);
  t->g_.n_kv_head = int(hp.n_head_kv);
  t->g_.head_dim = int(hp.head_dim);
  t->g_.chunk_tokens = chunk_tokens;
  t->fp_ = model.identity().header_hash;
  t->codec_ = codec;
  t->opts_ = opts;
  t->chunk_path_ = std::move(chunk_path);
  if (opts.store) {
    t->kv_ = opts.store;
  } else {
    RedisOptions ro;
    MZ_RETURN_IF_ERROR(ParseRemoteUrl(opts.url, &ro.url));
    if (!opts.password_file.empty()) {
      std::string pw;
      MZ_RETURN_IF_ERROR(model.env()->ReadSmallFile(opts.password_file, &pw).With("the remote's password file"));
      pw = Trim(pw);
      if (pw.empty()) return Status::InvalidArgument("the remote's password file " + opts.password_file + " is empty");
      ro.url.password = pw;
    }
    ro.timeout_ms = opts.timeout_ms;
    ro.max_connections = opts.connections;
    ro.env = model.env();
    ro.ca_file = opts.ca_file;
    ro.cert_file = opts.cert_file;
    ro.key_file = opts.key_file;
    std::unique_ptr<RemoteKv> kv;
    MZ_RETURN_IF_ERROR(OpenRedisKv(ro, &kv, /*check_now=*/false));
    t->kv_ = std::move(kv);
  }
  t->stats_.enabled = true;
  t->stats_.address = t->kv_->Describe();
  t->Note(t->kv_->Ping());  // down at start: degraded, not an error (the local tiers go on)
  RemoteTier* self = t.get();
  MZ_RETURN_IF_ERROR(model.env()->StartThread([self] { self->Loop(); }, &t->thread_));
  MZ_RETURN_IF_ERROR(model.env()->StartThread([self] { self->StreamLoop(); }, &t->st_thread_));
  *out = std::move(t);
  return Status::Ok();
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lk(st_mu_);
    st_stop_ = true;
  }
  st_cv_.notify_all();
  arrived_cv_.notify_all();
  if (st_thread_.joinable()) st_thread_.join();
}

std::string RemoteTier::ChunkKey(uint64_t hash) const { return "mz:" + Hex16(fp_) + ":" + codec_ + ":k:{" + Hex16(hash) + "}"; }
std::string RemoteTier::ManifestKey(const std::string& id) const { return "mz:" + Hex16(fp_) + ":m:{" + id + "}"; }

std::string RemoteTier::Wrap(Kind kind, const std::string& key, const std::string& payload) const {
  Envelope e{};
  std::memcpy(e.magic, kEnvMagic, 8);
  e.kind = kind;
  e.model = fp_;
  e.key_hash = XXH64(key.data(), key.size(), 0);
  e.length = payload.size();
  e.payload_hash = XXH64(payload.data(), payload.size(), 0);
  std::string v(reinterpret_cast<const char*>(&e), sizeof e);
  v += payload;
  return v;
}

Status RemoteTier::Unwrap(Kind kind, const std::string& key, const std::string& value, std::string* payload) const {
  auto bad = [&](const std::string& why) { return Status::Corruption("remote value " + key + ": " + why); };
  Envelope e{};
  if (value.size() < sizeof e) return bad("truncated (" + std::to_string(value.size()) + " bytes)");
  std::memcpy(&e, value.data(), sizeof e);
  if (std::memcmp(e.magic, kEnvMagic, 8) != 0) return bad("bad magic (not an mzcache value)");
  if (e.kind != kind) return bad("of another kind");
  if (e.model != fp_) return bad("written for another model");
  if (e.key_hash != XXH64(key.data(), key.size(), 0)) return bad("written under another key");
  if (e.length != value.size() - sizeof e) return bad("truncated or padded");
  if (XXH64(value.data() + sizeof e, size_t(e.length), 0) != e.payload_hash) return bad("checksum mismatch");
  payload->assign(value, sizeof e, std::string::npos);
  return Status::Ok();
}

void RemoteTier::Note(const Status& st) {
  std::lock_guard<std::mutex> lk(mu_);
  if (st.ok()) {
    stats_.degraded = false;
  } else if (st.code() == Status::kIOError) {
    stats_.degraded = true;
    stats_.last_error = st.message();
  } else {
    stats_.last_error = st.message();
  }
}

void RemoteTier::QueueWrite(const std::string& id, const std::string& path) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_[id] = path;
    deleted_.erase(id);  // made again since
  }
  cv_.notify_all();
}

void RemoteTier::DeleteConversation(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.erase(id);
    if (running_) deleted_.insert(id);  // a write of it in flight removes its manifest again after
  }
  Note(kv_->Remove({ManifestKey(id)}));
}

Status RemoteTier::Flush() {
  std::unique_lock<std::mutex> lk(mu_);
  if (pending_.empty() && !running_) return Status::Ok();
  const uint64_t want = attempts_ + (running_ ? 2 : 1);  // a pass that starts after this call
  retry_now_ = true;
  cv_.notify_all();
  done_cv_.wait(lk, [&] { return attempts_ >= want || stop_; });
  return last_pass_error_;
}

void RemoteTier::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (stats_.degraded && !retry_now_) {
      // The store was unreachable: every retry_ms, the pending writes are tried again, or (none
      // pending) the store is pinged, so that lookups (skipped meanwhile) resume once it is back.
      cv_.wait_for(lk, std::chrono::milliseconds(opts_.retry_ms), [&] { return stop_ || retry_now_; });
      if (stop_) break;
      if (!retry_now_ && pending_.empty()) {
        lk.unlock();
        Note(kv_->Ping());
        lk.lock();
        continue;
      }
    } else {
      cv_.wait(lk, [&] { return stop_ || !pending_.empty() || retry_now_; });
      if (stop_) break;
    }
    retry_now_ = false;
    running_ = true;
    std::map<std::string, std::string> batch;
    batch.swap(pending_);
    running_n_ = int(batch.size());
    lk.unlock();
    Status first;
    bool unreachable = false;
    std::map<std::string, std::string> again;
    for (const auto& w : batch) {
      if (unreachable) {  // the store is down: the rest waits for the next pass
        again.insert(w);
        continue;
      }
      Status st = WriteOne(w.first, w.second);
      bool deleted;
      {
        std::lock_guard<std::mutex> g(mu_);
        deleted = deleted_.erase(w.first) > 0;
      }
      if (deleted) (void)kv_->Remove({ManifestKey(w.first)});  // deleted while it was being written
      Note(st);
      if (!st.ok()) {
        if (first.ok()) first = st.With("writing conversation '" + w.first + "' to the remote tier");
        if (st.code() == Status::kIOError) {
          unreachable = true;
          again.insert(w);
        }
        std::lock_guard<std::mutex> g(mu_);
        stats_.write_failures++;
      }
    }
    lk.lock();
    for (const auto& w : again) pending_.emplace(w);  // a newer QueueWrite of the same id wins
    running_ = false;
    running_n_ = 0;
    attempts_++;
    last_pass_error_ = first;
    done_cv_.notify_all();
  }
  running_ = false;
  attempts_++;
  done_cv_.notify_all();
}

Status RemoteTier::TimedFetch(const std::function<Status()>& call) {
  Env* env = model_->env();
  const uint64_t t0 = env->NowNs();
  Status st = call();
  Note(st);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.fetch_s += double(env->NowNs() - t0) * 1e-9;
  return st;
}

bool RemoteTier::Skip() {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_.degraded;
}

Status RemoteTier::ChunkBytes(SessionReader& r, int c, uint64_t hash, std::string* out) {
  const int32_t* ct = r.tokens().data() + size_t(c) * size_t(T_);
  std::unique_ptr<SessionReader> cr;
  if (c < r.n_external()) {  // the local chunk file holds it
    MZ_RETURN_IF_ERROR(SessionReader::Open(*model_, T_, chunk_path_(hash), &cr));
    if (int(cr->tokens().size()) != T_ || cr->n_chunks() != 1 || cr->codec_id() != r.codec_id() ||
        !std::equal(cr->tokens().begin(), cr->tokens().end(), ct))
      return Status::Corruption("chunk file " + chunk_path_(hash) + " holds other tokens or another codec");
  }
  return BuildSessionBytes(fp_, g_, r.codec_id(), ct, T_, 0,
                           [&](int l, int, std::string* p, int* enc) {
                             return cr ? cr->ReadPayload(l, 0, p, enc) : r.ReadPayload(l, c, p, enc);
                           },
                           out);
}

Status RemoteTier::WriteOne(const std::string& id, const std::string& path) {
  std::unique_ptr<SessionReader> r;
  Status st = SessionReader::Open(*model_, T_, path, &r);
  if (!st.ok()) return st.With("reading its stored file");  // deleted meanwhile, or damaged: not sent
  if (r->codec() != codec_) return Status::Ok();  // stored before a codec change: its next persist sends it
  const std::vector<int32_t>& toks = r->tokens();
  const int n = int(toks.size()), F = n / T_;
  const std::vector<uint64_t> h = ChainHashes(fp_, toks.data(), F * T_, T_);
  std::vector<std::string> keys;
  for (uint64_t x : h) keys.push_back(ChunkKey(x));
  std::vector<bool> present;
  MZ_RETURN_IF_ERROR(kv_->Exists(keys, &present));
  uint64_t written = 0, bytes = 0, had = 0;
  std::vector<std::string> touch;
  for (int c = 0; c < F; ++c) {
    if (present[size_t(c)]) {
      had++;
      touch.push_back(keys[size_t(c)]);
      continue;
    }
    std::string blob;
    st = ChunkBytes(*r, c, h[size_t(c)], &blob);
    if (!st.ok()) {
      if (st.code() == Status::kIOError) return st;
      continue;  // a local chunk file gone: the manifest names it anyway (a fetcher computes it again)
    }
    const std::string v = Wrap(kChunk, keys[size_t(c)], blob);
    bool w = false;
    MZ_RETURN_IF_ERROR(kv_->Put(keys[size_t(c)], v, opts_.ttl_s, /*only_if_absent=*/true, &w));
    if (w) {
      written++;
      bytes += v.size();
    } else {
      had++;
      touch.push_back(keys[size_t(c)]);
    }
  }
  std::string man;
  MZ_RETURN_IF_ERROR(BuildSessionBytes(fp_, g_, r->codec_id(), toks.data(), n, F,
                                       [&](int l, int c, std::string* p, int* enc) { return r->ReadPayload(l, c, p, enc); },
                                       &man, r->turn_mark()));
  const std::string mk = ManifestKey(id);
  const std::string mv = Wrap(kManifest, mk, man);
  MZ_RETURN_IF_ERROR(kv_->Put(mk, mv, opts_.ttl_s, false));
  // After the manifest: no chunk it names expires before it.
  MZ_RETURN_IF_ERROR(kv_->Touch(touch, opts_.ttl_s));
  std::lock_guard<std::mutex> lk(mu_);
  stats_.manifests_written++;
  stats_.chunks_written += written;
  stats_.chunks_present += had;
  stats_.bytes_written += bytes + mv.size();
  return Status::Ok();
}

void RemoteTier::FetchManifest(const std::string& id, std::string* payload) {
  payload->clear();
  if (Skip()) return;  // unreachable a moment ago: no wait per request (the thread probes it)
  const std::string key = ManifestKey(id);
  std::vector<std::optional<std::string>> v;
  const Status st = TimedFetch([&] { return kv_->Get({key}, &v); });
  std::lock_guard<std::mutex> lk(mu_);
  if (!st.ok()) return;
  if (!v[0]) {
    stats_.manifest_misses++;
    return;
  }
  Status u = Unwrap(kManifest, key, *v[0], payload);
  if (!u.ok()) {
    payload->clear();
    stats_.damaged++;
    stats_.manifest_misses++;
    stats_.last_error = u.message();
    return;
  }
  stats_.manifest_hits++;
  stats_.bytes_fetched += v[0]->size();
}

void RemoteTier::FetchChunks(const std::vector<uint64_t>& hashes, std::vector<std::string>* payloads) {
  payloads->assign(hashes.size(), std::string());
  if (hashes.empty() || Skip()) return;
  std::vector<std::string> keys;
  for (uint64_t x : hashes) keys.push_back(ChunkKey(x));
  std::vector<std::optional<std::string>> v;
  const Status st = TimedFetch([&] {
    Status s = kv_->Get(keys, &v);
    return s.ok() ? kv_->Touch(keys, opts_.ttl_s) : s;
  });
  std::lock_guard<std::mutex> lk(mu_);
  if (!st.ok()) return;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!v[i]) {
      stats_.damaged++;  // named but gone (evicted): computed again
      continue;
    }
    Status u = Unwrap(kChunk, keys[i], *v[i], &(*payloads)[i]);
    if (!u.ok()) {
      (*payloads)[i].clear();
      stats_.damaged++;
      stats_.last_error = u.message();
      continue;
    }
    stats_.chunks_fetched++;
    stats_.bytes_fetched += v[i]->size();
  }
}

void RemoteTier::FetchChunkHeads(const std::vector<uint64_t>& hashes, uint64_t head_bytes,
                                 std::vector<std::string>* heads, std::vector<uint64_t>* file_bytes) {
  heads->assign(hashes.size(), std::string());
  file_bytes->assign(hashes.size(), 0);
  if (hashes.empty() || Skip()) return;
  std::vector<std::string> keys;
  for (uint64_t x : hashes) keys.push_back(ChunkKey(x));
  const std::vector<std::pair<uint64_t, uint64_t>> ranges(keys.size(), {0, sizeof(Envelope) + head_bytes});
  std::vector<std::string> v;
  std::vector<uint64_t> sizes;
  const Status st = TimedFetch([&] {
    Status s = kv_->GetRange(keys, ranges, &v, &sizes);
    return s.ok() ? kv_->Touch(keys, opts_.ttl_s) : s;
  });
  std::lock_guard<std::mutex> lk(mu_);
  if (!st.ok()) return;
  for (size_t i = 0; i < keys.size(); ++i) {
    Envelope e{};
    std::string why;
    if (sizes[i] == 0) why = "missing (evicted or expired)";
    else if (v[i].size() < sizeof e) why = "truncated (" + std::to_string(sizes[i]) + " bytes)";
    if (why.empty()) {
      std::memcpy(&e, v[i].data(), sizeof e);
      if (std::memcmp(e.magic, kEnvMagic, 8) != 0) why = "bad magic (not an mzcache value)";
      else if (e.kind != kChunk) why = "of another kind";
      else if (e.model != fp_) why = "written for another model";
      else if (e.key_hash != XXH64(keys[i].data(), keys[i].size(), 0)) why = "written under another key";
      else if (e.length != sizes[i] - sizeof e || e.length < head_bytes) why = "truncated or padded";
    }
    if (!why.empty()) {
      stats_.damaged++;
      stats_.last_error = "remote value " + keys[i] + ": " + why;
      continue;
    }
    (*heads)[i].assign(v[i], sizeof e, std::string::npos);
    (*file_bytes)[i] = e.length;
    stats_.bytes_fetched += v[i].size();
  }
}

void RemoteTier::StreamChunks(std::vector<StreamJob> jobs) {
  if (jobs.empty()) return;
  {
    std::lock_guard<std::mutex> lk(st_mu_);
    for (const auto& j : jobs) streams_[{j.hash, j.gen}] = StreamState();
    st_queue_.push_back(std::move(jobs));
  }
  st_cv_.notify_all();
}

Status RemoteTier::AwaitLayer(uint64_t hash, uint64_t gen, int layer) {
  std::unique_lock<std::mutex> lk(st_mu_);
  const auto key = std::make_pair(hash, gen);
  arrived_cv_.wait(lk, [&] {
    auto it = streams_.find(key);
    return st_stop_ || it == streams_.end() || it->second.arrived < 0 || it->second.arrived > layer;
  });
  auto it = streams_.find(key);
  if (it == streams_.end() || (it->second.arrived > layer)) return Status::Ok();
  if (it->second.arrived < 0) return Status::Corruption(it->second.why);
  return Status::Corruption("the remote tier stopped while chunk " + Hex16(hash) + " was arriving");
}

int RemoteTier::Streaming() {
  std::lock_guard<std::mutex> lk(st_mu_);
  int n = 0;
  for (const auto& s : streams_) n += s.second.arrived >= 0;
  return n;
}

void RemoteTier::StreamLoop() {
  std::unique_lock<std::mutex> lk(st_mu_);
  while (true) {
    st_cv_.wait(lk, [&] { return st_stop_ || !st_queue_.empty(); });
    if (st_stop_) break;
    std::vector<StreamJob> jobs = std::move(st_queue_.front());
    st_queue_.erase(st_queue_.begin());
    lk.unlock();
    StreamBatch(jobs);
    lk.lock();
  }
  for (auto& s : streams_)  // never arriving now: their readers compute them again
    if (s.second.arrived >= 0) {
      s.second.arrived = -1;
      s.second.why = "the remote tier stopped";
    }
  arrived_cv_.notify_all();
}

void RemoteTier::StreamBatch(std::vector<StreamJob>& jobs) {
  auto fail = [&](StreamJob& j, const std::string& why) {
    std::lock_guard<std::mutex> lk(st_mu_);
    StreamState& s = streams_[{j.hash, j.gen}];
    s.arrived = -1;
    s.why = "remote chunk " + Hex16(j.hash) + ": " + why;
    j.file.reset();
  };
  const int L = g_.n_layer;
  std::vector<std::string> v;  // every layer's payloads, its buffers reused layer after layer
  for (int l = 0; l < L; ++l) {
    std::vector<StreamJob*> live;
    std::vector<std::string> keys;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto& j : jobs) {
      if (!j.file || int(j.layers.size()) != L) continue;
      live.push_back(&j);
      keys.push_back(ChunkKey(j.hash));
      ranges.emplace_back(sizeof(Envelope) + j.layers[size_t(l)].off, j.layers[size_t(l)].size);
    }
    if (live.empty()) break;
    bool stopping;
    {
      std::lock_guard<std::mutex> lk(st_mu_);
      stopping = st_stop_;
    }
    const Status st = stopping ? Status::IOError("the remote tier is stopping")
                               : TimedFetch([&] { return kv_->GetRange(keys, ranges, &v); });
    uint64_t bytes = 0, bad = 0;
    for (size_t i = 0; i < live.size(); ++i) {
      StreamJob& j = *live[i];
      const SharedChunkStore::FilePlace& p = j.layers[size_t(l)];
      std::string why;
      if (!st.ok()) why = st.message();
      else if (v[i].size() != p.size) why = "layer " + std::to_string(l) + " missing or short (evicted or truncated)";
      else if (XXH64(v[i].data(), v[i].size(), 0) != p.hash) why = "layer " + std::to_string(l) + " fails its checksum";
      if (why.empty()) {
        Status w = j.file->Write(v[i].data(), v[i].size(), p.off);
        if (!w.ok()) why = "writing its chunk file: " + w.message();
      } else if (st.ok()) {
        bad++;
      }
      if (!why.empty()) {
        fail(j, why);
        std::lock_guard<std::mutex> lk(mu_);
        stats_.last_error = "remote chunk " + Hex16(j.hash) + ": " + why;
        continue;
      }
      bytes += v[i].size();
      if (l + 1 == L) {  // whole: synced, counted, then no longer streaming
        const bool synced = j.file->Sync().ok();
        j.file.reset();
        if (synced && j.marker && j.marker->left.fetch_sub(1) == 1) (void)model_->env()->Remove(j.marker->path);
        std::lock_guard<std::mutex> lk(mu_);
        stats_.chunks_fetched++;
      }
      std::lock_guard<std::mutex> lk(st_mu_);
      if (l + 1 == L) streams_.erase({j.hash, j.gen});
      else streams_[{j.hash, j.gen}].arrived = l + 1;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.bytes_fetched += bytes;
      stats_.damaged += bad;
    }
    arrived_cv_.notify_all();
  }
  for (auto& j : jobs)
    if (j.file) fail(j, "not streamed (no layers)");
  arrived_cv_.notify_all();
}

int RemoteTier::LongestPrefix(const std::vector<uint64_t>& hashes) {
  if (hashes.empty() || Skip()) return 0;
  std::vector<std::string> keys;
  for (uint64_t x : hashes) keys.push_back(ChunkKey(x));
  std::vector<bool> present;
  Status st = kv_->Exists(keys, &present);
  Note(st);
  if (!st.ok()) return 0;
  int k = 0;
  while (k < int(present.size()) && present[size_t(k)]) ++k;
  return k;
}

void RemoteTier::CountDamaged(uint64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.damaged += n;
}

void RemoteTier::CountPrefix(uint64_t chunks) {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.prefix_chunks += chunks;
}

void RemoteTier::CountSkippedSlower(uint64_t chunks) {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.fetches_skipped_slower++;
  stats_.chunks_skipped_slower += chunks;
}

RemoteTierStats RemoteTier::Stats() {
  const int streaming = Streaming();
  std::lock_guard<std::mutex> lk(mu_);
  RemoteTierStats s = stats_;
  s.streaming = streaming;
  s.pending = int(pending_.size()) + running_n_;
  return s;
}

}  // namespace mz
