#include "restore/executor.h"

#include <algorithm>
#include <atomic>

#include "core/sync_point.h"

namespace mz {
namespace {

constexpr size_t kPage = 4096;

// Every evicted unit in forward order, except KV chunks below attend_compressed_below that compute
// reads in place; cut at the first unit that no longer fits max_bytes (a forward-order prefix).
std::vector<UnitRef> PlanUnits(const UnitTable& t, uint64_t max_bytes, int attend_compressed_below) {
  std::vector<UnitRef> todo;
  uint64_t used = 0;
  for (const UnitRef& u : EvictedInForwardOrder(t)) {
    if (u.kind == UnitRef::kKv && u.chunk < attend_compressed_below && t.readable_compressed(u.layer, u.chunk)) continue;
    const uint64_t bytes = t.RestoreBytes(u);
    if (bytes > max_bytes - used) break;  // the budget is spent: later units wait
    used += bytes;
    todo.push_back(u);
  }
  return todo;
}

// kForCompute's first half: chunks below attend_compressed_below compressed on storage come into the
// in-memory swap as they are, one LoadCompressedRun per run of back-to-back extents. Every room is
// reserved here, before any worker reads (no mapping while they populate); a room that cannot be
// reserved is reserved again by its load.
Status LoadForCompute(UnitTable* t, int attend_compressed_below, int threads) {
  struct Group {
    int layer;
    std::vector<int> chunks;
  };
  std::vector<Group> groups;
  for (int l = 0; l < t->n_layer(); ++l) {
    std::vector<int> on_storage;
    for (int c = 0; c < attend_compressed_below && t->has_chunk(l, c); ++c)
      if (t->state(UnitRef::Kv(l, c)) == UnitState::kKvStorageCompressed) on_storage.push_back(c);
    for (auto& run : t->LoadRuns(l, on_storage, kLoadRunBytes)) groups.push_back({l, std::move(run)});
  }
  if (groups.empty()) return Status::Ok();
  std::vector<std::vector<UnitTable::LoadSlot>> rooms(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    rooms[g].resize(groups[g].chunks.size());
    for (size_t i = 0; i < groups[g].chunks.size(); ++i)
      (void)t->ReserveLoad(groups[g].layer, groups[g].chunks[i], &rooms[g][i]);  // a failure: the load reserves again
  }
  std::atomic<size_t> next{0};
  const int nt = std::max(1, std::min(threads, int(groups.size())));
  std::vector<Status> errs(static_cast<size_t>(nt));
  RunOnThreads(t->env(), nt, [&](int th) {
    for (size_t g; (g = next.fetch_add(1)) < groups.size();) {
      std::vector<UnitTable::LoadSlot*> ptrs;
      for (auto& r : rooms[g]) ptrs.push_back(&r);
      const Status st = t->LoadCompressedRun(groups[g].layer, groups[g].chunks.data(), ptrs.data(), int(ptrs.size()));
      if (!st.ok() && errs[size_t(th)].ok()) errs[size_t(th)] = st;
    }
  });
  for (const auto& e : errs)
    if (!e.ok()) return e;
  return Status::Ok();
}

// Restores `todo` (forward order) over the table's restore threads, each unit into its slice of one
// mapping (MapSlices; unit by unit if that mapping fails). Slices of units never taken (a stop
// request: always a tail, as indices are handed out in order) are unmapped again.
Status RestoreUnits(UnitTable* t, const std::vector<UnitRef>& todo, const std::function<bool()>& stop, int threads,
                    RestoreResult* res) {
  // Weight units of a model whose weights are file mappings, and KV chunks mapped from the swap
  // file, are not populated: the file mapping replaces the slice.
  auto populate = [t](const UnitRef& u) {
    return (u.kind != UnitRef::kWeights || !t->weights_file_backed()) && !t->RestoresByMapping(u);
  };
  std::vector<size_t> bytes(todo.size()), off;
  for (size_t i = 0; i < todo.size(); ++i) bytes[i] = t->RestoreBytes(todo[i]);
  size_t total = 0;
  Env* env = t->env();
  char* region = MapSlices(env, bytes, &off, &total);
  std::atomic<bool> halt{false};
  std::atomic<size_t> next{0};
  const int nt = std::max(1, std::min(threads, int(todo.size())));
  std::vector<Status> errs(static_cast<size_t>(nt));
  RunOnThreads(env, nt, [&](int th) {  // a thread the OS refuses: the others restore its units
    for (;;) {
      if (halt.load(std::memory_order_relaxed)) return;
      if (stop && stop()) {
        halt = true;
        return;
      }
      const size_t i = next.fetch_add(1);
      if (i >= todo.size()) return;
      MZ_SYNC_POINT("restore:unit", int(i));
      Status st;
      if (region) {
        void* mem = region + off[i];
        if (populate(todo[i])) t->PrefaultFor(todo[i], mem);  // the pages its restore uses
        st = t->RestoreInto(todo[i], mem);  // owns the slice from here (unmaps it on failure)
      } else {
        st = t->RestoreInto(todo[i], nullptr);  // maps its own memory
      }
      if (!st.ok() && errs[size_t(th)].ok()) errs[size_t(th)] = st;
    }
  });
  const size_t n_taken = std::min(next.load(), todo.size());
  if (region && n_taken < todo.size()) env->Unmap(region + off[n_taken], total - off[n_taken]);
  res->stopped = halt.load();
  for (const UnitRef& u : todo)
    if (t->state(u) == UnitState::kResident) res->restored += t->RestoreBytes(u);
  for (const auto& e : errs)
    if (!e.ok()) return e;
  return Status::Ok();
}

}  // namespace

std::vector<UnitRef> EvictedInForwardOrder(const UnitTable& t) {
  std::vector<UnitRef> out;
  auto add = [&](const UnitRef& u) {
    if (t.state(u) != UnitState::kResident) out.push_back(u);
  };
  add(UnitRef::Weights(-1));
  for (int l = 0; l < t.n_layer(); ++l) {
    add(UnitRef::Weights(l));
    for (int c = 0; t.has_chunk(l, c); ++c) add(UnitRef::Kv(l, c));
  }
  return out;
}

char* MapSlices(Env* env, const std::vector<size_t>& bytes, std::vector<size_t>* off, size_t* total) {
  off->assign(bytes.size(), 0);
  *total = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    (*off)[i] = *total;
    *total += (bytes[i] + kPage - 1) / kPage * kPage;
  }
  return *total > 0 ? static_cast<char*>(env->MapAnon(*total)) : nullptr;
}

Status RunRestore(UnitTable* t, const RestoreRequest& req, RestoreResult* out) {
  RestoreResult mine;
  RestoreResult* res = out ? out : &mine;
  *res = RestoreResult();
  int below = 0;
  const int threads = req.threads > 0 ? req.threads : t->options().restore_threads;
  if (req.mode == RestoreMode::kForCompute) {
    below = req.attend_compressed_below;
    // A failed load ends the call once every load was tried: the forward pass cannot run.
    if (t->codec_readable_in_place()) MZ_RETURN_IF_ERROR(LoadForCompute(t, below, threads));
  }
  if (t->AllResident()) return Status::Ok();
  const std::vector<UnitRef> todo = PlanUnits(*t, req.mode == RestoreMode::kUpTo ? req.max_bytes : UINT64_MAX, below);
  if (todo.empty()) return Status::Ok();
  if (req.stop && req.stop()) {  // before any setup cost (identity check, mapping)
    res->stopped = true;
    return Status::Ok();
  }
  for (const auto& u : todo)
    if (u.kind == UnitRef::kWeights) {
      MZ_RETURN_IF_ERROR(t->VerifyModelIdentity());
      break;
    }
  return RestoreUnits(t, todo, req.stop, threads, res);
}

}  // namespace mz
