// Smaps: the kernel's per-mapping memory accounting of this process (/proc/self/smaps), parsed.
//
// The kernel accounts memory per VMA (virtual memory area: one line of /proc/self/maps), not per
// allocation: adjacent anonymous mappings with the same protection are merged into one VMA, so a
// VMA can hold several of mzcache's units (and other memory of the process). Numbers read here
// are therefore per VMA; callers that attribute them to smaller ranges (memory/residency_report.h)
// say so.
//
// Thread-safety: the functions are pure (ParseSmaps) or read one file through the Env (ReadSmaps);
// both are safe to call from any thread.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "env/env.h"

namespace mz {

// The path ReadSmaps reads (a FaultEnv serves a fake file at it in tests).
inline constexpr const char* kSelfSmapsPath = "/proc/self/smaps";

// One VMA of smaps. Sizes in bytes (the kernel prints kB; multiplied by 1024 here).
struct SmapsVma {
  uint64_t start = 0, end = 0;  // [start, end) virtual addresses
  std::string perms;            // "r--p", "rw-p", ...
  uint64_t offset = 0;          // file offset of start (0 for anonymous memory)
  uint64_t inode = 0;           // 0: anonymous (no file behind it)
  std::string path;             // mapped file, "[heap]", "[stack]", ... or "" (anonymous);
                                // a deleted file keeps the kernel's " (deleted)" suffix
  uint64_t size = 0;            // Size: end - start as the kernel counts it
  uint64_t rss = 0;             // Rss: pages of the VMA mapped in this process's page tables now
  uint64_t pss = 0;             // Pss: Rss with each page divided by the processes mapping it
  uint64_t shared_clean = 0, shared_dirty = 0, private_clean = 0, private_dirty = 0;
  uint64_t anonymous = 0;       // Anonymous: private anonymous pages (for a private file mapping:
                                // pages copied on write, no longer the file's)
  uint64_t swap = 0;            // Swap: anonymous pages of the VMA now in swap (or zram)
  bool file_backed() const { return inode != 0; }
};

// Parses the text of a smaps file into *out (in the file's order: ascending addresses). Keys it
// does not use are skipped (kernels add keys over time); a key it uses must be "Key: N kB".
// Errors (kCorruption, naming the line number and the line): a field line before any VMA header,
// a header whose addresses are not hex or whose end is below its start, a used key whose value is
// not a number of kB, a line that is neither a header nor "Key: value". *out is then empty.
// Empty text is valid (no VMA).
Status ParseSmaps(const std::string& text, std::vector<SmapsVma>* out);

// Reads and parses kSelfSmapsPath through env (Env::ReadSmallFile). Failure: the Env's error
// naming the path (ENOENT where procfs is missing), or ParseSmaps's; *out then empty. The
// kernel walks every page table of the process to produce it: about 1 ms per GiB mapped.
Status ReadSmaps(Env* env, std::vector<SmapsVma>* out);

// Index of the first VMA of vmas (sorted by start, as ParseSmaps returns them) that ends after
// addr; vmas.size() if none.
size_t FirstVmaEndingAfter(const std::vector<SmapsVma>& vmas, uint64_t addr);

}  // namespace mz
