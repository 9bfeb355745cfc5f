// The two swap spaces on their own: the compressed in-memory stack (LIFO, segments returned to the
// OS when empty, out-of-order frees) and the storage swap file (direct I/O, checksums, space reuse,
// clear errors on ENOSPC / EIO / corruption).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <cstring>

#include <random>

#include "env/fault_env.h"
#include "store/compressed_stack.h"
#include "store/segment_cache.h"
#include "store/swap_file.h"
#include "test_util.h"

namespace mz {
namespace {

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::mt19937 r(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(r());
  return v;
}

TEST(CompressedStack, LifoPushPopReturnsSegmentsToTheOs) {
  CompressedStack s(Env::Default(), 1 << 20);
  std::vector<CompressedStack::Handle> hs;
  for (int i = 0; i < 10; ++i) {
    auto b = Bytes(300 << 10, uint32_t(i));
    CompressedStack::Handle h;
    ASSERT_TRUE(s.Push(b.data(), b.size(), &h).ok());
    hs.push_back(h);
  }
  EXPECT_EQ(s.n_live(), 10);
  EXPECT_GE(s.n_segments(), 3);  // 3 entries of 300 KiB fit a 1 MiB segment
  for (int i = 9; i >= 0; --i) {
    size_t n = 0;
    const uint8_t* p = s.Get(hs[size_t(i)], &n);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(0, std::memcmp(p, Bytes(300 << 10, uint32_t(i)).data(), n));
    s.Free(hs[size_t(i)]);
  }
  EXPECT_EQ(s.n_segments(), 0);
  EXPECT_EQ(s.mapped_bytes(), 0u);
  EXPECT_EQ(s.Get(hs[0], nullptr), nullptr) << "a freed handle must not resolve";
}

TEST(CompressedStack, BottomSegmentsFreedOutOfOrderAreReleased) {
  CompressedStack s(Env::Default(), 1 << 20);
  std::vector<CompressedStack::Handle> hs;
  for (int i = 0; i < 9; ++i) {
    auto b = Bytes(300 << 10, uint32_t(i));
    CompressedStack::Handle h;
    ASSERT_TRUE(s.Push(b.data(), b.size(), &h).ok());
    hs.push_back(h);
  }
  const uint64_t full = s.mapped_bytes();
  // Free the first three (the bottom segment): its memory goes back although the stack is not empty.
  for (int i = 0; i < 3; ++i) s.Free(hs[size_t(i)]);
  EXPECT_EQ(s.mapped_bytes(), full - (1 << 20));
  // The rest still reads back correctly; a new push works.
  size_t n = 0;
  ASSERT_NE(s.Get(hs[5], &n), nullptr);
  auto b = Bytes(100, 99);
  CompressedStack::Handle h;
  ASSERT_TRUE(s.Push(b.data(), b.size(), &h).ok());
  for (int i = 3; i < 9; ++i) s.Free(hs[size_t(i)]);
  s.Free(h);
  EXPECT_EQ(s.mapped_bytes(), 0u);
}

TEST(CompressedStack, FailedSegmentMappingIsAClearError) {
  FaultEnv env(Env::Default());
  CompressedStack s(&env, 1 << 20);
  env.fail_maps_after = 0;
  CompressedStack::Handle h;
  auto b = Bytes(1000, 1);
  Status st = s.Push(b.data(), b.size(), &h);
  EXPECT_EQ(st.code(), Status::kNoMemory) << st.ToString();
  EXPECT_EQ(s.n_live(), 0);
}

// Counts the anonymous mappings made and released (the load arena's tests).
class MapCountingEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  void* MapAnon(size_t n) override {
    maps++;
    return EnvWrapper::MapAnon(n);
  }
  void Unmap(void* p, size_t n) override {
    unmaps++;
    EnvWrapper::Unmap(p, n);
  }
  std::atomic<int> maps{0}, unmaps{0};
};

TEST(SegmentCache, KeepsSegmentsUpToItsCapAndHandsThemBack) {
  MapCountingEnv env(Env::Default());
  const size_t seg = 1 << 20;
  {
    SegmentCache cache(&env, seg, 2 * seg);
    void* a = env.MapAnon(seg);
    void* b = env.MapAnon(seg);
    void* c = env.MapAnon(seg);
    void* big = env.MapAnon(2 * seg);
    cache.Give(a, seg);
    cache.Give(b, seg);
    cache.Give(c, seg);       // over the cap: unmapped
    cache.Give(big, 2 * seg);  // not the cache's size: unmapped
    EXPECT_EQ(env.unmaps.load(), 2);
    EXPECT_EQ(cache.bytes(), 2 * seg);
    EXPECT_EQ(cache.Take(2 * seg), nullptr);  // only its own size
    void* t = cache.Take(seg);
    EXPECT_TRUE(t == a || t == b);
    EXPECT_EQ(cache.bytes(), seg);
    EXPECT_EQ(cache.reused_bytes(), seg);
    cache.Give(t, seg);
    EXPECT_EQ(cache.TrimTo(seg), seg);  // one left
    EXPECT_EQ(env.unmaps.load(), 3);
    cache.SetCap(0);
    EXPECT_EQ(cache.bytes(), 0u);
    EXPECT_EQ(env.unmaps.load(), 4);
    cache.Give(env.MapAnon(seg), seg);  // cap 0: unmapped at once
    EXPECT_EQ(env.unmaps.load(), 5);
  }
  EXPECT_EQ(env.maps.load(), env.unmaps.load());
}

TEST(SegmentCache, StacksShareItAndReuseTouchedSegments) {
  MapCountingEnv env(Env::Default());
  const size_t seg = 1 << 20;
  auto cache = std::make_shared<SegmentCache>(&env, seg, 4 * seg);
  auto fill = [&](CompressedStack& s, uint32_t seed, std::vector<CompressedStack::Handle>* hs) {
    for (int i = 0; i < 6; ++i) {
      auto b = Bytes(300 << 10, seed + uint32_t(i));
      CompressedStack::Handle h;
      ASSERT_TRUE(s.Push(b.data(), b.size(), &h).ok());
      hs->push_back(h);
    }
  };
  {
    CompressedStack a(&env, seg, cache);
    std::vector<CompressedStack::Handle> ha;
    fill(a, 1, &ha);
    const int mapped = env.maps.load();
    EXPECT_GE(mapped, 2);
    for (auto h : ha) a.Free(h);
    EXPECT_EQ(a.n_segments(), 0);
    EXPECT_EQ(env.unmaps.load(), 0);  // into the arena, not to the OS
    EXPECT_EQ(cache->bytes(), uint64_t(mapped) * seg);
    // Another stack (another conversation) takes them: no new mapping, and what it reads back is
    // what it wrote (a reused segment's old bytes never leak into an entry).
    CompressedStack b(&env, seg, cache);
    std::vector<CompressedStack::Handle> hb;
    fill(b, 100, &hb);
    EXPECT_EQ(env.maps.load(), mapped);
    EXPECT_EQ(cache->reused_bytes(), uint64_t(mapped) * seg);
    for (int i = 0; i < 6; ++i) {
      size_t n = 0;
      const uint8_t* p = b.Get(hb[size_t(i)], &n);
      auto want = Bytes(300 << 10, 100 + uint32_t(i));
      ASSERT_EQ(n, want.size());
      EXPECT_EQ(std::memcmp(p, want.data(), n), 0);
    }
  }  // b's segments go back to the arena as it is destroyed
  EXPECT_EQ(env.unmaps.load(), 0);
  cache.reset();  // the arena unmaps what it holds
  EXPECT_EQ(env.maps.load(), env.unmaps.load());
}

TEST(SwapFile, RoundTripChecksumsAndSpaceReuse) {
  std::unique_ptr<SwapFile> f;
  ASSERT_TRUE(SwapFile::Create(Env::Default(), test::TempDir() + "/t.swap", true, &f).ok());
  std::vector<SwapExtent> ex;
  for (int i = 0; i < 6; ++i) {
    auto b = Bytes(size_t(100000 + i * 5000), uint32_t(i));  // unaligned sizes: bounce buffer path
    SwapExtent e;
    ASSERT_TRUE(f->Write(b.data(), b.size(), &e).ok());
    ex.push_back(e);
  }
  const uint64_t end = f->file_bytes();
  for (int i = 0; i < 6; ++i) {
    std::vector<uint8_t> out(ex[size_t(i)].size);
    ASSERT_TRUE(f->Read(ex[size_t(i)], out.data()).ok());
    EXPECT_EQ(out, Bytes(out.size(), uint32_t(i)));
  }
  // Free two neighbours: they coalesce and a larger write reuses the hole.
  f->Free(ex[1]);
  f->Free(ex[2]);
  auto big = Bytes(ex[1].len + ex[2].len - 4096, 7);
  SwapExtent e;
  ASSERT_TRUE(f->Write(big.data(), big.size(), &e).ok());
  EXPECT_EQ(e.off, ex[1].off);
  EXPECT_EQ(f->file_bytes(), end) << "the file must not grow while a hole fits";
  for (auto& x : {ex[0], ex[3], ex[4], ex[5], e}) f->Free(x);
  EXPECT_EQ(f->used_bytes(), 0u);
}

TEST(SwapFile, FaultsGiveClearErrors) {
  FaultEnv env(Env::Default());
  std::unique_ptr<SwapFile> f;
  ASSERT_TRUE(SwapFile::Create(&env, test::TempDir() + "/f.swap", true, &f).ok());
  auto b = Bytes(1 << 20, 3);
  SwapExtent e;
  env.write_budget = 1000;
  Status st = f->Write(b.data(), b.size(), &e);
  EXPECT_EQ(st.code(), Status::kNoSpace) << st.ToString();
  EXPECT_EQ(f->used_bytes(), 0u) << "a failed write allocates nothing";
  env.write_budget = -1;
  ASSERT_TRUE(f->Write(b.data(), b.size(), &e).ok());
  std::vector<uint8_t> out(b.size());
  env.fail_reads_after = 0;
  EXPECT_EQ(f->Read(e, out.data()).code(), Status::kIOError);
  env.flip_bit_read_after = 0;
  st = f->Read(e, out.data());
  EXPECT_EQ(st.code(), Status::kCorruption) << st.ToString();
  EXPECT_TRUE(f->Read(e, out.data()).ok()) << "the stored copy itself is intact";
  EXPECT_EQ(out, b);
}


// Extents written one after another are read back with one request into separate aligned rooms;
// each is verified on its own; extents that are not back to back, or unaligned rooms, are refused.
TEST(SwapFile, BackToBackExtentsReadAsOneRun) {
  FaultEnv env(Env::Default());
  std::unique_ptr<SwapFile> f;
  ASSERT_TRUE(SwapFile::Create(&env, test::TempDir() + "/run.swap", true, &f).ok());
  constexpr int kN = 5;
  std::vector<SwapExtent> ex(kN);
  for (int i = 0; i < kN; ++i) {
    auto b = Bytes(size_t(70000 + i * 3000), uint32_t(10 + i));  // unaligned: padded extents
    ASSERT_TRUE(f->Write(b.data(), b.size(), &ex[size_t(i)]).ok());
    if (i > 0) ASSERT_EQ(ex[size_t(i - 1)].off + ex[size_t(i - 1)].len, ex[size_t(i)].off);
  }
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> rooms;
  std::vector<void*> dst;
  for (const auto& e : ex) {
    rooms.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlign, e.len)), &std::free);
    dst.push_back(rooms.back().get());
  }
  std::vector<Status> each(kN);
  const int64_t reads0 = env.n_reads.load();
  ASSERT_TRUE(f->ReadPaddedRun(ex.data(), dst.data(), kN, each.data()).ok());
  EXPECT_EQ(env.n_reads.load() - reads0, 1) << "one request for the run";
  for (int i = 0; i < kN; ++i) {
    EXPECT_TRUE(each[size_t(i)].ok()) << each[size_t(i)].ToString();
    EXPECT_EQ(0, std::memcmp(dst[size_t(i)], Bytes(ex[size_t(i)].size, uint32_t(10 + i)).data(), ex[size_t(i)].size));
  }
  // A flipped bit is charged to the one extent that holds it.
  env.flip_bit_read_after = 0;
  ASSERT_TRUE(f->ReadPaddedRun(ex.data(), dst.data(), kN, each.data()).ok());
  int bad = 0;
  for (const Status& st : each) bad += st.code() == Status::kCorruption ? 1 : 0;
  EXPECT_EQ(bad, 1);
  // An I/O error fails the whole run; a short read too.
  env.fail_reads_after = 0;
  EXPECT_EQ(f->ReadPaddedRun(ex.data(), dst.data(), kN, each.data()).code(), Status::kIOError);
  env.short_reads_after = 0;
  EXPECT_EQ(f->ReadPaddedRun(ex.data(), dst.data(), kN, each.data()).code(), Status::kIOError);
  // Not back to back (a gap: extents 0 and 2), or an unaligned room: refused before any read.
  const SwapExtent gap[2] = {ex[0], ex[2]};
  void* gap_dst[2] = {dst[0], dst[2]};
  const int64_t reads1 = env.n_reads.load();
  EXPECT_EQ(f->ReadPaddedRun(gap, gap_dst, 2, each.data()).code(), Status::kInvalidArgument);
  void* odd[2] = {static_cast<uint8_t*>(dst[0]) + 8, dst[1]};
  EXPECT_EQ(f->ReadPaddedRun(ex.data(), odd, 2, each.data()).code(), Status::kInvalidArgument);
  EXPECT_EQ(env.n_reads.load(), reads1);
}

}  // namespace
}  // namespace mz
