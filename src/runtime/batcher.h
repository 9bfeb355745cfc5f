// Batcher: one forward pass for every sequence that is generating (continuous batching).
//
// A pool's conversations (or any set of contexts over one model) share one Batcher: one Forward
// (one ggml backend, one set of compute buffers, one set of compute threads) that runs on the
// batcher's own thread. A caller's Run hands it one sequence's tokens and blocks until they are
// computed: the thread gathers every request waiting at that moment into a step (Forward::Step),
// so the matrix products read each weight once for all of them, and attention runs per sequence
// over its own KV chunks. A finished request leaves and a new one joins at the next step.
//
// Step composition (Schedule, the one place that decides it):
//   - a request with one token left (a decode) contributes it; at most max_seqs sequences a step;
//   - prompt tokens (a prefill) are cut into slices, oldest prompt first. The streams a prompt may
//     slow are those that were decoding before it arrived (Request::decoding_since_ns earlier than
//     the prompt's arrival): while they outnumber the waiting prompts, a slice is sized so that the
//     step takes at most itl_factor times a step without prompt tokens (measured: the time of the
//     last decode-only steps, and the time per prompt token of the last steps with prompts), at
//     most prefill_slice and at least min_prefill_slice tokens, so one long prompt does not freeze
//     every stream (chunked prefill). Otherwise (nobody decoding, users arriving together, more
//     prompts waiting than such streams) prompts take whole steps of n_ubatch tokens: first
//     tokens come first;
//   - a request still restoring its units (Request::restoring set) runs alone, its wait hook
//     called before each unit (the restore pipeline: front layers first, overlapped with its own
//     prefill): that step is computed layer by layer, every other step as one ggml graph (one
//     fork/join of the compute threads a step; Forward). Contexts submit such a request only when nothing else runs (Context); a request
//     arriving meanwhile waits at most until that request's restore is done (the hook reports it),
//     then joins the following steps.
//
// Failure: a step that fails fails every request in it (their KV truncated back to where each
// request began, their logits cleared); the others go on. Cancel (Request::cancel set) ends a
// request before its next slice with kCancelled, its KV truncated back the same way; the others in
// the batch are not disturbed.
//
// Thread-safety: Run may be called from any number of threads at once (one request per KvCache at
// a time: the caller holds its context). The KvCache, tokens and logits vector of a request are
// touched by the batcher's thread only while Run waits for them. Destruction fails requests still
// queued with kCancelled and joins the thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/status.h"
#include "memory/kv_cache.h"
#include "model/model.h"
#include "runtime/forward.h"

namespace mz {

struct BatcherOptions {
  int n_threads = 2;      // compute threads of the shared pass
  int n_ubatch = 512;     // tokens per step at most (decode tokens + prompt slices)
  int max_seqs = 64;      // sequences per step at most
  int prefill_slice = 512;     // prompt tokens per step at most while other requests decode
  int min_prefill_slice = 8;   // and at least this many (a long prompt always moves)
  // The step time a prompt slice may take beside decoding requests, as a multiple of a step with no
  // prompt tokens (2: their inter-token latency at most doubles). 0: prefill_slice, fixed.
  double itl_factor = 2.0;
  // The callers of requests a step finished sample and come back with their next token a moment
  // later: the next step waits for them at most this long (microseconds; 0: starts at once with
  // whatever is queued), so that synchronous streams keep sharing steps instead of splitting into
  // half-full ones.
  int gather_us = 5000;
  // While steps are long the gather may wait longer: up to this share of the measured decode-only
  // step (0: gather_us only). Callers each sample from a full vocabulary row (Qwen3: 152k logits,
  // ~1-2 ms) on the cores the step just left: 8 of them on 2 cores take more than 5 ms, and one
  // that misses the gather waits a whole step (session 36: mean batch 7.1-7.5 of 8). The wait
  // still ends as soon as every caller the last step finished is back.
  double gather_step_share = 0.25;
};

struct BatcherStats {
  uint64_t steps = 0;          // forward passes run
  uint64_t seq_slots = 0;      // sequences summed over steps (seq_slots / steps: mean batch)
  uint64_t tokens = 0;         // tokens computed
  uint64_t prefill_tokens = 0; // of them, prompt tokens (not a request's last token)
  uint64_t cancelled = 0, failed = 0;
  int max_batch = 0;           // most sequences in one step
  // Steps computed layer by layer (a request still restoring ran alone, its wait hook before each
  // layer); every other step is one ggml graph (runtime/forward.h).
  uint64_t layered_steps = 0;
  uint64_t compute_buffer_bytes = 0;  // the shared pass's compute buffers (grown to the largest step)
};

class Batcher {
 public:
  // Sizes the shared compute buffers for the largest step (Forward::ReserveCompute: kNoMemory) and
  // starts the batcher's thread (Env::StartThread: a refusal is kNoMemory, nothing left running).
  // kInvalidArgument: options out of range (n_threads 1-512, n_ubatch >= 1, max_seqs 1..n_ubatch,
  // prefill_slice >= 1). model must outlive the batcher.
  static Status Create(Model* model, const BatcherOptions& opts, std::shared_ptr<Batcher>* out);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  struct Request {
    KvCache* kv = nullptr;       // chunks for the new tokens are reserved by Run
    const int32_t* tokens = nullptr;
    int n = 0;
    bool all_logits = false;     // every token's logits row, else the last token's only
    std::vector<float>* logits = nullptr;  // cleared, then filled (n_vocab floats per row)
    // Units still restoring: the request runs alone and wait(unit) is called before each unit the
    // pass needs (it may block until the unit is resident, or fail). restoring() true while that
    // holds; once it returns false, wait is asked for every unit once (it must not block then): an
    // error ends this request with it (kCorruption for a damaged chunk), and otherwise the request
    // batches like any other.
    std::function<Status(int unit)> wait;
    std::function<bool()> restoring;
    int threads_while_restoring = 0;  // compute threads while it runs alone restoring (0: all)
    const std::atomic<bool>* cancel = nullptr;  // set by another thread: stop before the next slice
    // For a one-token request: when this sequence began decoding (its prompt was computed), on the
    // Env's clock; 0 for a prompt (the request's arrival counts). Chunked prefill protects only
    // the streams that were decoding before a prompt arrived.
    uint64_t decoding_since_ns = 0;
    // Out: time the pass waited in `wait`, and steps this request was part of.
    double wait_s = 0;
    int steps = 0;
  };
  // Computes r's tokens, appended at r.kv->n_tokens(), in shared steps; blocks until done. On
  // success the KV cache holds them and *r.logits the rows asked for. On failure (kCancelled,
  // kContextFull / kNoMemory reserving chunks, a step's error) the KV cache is back at its length
  // before the call and *r.logits is empty. kInvalidArgument: a malformed request (nothing
  // touched). REQUIRES: no other request on r.kv in flight.
  Status Run(Request* r);

  // While held, no step starts (requests queue): tests and benchmarks line requests up so that
  // they share a step deterministically. Releasing wakes the thread. Any thread.
  void Hold(bool on);
  // Requests in flight (queued or in a step).
  int active() const { return active_.load(); }
  // Steps run so far (monotonic): a caller that saw it change may run a once-per-step pass.
  uint64_t steps() const { return steps_.load(); }
  BatcherStats Stats();
  uint64_t compute_buffer_bytes() const { return buffer_bytes_.load(); }
  const BatcherOptions& options() const { return opts_; }

 private:
  struct Pending {
    Request* r;
    int start;      // r->kv->n_tokens() when it arrived
    uint64_t arrived_ns = 0;
    bool restore_checked = false;  // its wait hook was asked for every unit once it stopped restoring
    int done = 0;   // tokens computed
    bool finished = false;
    Status status;
  };
  // One slice of a step: tokens [done, done + n) of p.
  struct Slice {
    Pending* p;
    int n;
  };
  Batcher(Model* model, const BatcherOptions& opts);
  void Loop();
  // Chooses the next step from queue_ (REQUIRES mu_): the slices, per the rules above.
  std::vector<Slice> Schedule();
  // REQUIRES mu_. Ends p: its status, KV truncated back on failure; wakes its caller.
  void FinishLocked(Pending* p, Status st);

  Model* model_;
  const BatcherOptions opts_;
  std::unique_ptr<Forward> fwd_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // the thread: work arrived or stop
  std::condition_variable done_cv_;  // callers: a request finished
  std::deque<Pending*> queue_;       // in arrival order; removed when finished
  bool stop_ = false;
  bool held_ = false;
  int returning_ = 0;  // requests the last step finished (their callers likely come back)
  // Measured step costs (seconds; 0: not yet): a step with no prompt tokens, and a prompt token.
  double decode_step_s_ = 0, prompt_token_s_ = 0;
  int arrivals_ = 0;   // requests queued since the last step ended
  std::atomic<int> active_{0};
  std::atomic<uint64_t> steps_{0};
  std::atomic<uint64_t> buffer_bytes_{0};
  BatcherStats stats_;  // under mu_
  std::thread thread_;
};

}  // namespace mz
