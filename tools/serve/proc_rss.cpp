// This process's RSS (tools/serve/proc_rss.h).
#include "tools/serve/proc_rss.h"

#include <unistd.h>

#include <cstdio>

namespace mz::serve {

uint64_t ProcessRssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "re");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  const long page = sysconf(_SC_PAGESIZE);
  if (got != 2 || page <= 0) return 0;
  return uint64_t(resident) * uint64_t(page);
}

}  // namespace mz::serve
