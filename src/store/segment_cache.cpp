#include "store/segment_cache.h"

namespace mz {

SegmentCache::SegmentCache(Env* env, size_t segment_bytes, uint64_t cap)
    : env_(env), segment_bytes_(segment_bytes), cap_(cap) {}

SegmentCache::~SegmentCache() { TrimTo(0); }

void* SegmentCache::Take(size_t bytes) {
  if (bytes != segment_bytes_) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  if (free_.empty()) return nullptr;
  void* p = free_.back();
  free_.pop_back();
  reused_ += bytes;
  return p;
}

void SegmentCache::Give(void* p, size_t bytes) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (bytes == segment_bytes_ && uint64_t(free_.size() + 1) * segment_bytes_ <= cap_) {
      free_.push_back(p);
      given_ += bytes;
      return;
    }
  }
  env_->Unmap(p, bytes);
}

uint64_t SegmentCache::TrimTo(uint64_t keep) {
  std::vector<void*> out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (!free_.empty() && uint64_t(free_.size()) * segment_bytes_ > keep) {
      out.push_back(free_.back());
      free_.pop_back();
    }
  }
  for (void* p : out) env_->Unmap(p, segment_bytes_);  // outside the lock: munmap may take a while
  return uint64_t(out.size()) * segment_bytes_;
}

void SegmentCache::SetCap(uint64_t cap) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cap_ = cap;
  }
  TrimTo(cap);
}

uint64_t SegmentCache::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return uint64_t(free_.size()) * segment_bytes_;
}
uint64_t SegmentCache::cap() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cap_;
}
uint64_t SegmentCache::reused_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return reused_;
}
uint64_t SegmentCache::given_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return given_;
}

}  // namespace mz
