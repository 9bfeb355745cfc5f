#include "swap/mem_stack.h"

#include <cstring>

namespace mz {

CompressedStack::CompressedStack(Env* env, size_t segment_bytes) : env_(env), segment_bytes_(segment_bytes) {}

CompressedStack::~CompressedStack() {
  for (auto& s : segs_) env_->Unmap(s.base, s.cap);
}

Status CompressedStack::Push(const void* data, size_t n, Handle* out) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t need = AlignUp(n, 64);
  if (segs_.empty() || segs_.back().cap - segs_.back().top < need) {
    const size_t cap = AlignUp(std::max(segment_bytes_, need), kDirectIoAlign);
    void* p = env_->MapAnon(cap);
    if (!p) return Status::NoMemory("mapping a " + std::to_string(cap) + "-byte swap stack segment");
    segs_.push_back(Segment{static_cast<uint8_t*>(p), cap, 0});
  }
  Segment& s = segs_.back();
  std::memcpy(s.base + s.top, data, n);
  const uint32_t gen = ++gen_;
  entries_.push_back(Entry{int(segs_.size()) - 1, s.top, n, true, gen});
  s.top += need;
  live_bytes_ += n;
  ++n_live_;
  *out = int64_t(entries_.size() - 1) | (int64_t(gen) << 32);
  return Status::Ok();
}

const uint8_t* CompressedStack::Get(Handle h, size_t* n) const {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t i = h & 0xffffffff;
  if (h < 0 || i >= int64_t(entries_.size()) || !entries_[size_t(i)].live ||
      entries_[size_t(i)].gen != uint32_t(h >> 32))
    return nullptr;
  const Entry& e = entries_[size_t(i)];
  *n = e.n;
  return segs_[size_t(e.seg)].base + e.off;
}

void CompressedStack::Free(Handle h) {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t i = h & 0xffffffff;
  if (h < 0 || i >= int64_t(entries_.size()) || !entries_[size_t(i)].live ||
      entries_[size_t(i)].gen != uint32_t(h >> 32))
    return;
  Entry& e = entries_[size_t(i)];
  e.live = false;
  live_bytes_ -= e.n;
  --n_live_;
  Shrink();
}

void CompressedStack::Shrink() {
  while (!entries_.empty() && !entries_.back().live) {
    const Entry e = entries_.back();
    entries_.pop_back();
    segs_[size_t(e.seg)].top = e.off;
  }
  while (!segs_.empty() && segs_.back().top == 0) {
    env_->Unmap(segs_.back().base, segs_.back().cap);
    segs_.pop_back();
  }
}

uint64_t CompressedStack::live_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return live_bytes_;
}
uint64_t CompressedStack::mapped_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t n = 0;
  for (const auto& s : segs_) n += s.cap;
  return n;
}
int CompressedStack::n_segments() const {
  std::lock_guard<std::mutex> lk(mu_);
  return int(segs_.size());
}
int CompressedStack::n_live() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_live_;
}

}  // namespace mz
