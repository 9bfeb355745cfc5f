// SegmentCache: the load arena. Mapped, already touched in-memory swap segments kept after their
// stack let them go, for the next stack that needs one (one cache shared by every context of a
// pool).
//
// Why: a segment mapped afresh costs a page fault per 4 KiB page when it is first written, and a
// direct read into it costs another at the first user access (the kernel populates it, then the
// shadow page tables of a VM like this one fault again). On the AMD EPYC VM (2 cores), a direct read of
// 240 MiB into fresh memory then an xxh64 of it took 0.20 + 0.46 s, into memory already touched
// 0.11-0.15 + 0.016 s: a conversation loaded from storage into the in-memory swap (q8 chunks, read
// in place) pays that on each return, on the cores prefill needs. Segments an eviction gives back
// are kept here instead, up to a cap, and the next load reuses them.
//
// Ownership: the cache owns the segments it holds (unmapped by Trim, SetCap or its destructor); a
// segment taken is the taker's, given back by Give (kept, or unmapped when the cache is full or the
// size is not the cache's). Memory it holds is the process's: a pool counts bytes() in its budget and
// gives it back first under pressure (Trim).
// Thread-safety: every method may be called from any thread (an internal mutex).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "env/env.h"

namespace mz {

class SegmentCache {
 public:
  // segment_bytes: the only size kept (CompressedStack's default segment). cap: bytes kept at most.
  SegmentCache(Env* env, size_t segment_bytes, uint64_t cap);
  ~SegmentCache();
  SegmentCache(const SegmentCache&) = delete;
  SegmentCache& operator=(const SegmentCache&) = delete;

  size_t segment_bytes() const { return segment_bytes_; }
  // A kept segment of `bytes` bytes (its content unspecified), or nullptr when none is kept or
  // bytes is not segment_bytes(): the caller maps one itself.
  void* Take(size_t bytes);
  // Gives a segment back: kept if its size is segment_bytes() and the cache has room, else
  // unmapped. The caller must not use p afterwards either way.
  void Give(void* p, size_t bytes);
  // Unmaps kept segments until at most `keep` bytes remain; returns the bytes unmapped.
  uint64_t TrimTo(uint64_t keep);
  // Sets the cap (trimming to it).
  void SetCap(uint64_t cap);

  uint64_t bytes() const;          // held now
  uint64_t cap() const;
  uint64_t reused_bytes() const;   // handed out by Take since creation
  uint64_t given_bytes() const;    // kept by Give since creation

 private:
  Env* env_;
  const size_t segment_bytes_;
  mutable std::mutex mu_;
  uint64_t cap_;
  std::vector<void*> free_;
  uint64_t reused_ = 0, given_ = 0;
};

}  // namespace mz
