// The server's turn slots (--parallel N): at most N turns at once, at most max_wait requests
// waiting for one, and what each slot is doing or did last, for GET /slots (llama-server's field
// names; tools/serve/resources.cpp). mzcache's slots are its continuous batcher's places: a turn
// holds one from its claim to its end, and its conversation stays in the pool (in memory, compressed
// or on storage) after the slot is free again.
// Thread-safety: every member is safe from any thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mz::serve {

// A slot's current (is_processing) or last task.
struct SlotTask {
  int64_t id_task = -1;        // -1: the slot never ran a turn
  std::string conversation, model;
  int n_prompt_tokens = 0;     // the prompt's tokens
  int n_prompt_tokens_cache = 0;  // of them, held by the conversation already (not computed)
  int n_predict = 0;           // the turn's max_tokens
  float temperature = 0, top_p = 1;
  int top_k = 0;
  uint32_t seed = 0;
  bool stream = false;
};

struct SlotView {
  int id = 0;
  bool is_processing = false;  // held by a request (from its claim to its turn's end)
  int n_decoded = 0;  // tokens sampled by the current or last task
  SlotTask task;
};

class SlotTable {
 public:
  SlotTable(int n, int max_wait);
  // Waits for a free slot: its index, or -1 (refused at once) when max_wait requests already wait.
  // The slot shows no task until Start (its last one is forgotten).
  int Acquire();
  // The slot's task starts (REQUIRES: slot held); its n_decoded counts from 0.
  void Start(int slot, SlotTask task);
  // The counter of the slot's sampled tokens (the turn increments it). Valid while the table lives.
  std::atomic<int>* Decoded(int slot) { return &decoded_[size_t(slot)]; }
  // Frees the slot (REQUIRES: held); its last task stays visible.
  void Release(int slot);
  std::vector<SlotView> Snapshot() const;
  int n_free() const;
  int size() const { return int(busy_.size()); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> busy_;
  std::vector<SlotTask> tasks_;
  std::unique_ptr<std::atomic<int>[]> decoded_;
  int waiting_ = 0;
  const int max_wait_;
  int64_t next_task_ = 0;
};

}  // namespace mz::serve
