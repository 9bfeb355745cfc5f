// Remote fetch policy: whether the chunks of a prefix (or a conversation) the fleet's remote tier
// holds (pool/remote_tier.h) are fetched or computed again. A pure function: the pool gathers the
// figures (the device profile's remote rate or the one learned from RemoteTierStats, this context's
// measured prefill rate) and applies the plan in one place (Pool::RemotePrefix).
#pragma once
#include <cstdint>

namespace mz {

struct RemoteFetchInput {
  uint64_t bytes = 0;           // what the fetch would move (the chunks' stored bytes, estimated)
  int tokens = 0;               // the tokens those chunks hold (computed again instead)
  double remote_Bps = 0;        // the remote tier's read rate, bytes/s (0: unknown)
  double first_byte_s = 0;      // its time to the first reply, seconds (0: unknown, not added)
  double compute_s_per_token = 0;  // this context's prefill seconds per prompt token (0: unknown)
};

struct RemoteFetchPlan {
  bool fetch = true;
  double fetch_s = 0;    // expected: first_byte_s + bytes / remote_Bps (0 when a rate is unknown)
  double compute_s = 0;  // expected: tokens * compute_s_per_token (0 when unknown)
};

// Fetch when fetching is expected to be faster than or as fast as computing those tokens again;
// compute again when it is slower (a small prefix over a slow link). Either rate unknown (<= 0 or
// not finite), or nothing to fetch: fetch (the remote tier's default: it saves compute).
RemoteFetchPlan PlanRemoteFetch(const RemoteFetchInput& in);

}  // namespace mz
