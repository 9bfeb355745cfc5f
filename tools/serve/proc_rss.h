// This process's resident set size, for the pool report of `mzcache serve` (GET /v1/mzcache/pool
// "rss"). The library's own OS effects go through its Env; this small reader is the server's own,
// kept here so that it is the only place the server reads /proc.
#pragma once
#include <cstdint>

namespace mz::serve {

// Resident bytes of this process now (/proc/self/statm's second field times the page size), or 0
// if it cannot be read (not Linux, /proc not mounted). Thread-safe; one small read.
uint64_t ProcessRssBytes();

}  // namespace mz::serve
