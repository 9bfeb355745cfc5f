#include "runtime/batcher.h"

#include <algorithm>
#include <chrono>

#include "core/sync_point.h"

namespace mz {

Batcher::Batcher(Model* model, const BatcherOptions& opts) : model_(model), opts_(opts) {
  ForwardOptions fo;
  fo.n_threads = opts.n_threads;
  fo.n_ubatch = opts.n_ubatch;
  fwd_ = std::make_unique<Forward>(model, nullptr, fo);  // steps name their caches
}

Status Batcher::Create(Model* model, const BatcherOptions& opts, std::shared_ptr<Batcher>* out) {
  if (!model || !out) return Status::InvalidArgument("Batcher: no model");
  if (opts.n_threads < 1 || opts.n_threads > 512 || opts.n_ubatch < 1 || opts.max_seqs < 1 ||
      opts.max_seqs > opts.n_ubatch || opts.prefill_slice < 1 || opts.min_prefill_slice < 1 ||
      opts.min_prefill_slice > opts.prefill_slice || !(opts.itl_factor == 0 || opts.itl_factor >= 1) ||
      !(opts.gather_step_share >= 0 && opts.gather_step_share <= 1))
    return Status::InvalidArgument("Batcher: options out of range (n_threads " + std::to_string(opts.n_threads) +
                                   ", n_ubatch " + std::to_string(opts.n_ubatch) + ", max_seqs " +
                                   std::to_string(opts.max_seqs) + ", prefill_slice " +
                                   std::to_string(opts.prefill_slice) + ")");
  std::shared_ptr<Batcher> b(new Batcher(model, opts));
  // The one set of compute buffers, sized now for the largest step (n_ubatch tokens, a logits row
  // for each of max_seqs sequences): what the pool's budget counts from the start.
  MZ_RETURN_IF_ERROR(b->fwd_->ReserveCompute(opts.n_ubatch, opts.max_seqs));
  b->buffer_bytes_ = b->fwd_->compute_buffer_bytes();
  MZ_RETURN_IF_ERROR(model->env()->StartThread([p = b.get()] { p->Loop(); }, &b->thread_).With("the batcher's thread"));
  *out = std::move(b);
  return Status::Ok();
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  while (!queue_.empty()) FinishLocked(queue_.front(), Status::Cancelled("the batcher was destroyed"));
}

Status Batcher::Run(Request* r) {
  if (!r || !r->kv || !r->tokens || r->n <= 0 || !r->logits)
    return Status::InvalidArgument("Batcher::Run: a malformed request");
  const int n_vocab = int(model_->hparams().n_vocab);
  for (int i = 0; i < r->n; ++i)
    if (r->tokens[i] < 0 || r->tokens[i] >= n_vocab)
      return Status::InvalidArgument("token id " + std::to_string(r->tokens[i]) + " out of range [0, " +
                                     std::to_string(n_vocab) + ")");
  r->logits->clear();
  r->wait_s = 0;
  r->steps = 0;
  Pending p{r, r->kv->n_tokens(), model_->env()->NowNs()};
  // Chunks for every new token exist before the batcher's thread writes any (the chunk table of
  // this cache only grows here, on the caller's thread).
  if (Status st = r->kv->Reserve(p.start + r->n); !st.ok()) {
    r->kv->Truncate(p.start);
    return st;
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_) {
    r->kv->Truncate(p.start);
    return Status::Cancelled("the batcher is stopping");
  }
  queue_.push_back(&p);
  arrivals_++;
  active_.fetch_add(1);
  cv_.notify_all();
  done_cv_.wait(lk, [&] { return p.finished; });
  return p.status;
}

BatcherStats Batcher::Stats() {
  std::lock_guard<std::mutex> lk(mu_);
  BatcherStats s = stats_;
  s.compute_buffer_bytes = buffer_bytes_.load();
  return s;
}

void Batcher::FinishLocked(Pending* p, Status st) {
  if (!st.ok()) {
    p->r->kv->Truncate(p->start);
    p->r->logits->clear();
    if (st.code() == Status::kCancelled) stats_.cancelled++;
    else stats_.failed++;
  }
  p->status = std::move(st);
  p->finished = true;
  queue_.erase(std::find(queue_.begin(), queue_.end(), p));
  active_.fetch_sub(1);
  done_cv_.notify_all();
}

std::vector<Batcher::Slice> Batcher::Schedule() {
  std::vector<Slice> step;
  // Cancelled requests leave before anything is computed for them.
  for (size_t i = 0; i < queue_.size();) {
    Pending* p = queue_[i];
    if (p->r->cancel && p->r->cancel->load()) {
      FinishLocked(p, Status::Cancelled("the sequence was cancelled"));
      continue;
    }
    ++i;
  }
  // A request whose restore ended (its wait hook no longer blocks) is checked once, every unit,
  // before it batches: a unit that failed to restore (a damaged chunk) fails that request with its
  // error, never the step it would have joined.
  for (size_t i = 0; i < queue_.size();) {
    Pending* p = queue_[i];
    if (p->r->wait && !p->restore_checked && !(p->r->restoring && p->r->restoring())) {
      p->restore_checked = true;
      Status st = p->r->wait(model_->base_unit());
      for (int l = 0; st.ok() && l < int(model_->hparams().n_layer); ++l) st = p->r->wait(l);
      if (!st.ok()) {
        FinishLocked(p, st);
        continue;
      }
    }
    ++i;
  }
  if (queue_.empty()) return step;
  // A request still restoring runs alone (the oldest such one); it was submitted when nothing else
  // ran, so at most the requests that arrived since wait behind it.
  for (Pending* p : queue_)
    if (p->r->restoring && p->r->restoring()) {
      step.push_back({p, std::min(p->r->n - p->done, opts_.n_ubatch)});
      return step;
    }
  int tokens = 0, prompts = 0;
  const Pending* oldest_prompt = nullptr;
  for (Pending* p : queue_) {
    if (p->r->n - p->done > 1) {
      if (!oldest_prompt) oldest_prompt = p;
      ++prompts;
      continue;
    }
    if (int(step.size()) >= opts_.max_seqs || tokens >= opts_.n_ubatch) continue;
    step.push_back({p, 1});
    ++tokens;
  }
  // The streams the oldest waiting prompt would slow: those decoding since before it arrived.
  int protect = 0;
  for (const Slice& s : step)
    if (oldest_prompt && s.p->r->decoding_since_ns != 0 && s.p->r->decoding_since_ns < oldest_prompt->arrived_ns)
      ++protect;
  // Prompt slices, oldest first: whole steps unless those streams outnumber the waiting prompts;
  // then a slice that keeps the step within itl_factor x a decode step.
  int slice = opts_.n_ubatch;
  if (protect > 0 && prompts < protect) {
    slice = opts_.prefill_slice;
    if (opts_.itl_factor > 0) {
      if (decode_step_s_ == 0) slice = 0;  // first a step without prompt tokens, to measure it
      else if (prompt_token_s_ == 0) slice = opts_.min_prefill_slice;  // then a small slice
      else
        slice = std::clamp(int((opts_.itl_factor - 1) * decode_step_s_ / prompt_token_s_), opts_.min_prefill_slice,
                           opts_.prefill_slice);
    }
  }
  int budget = std::min(opts_.n_ubatch - tokens, slice);
  for (Pending* p : queue_) {
    if (budget <= 0 || int(step.size()) >= opts_.max_seqs) break;
    const int left = p->r->n - p->done;
    if (left <= 1) continue;
    const int m = std::min(left, budget);
    step.push_back({p, m});
    budget -= m;
  }
  return step;
}

void Batcher::Loop() {
  std::unique_lock<std::mutex> lk(mu_);
  std::vector<Forward::Seq> seqs;
  std::vector<std::vector<float>> slice_logits;
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && !held_); });
    if (stop_) return;
    if (returning_ > 0 && arrivals_ < returning_ && opts_.gather_us > 0) {
      // The last step's callers are sampling their next token: let them join this step (at most
      // gather_us, or gather_step_share of a decode-only step when that is longer).
      const auto cap = std::chrono::microseconds(
          std::max<int64_t>(opts_.gather_us, int64_t(opts_.gather_step_share * decode_step_s_ * 1e6)));
      cv_.wait_for(lk, cap, [&] { return stop_ || arrivals_ >= returning_; });
      if (stop_) return;
    }
    if (queue_.empty() || held_) continue;
    std::vector<Slice> step = Schedule();
    if (step.empty()) continue;
    const bool alone_restoring = step.size() == 1 && step[0].p->r->restoring && step[0].p->r->restoring();
    seqs.assign(step.size(), Forward::Seq());
    int n_prefill = 0;
    for (size_t i = 0; i < step.size(); ++i) {
      const Slice& s = step[i];
      Request* r = s.p->r;
      Forward::Seq& q = seqs[i];
      q.kv = r->kv;
      q.tokens = r->tokens + s.p->done;
      q.n = s.n;
      const bool last = s.p->done + s.n == r->n;
      q.n_logits = r->all_logits ? s.n : (last ? 1 : 0);
      q.logits = r->logits;
      if (!last) n_prefill += s.n;
      else n_prefill += s.n - 1;
    }
    // The step runs without the lock: callers queue meanwhile; nobody else touches these requests.
    lk.unlock();
    Request* solo = alone_restoring ? step[0].p->r : nullptr;
    if (solo) {
      fwd_->set_wait(solo->wait);
      if (solo->threads_while_restoring > 0) fwd_->set_n_threads(solo->threads_while_restoring);
    }
    const uint64_t t0 = model_->env()->NowNs();
    Status st = fwd_->Step(seqs.data(), int(seqs.size()));
    const double step_s = double(model_->env()->NowNs() - t0) * 1e-9;
    if (solo) {
      solo->wait_s += fwd_->timing().wait_s;
      fwd_->set_wait(nullptr);
      fwd_->set_n_threads(opts_.n_threads);
    }
    buffer_bytes_ = fwd_->compute_buffer_bytes();
    lk.lock();
    stats_.steps++;
    stats_.seq_slots += step.size();
    stats_.max_batch = std::max(stats_.max_batch, int(step.size()));
    if (fwd_->timing().graphs > 1) stats_.layered_steps++;
    for (const Slice& s : step) {
      s.p->r->steps++;
      if (!st.ok()) {
        FinishLocked(s.p, st);
        continue;
      }
      stats_.tokens += uint64_t(s.n);
      s.p->done += s.n;
      if (s.p->done == s.p->r->n) FinishLocked(s.p, Status::Ok());
    }
    if (st.ok()) stats_.prefill_tokens += uint64_t(n_prefill);
    if (st.ok() && !solo) {
      // The costs the slice size follows (exponential averages, weight 1/4 on the newest step).
      int n_tok = 0;
      for (const Slice& s : step) n_tok += s.n;
      const int n_dec = n_tok - n_prefill;
      auto ema = [](double* v, double x) { *v = *v > 0 ? 0.75 * *v + 0.25 * x : x; };
      if (n_prefill == 0) {
        ema(&decode_step_s_, step_s);
      } else {
        const double dec = n_dec > 0 ? decode_step_s_ : 0;
        if (step_s > dec) ema(&prompt_token_s_, (step_s - dec) / double(n_prefill));
      }
    }
    returning_ = 0;
    arrivals_ = 0;
    for (const Slice& s : step) returning_ += s.p->finished && s.p->status.ok();
    steps_.fetch_add(1);
    lk.unlock();
    MZ_SYNC_POINT("batcher:step_done", int(step.size()));  // no lock held: a test may cancel, hold, queue
    lk.lock();
  }
}

void Batcher::Hold(bool on) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    held_ = on;
  }
  cv_.notify_all();
}

}  // namespace mz
