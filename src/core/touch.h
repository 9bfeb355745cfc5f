// TouchPages: the first user-space access to each page of freshly restored memory, paid where the
// restore runs instead of where compute first reads it.
//
// Why: a unit restored by the kernel (page-cache readahead mapped by MADV_POPULATE_READ, a direct
// read into prefaulted memory) has page-table entries the CPU has never walked from user space. On
// bare metal the first walk is cheap, but under a hypervisor that shadows guest page tables it is
// a hypervisor exit per page: measured 2.3 us per 4 KiB page on the 2-core AMD EPYC VM (404k pages
// in 0.94 s), which made the first query after a full restore 0.8 s instead of 0.25 s (docs/design.md,
// "First touch"). Reading one byte per page on the restore thread (overlapped with compute by the
// pipeline, or before the user returns for restore-ahead) moves that cost off compute's path; on
// bare metal it costs one cache miss per page.
//
// Thread-safety: reads only; the range must be mapped and readable for the whole call (a file
// mapping past end of file would fault: pass only mapped bytes).
#pragma once
#include <cstddef>
#include <cstdint>

namespace mz {

inline void TouchPages(const void* p, size_t bytes, size_t page = 4096) {
  if (!p || bytes == 0) return;
  const volatile uint8_t* c = static_cast<const volatile uint8_t*>(p);
  uint8_t acc = 0;
  for (size_t off = 0; off < bytes; off += page) acc = uint8_t(acc ^ c[off]);
  acc = uint8_t(acc ^ c[bytes - 1]);
  (void)acc;
}

}  // namespace mz
