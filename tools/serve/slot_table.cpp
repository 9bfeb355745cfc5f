// See slot_table.h.
#include "tools/serve/slot_table.h"

#include <algorithm>

namespace mz::serve {

SlotTable::SlotTable(int n, int max_wait)
    : busy_(size_t(std::max(n, 1)), false), tasks_(busy_.size()), decoded_(new std::atomic<int>[busy_.size()]),
      max_wait_(max_wait) {
  for (size_t i = 0; i < busy_.size(); ++i) decoded_[i] = 0;
}

int SlotTable::Acquire() {
  std::unique_lock<std::mutex> lk(mu_);
  auto free_slot = [&] { return std::find(busy_.begin(), busy_.end(), false) != busy_.end(); };
  if (!free_slot() && waiting_ >= max_wait_) return -1;
  ++waiting_;
  cv_.wait(lk, free_slot);
  --waiting_;
  const int slot = int(std::find(busy_.begin(), busy_.end(), false) - busy_.begin());
  busy_[size_t(slot)] = true;
  tasks_[size_t(slot)] = SlotTask();  // taken by a request whose turn has not started yet
  decoded_[size_t(slot)] = 0;
  return slot;
}

void SlotTable::Start(int slot, SlotTask task) {
  std::lock_guard<std::mutex> lk(mu_);
  task.id_task = next_task_++;
  tasks_[size_t(slot)] = std::move(task);
  decoded_[size_t(slot)] = 0;
}

void SlotTable::Release(int slot) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_[size_t(slot)] = false;
  }
  cv_.notify_one();
}

std::vector<SlotView> SlotTable::Snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<SlotView> out(busy_.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].id = int(i);
    out[i].is_processing = busy_[i];
    out[i].n_decoded = decoded_[i].load();
    out[i].task = tasks_[i];
  }
  return out;
}

int SlotTable::n_free() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int(std::count(busy_.begin(), busy_.end(), false));
}

}  // namespace mz::serve
