// The models a server (or a chat) holds at once: several models, one memory budget (issue 45,
// docs/server.md "Several models"). Built on the public C API only (include/mzcache.h).
//
// Each model has its own pool (its conversations, its folder, its forward pass) and its own router
// (token histories only mean something within one model's vocabulary); with two or more models the
// pools share one mz_budget holding the memory budget, so idle models give back first (their
// conversations, then their weights back to front) and a model's weights come back front layers
// first with its next request's prefill. With one model nothing is shared: its pool has its own
// budget and its folder is the pool folder itself, exactly as before several models existed.
//
// Names: a model's name is its file's stem (qwen3-0.6b-q8_0.gguf: qwen3-0.6b-q8_0), unique (a
// second file with the same stem is refused at start). With several models each pool lives in
// <dir>/<name>/; with one, in <dir>.
//
// Thread-safety: the set is filled once (Add, before the server answers requests) and read-only
// after; each model's router is synchronized itself; the C API calls are thread-safe.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/serve/prompt_tokens.h"
#include "tools/serve/router.h"
#include "tools/serve/tool_calls.h"

namespace mz::serve {

struct ModelSpec {
  std::string name;  // the file's stem: what requests name ("model")
  std::string path;  // the GGUF
};

// The models to serve: the paths given (-m, in order), then every *.gguf file of models_dir (sorted
// by name; "" = none). false with *why when models_dir cannot be listed or holds no GGUF, or when
// two files share a name.
bool ListModels(const std::vector<std::string>& paths, const std::string& models_dir, std::vector<ModelSpec>* out,
                std::string* why);

// Conversation id's history and turn mark (-1: none) as pool holds them, waiting (up to 10 s) while
// the pool's own threads hold it (a write-behind persisting it, a restore-ahead slice): MZ_OK, or
// the pool's error.
int ReadConversation(mz_pool* pool, const std::string& id, std::vector<mz_token>* history, int* turn_mark);

// One model served: its handles and its router (which reads its pool's histories and turn marks).
struct ServedModel {
  ServedModel(ModelSpec s, std::function<bool(const std::string&)> routable)
      : name(std::move(s.name)),
        path(std::move(s.path)),
        id(name),
        router([this](const std::string& cid, std::vector<int32_t>* h, int* mark) {
                 return pool && ReadConversation(pool, cid, h, mark) == MZ_OK;
               },
               std::move(routable)) {}
  std::string name, path;
  std::string id;    // the id reported in responses (the name, or the server's --alias with one model)
  std::string dir;   // its pool's folder
  mz_model* model = nullptr;
  mz_pool* pool = nullptr;
  Router router;
  // Chat prompts' tokens, reusing a recent prompt's up to the last special token they share
  // (tools/serve/prompt_tokens.h): a returning user's resent history is not tokenized again.
  PromptTokens prompt_tokens;
  int chunk_tokens = 256;
  ToolSyntax tool_syntax = ToolSyntax::kHermes;
};

class ModelSet {
 public:
  ModelSet() = default;
  ModelSet(const ModelSet&) = delete;
  ModelSet& operator=(const ModelSet&) = delete;
  // Frees every pool (each persists its changed conversations), the budget, then the models.
  ~ModelSet();

  // With several models: the budget every pool added afterwards shares (memory_budget bytes; 0:
  // none, only pressure and trims take). Call once, before the first Add. MZ_OK or the status.
  int ShareBudget(uint64_t memory_budget);
  // How Add loads every model (mz_model_load's params: --weights, tools/weights_option.h); default
  // mz_model_default_params(). Call before Add.
  void set_model_params(const mz_model_params& p) { model_params_ = p; }
  mz_budget* budget() const { return budget_; }
  bool shared() const { return budget_ != nullptr; }

  // Loads spec's model and opens its pool in dir with params pp (pp.dir and pp.shared_budget are
  // set here). MZ_OK with *out (owned by the set), or the failing call's status (*what: which).
  int Add(ModelSpec spec, const std::string& dir, mz_pool_params pp, std::function<bool(const std::string&)> routable,
          ServedModel** out, std::string* what);

  size_t size() const { return models_.size(); }
  ServedModel& at(size_t i) { return *models_[i]; }
  ServedModel& front() { return *models_.front(); }
  // The model named name (its name or its id), or nullptr.
  ServedModel* Find(const std::string& name);
  // The model a request naming `requested` goes to: with one model, that one whatever the name (as
  // before: OpenAI clients always send some name); with several, the first for "" (a request
  // without "model"), the one named, or nullptr (unknown).
  ServedModel* Resolve(const std::string& requested);
  // The model whose pool holds conversation id (stored or open) or whose router knows it, or nullptr.
  ServedModel* OwnerOf(const std::string& id);
  // "a, b, c": the names, for error messages.
  std::string Names() const;
  // Every pool's report summed (memory_budget: the shared budget's, or the one pool's).
  mz_pool_report SumReport();
  mz_pool_event_report SumEvents();

 private:
  std::vector<std::unique_ptr<ServedModel>> models_;
  mz_budget* budget_ = nullptr;
  mz_model_params model_params_ = mz_model_default_params();
};

}  // namespace mz::serve
