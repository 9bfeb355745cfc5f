// bench batch: many users at once through the library (public C API only). B conversations of one
// pool, each with its own history, each decoding on its own thread (as an app or a server's turns
// would): aggregate decode tokens/s and the slowest stream's, with the pool's shared forward pass
// (mz_pool_params.batch, the default) against each conversation computing alone (batch off: the
// 0.12 behaviour), alternated per rep; plus the physical bound at each B: the bytes of weights a
// step reads over the machine's read bandwidth measured in the same run.
//
// The return case: a stored conversation comes back (restore_generate from its file) while others
// decode: their tokens/s during its return against just before it.
//
// Writes batch.md, batch.json and batch.png (aggregate tokens/s against streams) into -o DIR.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mzcache.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/report.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct BatchArgs {
  std::string model, type = "q8_0";
  std::string streams = "1,2,4,8";
  int history = 512, gen = 128, reps = 3, threads = 2;
  std::string kv = "f16";
  std::string systems = "batched,alone";
  std::string dir = "/var/tmp";
  std::string out = "results/bench-batch";
  // The return case (0: skip): `restore_streams` conversations decode while one more, of
  // `return_tokens` tokens stored and closed, comes back with a short query (restore_generate from
  // its stored file, beside their steps).
  int restore_streams = 4, return_tokens = 2048;
  // The long-prompt case (0: skip): a prompt of this many tokens arrives while restore_streams
  // conversations decode: their inter-token latency p95 during it against before it.
  int long_prompt = 0;
  // Alternated within each rep: the returning conversation's restore priority beside the steps
  // (mz_context_params.restore_nice_beside_batch) and the prompt slices' step-time factor
  // (mz_pool_params.batch_itl_factor).
  std::string return_nice = "10";
  std::string itl_factor = "2";
};

struct PoolFree {
  void operator()(mz_pool* p) const { mz_pool_free(p); }
};
struct ConvFree {
  void operator()(mz_conversation* c) const { mz_conversation_release(c); }
};

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> v;
  for (size_t i = 0, j; i < s.size(); i = j + 1) {
    j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(std::atoi(s.substr(i, j - i).c_str()));
  }
  return v;
}

std::vector<std::string> ParseNames(const std::string& s) {
  std::vector<std::string> v;
  for (size_t i = 0, j; i < s.size(); i = j + 1) {
    j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    v.push_back(s.substr(i, j - i));
  }
  return v;
}

struct Run {
  double agg_tps = 0, slowest_tps = 0, wall_s = 0, mean_batch = 0;
  uint64_t steps = 0, compute_buffers = 0;
};

// One measurement: a fresh pool, B histories prefilled one at a time (not timed), then B threads
// each sample-and-decode `gen` tokens (greedy) at once.
Status Measure(mz_model* model, const BatchArgs& a, bool batch, int B, uint32_t seed, Run* out) {
  mz_model_info info;
  mz_model_get_info(model, &info);
  const std::string dir = a.dir + "/mzcache-bench-batch-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a.history + a.gen + 64);
  cp.n_threads = a.threads;
  cp.kv_type = a.kv == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16;
  mz_pool_params pp = mz_pool_default_params();
  pp.dir = dir.c_str();
  pp.context = &cp;
  pp.batch = batch;
  pp.share_prefixes = false;  // distinct histories anyway; nothing to look up
  mz_pool* raw = nullptr;
  MZ_RETURN_IF_ERROR(MzStatus(mz_pool_new(model, &pp, &raw)));
  std::unique_ptr<mz_pool, PoolFree> pool(raw);
  std::vector<std::unique_ptr<mz_conversation, ConvFree>> convs;
  std::mt19937 rng(seed);
  for (int i = 0; i < B; ++i) {
    mz_conversation* c = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), ("s" + std::to_string(i)).c_str(), &c)));
    convs.emplace_back(c);
    std::vector<mz_token> h(size_t(a.history));
    for (auto& t : h) t = mz_token(200 + rng() % uint32_t(info.n_vocab - 400));
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_decode(c, h.data(), int32_t(h.size()), false)));
  }
  mz_pool_batch_report b0{};
  mz_pool_get_batch_report(pool.get(), &b0);
  std::vector<double> tps(static_cast<size_t>(B));
  std::vector<int> rc(size_t(B), MZ_OK);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> th;
  for (int i = 0; i < B; ++i)
    th.emplace_back([&, i] {
      mz_sampler_params sp = mz_sampler_default_params();
      sp.temperature = 0;
      mz_sampler* s = mz_sampler_new(&sp);
      ready++;
      while (!go.load()) std::this_thread::yield();
      const double t0 = NowSeconds();
      for (int k = 0; k < a.gen && rc[size_t(i)] == MZ_OK; ++k) {
        mz_token t = mz_conversation_sample(convs[size_t(i)].get(), s, 0);
        if (t < 0) {
          rc[size_t(i)] = t;
          break;
        }
        rc[size_t(i)] = mz_conversation_decode(convs[size_t(i)].get(), &t, 1, false);
      }
      tps[size_t(i)] = double(a.gen) / (NowSeconds() - t0);
      mz_sampler_free(s);
    });
  while (ready.load() < B) std::this_thread::yield();
  const double t0 = NowSeconds();
  go = true;
  for (auto& t : th) t.join();
  out->wall_s = NowSeconds() - t0;
  for (int i = 0; i < B; ++i)
    if (rc[size_t(i)] != MZ_OK) return MzStatus(rc[size_t(i)]).With("stream " + std::to_string(i));
  out->agg_tps = double(B) * a.gen / out->wall_s;
  out->slowest_tps = *std::min_element(tps.begin(), tps.end());
  mz_pool_batch_report b1{};
  mz_pool_get_batch_report(pool.get(), &b1);
  out->steps = b1.steps - b0.steps;
  out->mean_batch = out->steps ? double(b1.seq_slots - b0.seq_slots) / double(out->steps) : 0;
  out->compute_buffers = b1.compute_buffer_bytes;
  convs.clear();
  pool.reset();
  std::filesystem::remove_all(dir);
  return Status::Ok();
}

// The return case: `restore_streams` conversations decode `gen` tokens each (every token's time
// kept); when each has made gen/4, conversation "ret" (return_tokens tokens, stored and closed,
// so its KV is read from its file on storage) returns with 16 tokens through restore_generate. The
// others' aggregate tokens/s while it restores and prefills, against the same streams' before it.
struct ReturnRun {
  double before_tps = 0, during_tps = 0, return_s = 0;
  double itl_p95_before = 0, itl_p95_during = 0;  // gaps between a stream's tokens, all streams
};
// long_prompt > 0: instead of the return, a new conversation's prompt of that many tokens arrives
// (mz_conversation_decode), and the window is its prefill while the streams still decode.
Status MeasureReturn(mz_model* model, const BatchArgs& a, uint32_t seed, int long_prompt, int nice, double itl_factor,
                     ReturnRun* out) {
  mz_model_info info;
  mz_model_get_info(model, &info);
  const std::string dir = a.dir + "/mzcache-bench-batch-ret-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(std::max({a.history, a.return_tokens, long_prompt}) + a.gen + 64);
  cp.n_threads = a.threads;
  cp.kv_type = a.kv == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16;
  cp.restore_nice_beside_batch = nice;
  mz_pool_params pp = mz_pool_default_params();
  pp.dir = dir.c_str();
  pp.context = &cp;
  pp.share_prefixes = false;
  pp.batch_itl_factor = float(itl_factor);
  mz_pool* raw = nullptr;
  MZ_RETURN_IF_ERROR(MzStatus(mz_pool_new(model, &pp, &raw)));
  std::unique_ptr<mz_pool, PoolFree> pool(raw);
  std::mt19937 rng(seed);
  auto tokens = [&](int n) {
    std::vector<mz_token> h(static_cast<size_t>(n));
    for (auto& t : h) t = mz_token(200 + rng() % uint32_t(info.n_vocab - 400));
    return h;
  };
  {
    mz_conversation* c = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), "ret", &c)));
    std::unique_ptr<mz_conversation, ConvFree> h(c);
    const auto t = tokens(a.return_tokens);
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_decode(c, t.data(), int32_t(t.size()), false)));
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_commit(c)));
  }
  MZ_RETURN_IF_ERROR(MzStatus(mz_pool_close(pool.get(), "ret")));  // stored; its memory freed
  const int B = a.restore_streams;
  std::vector<std::unique_ptr<mz_conversation, ConvFree>> convs;
  for (int i = 0; i < B; ++i) {
    mz_conversation* c = nullptr;
    MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), ("s" + std::to_string(i)).c_str(), &c)));
    convs.emplace_back(c);
    const auto h = tokens(a.history);
    MZ_RETURN_IF_ERROR(MzStatus(mz_conversation_decode(c, h.data(), int32_t(h.size()), false)));
  }
  mz_conversation* rc_raw = nullptr;
  MZ_RETURN_IF_ERROR(MzStatus(mz_pool_open(pool.get(), "ret", &rc_raw)));  // opened: nothing read yet
  std::unique_ptr<mz_conversation, ConvFree> ret(rc_raw);
  std::vector<std::vector<double>> times(static_cast<size_t>(B));
  std::vector<int> rc(static_cast<size_t>(B), MZ_OK);
  std::atomic<int> past_quarter{0};
  std::vector<std::thread> th;
  for (int i = 0; i < B; ++i)
    th.emplace_back([&, i] {
      mz_sampler_params sp = mz_sampler_default_params();
      sp.temperature = 0;
      mz_sampler* s = mz_sampler_new(&sp);
      for (int k = 0; k < a.gen && rc[size_t(i)] == MZ_OK; ++k) {
        mz_token t = mz_conversation_sample(convs[size_t(i)].get(), s, 0);
        if (t < 0) {
          rc[size_t(i)] = t;
          break;
        }
        rc[size_t(i)] = mz_conversation_decode(convs[size_t(i)].get(), &t, 1, false);
        times[size_t(i)].push_back(NowSeconds());
        if (k + 1 == a.gen / 4) past_quarter++;
      }
      mz_sampler_free(s);
    });
  while (past_quarter.load() < B) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto q = tokens(long_prompt > 0 ? long_prompt : 16);
  const double r0 = NowSeconds();
  int rr = MZ_OK;
  if (long_prompt > 0) {
    mz_conversation* lc = nullptr;
    rr = mz_pool_open(pool.get(), "long", &lc);
    if (rr == MZ_OK) rr = mz_conversation_decode(lc, q.data(), int32_t(q.size()), false);
    if (lc) mz_conversation_release(lc);
  } else {
    rr = mz_conversation_restore_generate(ret.get(), q.data(), 16, nullptr, nullptr);
  }
  double r1 = NowSeconds();
  for (auto& t : th) t.join();
  if (long_prompt > 0) {
    // The window: the prompt's prefill while every stream still decodes.
    double last = r1;
    for (auto& v : times)
      if (!v.empty()) last = std::min(last, v.back());
    r1 = last;
  }
  std::vector<double> gaps_before, gaps_during;
  for (auto& v : times)
    for (size_t k = 1; k < v.size(); ++k) {
      if (v[k] < r0) gaps_before.push_back(v[k] - v[k - 1]);
      else if (v[k - 1] >= r0 && v[k] <= r1) gaps_during.push_back(v[k] - v[k - 1]);
    }
  auto p95 = [](std::vector<double> g) {
    if (g.empty()) return 0.0;
    std::sort(g.begin(), g.end());
    return g[std::min(g.size() - 1, size_t(0.95 * double(g.size())))];
  };
  out->itl_p95_before = p95(gaps_before);
  out->itl_p95_during = p95(gaps_during);
  if (rr != MZ_OK) return MzStatus(rr).With("the returning conversation");
  for (int i = 0; i < B; ++i)
    if (rc[size_t(i)] != MZ_OK) return MzStatus(rc[size_t(i)]).With("stream " + std::to_string(i));
  // Tokens in [r0, r1] against tokens in the window of the same length before r0 (after the first
  // tokens: from the earliest token of all streams on).
  double first = r0;
  for (auto& v : times)
    if (!v.empty()) first = std::min(first, v.front());
  const double len = r1 - r0, b0 = std::max(first, r0 - len);
  int during = 0, before = 0;
  for (auto& v : times)
    for (double t : v) {
      during += t >= r0 && t <= r1;
      before += t >= b0 && t < r0;
    }
  out->return_s = len;
  out->during_tps = double(during) / len;
  out->before_tps = r0 > b0 ? double(before) / (r0 - b0) : 0;
  convs.clear();
  ret.reset();
  pool.reset();
  std::filesystem::remove_all(dir);
  return Status::Ok();
}

std::string Num(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

int RunBatchBench(const BatchArgs& a) {
  std::string path;
  MzModel model;
  if (Status st = OpenBenchModel(a.model, a.type, &path, &model); !st.ok()) return Fail(st);
  mz_model_info info;
  mz_model_get_info(model.get(), &info);
  const std::vector<int> streams = ParseList(a.streams);
  const std::vector<std::string> systems = ParseNames(a.systems);
  for (const auto& s : systems)
    if (s != "batched" && s != "alone") return Fail(Status::InvalidArgument("--systems: batched, alone"));
  std::fprintf(stderr, "[bench batch] %s, %d-token histories, %d new tokens, streams %s, %d threads, KV %s, %d reps\n",
               info.name, a.history, a.gen, a.streams.c_str(), a.threads, a.kv.c_str(), a.reps);
  const double bw = MeasureReadBandwidth(a.threads);
  std::fprintf(stderr, "[bench batch] read bandwidth (%d threads): %.2f GB/s\n", a.threads, bw / 1e9);
  nlohmann::json doc;
  doc["machine"] = MachineDescription();
  doc["model"] = info.name;
  doc["args"] = {{"history", a.history}, {"gen", a.gen}, {"reps", a.reps}, {"threads", a.threads}, {"kv", a.kv}};
  doc["read_bandwidth_Bps"] = bw;
  doc["weight_bytes"] = info.weight_bytes;
  nlohmann::json rows = nlohmann::json::array();
  // results[system][B] = runs
  std::map<std::string, std::map<int, std::vector<Run>>> res;
  for (int rep = 0; rep < a.reps; ++rep)
    for (int B : streams)
      for (size_t k = 0; k < systems.size(); ++k) {
        // Alternated: A B in even reps, B A in odd ones.
        const std::string& sys = systems[(rep % 2 == 0) ? k : systems.size() - 1 - k];
        Run r;
        std::fprintf(stderr, "[bench batch] rep %d/%d, %d streams, %s ...\n", rep + 1, a.reps, B, sys.c_str());
        if (Status st = Measure(model.get(), a, sys == "batched", B, uint32_t(1000 * rep + B), &r); !st.ok())
          return Fail(st);
        std::fprintf(stderr, "[bench batch]   %.2f tok/s aggregate, slowest stream %.2f tok/s, mean batch %.2f\n",
                     r.agg_tps, r.slowest_tps, r.mean_batch);
        res[sys][B].push_back(r);
        rows.push_back({{"rep", rep}, {"system", sys}, {"streams", B}, {"agg_tps", r.agg_tps},
                        {"slowest_tps", r.slowest_tps}, {"wall_s", r.wall_s}, {"steps", r.steps},
                        {"mean_batch", r.mean_batch}, {"compute_buffer_bytes", r.compute_buffers}});
      }
  doc["runs"] = rows;
  const std::vector<int> nices = ParseList(a.return_nice);
  std::vector<double> factors;
  for (const auto& f : ParseNames(a.itl_factor)) factors.push_back(std::atof(f.c_str()));
  for (int n : nices)
    if (n < 0 || n > 19) return Fail(Status::InvalidArgument("--return-nice: " + std::to_string(n) + " is not in 0..19"));
  for (double f : factors)
    if (!(f == 0 || f >= 1)) return Fail(Status::InvalidArgument("--itl-factor: 0 or at least 1"));
  if (nices.empty() || factors.empty()) return Fail(Status::InvalidArgument("--return-nice and --itl-factor need a value"));
  std::map<int, std::vector<double>> drops, ret_s;  // by restore nice
  if (a.restore_streams > 0) {
    nlohmann::json rr = nlohmann::json::array();
    for (int rep = 0; rep < a.reps; ++rep)
      for (int nice : nices) {
        ReturnRun r;
        std::fprintf(stderr,
                     "[bench batch] rep %d/%d: %d streams decode while a %d-token conversation returns from storage "
                     "(restore nice +%d) ...\n",
                     rep + 1, a.reps, a.restore_streams, a.return_tokens, nice);
        if (Status st = MeasureReturn(model.get(), a, uint32_t(7000 + rep), 0, nice, factors[0], &r); !st.ok())
          return Fail(st);
        std::fprintf(stderr, "[bench batch]   before %.2f tok/s, during the return (%.2f s) %.2f tok/s\n", r.before_tps,
                     r.return_s, r.during_tps);
        drops[nice].push_back(r.before_tps > 0 ? 1.0 - r.during_tps / r.before_tps : 0);
        ret_s[nice].push_back(r.return_s);
        rr.push_back({{"rep", rep}, {"restore_nice", nice}, {"before_tps", r.before_tps}, {"during_tps", r.during_tps},
                      {"return_s", r.return_s}});
      }
    doc["return"] = rr;
  }
  std::map<double, std::vector<double>> itl_ratio, itl_b, itl_d, window;  // by itl factor
  if (a.long_prompt > 0) {
    nlohmann::json lr = nlohmann::json::array();
    for (int rep = 0; rep < a.reps; ++rep)
      for (double f : factors) {
        ReturnRun r;
        std::fprintf(stderr, "[bench batch] rep %d/%d: %d streams decode while a %d-token prompt arrives (itl factor %.2f) ...\n",
                     rep + 1, a.reps, a.restore_streams, a.long_prompt, f);
        if (Status st = MeasureReturn(model.get(), a, uint32_t(9000 + rep), a.long_prompt, nices[0], f, &r); !st.ok())
          return Fail(st);
        std::fprintf(stderr, "[bench batch]   ITL p95 before %.3f s, during the prompt %.3f s (window %.1f s)\n",
                     r.itl_p95_before, r.itl_p95_during, r.return_s);
        itl_b[f].push_back(r.itl_p95_before);
        itl_d[f].push_back(r.itl_p95_during);
        window[f].push_back(r.return_s);
        if (r.itl_p95_before > 0) itl_ratio[f].push_back(r.itl_p95_during / r.itl_p95_before);
        lr.push_back({{"rep", rep}, {"itl_factor", f}, {"itl_p95_before_s", r.itl_p95_before},
                      {"itl_p95_during_s", r.itl_p95_during}, {"window_s", r.return_s}, {"before_tps", r.before_tps},
                      {"during_tps", r.during_tps}});
      }
    doc["long_prompt"] = lr;
  }
  std::string md = "# bench batch\n\n" + MachineDescription() + ", " + std::string(info.name) + ", " +
                   std::to_string(a.history) + "-token histories, " + std::to_string(a.gen) + " new tokens, " +
                   std::to_string(a.threads) + " threads, KV " + a.kv + ", " + std::to_string(a.reps) +
                   " reps alternated. Medians (min-max).\n\n";
  // Weights per byte of the file's type (q8_0: 32 per 34 bytes), for the operations a token costs.
  const double per_byte = a.type == "f16" ? 0.5 : a.type == "q4_0" ? 32.0 / 18 : 32.0 / 34;
  const double ops_per_token = 2.0 * double(info.weight_bytes) * per_byte;
  md += "| streams | system | aggregate tok/s | slowest stream tok/s | mean batch | weights read GB/s (bound " +
        Num("%.1f", bw / 1e9) + ") | GOP/s (2 x weights x tok/s) |\n|---|---|---|---|---|---|---|\n";
  auto cell = [](const std::vector<double>& v, const char* f) {
    Stats s = Summarize(v);
    return Num(f, s.median) + " (" + Num(f, s.min) + "-" + Num(f, s.max) + ")";
  };
  nlohmann::json summary = nlohmann::json::array();
  std::string dat;
  for (int B : streams) {
    dat += std::to_string(B);
    for (const auto& sys : systems) {
      std::vector<double> agg, slow, mb, wbw;
      for (const Run& r : res[sys][B]) {
        agg.push_back(r.agg_tps);
        slow.push_back(r.slowest_tps);
        mb.push_back(r.mean_batch);
        // Each step (batched) or each token (alone) reads every weight once.
        const double passes = sys == "batched" ? double(r.steps) : double(B) * a.gen;
        wbw.push_back(passes * double(info.weight_bytes) / r.wall_s / 1e9);
      }
      std::vector<double> gops;
      for (double x : agg) gops.push_back(x * ops_per_token / 1e9);
      md += "| " + std::to_string(B) + " | " + sys + " | " + cell(agg, "%.2f") + " | " + cell(slow, "%.2f") + " | " +
            (sys == "batched" ? cell(mb, "%.2f") : std::string("1")) + " | " + cell(wbw, "%.2f") + " | " +
            cell(gops, "%.1f") + " |\n";
      Stats s = Summarize(agg);
      dat += " " + Num("%.3f", s.median) + " " + Num("%.3f", s.min) + " " + Num("%.3f", s.max);
      summary.push_back({{"streams", B}, {"system", sys}, {"agg_tps_median", s.median}, {"agg_tps_min", s.min},
                         {"agg_tps_max", s.max}, {"slowest_tps_median", Summarize(slow).median},
                         {"weights_GBps_median", Summarize(wbw).median}});
    }
    dat += "\n";
    if (systems.size() == 2 && res.count("batched") && res.count("alone")) {
      std::vector<double> ratio;
      for (size_t i = 0; i < res["batched"][B].size() && i < res["alone"][B].size(); ++i)
        ratio.push_back(res["batched"][B][i].agg_tps / res["alone"][B][i].agg_tps);
      md += "| " + std::to_string(B) + " | batched / alone | " + cell(ratio, "%.2f") + " | | | | |\n";
    }
  }
  doc["summary"] = summary;
  if (!drops.empty()) {
    md += "\nA conversation of " + std::to_string(a.return_tokens) + " tokens returns from storage (stored, closed, " +
          "reopened: restore_generate of 16 tokens) while " + std::to_string(a.restore_streams) +
          " streams decode: their aggregate tokens/s drop during its return, against the same streams just before, " +
          "and the return's time, by the restore thread's nice increment (restore_nice_beside_batch; 0: restore_threads " +
          "threads at the caller's priority), alternated within each rep:\n\n| restore nice | drop | return s |\n|---|---|---|\n";
    for (int nice : nices) {
      Stats d = Summarize(drops[nice]), r = Summarize(ret_s[nice]);
      md += "| +" + std::to_string(nice) + " | " + Num("%.0f", 100 * d.median) + "% (" + Num("%.0f", 100 * d.min) + "-" +
            Num("%.0f", 100 * d.max) + "%) | " + Num("%.2f", r.median) + " (" + Num("%.2f", r.min) + "-" +
            Num("%.2f", r.max) + ") |\n";
    }
  }
  if (!itl_ratio.empty()) {
    md += "\nA prompt of " + std::to_string(a.long_prompt) + " tokens arrives while " +
          std::to_string(a.restore_streams) + " streams decode: their inter-token latency p95 during its prefill " +
          "against before it, by batch_itl_factor, alternated within each rep:\n\n" +
          "| itl factor | ITL p95 during s | before s | ratio | prefill window s |\n|---|---|---|---|---|\n";
    for (double f : factors) {
      Stats b = Summarize(itl_b[f]), d = Summarize(itl_d[f]), q = Summarize(itl_ratio[f]), w = Summarize(window[f]);
      md += "| " + Num("%.2f", f) + " | " + Num("%.3f", d.median) + " (" + Num("%.3f", d.min) + "-" + Num("%.3f", d.max) +
            ") | " + Num("%.3f", b.median) + " (" + Num("%.3f", b.min) + "-" + Num("%.3f", b.max) + ") | " +
            Num("%.2f", q.median) + "x (" + Num("%.2f", q.min) + "-" + Num("%.2f", q.max) + ") | " +
            Num("%.1f", w.median) + " |\n";
    }
  }
  md += "\nThe bound: one step reads every weight once (" + Num("%.0f", double(info.weight_bytes) / 1048576.0) +
        " MiB); at the read bandwidth measured here a step cannot take less than " +
        Num("%.1f", double(info.weight_bytes) / bw * 1000.0) + " ms.\n";
  md += "\nCommand: `mzcache bench batch --streams " + a.streams + " --history " + std::to_string(a.history) +
        " --new " + std::to_string(a.gen) + " --reps " + std::to_string(a.reps) + " -t " + std::to_string(a.threads) +
        " --kv " + a.kv +
        (a.restore_streams > 0 ? " --restore-streams " + std::to_string(a.restore_streams) + " --return-tokens " +
                                     std::to_string(a.return_tokens) + " --return-nice " + a.return_nice
                               : std::string(" --restore-streams 0")) +
        (a.long_prompt > 0 ? " --long-prompt " + std::to_string(a.long_prompt) + " --itl-factor " + a.itl_factor : "") +
        "`\n";
  WriteFile(a.out, "batch.dat", dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'batch.png'\nset xlabel 'concurrent streams'\n"
                   "set ylabel 'aggregate decode tokens/s'\nset key left top\nset grid\nset logscale x 2\n"
                   "set title 'Many users at once (" + std::string(info.name) + ", " + std::to_string(a.threads) +
                   " threads)'\nplot ";
  for (size_t k = 0; k < systems.size(); ++k)
    gp += std::string(k ? ", " : "") + "'batch.dat' using 1:" + std::to_string(2 + 3 * k) + ":" +
          std::to_string(3 + 3 * k) + ":" + std::to_string(4 + 3 * k) + " with yerrorlines title '" + systems[k] + "'";
  gp += "\n";
  const std::string png = PlotPng(a.out, "batch", gp);
  if (!png.empty()) md += "\n![aggregate tokens/s](" + png + ")\n";
  WriteReport(a.out, "batch", md, doc);
  std::printf("%s", md.c_str());
  return 0;
}

}  // namespace

void AddBatchBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<BatchArgs>();
  auto* c = bench->add_subcommand("batch", "many users at once: B conversations decoding together through the pool's "
                                           "one forward pass, against each computing alone");
  c->add_option("-m,--model", a->model, "GGUF path or synthesized shape (default qwen3-0.6b)");
  c->add_option("--type", a->type, "weight type of a synthesized model");
  c->add_option("--streams", a->streams, "concurrent streams, comma-separated (default 1,2,4,8)");
  c->add_option("--history", a->history, "tokens of each conversation's history (default 512)")->check(CLI::Range(1, 1 << 20));
  c->add_option("--new", a->gen, "tokens each stream decodes (default 128)")->check(CLI::Range(1, 1 << 20));
  c->add_option("--reps", a->reps, "repetitions, systems alternated (default 3)")->check(CLI::Range(1, 100));
  c->add_option("-t,--threads", a->threads, "compute threads (default 2)")->check(CLI::Range(1, 256));
  c->add_option("--kv", a->kv, "resident KV: f16 (default) or q8_0")->check(CLI::IsMember({"f16", "q8_0"}));
  c->add_option("--systems", a->systems, "batched,alone (default both)");
  c->add_option("--restore-streams", a->restore_streams,
                "streams decoding while a stored conversation returns (default 4; 0: skip the return case)")
      ->check(CLI::Range(0, 64));
  c->add_option("--return-tokens", a->return_tokens, "tokens of the returning conversation (default 2048)")
      ->check(CLI::Range(16, 1 << 20));
  c->add_option("--long-prompt", a->long_prompt,
                "tokens of a prompt arriving while --restore-streams streams decode: their inter-token latency (default 0: skip)")
      ->check(CLI::Range(0, 1 << 20));
  c->add_option("--return-nice", a->return_nice,
                 "the return case's restore nice increments beside the steps, comma-separated, alternated (default 10; 0: "
                 "restore_threads threads at the caller's priority)");
  c->add_option("--itl-factor", a->itl_factor,
                "the long-prompt case's batch_itl_factor values, comma-separated, alternated (default 2)");
  c->add_option("--dir", a->dir, "where the pools' folders are made (removed at the end)");
  c->add_option("-o,--out", a->out, "report folder (default results/bench-batch)");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunBatchBench(*a);
  });
}

}  // namespace mz::cli
