// bench pool: many conversations under one memory budget (issue 22). Built on the public C API
// alone (mz_pool_*), as an app or a server would use it.
//
//   1. build N conversations of M tokens that share an S-token system prompt (each reuses the
//      stored or open prefix; conversation 0 computes it), each committed (write-behind);
//   2. a seeded random trace of Q returns, each an 8-token query: TTFT on return (the budget holds
//      about R conversations resident), then at once a second query on the same conversation (all
//      in memory: the paired baseline). Each turn is committed, so the write-behind saves it while
//      the next return runs; --settle alternate waits for that save (mz_pool_flush) before every
//      other return, and reports the two halves apart (a save in flight, or settled);
//   3. re-prefill of a whole history in a fresh conversation (what an unloaded Ollama or a killed app
//      pays), measured between trace segments;
//   4. restart: the pool is freed and made again on its folder (model load excluded, reported
//      apart); the first return to a conversation (its stored file is its storage tier), against
//      the same conversation's return from 0% remaining (weights and its KV evicted) in the running
//      process and against a restart that reads the stored file whole at open (the ablation),
//      the three alternated;
//   5. return after pressure eased: a critical onTrimMemory takes everything (weights too), the
//      pressure then ends, and the user returns to the conversation used last after --calm-wait
//      seconds. Restore-ahead (a pressure watch with restore_in_background, calm after 1 s)
//      against on-request restore (no watch: the query restores what it needs), alternated.
// Results: <out>/bench-pool.md, .json and a TTFT plot (gnuplot).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <random>
#include <thread>
#include <chrono>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/report.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct PoolBenchArgs {
  std::string model;
  std::string type = "q8_0";
  int conversations = 50, tokens = 4096, system = 1024, resident = 3, queries = 40, query_tokens = 8;
  int reprefill_reps = 3, restart_reps = 3, threads = 2, pressure_reps = 3;
  double calm_wait = 5;  // seconds between the pressure's end and the return (phase 5)
  uint32_t seed = 1;
  std::string dir = "/var/tmp";
  std::string out = "results/bench-pool";
  bool quick = false;
  std::string settle = "none";  // none | alternate: wait for the previous turn's save before even returns
  int64_t arena_mib = -1;        // mz_pool_params.load_arena_bytes in MiB (-1: the default)
  int yield_ms = -1;             // mz_pool_params.write_behind_yield_ms (-1: the default)
};

struct PoolFree {
  void operator()(mz_pool* p) const { mz_pool_free(p); }
};
struct ConvFree {
  void operator()(mz_conversation* c) const { mz_conversation_release(c); }
};
using MzPool = std::unique_ptr<mz_pool, PoolFree>;
using MzConv = std::unique_ptr<mz_conversation, ConvFree>;

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p * double(v.size() - 1);
  const size_t lo = size_t(idx), hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

std::vector<mz_token> RandomTokens(std::mt19937& rng, int n, int n_vocab) {
  std::vector<mz_token> t(size_t(std::max(0, n)));
  for (auto& x : t) x = mz_token(200 + rng() % uint32_t(n_vocab - 400));
  return t;
}

Status Query(mz_conversation* c, const std::vector<mz_token>& q, mz_restore_stats* rs) {
  return MzStatus(mz_conversation_restore_generate(c, q.data(), int32_t(q.size()), nullptr, rs));
}

// The bench's steps, in the order Run takes them; the figures each step records are members, read
// by Report. Not copyable (pp points into cp and dir).
class PoolBench {
 public:
  explicit PoolBench(PoolBenchArgs args) : a(std::move(args)) {}
  PoolBench(const PoolBench&) = delete;
  PoolBench& operator=(const PoolBench&) = delete;

  int Run() {
    if (a.quick) {
      a.conversations = 8, a.tokens = 1024, a.system = 256, a.queries = 16, a.reprefill_reps = 2, a.restart_reps = 2, a.pressure_reps = 2;
    }
    for (auto step : {&PoolBench::Open, &PoolBench::Build, &PoolBench::Trace, &PoolBench::Restarts,
                      &PoolBench::PressureEased}) {
      Status st = (this->*step)();  // one step at a time: the first error ends the bench
      if (!st.ok()) return Fail(st);
    }
    Report();
    pool.reset();
    std::filesystem::remove_all(dir);
    return 0;
  }

 private:
  static std::string name(int i) { return "conv-" + std::to_string(i); }

  // The model, the budget (weights + --resident conversations), the pool on a fresh folder.
  Status Open() {
    if (a.system >= a.tokens) return Status::InvalidArgument("--system must be below --tokens");
    const double tl0 = NowSeconds();
    MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &path, &model));
    model_load_s = NowSeconds() - tl0;
    mz_model_get_info(model.get(), &info);
    conv_bytes = uint64_t(a.tokens) * info.kv_bytes_per_token;
    budget = info.weight_bytes + uint64_t(a.resident) * conv_bytes;
    dir = a.dir + "/mzcache-bench-pool-" + std::to_string(getpid());
    std::filesystem::remove_all(dir);
    std::fprintf(stderr, "[bench pool] %s: %d conversations x %d tokens (system prompt %d), budget %.0f MiB "
                 "(weights %.0f MiB + %d conversations of %.0f MiB), folder %s\n", info.name, a.conversations, a.tokens,
                 a.system, double(budget) / 1048576, double(info.weight_bytes) / 1048576, a.resident,
                 double(conv_bytes) / 1048576, dir.c_str());
    cp = mz_context_default_params();
    cp.n_ctx = uint32_t(a.tokens + 2 * a.query_tokens * (a.queries + 2 * a.restart_reps + 4) + 256);
    cp.n_threads = a.threads;
    pp = mz_pool_default_params();
    pp.dir = dir.c_str();
    pp.memory_budget = budget;
    pp.context = &cp;
    if (a.arena_mib >= 0) pp.load_arena_bytes = uint64_t(a.arena_mib) << 20;
    if (a.yield_ms >= 0) pp.write_behind_yield_ms = uint32_t(a.yield_ms);
    {
      mz_pool* p = nullptr;
      if (int rc = mz_pool_new(model.get(), &pp, &p); rc != MZ_OK) return MzStatus(rc);
      pool.reset(p);
    }
    rng.seed(a.seed);
    sys = RandomTokens(rng, a.system, info.n_vocab);
    hist.assign(size_t(a.conversations), {});
    return Status::Ok();
  }

  // 1. Build the conversations, each committed (its prefix reused from the stored or open ones).
  Status Build() {
    Status st;
    for (int i = 0; i < a.conversations; ++i) {
      hist[size_t(i)] = sys;
      auto own = RandomTokens(rng, a.tokens - a.system, info.n_vocab);
      hist[size_t(i)].insert(hist[size_t(i)].end(), own.begin(), own.end());
      mz_conversation* c = nullptr;
      if (int rc = mz_pool_open(pool.get(), name(i).c_str(), &c); rc != MZ_OK) return MzStatus(rc);
      MzConv conv(c);
      const double t0 = NowSeconds();
      mz_restore_stats rs;
      st = Query(c, hist[size_t(i)], &rs);
      if (!st.ok()) return st;
      build_s.push_back(NowSeconds() - t0);
      mz_conversation_commit(c);
      std::fprintf(stderr, "[bench pool] built %d/%d in %.1f s\n", i + 1, a.conversations, build_s.back());
    }
    mz_pool_flush(pool.get());
    mz_pool_get_report(pool.get(), &pr);
    prefix_reused = pr.prefix_chunks_reused;
    stored_after_build = pr.stored_bytes;
    mz_pool_get_shared_report(pool.get(), &shr);
    mz_pool_get_stored_report(pool.get(), &stored);
    return Status::Ok();
  }

  // 2-3. The trace of returns, with re-prefill samples between its segments.
  Status Trace() {
    Status st;
    auto reprefill_once = [&](int k) -> Status {
      mz_pool_params rp = pp;
      rp.dir = nullptr;
      rp.memory_budget = 0;
      rp.share_prefixes = false;
      mz_pool* p = nullptr;
      MZ_RETURN_IF_ERROR(MzStatus(mz_pool_new(model.get(), &rp, &p)));
      MzPool fresh(p);
      mz_conversation* c = nullptr;
      MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(p, "r", &c)));
      MzConv conv(c);
      mz_restore_stats rs;
      MZ_RETURN_IF_ERROR(Query(c, hist[size_t(k % a.conversations)], &rs));
      reprefill.push_back(rs.ttft_s);
      std::fprintf(stderr, "[bench pool] re-prefill of %d tokens: %.2f s\n", a.tokens, rs.ttft_s);
      return Status::Ok();
    };
    const int seg = std::max(1, a.queries / std::max(1, a.reprefill_reps));
    for (int q = 0; q < a.queries; ++q) {
      if (q % seg == 0 && int(reprefill.size()) < a.reprefill_reps) {
        st = reprefill_once(q);
        if (!st.ok()) return st;
      }
      const int i = int(rng() % uint32_t(a.conversations));
      const bool settled = a.settle == "alternate" && q % 2 == 0;
      if (settled) mz_pool_flush(pool.get());  // the previous turn's save ends before this return
      mz_conversation_report before;
      mz_pool_conversation_report(pool.get(), name(i).c_str(), &before);
      mz_conversation* c = nullptr;
      if (int rc = mz_pool_open(pool.get(), name(i).c_str(), &c); rc != MZ_OK) return MzStatus(rc);
      MzConv conv(c);
      mz_restore_stats r1, r2;
      st = Query(c, RandomTokens(rng, a.query_tokens, info.n_vocab), &r1);
      if (st.ok()) st = Query(c, RandomTokens(rng, a.query_tokens, info.n_vocab), &r2);
      if (!st.ok()) return st;
      mz_conversation_commit(c);
      const double share = double(before.kv_resident) / double(conv_bytes);
      // q8 chunks held in the in-memory swap are read in place by compute (not restored first).
      const double mem_q8 = double(before.kv_mem_compressed) / double(conv_bytes);
      ret.push_back(r1.ttft_s);
      res.push_back(r2.ttft_s);
      if (a.settle == "alternate") (settled ? ret_settled : ret_in_flight).push_back(r1.ttft_s);
      resident_share.push_back(share);
      rows.push_back({{"query", q}, {"conversation", i}, {"settled", settled}, {"kv_resident_share", share},
                      {"ttft_return_s", r1.ttft_s}, {"reload_s", r1.reload_s}, {"wait_s", r1.wait_s}, {"cpu_s", r1.cpu_s},
                      {"ttft_resident_s", r2.ttft_s}, {"bytes_from_storage", r1.bytes_from_storage},
                      {"kv_mem_compressed_bytes", before.kv_mem_compressed}, {"kv_storage_bytes", before.kv_storage},
                      {"units_restored", r1.units_restored}});
      std::fprintf(stderr,
                   "[bench pool] query %d/%d: %s (KV resident %.0f%%, q8 in memory %.0f%% of the fp16 size) return %.3f s, "
                   "resident %.3f s\n",
                   q + 1, a.queries, name(i).c_str(), 100 * share, 100 * mem_q8, r1.ttft_s, r2.ttft_s);
    }
    mz_pool_get_io_report(pool.get(), &io_trace);  // before the re-prefills left: the trace's own figures
    while (int(reprefill.size()) < a.reprefill_reps) {
      st = reprefill_once(int(reprefill.size()));
      if (!st.ok()) return st;
    }
    return Status::Ok();
  }

  Status Restarts() {
    Status st;
    // 4. Restart, alternated (the order rotates each rep) with a return from 0% in the running
    // process and with the ablation: a restart that reads the stored conversation whole at open.
    auto from_zero_once = [&](int i) -> Status {
      // 0% remaining in the running process: everything out (weights too), then the query.
      uint64_t freed = 0;
      mz_pool_evict(pool.get(), uint64_t(1) << 42, &freed);
      mz_conversation* c = nullptr;
      MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), name(i).c_str(), &c)));
      MzConv conv(c);
      mz_restore_stats rs;
      MZ_RETURN_IF_ERROR(Query(c, RandomTokens(rng, a.query_tokens, info.n_vocab), &rs));
      from_zero.push_back(rs.ttft_s);
      mz_conversation_commit(c);
      return Status::Ok();
    };
    // The pool freed (it persists what changed) and made again on its folder; the weights evicted
    // as in from_zero_once; the first return = open + query.
    auto restart_once = [&](int i, bool whole) -> Status {
      pool.reset();
      mz_pool_params rp = pp;
      rp.read_stored_whole = whole;
      const double t0 = NowSeconds();
      {
        mz_pool* p = nullptr;
        MZ_RETURN_IF_ERROR(MzStatus(mz_pool_new(model.get(), &rp, &p)));
        pool.reset(p);
      }
      if (!whole) restart_index.push_back(NowSeconds() - t0);
      uint64_t freed = 0;
      mz_pool_evict(pool.get(), uint64_t(1) << 42, &freed);
      const double t1 = NowSeconds();
      mz_conversation* c = nullptr;
      MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), name(i).c_str(), &c)));
      MzConv conv(c);
      const double open_s = NowSeconds() - t1;
      mz_restore_stats rs;
      MZ_RETURN_IF_ERROR(Query(c, RandomTokens(rng, a.query_tokens, info.n_vocab), &rs));
      (whole ? whole_open : restart_open).push_back(open_s);
      (whole ? whole_restart : after_restart).push_back(open_s + rs.ttft_s);
      mz_conversation_commit(c);
      return Status::Ok();
    };
    for (int k = 0; k < a.restart_reps; ++k) {
      const int i = (k * 7 + 3) % a.conversations;
      for (int j = 0; j < 3; ++j) {
        const int arm = (j + k) % 3;
        st = arm == 0 ? from_zero_once(i) : restart_once(i, arm == 2);
        if (!st.ok()) return st;
      }
      std::fprintf(stderr,
                   "[bench pool] restart %d/%d: %s from 0%% %.3f s; after restart %.3f s (open %.3f s); read whole at "
                   "open %.3f s (open %.3f s)\n",
                   k + 1, a.restart_reps, name(i).c_str(), from_zero.back(), after_restart.back(), restart_open.back(),
                   whole_restart.back(), whole_open.back());
    }
    return Status::Ok();
  }

  Status PressureEased() {
    Status st;
    // 5. Return after pressure eased, restore-ahead against on-request, alternated.
    int last = (a.restart_reps * 7 + 3 - 7) % a.conversations;  // the conversation used last
    for (int k = 0; k < a.pressure_reps; ++k) {
      for (int j = 0; j < 2; ++j) {
        const bool ahead = (j + k) % 2 == 0;
        if (ahead) {
          mz_pressure_params wp = mz_pressure_default_params();
          wp.source = "watermark";  // its free-memory reading is restore-ahead's fit check
          wp.restore_in_background = true;
          wp.calm_ms = 1000;
          if (int rc = mz_pool_pressure_watch_start(pool.get(), &wp); rc != MZ_OK) return MzStatus(rc);
        }
        uint64_t freed = 0;
        if (int rc = mz_pool_on_trim_memory(pool.get(), 80, &freed); rc != MZ_OK) return MzStatus(rc);
        std::this_thread::sleep_for(std::chrono::duration<double>(a.calm_wait));
        mz_pool_get_report(pool.get(), &pr);
        const double share = double(pr.in_memory) / double(std::max<uint64_t>(1, budget));
        mz_conversation* c = nullptr;
        if (int rc = mz_pool_open(pool.get(), name(last).c_str(), &c); rc != MZ_OK) return MzStatus(rc);
        MzConv conv(c);
        mz_restore_stats rs;
        st = Query(c, RandomTokens(rng, a.query_tokens, info.n_vocab), &rs);
        if (!st.ok()) return st;
        mz_conversation_commit(c);
        if (ahead) mz_pool_pressure_watch_stop(pool.get());
        (ahead ? eased_ahead : eased_request).push_back(rs.ttft_s);
        if (ahead) eased_ahead_resident.push_back(share);
        std::fprintf(stderr,
                     "[bench pool] pressure eased %d/%d, %s: gave back %.0f MiB; after %.1f s the pool held %.0f%% of "
                     "its budget; return to %s: TTFT %.3f s\n",
                     k + 1, a.pressure_reps, ahead ? "restore-ahead" : "on request", double(freed) / 1048576,
                     a.calm_wait, 100 * share, name(last).c_str(), rs.ttft_s);
      }
    }
    return Status::Ok();
  }

  // The markdown and JSON reports and the TTFT plot, in a.out.
  void Report() {
    mz_pool_get_report(pool.get(), &pr);
    found = pr.n_conversations;

    const Stats rp = Summarize(reprefill), fz = Summarize(from_zero), ar = Summarize(after_restart);
    const double p50r = Pct(ret, 0.5), p95r = Pct(ret, 0.95), p50m = Pct(res, 0.5), p95m = Pct(res, 0.95);
    const uint64_t sys_bytes = uint64_t(a.system) * info.kv_bytes_per_token;
    char buf[4096];
    std::string md = "# bench pool\n\n";
    md += "machine: " + MachineDescription() + "\n\n";
    std::snprintf(buf, sizeof buf,
                  "model %s; %d conversations x %d tokens sharing a %d-token system prompt; budget %.0f MiB (weights + "
                  "%d conversations); %d queries of %d tokens; threads %d; seed %u; model load %.2f s (excluded below)\n\n",
                  info.name, a.conversations, a.tokens, a.system, double(budget) / 1048576, a.resident, a.queries,
                  a.query_tokens, a.threads, a.seed, model_load_s);
    md += buf;
    md += "| TTFT | p50 s | p95 s | p50 vs all-in-memory | p50 vs re-prefill |\n|---|---|---|---|---|\n";
    std::snprintf(buf, sizeof buf, "| return after other conversations | %.3f | %.3f | %.2fx | %.1fx faster |\n", p50r, p95r,
                  p50r / std::max(1e-9, p50m), rp.median / std::max(1e-9, p50r));
    md += buf;
    if (!ret_settled.empty()) {
      const double p50s = Pct(ret_settled, 0.5), p50f = Pct(ret_in_flight, 0.5);
      std::snprintf(buf, sizeof buf, "| of which: the previous turn's save settled first (%zu) | %.3f | %.3f | %.2fx | |\n",
                    ret_settled.size(), p50s, Pct(ret_settled, 0.95), p50s / std::max(1e-9, p50m));
      md += buf;
      std::snprintf(buf, sizeof buf, "| of which: the previous turn's save in flight (%zu) | %.3f | %.3f | %.2fx | |\n",
                    ret_in_flight.size(), p50f, Pct(ret_in_flight, 0.95), p50f / std::max(1e-9, p50m));
      md += buf;
    }
    std::snprintf(buf, sizeof buf, "| all in memory (same conversation, next query) | %.3f | %.3f | 1.00x | |\n", p50m, p95m);
    md += buf;
    std::snprintf(buf, sizeof buf, "| re-prefill of the whole history (%d reps) | %.3f (min %.3f max %.3f) | | | |\n\n",
                  rp.n, rp.median, rp.min, rp.max);
    md += buf;
    const Stats wr = Summarize(whole_restart);
    md += "| first return (TTFT incl. open; model load excluded) | median s | min | max | open s (median) | vs from 0% |\n"
          "|---|---|---|---|---|---|\n";
    std::snprintf(buf, sizeof buf, "| after a restart: the stored file is the storage tier (default) | %.3f | %.3f | %.3f | %.3f | %.2fx |\n",
                  ar.median, ar.min, ar.max, Summarize(restart_open).median, ar.median / std::max(1e-9, fz.median));
    md += buf;
    std::snprintf(buf, sizeof buf, "| after a restart: read whole at open (ablation) | %.3f | %.3f | %.3f | %.3f | %.2fx |\n",
                  wr.median, wr.min, wr.max, Summarize(whole_open).median, wr.median / std::max(1e-9, fz.median));
    md += buf;
    std::snprintf(buf, sizeof buf, "| from 0%% remaining in the running process | %.3f | %.3f | %.3f | | 1.00x |\n\n",
                  fz.median, fz.min, fz.max);
    md += buf;
    std::snprintf(buf, sizeof buf,
                  "Restart: %d reps, the three arms alternated (order rotated each rep), on the same conversation per rep. "
                  "Index rebuild at pool start %.3f s. Conversations found after the restarts: %d of %d.\n\n",
                  ar.n, Summarize(restart_index).median, found, a.conversations);
    md += buf;
    if (a.pressure_reps > 0) {
      const Stats ea = Summarize(eased_ahead), er = Summarize(eased_request);
      md += "| return after pressure eased (critical trim, then calm for " + std::to_string(a.calm_wait).substr(0, 4) +
            " s) | median s | min | max | vs all-in-memory p50 |\n|---|---|---|---|---|\n";
      std::snprintf(buf, sizeof buf, "| restore-ahead (watch, restore_in_background) | %.3f | %.3f | %.3f | %.2fx |\n",
                    ea.median, ea.min, ea.max, ea.median / std::max(1e-9, p50m));
      md += buf;
      std::snprintf(buf, sizeof buf, "| on request (restore overlapped with the query's prefill) | %.3f | %.3f | %.3f | %.2fx |\n\n",
                    er.median, er.min, er.max, er.median / std::max(1e-9, p50m));
      md += buf;
      std::snprintf(buf, sizeof buf,
                    "Pressure eased: %d reps, the two arms alternated; the pool held a median %.0f%% of its budget when "
                    "the user returned with restore-ahead.\n\n",
                    ea.n, 100 * Summarize(eased_ahead_resident).median);
      md += buf;
    }
    std::snprintf(buf, sizeof buf,
                  "Shared system prompt: %.1f MiB of KV per conversation; %llu full chunks reused instead of computed "
                  "(build median %.1f s per conversation, conversation 0 %.1f s). After the build the pool's store of "
                  "shared chunks held %d chunks (%d units, %llu references) once: %.1f MiB in RAM + %.1f MiB on its "
                  "storage, against %.1f MiB unshared (a copy per conversation using them).\n",
                  double(sys_bytes) / 1048576, (unsigned long long)prefix_reused,
                  Summarize(build_s).median, build_s.empty() ? 0 : build_s[0], (int)shr.chunks, (int)shr.units,
                  (unsigned long long)shr.refs, double(shr.resident_bytes) / 1048576, double(shr.storage_bytes) / 1048576,
                  double(shr.bytes_if_copied) / 1048576);
    md += buf;
    std::snprintf(buf, sizeof buf,
                  "\nStored after the build: %.1f MiB in all, of which %d chunk files of %.1f MiB hold the shared "
                  "chunks once (named %llu times by the stored conversations; each name would otherwise be a copy of "
                  "about %.2f MiB).\n",
                  double(stored_after_build) / 1048576, (int)stored.chunk_files, double(stored.chunk_file_bytes) / 1048576,
                  (unsigned long long)stored.chunk_file_refs,
                  stored.chunk_files ? double(stored.chunk_file_bytes) / stored.chunk_files / 1048576 : 0.0);
    md += buf;
    std::snprintf(buf, sizeof buf,
                  "\nAt the trace's end: load arena %.0f of %.0f MiB held, %.0f MiB of segments reused by loads "
                  "instead of fresh memory; background writes waited %.1f s in all for first tokens elsewhere; %d "
                  "conversations had a change not yet stored.\n",
                  double(io_trace.arena_bytes) / 1048576, double(io_trace.arena_cap) / 1048576,
                  double(io_trace.arena_reused_bytes) / 1048576, io_trace.persist_yielded_s, (int)io_trace.unsaved);
    md += buf;
    nlohmann::json doc = {{"machine", MachineDescription()}, {"model", info.name}, {"args",
                           {{"conversations", a.conversations}, {"tokens", a.tokens}, {"system", a.system},
                            {"resident", a.resident}, {"queries", a.queries}, {"threads", a.threads}, {"seed", a.seed},
                            {"settle", a.settle}, {"arena_mib", a.arena_mib}, {"yield_ms", a.yield_ms}}},
                          {"io_at_trace_end", {{"arena_bytes", io_trace.arena_bytes}, {"arena_cap", io_trace.arena_cap},
                                               {"arena_reused_bytes", io_trace.arena_reused_bytes},
                                               {"persist_yielded_s", io_trace.persist_yielded_s},
                                               {"unsaved", io_trace.unsaved}}},
                          {"ttft_return_settled_s", ret_settled}, {"ttft_return_in_flight_s", ret_in_flight},
                          {"budget_bytes", budget}, {"model_load_s", model_load_s}, {"build_s", build_s},
                          {"ttft_return_s", ret}, {"ttft_resident_s", res}, {"kv_resident_share", resident_share},
                          {"reprefill_s", reprefill}, {"restart_first_return_s", after_restart},
                          {"restart_open_s", restart_open}, {"from_zero_s", from_zero},
                          {"restart_read_whole_first_return_s", whole_restart},
                          {"pressure_eased_restore_ahead_s", eased_ahead}, {"pressure_eased_on_request_s", eased_request},
                          {"pressure_eased_budget_share_at_return", eased_ahead_resident}, {"calm_wait_s", a.calm_wait}, {"restart_read_whole_open_s", whole_open}, {"index_rebuild_s", restart_index},
                          {"conversations_found", found}, {"prefix_chunks_reused", prefix_reused},
                          {"system_prompt_kv_bytes", sys_bytes},
                          {"shared", {{"chunks", shr.chunks}, {"units", shr.units}, {"refs", shr.refs},
                                      {"resident_bytes", shr.resident_bytes}, {"storage_bytes", shr.storage_bytes},
                                      {"bytes_if_copied", shr.bytes_if_copied}}},
                          {"stored", {{"stored_bytes", stored_after_build}, {"chunk_files", stored.chunk_files},
                                      {"chunk_file_bytes", stored.chunk_file_bytes},
                                      {"chunk_file_refs", stored.chunk_file_refs}}},
                          {"queries_detail", rows}};
    std::string data;
    for (size_t k = 0; k < ret.size(); ++k) {
      std::snprintf(buf, sizeof buf, "%zu %.4f %.4f %.3f\n", k, ret[k], res[k], resident_share[k]);
      data += buf;
    }
    WriteFile(a.out, "bench-pool-ttft.dat", data);
    const std::string png = PlotPng(a.out, "bench-pool-ttft",
                                    "set terminal pngcairo size 900,500\nset output 'bench-pool-ttft.png'\n"
                                    "set xlabel 'query'\nset ylabel 'TTFT (s)'\nset y2label 'KV resident at return'\n"
                                    "set y2tics\nset key top left\n"
                                    "plot 'bench-pool-ttft.dat' u 1:2 w lp t 'return after other conversations', "
                                    "'' u 1:3 w lp t 'all in memory (next query)', '' u 1:4 axes x1y2 w i t 'KV resident share'\n");
    if (!png.empty()) md += "\n![TTFT per query](" + png + ")\n";
    WriteReport(a.out, "bench-pool", md, doc);
    std::printf("%s", md.c_str());
  }

  PoolBenchArgs a;
  std::string path, dir;
  MzModel model;
  double model_load_s = 0;
  mz_model_info info{};
  uint64_t conv_bytes = 0, budget = 0;
  mz_context_params cp{};
  mz_pool_params pp{};
  MzPool pool;
  std::mt19937 rng;
  std::vector<mz_token> sys;
  std::vector<std::vector<mz_token>> hist;
  // Build.
  std::vector<double> build_s;
  mz_pool_report pr{};
  uint64_t prefix_reused = 0, stored_after_build = 0;
  mz_pool_shared_report shr{};     // the shared system prompt's chunks, held once (issue 22)
  mz_pool_stored_report stored{};  // and stored once, in chunk files (0.11)
  mz_pool_io_report io_trace{};    // load arena and write-behind at the trace's end (0.12)
  // Trace.
  std::vector<double> ret, res, resident_share, reprefill;
  std::vector<double> ret_settled, ret_in_flight;  // --settle alternate: the two halves
  nlohmann::json rows = nlohmann::json::array();
  // Restarts.
  std::vector<double> from_zero, after_restart, restart_open, restart_index, whole_restart, whole_open;
  // Pressure eased.
  std::vector<double> eased_ahead, eased_request, eased_ahead_resident;
  int found = 0;
};

int RunPoolBench(PoolBenchArgs a) { return PoolBench(std::move(a)).Run(); }

}  // namespace

void AddPoolBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<PoolBenchArgs>();
  auto* c = bench->add_subcommand("pool", "many conversations under one budget: TTFT on return vs all-in-memory and "
                                          "re-prefill; restart from the stored conversations");
  c->add_option("-m,--model", a->model, "GGUF path or synthesized shape (default qwen3-0.6b)");
  c->add_option("--type", a->type, "weight type of a synthesized model");
  c->add_option("--conversations", a->conversations, "conversations")->check(CLI::Range(2, 10000));
  c->add_option("--tokens", a->tokens, "tokens per conversation")->check(CLI::Range(64, 1 << 20));
  c->add_option("--system", a->system, "tokens of the shared system prompt")->check(CLI::Range(0, 1 << 20));
  c->add_option("--resident", a->resident, "conversations the budget holds besides the weights")->check(CLI::Range(1, 1000));
  c->add_option("--queries", a->queries, "returns in the trace")->check(CLI::Range(1, 100000));
  c->add_option("--reprefill-reps", a->reprefill_reps, "re-prefill samples")->check(CLI::Range(1, 100));
  c->add_option("--restart-reps", a->restart_reps, "restart samples")->check(CLI::Range(1, 100));
  c->add_option("--pressure-reps", a->pressure_reps, "return-after-pressure-eased samples per arm (0: skip)")->check(CLI::Range(0, 100));
  c->add_option("--calm-wait", a->calm_wait, "seconds from the pressure's end to the return (phase 5)")->check(CLI::Range(0.0, 3600.0));
  c->add_option("-t,--threads", a->threads, "compute threads")->check(CLI::Range(1, 256));
  c->add_option("--seed", a->seed, "trace seed");
  c->add_option("--dir", a->dir, "where the pool's folder is made (removed at the end)");
  c->add_option("-o,--out", a->out, "report folder");
  c->add_flag("--quick", a->quick, "8 conversations x 1024 tokens, 16 queries (a first look)");
  c->add_option("--settle", a->settle,
                "none: each return runs while the previous turn is being saved (write-behind); alternate: even "
                "returns first wait for that save, reported apart")
      ->check(CLI::IsMember({"none", "alternate"}));
  c->add_option("--arena-mib", a->arena_mib, "load arena in MiB (mz_pool_params.load_arena_bytes; -1: the default, 0: none)")
      ->check(CLI::Range(int64_t(-1), int64_t(1) << 20));
  c->add_option("--yield-ms", a->yield_ms,
                "write-behind yield per write in ms (mz_pool_params.write_behind_yield_ms; -1: the default, 0: never)")
      ->check(CLI::Range(-1, 600000));
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunPoolBench(*a);
  });
}

}  // namespace mz::cli
