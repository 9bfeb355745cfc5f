#include "store/compressed_stack.h"

#include <algorithm>
#include <cstring>

namespace mz {

CompressedStack::CompressedStack(Env* env, size_t segment_bytes, std::shared_ptr<SegmentCache> cache)
    : env_(env), cache_(std::move(cache)), segment_bytes_(segment_bytes) {}

CompressedStack::~CompressedStack() {
  for (auto& s : segs_)
    if (s.base) Release(s.base, s.cap);
}

void CompressedStack::Release(uint8_t* base, size_t cap) {
  if (cache_) {
    cache_->Give(base, cap);
  } else {
    env_->Unmap(base, cap);
  }
}

Status CompressedStack::Push(const void* data, size_t n, Handle* out) {
  uint8_t* p = nullptr;
  MZ_RETURN_IF_ERROR(Reserve(n, n, 64, out, &p));
  std::memcpy(p, data, n);
  return Status::Ok();
}

Status CompressedStack::Reserve(size_t n, size_t cap, size_t align, Handle* out, uint8_t** p) {
  std::lock_guard<std::mutex> lk(mu_);
  if (align == 0 || (align & (align - 1)) != 0 || align > kDirectIoAlign || cap < n)
    return Status::InvalidArgument("swap stack: bad reservation");
  const size_t need = AlignUp(std::max(cap, size_t(1)), 64);
  size_t off = segs_.empty() ? 0 : AlignUp(segs_.back().top, align);
  if (segs_.empty() || !segs_.back().base || off > segs_.back().cap || segs_.back().cap - off < need) {
    const size_t seg_cap = AlignUp(std::max(segment_bytes_, need), kDirectIoAlign);
    void* m = cache_ ? cache_->Take(seg_cap) : nullptr;  // a touched segment of the load arena
    if (!m) m = env_->MapAnon(seg_cap);
    if (!m) return Status::NoMemory("mapping a " + std::to_string(seg_cap) + "-byte swap stack segment");
    segs_.push_back(Segment{static_cast<uint8_t*>(m), seg_cap, 0, 0});
    off = 0;
  }
  Segment& s = segs_.back();
  const uint32_t gen = ++gen_;
  entries_.push_back(Entry{int(segs_.size()) - 1, off, n, true, gen});
  s.top = off + need;
  s.live++;
  live_bytes_ += n;
  ++n_live_;
  *out = int64_t(entries_.size() - 1) | (int64_t(gen) << 32);
  *p = s.base + off;
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
  Segment& seg = segs_[size_t(e.seg)];
  if (--seg.live == 0 && seg.base && size_t(e.seg) + 1 < segs_.size()) {
    // An interior segment emptied out of order: give it back now (the top one is handled by Shrink).
    Release(seg.base, seg.cap);
    seg.base = nullptr;
    seg.top = 0;
  }
  Shrink();
}

void CompressedStack::Shrink() {
  while (!entries_.empty() && !entries_.back().live) {
    const Entry e = entries_.back();
    entries_.pop_back();
    if (segs_[size_t(e.seg)].base) segs_[size_t(e.seg)].top = e.off;
  }
  while (!segs_.empty() && (segs_.back().top == 0 || !segs_.back().base)) {
    if (segs_.back().base) Release(segs_.back().base, segs_.back().cap);
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
  for (const auto& s : segs_) n += s.base ? s.cap : 0;
  return n;
}
int CompressedStack::n_segments() const {
  std::lock_guard<std::mutex> lk(mu_);
  int n = 0;
  for (const auto& s : segs_) n += s.base != nullptr;
  return n;
}
int CompressedStack::n_live() const {
  std::lock_guard<std::mutex> lk(mu_);
  return n_live_;
}

}  // namespace mz
