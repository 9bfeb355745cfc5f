// CompressedStack: the in-memory swap for compressed KV chunks, organised as a stack (paper §4.4).
//
// Backward-out eviction pushes chunks rear-first; forward-in restoration pops them front-first, i.e.
// in LIFO order. Storage is a list of segments (anonymous mappings) allocated only when a push does
// not fit the top segment and returned to the OS as soon as they are empty. Entries may also be
// removed out of order (an explicit plan may restore in any order): their space is reclaimed when
// everything above them is gone, as in any stack.
//
// Thread-safety: Push/Free/Get are serialized by an internal mutex; the bytes of a live entry may be
// read concurrently (the pointer stays valid until that entry is freed).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "store/segment_cache.h"

namespace mz {

class CompressedStack {
 public:
  static constexpr size_t kDefaultSegmentBytes = size_t(8) << 20;
  // segment_bytes: default size of a new segment (a larger push gets a segment of its own size).
  // cache (optional, shared): segments of its size are taken from it before mapping new ones and
  // given back to it instead of being unmapped (it keeps them up to its cap: the load arena).
  CompressedStack(Env* env, size_t segment_bytes = kDefaultSegmentBytes,
                  std::shared_ptr<SegmentCache> cache = nullptr);
  ~CompressedStack();
  CompressedStack(const CompressedStack&) = delete;
  CompressedStack& operator=(const CompressedStack&) = delete;

  using Handle = int64_t;  // (gen << 32) | index; stable until Free, never reused
  // Copies n bytes onto the top of the stack. kNoMemory if a segment cannot be mapped.
  Status Push(const void* data, size_t n, Handle* out);
  // Makes an entry of n bytes whose start is aligned to `align` (a power of two <= 4096) with room
  // for cap >= n bytes, and returns a pointer to fill (*p, valid until Free; its content is
  // unspecified). The caller fills it before any reader Gets the entry. kNoMemory as Push.
  Status Reserve(size_t n, size_t cap, size_t align, Handle* out, uint8_t** p);
  // Pointer to an entry's bytes and its size.
  const uint8_t* Get(Handle h, size_t* n) const;
  // Frees an entry; empty top segments are returned to the OS.
  void Free(Handle h);

  uint64_t live_bytes() const;     // sum of live entries
  uint64_t mapped_bytes() const;   // sum of mapped segments (what the process holds)
  int n_segments() const;
  int n_live() const;

 private:
  struct Segment {
    uint8_t* base;  // nullptr once released
    size_t cap;
    size_t top;
    int live;       // live entries in this segment
  };
  struct Entry {
    int seg;
    size_t off;
    size_t n;
    bool live;
    uint32_t gen;  // push sequence number: a stale handle never matches a reused slot
  };
  void Shrink();  // pops dead entries from the top and releases empty segments
  void Release(uint8_t* base, size_t cap);  // to the cache, or unmapped
  Env* env_;
  std::shared_ptr<SegmentCache> cache_;
  size_t segment_bytes_;
  mutable std::mutex mu_;
  std::vector<Segment> segs_;
  std::vector<Entry> entries_;     // in push order
  uint32_t gen_ = 0;
  uint64_t live_bytes_ = 0;
  int n_live_ = 0;
};

}  // namespace mz
