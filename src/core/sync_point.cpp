#include "core/sync_point.h"

#include <map>
#include <mutex>

namespace mz {
namespace {
std::mutex g_mu;
std::map<std::string, SyncPoints::Callback>& Callbacks() {
  static auto* m = new std::map<std::string, SyncPoints::Callback>();
  return *m;
}
}  // namespace

std::atomic<bool> SyncPoints::enabled{false};

void SyncPoints::SetCallback(const std::string& name, Callback cb) {
  std::lock_guard<std::mutex> lk(g_mu);
  Callbacks()[name] = std::move(cb);
  enabled = true;
}

void SyncPoints::ClearAll() {
  std::lock_guard<std::mutex> lk(g_mu);
  Callbacks().clear();
  enabled = false;
}

void SyncPoints::Process(const char* name, int arg) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = Callbacks().find(name);
    if (it == Callbacks().end()) return;
    cb = it->second;
  }
  cb(arg);
}

}  // namespace mz
