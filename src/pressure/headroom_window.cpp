#include "pressure/headroom_window.h"

#include <algorithm>

namespace mz {

HeadroomWindow::Verdict HeadroomWindow::Sample(PressureSource* src, uint64_t now_ns, const AmountOptions& o,
                                               uint64_t* budget) {
  *budget = o.restore_slice_bytes ? o.restore_slice_bytes : UINT64_MAX;
  uint64_t avail = 0, limit = 0;
  // Free before the cgroup reclaims (no page-cache credit): restoring into inactive page cache
  // would make the kernel reclaim, which raises the next pressure event by itself.
  const Status hs = src->FreeBeforeReclaim(&avail, &limit);
  fit_check_ = hs.ok() && limit > 0;
  if (!fit_check_) return hs.code() == Status::kUnsupported ? Verdict::kRestore : Verdict::kSourceFailed;
  const uint64_t tol = std::max<uint64_t>(256ull << 10, limit / 400);  // counter jitter
  if (!watching_ || avail + tol < window_max_avail_) {
    watching_ = true;
    stable_since_ns_ = now_ns;
    window_max_avail_ = avail;
  }
  window_max_avail_ = std::max(window_max_avail_, avail);
  if (now_ns - stable_since_ns_ < o.calm_ns) return Verdict::kWaitCalm;
  const uint64_t keep = uint64_t(std::clamp(o.restore_margin, 0.0, 1.0) * double(limit));
  *budget = std::min(*budget, avail > keep ? avail - keep : 0);
  return Verdict::kRestore;
}

void HeadroomWindow::Took(uint64_t bytes) {
  if (fit_check_) window_max_avail_ = window_max_avail_ > bytes ? window_max_avail_ - bytes : 0;
}

}  // namespace mz
