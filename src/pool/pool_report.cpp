// What the pool reports: Stats, List, Report, History, Damaged, WeightsTiers.
#include "pool/pool.h"

#include <algorithm>

#include "runtime/session_file.h"

#include "pool/pool_internal.h"

namespace mz {

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

// Conversation id with its use lock taken without waiting (History, TurnMark): kInvalidArgument
// (unknown, closed or deleted), kBusy (a call runs on it).
Status Pool::ForRead(const std::string& id, std::shared_ptr<Conversation>* out, std::unique_lock<std::mutex>* use) {
  std::shared_ptr<Conversation> c;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = convs_.find(id);
    if (it == convs_.end()) return Status::InvalidArgument("no conversation '" + id + "'");
    c = it->second;
  }
  std::unique_lock<std::mutex> u(c->use_mu_, std::try_to_lock);
  if (!u.owns_lock()) return Status::Busy("conversation '" + id + "' is in use");
  if (c->closed_) return Status::InvalidArgument("conversation '" + id + "' was closed or deleted");
  *out = std::move(c);
  *use = std::move(u);
  return Status::Ok();
}

bool Pool::PersistingSnapshot(const std::string& id, std::vector<int32_t>* history, int* turn_mark) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = convs_.find(id);
  if (it == convs_.end() || !it->second->persisting_ || it->second->closed_) return false;
  if (history) *history = it->second->persisting_history_;
  if (turn_mark) *turn_mark = it->second->persisting_turn_mark_;
  return true;
}

Status Pool::History(const std::string& id, std::vector<int32_t>* out) {
  std::shared_ptr<Conversation> c;
  std::unique_lock<std::mutex> use;
  Status busy = ForRead(id, &c, &use);
  if (busy.code() == Status::kBusy && PersistingSnapshot(id, out, nullptr)) return Status::Ok();
  MZ_RETURN_IF_ERROR(busy);
  if (c->ctx_) {
    *out = c->ctx_->history();
    return Status::Ok();
  }
  std::string path;
  {
    std::lock_guard<std::mutex> lk(mu_);
    path = c->stored_path_;
    if (path.empty() || int(c->stored_history_.size()) == c->stored_tokens_) {  // kept: no file read
      *out = path.empty() ? std::vector<int32_t>() : c->stored_history_;
      return Status::Ok();
    }
  }
  std::unique_ptr<SessionReader> r;
  MZ_RETURN_IF_ERROR(SessionReader::Open(*model_, opts_.context.kv_chunk_tokens, path, &r));
  *out = r->tokens();
  std::lock_guard<std::mutex> lk(mu_);
  if (c->stored_path_ == path) c->stored_history_ = r->tokens();
  return Status::Ok();
}

Status Pool::TurnMark(const std::string& id, int* out) {
  std::shared_ptr<Conversation> c;
  std::unique_lock<std::mutex> use;
  Status busy = ForRead(id, &c, &use);
  if (busy.code() == Status::kBusy && PersistingSnapshot(id, nullptr, out)) return Status::Ok();
  MZ_RETURN_IF_ERROR(busy);
  if (c->ctx_) {
    *out = c->ctx_->turn_mark();
    return Status::Ok();
  }
  std::lock_guard<std::mutex> lk(mu_);
  *out = c->stored_path_.empty() ? -1 : c->stored_turn_mark_;
  return Status::Ok();
}

std::vector<DamagedFile> Pool::Damaged() {
  std::lock_guard<std::mutex> lk(mu_);
  return damaged_;
}

}  // namespace mz
