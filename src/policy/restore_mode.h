// RestoreMode: whether a restore_generate overlaps its restoration with the prefill or restores
// first and computes after (serial), and how many restoration workers it runs, chosen from the
// cores, the device profile's restore rates and the context's measured compute rate.
//
// Why: overlapping hides the restore behind the prefill only when the two do not compete for the
// same cores. Restoring through the page cache (file-backed weights, KV mapped from the swap) and
// decoding are CPU work (the kernel allocates and maps every page in the reading thread); on a
// machine with no core beyond the compute threads, the overlapped pipeline gives compute one
// thread fewer while it restores, and the restore still takes a core's time: measured on a 2-core
// VM, serial 0.765 s against overlapped 0.891 s after a model switch (docs/results.md, session 32).
// Overlap pays where restoration mostly waits for storage (direct I/O) or has spare cores.
//
// The cost model (seconds; c = compute_s, r = restore_cpu_s, w = restore_wait_s, n compute
// threads, C cores, K = the workers asked for):
//   serial   = max(r / min(C, K), w) + c          (restore on every core, then compute on n)
//   overlap  = max(c, r / min(C - n, K), w)       (C > n: restoration has cores of its own)
//   overlap  = max(c * n / (n - 1), r, w)         (C <= n, n > 1: compute on n - 1 threads, one core restores)
//   overlap  = max(c + r, w)                      (C <= n, n == 1: one core does both)
// The smaller wins; a tie goes to serial (no contention risk). Compute unknown (c = 0, nothing
// measured yet): overlap when restoration mostly waits (w > r) or there are spare cores, else serial.
// Thread-safety: a pure function.
#pragma once

namespace mz {

struct RestoreCosts {
  int cores = 1;             // CPUs this process may run on (>= 1)
  int compute_threads = 1;   // the prefill's compute threads (>= 1)
  int io_workers = 2;        // storage-path workers asked for (mz_restore_params.io_threads)
  int decode_workers = 1;    // in-memory path workers asked for
  double restore_cpu_s = 0;  // one thread's CPU seconds the restore needs (page-cache reads, decoding, allocation)
  double restore_wait_s = 0; // seconds the restore waits for storage (direct reads), with io_workers in flight
  double compute_s = 0;      // the prefill's compute with every unit resident on compute_threads (0: unknown)
};

struct RestoreModePlan {
  bool overlap = true;             // restore overlapped with the prefill (else: restore, then compute)
  int io_workers = 2;              // storage-path workers to run
  int decode_workers = 1;          // in-memory path workers to run
  int compute_threads_during = 1;  // compute threads while restoration runs (overlap)
  double predicted_serial_s = 0, predicted_overlap_s = 0;  // the model's figures (0 when compute unknown)
  const char* why = "";            // the rule that decided, for reports
};

RestoreModePlan PlanRestoreMode(const RestoreCosts& c);

}  // namespace mz
