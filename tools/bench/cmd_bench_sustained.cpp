// bench sustained: tokens/s over time of a long generation (issue 24 section 4), without and with
// sustained mode (mz_context_set_sustained: a thread cap and a duty-cycle cap, thermal stepping
// where the machine has sensors), through the public C API. Each run: a fresh context, a short
// prompt, then greedy decoding for --seconds (the context wraps back to the prompt when full),
// tokens/s and the process's CPU share reported per --window. Modes alternate round by round (the
// order flips every round) so slow drifts of a shared machine hit both. Writes
// bench-sustained.{md,json} and a gnuplot PNG of tokens/s over time.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "env/env.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/report.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct SusBenchArgs {
  std::string model;
  std::string type = "q8_0";
  double seconds = 300;
  double window = 5;
  int threads = 1;
  int max_threads = 1;
  double duty = 0.7;
  int rounds = 1;
  int n_ctx = 4096;
  std::string prompt = "Once upon a time";
  std::string out = "results/bench-sustained";
};

struct Window {
  double t_end = 0;    // seconds since the first generated token
  int tokens = 0;
  double tps = 0;      // tokens / wall seconds
  double cpu = 0;      // process CPU seconds / wall seconds
  int threads = 0;
};

struct RunResult {
  std::string mode;
  int round = 0;
  std::vector<Window> windows;
  int tokens = 0;
  double seconds = 0;
  double cpu_s = 0;
  double slept_s = 0;
  int wraps = 0;
  int steps_down = 0, steps_up = 0;
  std::string sensors;
};

std::string LoadAvg() {
  std::string s;
  if (!Env::Default()->ReadSmallFile("/proc/loadavg", &s).ok()) return "?";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

Status RunOne(mz_model* m, const SusBenchArgs& a, bool sustained, int round, RunResult* r) {
  r->mode = sustained ? "sustained" : "baseline";
  r->round = round;
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a.n_ctx);
  cp.n_threads = a.threads;
  mz_context* c0 = nullptr;
  MZ_RETURN_IF_ERROR(MzStatus(mz_context_new(m, &cp, &c0)));
  MzContext c(c0);
  if (sustained) {
    mz_sustained_params sp = mz_sustained_default_params();
    sp.max_threads = a.max_threads;
    sp.duty_cycle = float(a.duty);
    MZ_RETURN_IF_ERROR(MzStatus(mz_context_set_sustained(c.get(), &sp)));
  }
  std::vector<mz_token> toks;
  MZ_RETURN_IF_ERROR(MzStatus(TokenizeText(m, a.prompt, true, false, &toks)));
  const int32_t n = int32_t(toks.size());
  mz_sampler_params sap = mz_sampler_default_params();  // greedy
  MzSampler smp(mz_sampler_new(&sap));
  if (!smp) return Status::NoMemory("sampler");
  MZ_RETURN_IF_ERROR(MzStatus(mz_decode(c.get(), toks.data(), n, false)));
  mz_token tok = mz_sampler_sample(smp.get(), c.get(), 0);
  Env* env = Env::Default();
  const double t0 = NowSeconds();
  const uint64_t cpu0 = env->ProcessCpuNs();
  double wt = t0;
  uint64_t wcpu = cpu0;
  int wtok = 0;
  while (true) {
    if (mz_context_n_tokens(c.get()) >= a.n_ctx - 1) {  // full: back to the prompt
      MZ_RETURN_IF_ERROR(MzStatus(mz_context_truncate(c.get(), n)));
      ++r->wraps;
    }
    MZ_RETURN_IF_ERROR(MzStatus(mz_decode(c.get(), &tok, 1, false)));
    tok = mz_sampler_sample(smp.get(), c.get(), 0);
    ++wtok;
    ++r->tokens;
    const double now = NowSeconds();
    if (now - wt >= a.window || now - t0 >= a.seconds) {
      const uint64_t cpu = env->ProcessCpuNs();
      Window w;
      w.t_end = now - t0;
      w.tokens = wtok;
      w.tps = double(wtok) / (now - wt);
      w.cpu = double(cpu - wcpu) * 1e-9 / (now - wt);
      mz_sustained_stats ss;
      MZ_RETURN_IF_ERROR(MzStatus(mz_context_get_sustained_stats(c.get(), &ss)));
      w.threads = ss.enabled ? ss.threads : a.threads;
      r->windows.push_back(w);
      std::fprintf(stderr, "  %-9s round %d  t=%6.1f s  %6.2f tok/s  cpu %.2f  threads %d\n", r->mode.c_str(), round,
                   w.t_end, w.tps, w.cpu, w.threads);
      wt = now;
      wcpu = cpu;
      wtok = 0;
      if (now - t0 >= a.seconds) break;
    }
  }
  r->seconds = NowSeconds() - t0;
  r->cpu_s = double(env->ProcessCpuNs() - cpu0) * 1e-9;
  mz_sustained_stats ss;
  MZ_RETURN_IF_ERROR(MzStatus(mz_context_get_sustained_stats(c.get(), &ss)));
  r->slept_s = ss.slept_s;
  r->steps_down = ss.steps_down;
  r->steps_up = ss.steps_up;
  if (ss.enabled) r->sensors = ss.n_zones > 0 ? std::to_string(ss.n_zones) + " thermal zones" : "no thermal sensors";
  return Status::Ok();
}

std::string F(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// Mean tokens/s of the windows ending in (from, to] seconds.
double MeanTps(const std::vector<RunResult>& rs, const std::string& mode, double from, double to) {
  int tok = 0;
  double s = 0;
  for (const RunResult& r : rs) {
    if (r.mode != mode) continue;
    double prev = 0;
    for (const Window& w : r.windows) {
      if (w.t_end > from && w.t_end <= to) tok += w.tokens, s += w.t_end - prev;
      prev = w.t_end;
    }
  }
  return s > 0 ? tok / s : 0;
}

Status RunSustainedBench(const SusBenchArgs& a, const std::string& cmdline) {
  std::string path;
  MzModel m;
  MZ_RETURN_IF_ERROR(OpenBenchModel(a.model, a.type, &path, &m));
  const std::string load_before = LoadAvg();
  std::fprintf(stderr, "[bench sustained: %s, %d round(s) x 2 modes x %.0f s; load average %s]\n", path.c_str(),
               a.rounds, a.seconds, load_before.c_str());
  std::vector<RunResult> runs;
  for (int r = 0; r < a.rounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const bool sustained = (k == 1) != (r % 2 == 1);  // baseline first in even rounds
      RunResult res;
      MZ_RETURN_IF_ERROR(RunOne(m.get(), a, sustained, r, &res));
      runs.push_back(std::move(res));
    }
  }
  const std::string load_after = LoadAvg();

  nlohmann::json doc;
  doc["command"] = cmdline;
  doc["machine"] = MachineDescription();
  doc["model"] = path;
  doc["load_average_before"] = load_before;
  doc["load_average_after"] = load_after;
  doc["args"] = {{"seconds", a.seconds}, {"window", a.window}, {"threads", a.threads}, {"max_threads", a.max_threads},
                 {"duty", a.duty}, {"rounds", a.rounds}, {"n_ctx", a.n_ctx}};
  std::string md = "# bench sustained\n\nCommand: `" + cmdline + "`\n\nMachine: " + MachineDescription() +
                   "\n\nModel: `" + path + "`. Load average before " + load_before + ", after " + load_after +
                   " (the machine is shared: other processes' load is in these numbers).\n\n";
  md += "Greedy decoding for " + F("%.0f", a.seconds) + " s per run after a " + std::to_string(a.prompt.size()) +
        "-character prompt; baseline: " + std::to_string(a.threads) + " thread(s), no cap; sustained: "
        "mz_context_set_sustained with max_threads " + std::to_string(a.max_threads) + ", duty cycle " +
        F("%.2f", a.duty) + " (defaults otherwise). Windows of " + F("%.0f", a.window) + " s.\n\n";
  md += "| mode | round | tokens | seconds | tok/s overall | window tok/s median [min, max] | first 30 s tok/s | "
        "last 60 s tok/s | CPU share | slept s | thread steps down/up | context wraps |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const RunResult& r : runs) {
    std::vector<double> tps;
    for (const Window& w : r.windows) tps.push_back(w.tps);
    const Stats st = Summarize(tps);
    std::vector<RunResult> one{r};
    md += "| " + r.mode + " | " + std::to_string(r.round) + " | " + std::to_string(r.tokens) + " | " +
          F("%.1f", r.seconds) + " | " + F("%.2f", r.tokens / r.seconds) + " | " + F("%.2f", st.median) + " [" +
          F("%.2f", st.min) + ", " + F("%.2f", st.max) + "] | " + F("%.2f", MeanTps(one, r.mode, 0, 30)) + " | " +
          F("%.2f", MeanTps(one, r.mode, r.seconds - 60, r.seconds + 1)) + " | " + F("%.2f", r.cpu_s / r.seconds) +
          " | " + F("%.1f", r.slept_s) + " | " + std::to_string(r.steps_down) + "/" + std::to_string(r.steps_up) +
          " | " + std::to_string(r.wraps) + " |\n";
    nlohmann::json jr = {{"mode", r.mode}, {"round", r.round}, {"tokens", r.tokens}, {"seconds", r.seconds},
                         {"cpu_s", r.cpu_s}, {"slept_s", r.slept_s}, {"wraps", r.wraps},
                         {"steps_down", r.steps_down}, {"steps_up", r.steps_up}, {"sensors", r.sensors}};
    for (const Window& w : r.windows)
      jr["windows"].push_back({{"t_end", w.t_end}, {"tokens", w.tokens}, {"tokens_per_s", w.tps}, {"cpu", w.cpu},
                               {"threads", w.threads}});
    doc["runs"].push_back(jr);
  }
  const double base = MeanTps(runs, "baseline", 0, 1e18), sus = MeanTps(runs, "sustained", 0, 1e18);
  md += "\nAll rounds: baseline " + F("%.2f", base) + " tok/s, sustained " + F("%.2f", sus) + " tok/s (" +
        F("%.1f", base > 0 ? 100.0 * sus / base : 0) + "% of baseline).\n";
  doc["baseline_tokens_per_s"] = base;
  doc["sustained_tokens_per_s"] = sus;
  for (const char* mode : {"baseline", "sustained"}) {
    std::string dat;
    for (const RunResult& r : runs) {
      if (r.mode != mode) continue;
      for (const Window& w : r.windows) dat += F("%.2f", w.t_end) + " " + F("%.4f", w.tps) + "\n";
      dat += "\n\n";
    }
    WriteFile(a.out, std::string("bench-sustained-") + mode + ".dat", dat);
  }
  const std::string png = PlotPng(
      a.out, "bench-sustained",
      "set terminal pngcairo size 900,500\nset output 'bench-sustained.png'\n"
      "set xlabel 'seconds into the generation'\nset ylabel 'tokens/s (per window)'\nset yrange [0:*]\n"
      "set key bottom right\nset grid\n"
      "plot 'bench-sustained-baseline.dat' u 1:2 w lp pt 7 ps 0.4 t 'baseline', "
      "'bench-sustained-sustained.dat' u 1:2 w lp pt 5 ps 0.4 t 'sustained (thread cap " +
          std::to_string(a.max_threads) + ", duty " + F("%.2f", a.duty) + ")'\n");
  if (!png.empty()) md += "\n![tokens/s over time](" + png + ")\n";
  WriteReport(a.out, "bench-sustained", md, doc);
  std::printf("%s", md.c_str());
  return Status::Ok();
}

}  // namespace

void AddSustainedBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<SusBenchArgs>();
  auto* c = bench->add_subcommand("sustained", "tokens/s over a long generation, without and with sustained mode "
                                               "(thread and duty-cycle caps), alternated; plot over time");
  c->add_option("-m,--model", a->model, "GGUF path or synthesized shape (default qwen3-0.6b)");
  c->add_option("--type", a->type, "weight type of a synthesized model");
  c->add_option("--seconds", a->seconds, "seconds of generation per run")->check(CLI::Range(1.0, 86400.0));
  c->add_option("--window", a->window, "seconds per reported window")->check(CLI::Range(0.1, 3600.0));
  c->add_option("-t,--threads", a->threads, "compute threads of both modes")->check(CLI::Range(1, 256));
  c->add_option("--max-threads", a->max_threads, "sustained: thread cap (0 = --threads)")->check(CLI::Range(0, 256));
  c->add_option("--duty", a->duty, "sustained: duty-cycle cap in (0, 1]")->check(CLI::Range(0.01, 1.0));
  c->add_option("--rounds", a->rounds, "rounds of (baseline, sustained), order flipped every round")
      ->check(CLI::Range(1, 100));
  c->add_option("-c,--ctx", a->n_ctx, "context tokens (the generation wraps back to the prompt when full)")
      ->check(CLI::Range(64, 1 << 20));
  c->add_option("-o,--out", a->out, "folder for bench-sustained.{md,json,png}");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    std::string cmd = "mzcache bench sustained";
    for (const auto& o : c->get_options()) {
      if (o->count() == 0 || o->get_name() == "--help") continue;
      cmd += " " + o->get_name(false, true).substr(0, o->get_name(false, true).find(',')) ;
      for (const auto& r : o->results()) cmd += " " + r;
    }
    Status st = RunSustainedBench(*a, cmd);
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace mz::cli
