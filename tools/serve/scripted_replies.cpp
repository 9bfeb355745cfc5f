#include "tools/serve/scripted_replies.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace mz::serve {

bool ScriptedReplies::Load(const std::string& path, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = "cannot read " + path;
    return false;
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) {
    *error = path + ": not a JSON array of strings";
    return false;
  }
  replies_.clear();
  for (const auto& s : j) {
    if (!s.is_string()) {
      *error = path + ": not a JSON array of strings";
      return false;
    }
    replies_.push_back(s.get<std::string>());
  }
  return true;
}

std::optional<std::string> ScriptedReplies::Next() {
  const size_t i = next_.fetch_add(1);
  if (i >= replies_.size()) return std::nullopt;
  return replies_[i];
}

}  // namespace mz::serve
