#include "policy/remote_fetch.h"

#include <cmath>

namespace mz {

RemoteFetchPlan PlanRemoteFetch(const RemoteFetchInput& in) {
  RemoteFetchPlan p;
  const bool rate_known = in.remote_Bps > 0 && std::isfinite(in.remote_Bps);
  const bool compute_known = in.compute_s_per_token > 0 && std::isfinite(in.compute_s_per_token);
  if (!rate_known || !compute_known || in.tokens <= 0) return p;  // fetch: nothing to weigh
  const double first = in.first_byte_s > 0 && std::isfinite(in.first_byte_s) ? in.first_byte_s : 0.0;
  p.fetch_s = first + double(in.bytes) / in.remote_Bps;
  p.compute_s = double(in.tokens) * in.compute_s_per_token;
  p.fetch = p.fetch_s <= p.compute_s;
  return p;
}

}  // namespace mz
