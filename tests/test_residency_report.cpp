// Residency as the kernel sees it, unit by unit (issue 24 §5): the smaps parser, attribution of
// per-VMA figures to units, and the report over a real test model: after load, after evictions and
// restores, and when the kernel takes pages of mapped weights (played by a FaultEnv, and for real
// with MADV_PAGEOUT), which raises the warning.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "env/fault_env.h"
#include "env/smaps.h"
#include "memory/residency_report.h"
#include "model/model.h"
#include "runtime/context.h"
#include "test_util.h"

namespace mz {
namespace {

// Three VMAs as a 6.x kernel prints them: a file mapping whose path has a space, an anonymous one,
// and [heap]; with keys the parser does not use (VmFlags, THPeligible, ProtectionKey).
const char* kSmaps =
    "7f0000000000-7f0000010000 r--p 00001000 08:01 1234                       /data/my model.gguf\n"
    "Size:                 64 kB\n"
    "KernelPageSize:        4 kB\n"
    "MMUPageSize:           4 kB\n"
    "Rss:                  48 kB\n"
    "Pss:                  24 kB\n"
    "Pss_Dirty:             0 kB\n"
    "Shared_Clean:         48 kB\n"
    "Shared_Dirty:          0 kB\n"
    "Private_Clean:         0 kB\n"
    "Private_Dirty:         0 kB\n"
    "Referenced:           48 kB\n"
    "Anonymous:             0 kB\n"
    "Swap:                  0 kB\n"
    "THPeligible:    0\n"
    "ProtectionKey:         0\n"
    "VmFlags: rd mr mw me sd\n"
    "7f0000010000-7f0000030000 rw-p 00000000 00:00 0 \n"
    "Size:                128 kB\n"
    "Rss:                 100 kB\n"
    "Pss:                 100 kB\n"
    "Anonymous:           100 kB\n"
    "Swap:                 28 kB\n"
    "VmFlags: rd wr mr mw me ac sd\n"
    "7f0000040000-7f0000041000 rw-p 00000000 00:00 0                          [heap]\n"
    "Size:                  4 kB\n"
    "Rss:                   4 kB\n";

TEST(Smaps, ParsesEveryVmaAndTheFieldsItUses) {
  std::vector<SmapsVma> v;
  Status st = ParseSmaps(kSmaps, &v);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].start, 0x7f0000000000u);
  EXPECT_EQ(v[0].end, 0x7f0000010000u);
  EXPECT_EQ(v[0].perms, "r--p");
  EXPECT_EQ(v[0].offset, 0x1000u);
  EXPECT_EQ(v[0].inode, 1234u);
  EXPECT_TRUE(v[0].file_backed());
  EXPECT_EQ(v[0].path, "/data/my model.gguf");
  EXPECT_EQ(v[0].size, 64u << 10);
  EXPECT_EQ(v[0].rss, 48u << 10);
  EXPECT_EQ(v[0].pss, 24u << 10);
  EXPECT_EQ(v[0].shared_clean, 48u << 10);
  EXPECT_FALSE(v[1].file_backed());
  EXPECT_EQ(v[1].path, "");
  EXPECT_EQ(v[1].anonymous, 100u << 10);
  EXPECT_EQ(v[1].swap, 28u << 10);
  EXPECT_EQ(v[2].path, "[heap]");
  EXPECT_EQ(v[2].rss, 4u << 10);
  EXPECT_EQ(FirstVmaEndingAfter(v, 0), 0u);
  EXPECT_EQ(FirstVmaEndingAfter(v, 0x7f000000ffffu), 0u);
  EXPECT_EQ(FirstVmaEndingAfter(v, 0x7f0000010000u), 1u) << "end is exclusive";
  EXPECT_EQ(FirstVmaEndingAfter(v, 0x7f0000035000u), 2u) << "in the gap: the next VMA";
  EXPECT_EQ(FirstVmaEndingAfter(v, 0x7f0000041000u), 3u);
  ASSERT_TRUE(ParseSmaps("", &v).ok());
  EXPECT_TRUE(v.empty());
}

TEST(Smaps, MalformedTextIsAClearErrorNamingTheLine) {
  const std::string hdr = "7f0000000000-7f0000010000 r--p 00000000 08:01 1 /m\n";
  struct Case {
    std::string text, line;  // line: "line N" expected in the message
  } cases[] = {
      {"Rss: 4 kB\n", "line 1"},                                        // a field before any header
      {hdr + "Rss: four kB\n", "line 2"},                               // not a number
      {hdr + "Rss: 4 MB\n", "line 2"},                                  // not kB
      {hdr + "Rss: -4 kB\n", "line 2"},                                 // negative
      {hdr + "Rss: 4 kB extra\n", "line 2"},                            // trailing junk
      {hdr + "Rss: 99999999999999999999 kB\n", "line 2"},               // overflow
      {hdr + "this is not smaps\n", "line 2"},                          // neither header nor field
      {"zz-7f0000010000 r--p 00000000 08:01 1 /m\n", "line 1"},         // bad hex
      {"7f0000010000-7f0000000000 r--p 00000000 08:01 1 /m\n", "line 1"},  // ends before it starts
      {"7f0000000000-7f0000010000 r--p\n", "line 1"},                   // truncated header
      {hdr + "7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n", "line 2"},  // overlapping
  };
  for (const Case& c : cases) {
    std::vector<SmapsVma> v(1);
    Status st = ParseSmaps(c.text, &v);
    EXPECT_EQ(st.code(), Status::kCorruption) << c.text;
    EXPECT_NE(st.message().find(c.line), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(kSelfSmapsPath), std::string::npos) << st.message();
    EXPECT_TRUE(v.empty());
  }
  // Binary junk never crashes.
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += char((i * 131 + 7) & 0xff);
  std::vector<SmapsVma> v;
  EXPECT_FALSE(ParseSmaps(junk, &v).ok());
}

TEST(Smaps, ReadThroughTheEnv) {
  FaultEnv env(Env::Default());
  env.SetFakeFile(kSelfSmapsPath, kSmaps);
  std::vector<SmapsVma> v;
  ASSERT_TRUE(ReadSmaps(&env, &v).ok());
  EXPECT_EQ(v.size(), 3u);
  env.RemoveFakeFile(kSelfSmapsPath);
  env.HideRealFilesUnder("/proc/");
  Status st = ReadSmaps(&env, &v);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(kSelfSmapsPath), std::string::npos) << st.message();
  EXPECT_TRUE(v.empty());
}

// Per-VMA figures attributed to units: a VMA that is exactly a unit, one holding two units (counted
// once in the totals), a unit over two VMAs, a unit outside every VMA, a unit with no memory.
TEST(Smaps, AttributionIsPerVmaAndTotalsCountEachVmaOnce) {
  std::vector<SmapsVma> v;
  ASSERT_TRUE(ParseSmaps(kSmaps, &v).ok());
  ResidencyReport r;
  auto unit = [&](uint64_t addr, uint64_t held) {
    UnitResidency u;
    u.addr = addr;
    u.held_bytes = held;
    r.units.push_back(u);
  };
  unit(0x7f0000000000, 0x10000);  // exactly VMA 0
  unit(0x7f0000010000, 0x8000);   // first half of VMA 1
  unit(0x7f0000018000, 0x8000);   // in VMA 1 too
  unit(0x7f000000f000, 0x2000);   // over VMAs 0 and 1
  unit(0x7f0000050000, 0x1000);   // no VMA
  unit(0, 0);                     // no memory
  AttributeSmaps(v, &r);
  EXPECT_EQ(r.units[0].n_vmas, 1);
  EXPECT_EQ(r.units[0].vma_bytes, 0x10000u) << "its own VMA: the figures are the unit's";
  EXPECT_EQ(r.units[0].vma_rss, 48u << 10);
  EXPECT_EQ(r.units[0].vma_pss, 24u << 10);
  EXPECT_EQ(r.units[1].n_vmas, 1);
  EXPECT_EQ(r.units[1].vma_bytes, 0x20000u) << "a shared VMA: larger than the unit";
  EXPECT_EQ(r.units[1].vma_rss, 100u << 10);
  EXPECT_EQ(r.units[1].vma_swap, 28u << 10);
  EXPECT_EQ(r.units[2].vma_rss, 100u << 10);
  EXPECT_EQ(r.units[3].n_vmas, 2);
  EXPECT_EQ(r.units[3].vma_rss, (48u + 100u) << 10);
  EXPECT_EQ(r.units[4].n_vmas, 0);
  EXPECT_EQ(r.units[5].n_vmas, 0);
  EXPECT_EQ(r.summary.n_vmas, 2) << "[heap] holds no unit";
  EXPECT_EQ(r.summary.vma_bytes, 0x30000u);
  EXPECT_EQ(r.summary.vma_rss, (48u + 100u) << 10) << "each VMA once";
  EXPECT_EQ(r.summary.vma_pss, (24u + 100u) << 10);
  EXPECT_EQ(r.summary.vma_anonymous, 100u << 10);
  EXPECT_EQ(r.summary.vma_swap, 28u << 10);
}

constexpr int kPrompt = 192;  // whole chunks: every page of every chunk written
constexpr int kChunk = 32;

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Context> ctx;
};

Fixture Make(Env* env, const std::string& swap_name, const std::string& path = test::ModelPath("tiny-qwen3")) {
  Fixture f;
  Status st = Model::Load(env, path, ModelOptions(), &f.model);
  EXPECT_TRUE(st.ok()) << st.ToString();
  ContextOptions co;
  co.n_ctx = 1024;
  co.kv_chunk_tokens = kChunk;
  co.swap_path = test::TempDir() + "/" + swap_name + ".swap";
  co.reconcile_min_missing = 0;  // the report must see what the kernel did, not a reconciled table
  f.ctx = std::make_unique<Context>(f.model.get(), co);
  EXPECT_TRUE(f.ctx->Init().ok());
  const auto toks = test::PromptTokens(path, kPrompt);
  st = f.ctx->Decode(toks.data(), int(toks.size()), false);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return f;
}

const UnitResidency& Find(const ResidencyReport& r, const UnitRef& u) {
  for (const UnitResidency& x : r.units)
    if (x.unit == u) return x;
  ADD_FAILURE() << "no unit " << UnitName(u);
  return r.units.front();
}

TEST(ResidencyReport, AfterLoadEveryUnitIsResidentForBoth) {
  Fixture f = Make(Env::Default(), "rr-load");
  ResidencyReport r;
  Status st = f.ctx->MeasureResidency(true, &r);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const int L = int(f.model->hparams().n_layer);
  const int chunks = (kPrompt + kChunk - 1) / kChunk;
  ASSERT_EQ(r.units.size(), size_t(L + 1 + L * chunks));
  EXPECT_EQ(r.units[size_t(L)].unit, UnitRef::Weights(-1)) << "layers first, the base unit last";
  const Backing wb = f.model->weight_memory() == WeightMemory::kAnonymous ? Backing::kAnonymous : Backing::kModelFile;
  for (const UnitResidency& u : r.units) {
    SCOPED_TRACE(UnitName(u.unit));
    EXPECT_EQ(u.state, UnitState::kResident);
    EXPECT_GT(u.counted_bytes, 0u);
    EXPECT_EQ(u.in_ram_bytes, u.counted_bytes) << "mincore agrees: in RAM";
    EXPECT_NE(u.addr, 0u);
    EXPECT_EQ(u.held_bytes, u.bytes);
    if (u.unit.kind == UnitRef::kWeights) {
      EXPECT_EQ(u.backing, wb);
      EXPECT_GT(u.file_bytes, 0u);
      if (wb == Backing::kModelFile) {
        EXPECT_EQ(u.file_cached_bytes, u.file_bytes) << "mapped pages are cached";
      }
    } else {
      EXPECT_EQ(u.backing, Backing::kAnonymous);
      EXPECT_EQ(u.file_bytes, 0u);
    }
    if (r.summary.smaps_ok) {
      EXPECT_GE(u.n_vmas, 1);
      EXPECT_GE(u.vma_bytes, u.counted_bytes);
      EXPECT_GT(u.vma_rss, 0u);
    }
  }
  EXPECT_TRUE(r.summary.smaps_ok) << r.summary.smaps_error;
  EXPECT_FALSE(r.summary.warn) << r.summary.warning;
  EXPECT_EQ(r.summary.in_ram(), r.summary.counted());
  KernelResidency k;
  ASSERT_TRUE(f.ctx->MeasureInRam(&k).ok());
  EXPECT_EQ(r.summary.weights_file_counted + r.summary.weights_anon_counted, k.weights_counted);
  EXPECT_EQ(r.summary.kv_counted, k.kv_counted);
}

TEST(ResidencyReport, EvictedUnitsAreNotResidentForBothAndComeBack) {
  Fixture f = Make(Env::Default(), "rr-evict");
  const uint64_t cb = f.ctx->kv().geometry().chunk_bytes();
  Plan p = {{UnitRef::Weights(1), UnitState::kWeightsDropped},
            {UnitRef::Kv(0, 0), UnitState::kKvMemCompressed},
            {UnitRef::Kv(0, 1), UnitState::kKvStorageRaw},
            {UnitRef::Kv(0, 2), UnitState::kKvStorageCompressed}};
  ASSERT_TRUE(f.ctx->Evict(p, 0, nullptr).ok());
  ResidencyReport r;
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  const UnitResidency& w = Find(r, UnitRef::Weights(1));
  EXPECT_EQ(w.state, UnitState::kWeightsDropped);
  EXPECT_EQ(w.backing, Backing::kNone);
  EXPECT_EQ(w.counted_bytes, 0u);
  EXPECT_EQ(w.in_ram_bytes, 0u);
  EXPECT_EQ(w.addr, 0u);
  EXPECT_EQ(w.n_vmas, 0);
  EXPECT_GT(w.file_bytes, 0u) << "its copy is the model file";
  const UnitResidency& mc = Find(r, UnitRef::Kv(0, 0));
  EXPECT_EQ(mc.state, UnitState::kKvMemCompressed);
  EXPECT_EQ(mc.backing, Backing::kAnonymous) << "the in-memory swap";
  EXPECT_GT(mc.held_bytes, 0u);
  EXPECT_LT(mc.held_bytes, cb);
  EXPECT_GT(mc.in_ram_bytes, 0u);
  EXPECT_GE(mc.counted_bytes, mc.held_bytes);
  for (int c : {1, 2}) {
    const UnitResidency& s = Find(r, UnitRef::Kv(0, c));
    EXPECT_EQ(s.backing, Backing::kNone);
    EXPECT_EQ(s.held_bytes, 0u);
    EXPECT_EQ(s.counted_bytes, 0u);
    EXPECT_GT(s.file_bytes, 0u) << "its swap extent";
  }
  EXPECT_EQ(Find(r, UnitRef::Kv(0, 1)).state, UnitState::kKvStorageRaw);
  EXPECT_EQ(Find(r, UnitRef::Kv(0, 2)).state, UnitState::kKvStorageCompressed);
  EXPECT_FALSE(r.summary.warn) << "a dropped unit is not a unit that fell out: " << r.summary.warning;

  ASSERT_TRUE(f.ctx->Restore().ok());
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  for (const UnitResidency& u : r.units) {
    SCOPED_TRACE(UnitName(u.unit));
    EXPECT_EQ(u.state, UnitState::kResident);
    EXPECT_EQ(u.in_ram_bytes, u.counted_bytes);
    EXPECT_GT(u.counted_bytes, 0u);
  }
  // A full chunk back from storage raw is a mapping of its swap extent where the swap file has
  // direct I/O (not tmpfs): file-backed, its copy still in the file.
  const UnitResidency& m = Find(r, UnitRef::Kv(0, 1));
  if (f.ctx->Report().kv_resident_mapped > 0) {
    EXPECT_EQ(m.backing, Backing::kSwapFile);
    EXPECT_EQ(m.file_bytes, cb);
  } else {
    EXPECT_EQ(m.backing, Backing::kAnonymous);
  }
}

// The kernel takes half of weight unit 2's pages (a FaultEnv plays mincore): the unit stays counted
// resident by mzcache (no reconcile here), the report shows the pages missing and warns.
TEST(ResidencyReport, WeightsOutOfThePageCacheWarn) {
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, "rr-warn");
  if (f.model->weight_memory() != WeightMemory::kPageCache) GTEST_SKIP() << "weights are not in the page cache here";
  const WeightUnit& w = f.model->unit(2);
  const char* base = static_cast<const char*>(w.region);
  env.resident_bytes = [&](const void* p, size_t n, uint64_t* out) -> Status {
    const char* c = static_cast<const char*>(p);
    if (c >= base && c < base + w.region_bytes) {
      *out = (n / 2) & ~uint64_t(4095);
      return Status::Ok();
    }
    return env.EnvWrapper::ResidentBytes(p, n, out);
  };
  ResidencyReport r;
  Status st = f.ctx->MeasureResidency(true, &r);
  env.resident_bytes = nullptr;
  ASSERT_TRUE(st.ok()) << st.ToString();
  const UnitResidency& u = Find(r, UnitRef::Weights(2));
  EXPECT_EQ(u.state, UnitState::kResident) << "mzcache still counts it resident";
  EXPECT_GT(u.missing(), 0u);
  EXPECT_TRUE(r.summary.warn);
  EXPECT_EQ(r.summary.weight_units_out_of_page_cache, 1);
  EXPECT_EQ(r.summary.weights_out_of_page_cache, u.missing());
  EXPECT_NE(r.summary.warning.find("1 weight unit "), std::string::npos) << r.summary.warning;
  EXPECT_NE(r.summary.warning.find("page cache"), std::string::npos) << r.summary.warning;
  EXPECT_EQ(Find(r, UnitRef::Weights(1)).missing(), 0u) << "only unit 2";
}

// An anonymous KV chunk with pages missing (swapped out) is shown, but is not the weights warning.
TEST(ResidencyReport, AnonymousPagesMissingDoNotRaiseTheWeightsWarning) {
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, "rr-anon");
  const char* chunk = reinterpret_cast<const char*>(f.ctx->kv().chunk(1, 0));
  env.resident_bytes = [&](const void* p, size_t n, uint64_t* out) -> Status {
    if (static_cast<const char*>(p) == chunk) {
      *out = 0;
      return Status::Ok();
    }
    return env.EnvWrapper::ResidentBytes(p, n, out);
  };
  ResidencyReport r;
  ASSERT_TRUE(f.ctx->MeasureResidency(false, &r).ok());
  env.resident_bytes = nullptr;
  EXPECT_EQ(Find(r, UnitRef::Kv(1, 0)).in_ram_bytes, 0u);
  EXPECT_LT(r.summary.kv_in_ram, r.summary.kv_counted);
  EXPECT_FALSE(r.summary.warn);
  EXPECT_FALSE(r.summary.smaps_ok) << "asked without smaps";
}

// smaps missing (no procfs) or malformed: the report is still built from mincore, and says why
// smaps is not in it.
TEST(ResidencyReport, UnreadableOrMalformedSmapsLeavesTheRestOfTheReport) {
  FaultEnv env(Env::Default());
  Fixture f = Make(&env, "rr-nosmaps");
  env.HideRealFilesUnder("/proc/");
  ResidencyReport r;
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  EXPECT_FALSE(r.summary.smaps_ok);
  EXPECT_NE(r.summary.smaps_error.find(kSelfSmapsPath), std::string::npos) << r.summary.smaps_error;
  EXPECT_GT(r.summary.counted(), 0u);
  EXPECT_EQ(r.units.front().n_vmas, 0);
  env.SetFakeFile(kSelfSmapsPath, "garbage\n");
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  EXPECT_FALSE(r.summary.smaps_ok);
  EXPECT_NE(r.summary.smaps_error.find("line 1"), std::string::npos) << r.summary.smaps_error;
  // A fake smaps with one VMA exactly over weight unit 0's region: attributed to it alone.
  const WeightUnit& w = f.model->unit(0);
  char hdr[160];
  std::snprintf(hdr, sizeof hdr, "%lx-%lx r--p 00000000 08:01 77 /m.gguf\nRss: 8 kB\nPss: 4 kB\n",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(w.region)),
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(w.region) + w.region_bytes));
  env.SetFakeFile(kSelfSmapsPath, hdr);
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  ASSERT_TRUE(r.summary.smaps_ok) << r.summary.smaps_error;
  EXPECT_EQ(r.units[0].n_vmas, 1);
  EXPECT_EQ(r.units[0].vma_bytes, w.region_bytes);
  EXPECT_EQ(r.units[0].vma_rss, 8u << 10);
  EXPECT_EQ(r.units[0].vma_pss, 4u << 10);
  EXPECT_EQ(r.units[1].n_vmas, 0);
  EXPECT_EQ(r.summary.n_vmas, 1);
  EXPECT_EQ(r.summary.vma_rss, 8u << 10);
}

// The real kernel: MADV_PAGEOUT reclaims the clean file pages of weight units of a private copy of
// the model (a page another process maps would stay). mincore then reports them out of RAM, the
// report warns; a restore brings them back and the warning goes.
TEST(ResidencyReport, RealReclaimIsReportedAndWarned) {
  const std::string copy = test::TempDir() + "/rr-real-" + std::to_string(getpid()) + ".gguf";
  {
    std::ifstream in(test::ModelPath("tiny-qwen3"), std::ios::binary);
    std::ofstream out(copy, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
    ASSERT_TRUE(out.good());
  }
  {
    const int fd = open(copy.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
  }
  Fixture f = Make(Env::Default(), "rr-real", copy);
  if (f.model->weight_memory() != WeightMemory::kPageCache) GTEST_SKIP() << "weights are not in the page cache here";
  const int L = int(f.model->hparams().n_layer);
  for (int u = L / 2; u < L; ++u) {
#ifdef MADV_PAGEOUT
    if (madvise(f.model->unit(u).region, f.model->unit(u).region_bytes, MADV_PAGEOUT) != 0)
      GTEST_SKIP() << "MADV_PAGEOUT refused";
#else
    GTEST_SKIP() << "no MADV_PAGEOUT";
#endif
  }
  ResidencyReport r;
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  if (!r.summary.warn) GTEST_SKIP() << "the kernel kept every page";
  EXPECT_GT(r.summary.weight_units_out_of_page_cache, 0);
  EXPECT_LE(r.summary.weight_units_out_of_page_cache, L - L / 2);
  for (int u = 0; u < L / 2; ++u) EXPECT_EQ(Find(r, UnitRef::Weights(u)).missing(), 0u) << u;
  if (r.summary.smaps_ok) {
    // Rss counts pages this process maps: reclaimed pages are unmapped too.
    const UnitResidency& last = Find(r, UnitRef::Weights(L - 1));
    if (last.missing() == last.counted_bytes && last.vma_bytes == last.counted_bytes) {
      EXPECT_EQ(last.vma_rss, 0u);
    }
  }
  // Evict and restore the units that fell out: they come back through readahead, in RAM.
  Plan drop;
  for (int u = L / 2; u < L; ++u) drop.push_back({UnitRef::Weights(u), UnitState::kWeightsDropped});
  ASSERT_TRUE(f.ctx->Evict(drop, 0, nullptr).ok());
  ASSERT_TRUE(f.ctx->Restore().ok());
  ASSERT_TRUE(f.ctx->MeasureResidency(true, &r).ok());
  EXPECT_FALSE(r.summary.warn) << r.summary.warning;
  EXPECT_EQ(r.summary.weights_file_in_ram, r.summary.weights_file_counted);
  f = Fixture();
  std::remove(copy.c_str());
}

}  // namespace
}  // namespace mz
