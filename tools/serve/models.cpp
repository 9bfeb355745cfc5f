// The models a server or a chat holds at once (tools/serve/models.h).
#include "tools/serve/models.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <system_error>
#include <thread>

namespace mz::serve {

bool ListModels(const std::vector<std::string>& paths, const std::string& models_dir, std::vector<ModelSpec>* out,
                std::string* why) {
  out->clear();
  std::vector<std::string> all = paths;
  if (!models_dir.empty()) {
    std::error_code ec;
    std::vector<std::string> found;
    for (std::filesystem::directory_iterator it(models_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::filesystem::path& p = it->path();
      std::error_code ec2;
      if (p.extension() == ".gguf" && std::filesystem::is_regular_file(p, ec2)) found.push_back(p.string());
    }
    if (ec) {
      *why = "--models-dir " + models_dir + ": " + ec.message();
      return false;
    }
    if (found.empty()) {
      *why = "--models-dir " + models_dir + " holds no .gguf file";
      return false;
    }
    std::sort(found.begin(), found.end());
    all.insert(all.end(), found.begin(), found.end());
  }
  std::map<std::string, std::string> seen;  // name -> path
  for (const std::string& path : all) {
    ModelSpec s;
    s.path = path;
    s.name = std::filesystem::path(path).stem().string();
    if (s.name.empty()) {
      *why = "'" + path + "' has no file name to name its model by";
      return false;
    }
    if (auto it = seen.find(s.name); it != seen.end()) {
      *why = "two models named '" + s.name + "' (" + it->second + " and " + path +
             "): a model is named by its file's stem, which must be unique";
      return false;
    }
    seen[s.name] = path;
    out->push_back(std::move(s));
  }
  return true;
}

ModelSet::~ModelSet() {
  for (auto& m : models_)
    if (m->pool) mz_pool_free(m->pool);  // persists every changed conversation
  mz_budget_free(budget_);  // the pools held it until they were freed
  for (auto& m : models_)
    if (m->model) mz_model_free(m->model);
}

int ModelSet::ShareBudget(uint64_t memory_budget) {
  mz_budget_params bp = mz_budget_default_params();
  bp.memory_budget = memory_budget;
  return mz_budget_new(&bp, &budget_);
}

int ModelSet::Add(ModelSpec spec, const std::string& dir, mz_pool_params pp,
                  std::function<bool(const std::string&)> routable, ServedModel** out, std::string* what) {
  auto m = std::make_unique<ServedModel>(std::move(spec), std::move(routable));
  m->dir = dir;
  if (int rc = mz_model_load(m->path.c_str(), &model_params_, &m->model)) {
    *what = "loading " + m->path;
    return rc;
  }
  if (mz_model_info mi; mz_model_get_info(m->model, &mi) == MZ_OK) m->tool_syntax = ToolSyntaxFor(mi.arch);
  if (pp.context) m->chunk_tokens = int(pp.context->kv_chunk_tokens);
  pp.dir = m->dir.c_str();
  if (budget_) {
    pp.shared_budget = budget_;
    pp.memory_budget = 0;  // the shared budget's
  }
  if (int rc = mz_pool_new(m->model, &pp, &m->pool)) {
    *what = "opening the pool of " + m->name + " in " + m->dir;
    mz_model_free(m->model);
    m->model = nullptr;
    return rc;
  }
  models_.push_back(std::move(m));
  *out = models_.back().get();
  return MZ_OK;
}

ServedModel* ModelSet::Find(const std::string& name) {
  for (auto& m : models_)
    if (m->name == name || m->id == name) return m.get();
  return nullptr;
}

ServedModel* ModelSet::Resolve(const std::string& requested) {
  if (models_.empty()) return nullptr;
  if (models_.size() == 1 || requested.empty()) return models_.front().get();
  return Find(requested);
}

int ReadConversation(mz_pool* pool, const std::string& id, std::vector<mz_token>* history, int* turn_mark) {
  for (int attempt = 0;; ++attempt) {
    int st = MZ_OK;
    const int32_t n = mz_pool_conversation_tokens(pool, id.c_str(), nullptr, 0);
    if (n >= 0) {
      history->resize(size_t(n));
      const int32_t got = n > 0 ? mz_pool_conversation_tokens(pool, id.c_str(), history->data(), n) : 0;
      if (got >= 0 && got != n) continue;  // it changed between the two calls: ask again
      st = got < 0 ? got : MZ_OK;
      if (st == MZ_OK) {
        int32_t mark = -1;
        st = turn_mark ? mz_pool_conversation_turn_mark(pool, id.c_str(), &mark) : MZ_OK;
        if (st == MZ_OK) {
          if (turn_mark) *turn_mark = mark;
          return MZ_OK;
        }
      }
    } else {
      st = n;
    }
    if (st != MZ_ERR_BUSY) return st;
    if (attempt >= 1000) return MZ_ERR_BUSY;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

ServedModel* ModelSet::OwnerOf(const std::string& id) {
  for (auto& m : models_) {
    mz_conversation_report r;
    if (m->router.Knows(id) || mz_pool_conversation_report(m->pool, id.c_str(), &r) == MZ_OK) return m.get();
  }
  return nullptr;
}

std::string ModelSet::Names() const {
  std::string s;
  for (const auto& m : models_) s += (s.empty() ? "" : ", ") + m->name;
  return s;
}

mz_pool_report ModelSet::SumReport() {
  mz_pool_report t{};
  for (auto& m : models_) {
    mz_pool_report p{};
    if (mz_pool_get_report(m->pool, &p) != MZ_OK) continue;
    t.n_conversations += p.n_conversations;
    t.n_open += p.n_open;
    t.n_damaged += p.n_damaged;
    t.weights_total += p.weights_total;
    t.weights_resident += p.weights_resident;
    t.kv_resident += p.kv_resident;
    t.kv_mem_compressed += p.kv_mem_compressed;
    t.kv_storage += p.kv_storage;
    t.in_memory += p.in_memory;
    t.stored_bytes += p.stored_bytes;
    t.memory_budget = p.memory_budget;  // one pool: its own
    t.disk_budget += p.disk_budget;     // each pool has its own
    t.conversations_lost += p.conversations_lost;
    t.persists += p.persists;
    t.persist_failures += p.persist_failures;
    t.prefix_chunks_reused += p.prefix_chunks_reused;
    t.evictions += p.evictions;
    t.bytes_evicted += p.bytes_evicted;
  }
  if (budget_) {
    mz_budget_report b{};
    if (mz_budget_get_report(budget_, &b) == MZ_OK) t.memory_budget = b.memory_budget;
  }
  return t;
}

mz_pool_event_report ModelSet::SumEvents() {
  mz_pool_event_report t{};
  for (auto& m : models_) {
    mz_pool_event_report e{};
    if (mz_pool_get_event_report(m->pool, &e) != MZ_OK) continue;
    t.evict_budget += e.evict_budget;
    t.evict_budget_bytes += e.evict_budget_bytes;
    t.evict_pressure += e.evict_pressure;
    t.evict_pressure_bytes += e.evict_pressure_bytes;
    t.evict_trim += e.evict_trim;
    t.evict_trim_bytes += e.evict_trim_bytes;
    t.evict_manual += e.evict_manual;
    t.evict_manual_bytes += e.evict_manual_bytes;
    t.evict_conversation += e.evict_conversation;
    t.evict_conversation_bytes += e.evict_conversation_bytes;
    t.pressure_events += e.pressure_events;
    t.trim_events += e.trim_events;
    t.restored_ahead_bytes += e.restored_ahead_bytes;
    t.conversation_restores += e.conversation_restores;
    t.conversation_restored_bytes += e.conversation_restored_bytes;
    t.recomputed += e.recomputed;
  }
  return t;
}

}  // namespace mz::serve
