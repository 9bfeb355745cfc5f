#include "pressure/manual_source.h"

#include <chrono>

#include "env/env.h"

namespace mz {

ManualSource::ManualSource(Env* env, std::string name) : env_(env ? env : Env::Default()), name_(std::move(name)) {}

Status ManualSource::Start() {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopped_) return Status::Cancelled("manual pressure source was stopped");
  return Status::Ok();
}

Status ManualSource::Wait(int timeout_ms, PressureEvent* ev) {
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return stopped_ || !q_.empty(); };
  if (timeout_ms < 0) cv_.wait(lk, ready);
  else cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready);
  if (stopped_) return Status::Cancelled("pressure source stopped");
  if (q_.empty()) return Status::Timeout("no pressure event");
  *ev = std::move(q_.front());
  q_.pop_front();
  return Status::Ok();
}

void ManualSource::Stop() {
  std::lock_guard<std::mutex> lk(mu_);
  stopped_ = true;
  q_.clear();
  cv_.notify_all();
}

void ManualSource::Push(PressureEvent ev) {
  if (ev.time_ns == 0) ev.time_ns = env_->NowNs();
  if (ev.source.empty()) ev.source = name_;
  std::lock_guard<std::mutex> lk(mu_);
  if (stopped_) return;
  q_.push_back(std::move(ev));
  cv_.notify_all();
}

void ManualSource::Push(PressureLevel level, uint64_t bytes_hint) {
  PressureEvent ev;
  ev.level = level;
  ev.bytes_hint = bytes_hint;
  Push(std::move(ev));
}

size_t ManualSource::pending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return q_.size();
}

}  // namespace mz
