// ManualSource: pressure events pushed by the host app instead of read from the kernel: Android's
// onTrimMemory levels (mz_on_trim_memory), explicit requests (bytes_hint), and tests (a fake that
// produces levels the machine cannot).
//
// Thread-safety: Push() and Stop() from any thread; Wait() from one thread (the monitor's).
#pragma once
#include <condition_variable>
#include <deque>
#include <mutex>

#include "pressure/pressure_source.h"

namespace mz {

class ManualSource : public PressureSource {
 public:
  // env: clock for events pushed without a time (nullptr: Env::Default()).
  explicit ManualSource(Env* env = nullptr, std::string name = "manual");
  std::string name() const override { return name_; }
  Status Start() override;
  // Returns queued events in push order; kTimeout after timeout_ms with none (0: just checks);
  // kCancelled once Stop() was called (queued events are dropped).
  Status Wait(int timeout_ms, PressureEvent* ev) override;
  void Stop() override;
  // Queues ev; time_ns 0 is stamped with the Env clock, an empty source with name(). Events pushed
  // after Stop() are dropped.
  void Push(PressureEvent ev);
  void Push(PressureLevel level, uint64_t bytes_hint = 0);
  size_t pending() const;

 private:
  Env* env_;
  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PressureEvent> q_;
  bool stopped_ = false;
};

}  // namespace mz
