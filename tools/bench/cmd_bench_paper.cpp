// `mzcache bench paper`: the whole evaluation in one command. Runs each measurement as its own
// child process (a fresh address space per part, so one part's memory does not skew the next and
// a crash in one part still leaves a report of the others), then assembles one markdown report
// with every table and plot, next to the parts' JSON.
//
// Parts, in order (paper figure/table in brackets):
//   profile          device profile: codec, storage, allocation throughputs; Table 2 savings
//   bench footprint  weights and KV footprint of every shape [Table 1/3]
//   bench ttft       TTFT vs remaining memory, lower bound, OS Paging, full reload breakdown,
//                    CPU-seconds/bytes per restoration, ablations [Fig. 3/4, 9, 10-12, 13]
//   bench accuracy   codecs: savings, TTFT, KL/top-1 vs f16 KV, 10-cycle idempotence [Fig. 14]
//   bench peers      llama.cpp state save/load, cold start, mmap under cgroup pressure
// A part that fails is reported as failed (with its exit code) and the exit status is non-zero.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct PaperArgs {
  std::string out = "results/paper";
  std::string report;  // default <out>/evaluation.md
  bool quick = false;
  bool no_ospaging = false;
  bool skip_profile = false;
  int reps = 0;  // 0: each part's default
  std::vector<std::string> only;
};

struct Part {
  std::string name;     // folder under out
  std::string title;
  std::vector<std::string> args;  // subcommand and its options (without -o)
  std::string md_file;  // markdown the part writes into its folder ("" = its stdout)
};

std::string ReadText(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Demotes headings by two levels (below the part heading) and points relative image links at the part's folder.
std::string Embed(const std::string& md, const std::string& rel_dir) {
  std::istringstream in(md);
  std::string line, out;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '#') line = "##" + line;
    for (size_t p = 0; (p = line.find("](", p)) != std::string::npos; p += 2) {
      const size_t s = p + 2;
      if (line.compare(s, 4, "http") != 0 && line.compare(s, 1, "/") != 0) line.insert(s, rel_dir + "/");
    }
    out += line + "\n";
  }
  return out;
}

// Relative path from directory `from` to `to` (both made absolute).
std::string Relative(const std::string& from, const std::string& to) {
  auto abs = [](const std::string& p) {
    std::unique_ptr<char, decltype(&free)> r(realpath(p.c_str(), nullptr), &free);
    return r ? std::string(r.get()) : p;
  };
  std::string a = abs(from) + "/", b = abs(to) + "/";
  size_t common = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()) && a[i] == b[i]; ++i)
    if (a[i] == '/') common = i + 1;
  std::string rel;
  for (size_t i = common; i < a.size(); ++i)
    if (a[i] == '/') rel += "../";
  rel += b.substr(common);
  if (!rel.empty() && rel.back() == '/') rel.pop_back();
  return rel.empty() ? "." : rel;
}

// The parts to run, with their options (--only keeps the named ones, in this order).
std::vector<Part> PaperParts(const PaperArgs& a) {
  std::vector<Part> parts;
  auto with = [&](std::vector<std::string> v, bool quick_flag, bool reps_flag, bool ospaging_flag) {
    if (quick_flag && a.quick) v.push_back("--quick");
    if (reps_flag && a.reps > 0) v.push_back("-r"), v.push_back(std::to_string(a.reps));
    if (ospaging_flag && a.no_ospaging) v.push_back("--no-ospaging");
    return v;
  };
  if (!a.skip_profile) parts.push_back({"profile", "Device profile and Table 2 (codec savings on real KV)", {"profile"}, ""});
  parts.push_back({"footprint", "Table 1 / Table 3: weights and KV footprint", with({"bench", "footprint"}, false, false, false),
                   "bench-footprint.md"});
  parts.push_back({"ttft", "Fig. 3/4, 9-13: TTFT from every eviction level, baselines, lower bound, ablations",
                   with({"bench", "ttft"}, true, true, true), "bench-ttft.md"});
  parts.push_back({"accuracy", "Fig. 14: q8 vs q4 vs cachegen", with({"bench", "accuracy"}, true, true, false),
                   "bench-accuracy.md"});
  parts.push_back({"peers", "Real peers: llama.cpp state files, cold start, mmap under pressure",
                   with({"bench", "peers"}, true, true, true), "bench-peers.md"});
  if (a.only.empty()) return parts;
  std::vector<Part> keep;
  for (auto& p : parts)
    for (auto& o : a.only)
      if (p.name == o) keep.push_back(p);
  return keep;
}

// Runs part i of n as a child process (`self` its executable, quoted) writing into its folder
// under a.out; appends its section to *body and its entry to *summary. Returns its exit code.
int RunPart(const PaperArgs& a, const std::string& self, const Part& p, size_t i, size_t n, double t_start,
            const std::string& report_dir, std::string* body, nlohmann::json* summary) {
  const std::string dir = a.out + "/" + p.name;
  std::system(("mkdir -p " + ShellQuote(dir)).c_str());
  std::string cmd = self;
  for (auto& x : p.args) cmd += " " + ShellQuote(x);
  std::string shown = "mzcache";
  for (auto& x : p.args) shown += " " + x;
  if (p.name == "profile") {
    cmd += " > " + ShellQuote(dir + "/profile.md");
  } else {
    cmd += " -o " + ShellQuote(dir) + " > /dev/null";
    shown += " -o " + dir;
  }
  std::fprintf(stderr, "[paper] part %zu/%zu: %s (%s) — elapsed %.0f s\n", i + 1, n, p.name.c_str(), shown.c_str(),
               NowSeconds() - t_start);
  const double t0 = NowSeconds();
  const int rc = std::system(cmd.c_str());
  const double dt = NowSeconds() - t0;
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
  std::fprintf(stderr, "[paper] part %s: %s in %.0f s\n", p.name.c_str(), code == 0 ? "done" : "FAILED", dt);
  (*summary)["parts"].push_back({{"name", p.name}, {"command", shown}, {"exit_code", code}, {"seconds", dt}});
  char head[512];
  std::snprintf(head, sizeof head, "\n## %s\n\nCommand: `%s` (%.0f s, %s)\n\n", p.title.c_str(), shown.c_str(), dt,
                code == 0 ? "ok" : ("FAILED, exit code " + std::to_string(code)).c_str());
  *body += head;
  const std::string md = ReadText(dir + "/" + (p.md_file.empty() ? "profile.md" : p.md_file));
  *body += md.empty() ? "(no report written)\n" : Embed(md, Relative(report_dir, dir));
  return code;
}

// bench paper: every part in turn, then the report assembled from theirs.
int RunPaper(PaperArgs& a) {
  if (a.report.empty()) a.report = a.out + "/evaluation.md";
  // Resolved here: inside std::system's shell /proc/self/exe would name the shell.
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return Fail(Status::IOError("cannot resolve /proc/self/exe"));
  const std::string self = ShellQuote(std::string(exe, size_t(len)));
  const std::vector<Part> parts = PaperParts(a);
  std::system(("mkdir -p " + ShellQuote(a.out)).c_str());
  const std::string report_dir = a.report.find('/') == std::string::npos ? "." : a.report.substr(0, a.report.rfind('/'));
  std::system(("mkdir -p " + ShellQuote(report_dir)).c_str());

  const double t_start = NowSeconds();
  std::string body;
  nlohmann::json summary;
  int failed = 0;
  for (size_t i = 0; i < parts.size(); ++i)
    failed += RunPart(a, self, parts[i], i, parts.size(), t_start, report_dir, &body, &summary) != 0;
  std::string report = "# mzcache evaluation\n\nGenerated by `mzcache bench paper" + std::string(a.quick ? " --quick" : "") +
                       " -o " + a.out + "` in " + std::to_string(int(NowSeconds() - t_start)) + " s.\n\nMachine: " +
                       MachineDescription() +
                       ". Every figure below was measured in this run; columns labeled \"paper\" are the paper's figures "
                       "for reference. Medians of repeated runs with (min-max); storage figures use direct I/O or dropped "
                       "page caches. Long contexts are built once by real prefill of real text (KJV Bible, Debian "
                       "package bible-kjv) and kept as session files in ~/.cache/mzcache/contexts, so repeated runs do "
                       "not re-prefill.\n" +
                       body;
  WriteFile(report_dir, a.report.substr(a.report.rfind('/') + 1), report);
  summary["failed_parts"] = failed;
  summary["seconds"] = NowSeconds() - t_start;
  WriteFile(a.out, "paper.json", summary.dump(2));
  std::fprintf(stderr, "[paper] wrote %s (%d part(s) failed) in %.0f s\n", a.report.c_str(), failed, NowSeconds() - t_start);
  return failed ? 1 : 0;
}

}  // namespace

void AddPaperBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<PaperArgs>();
  auto* c = bench->add_subcommand("paper", "the whole evaluation (paper tables and figures, real peers) in one report");
  c->add_option("-o,--out", a->out, "results folder (one subfolder per part)");
  c->add_option("--report", a->report, "markdown report path (default <out>/evaluation.md)");
  c->add_flag("--quick", a->quick, "8k context, one model, fewer repetitions (under 15 minutes)");
  c->add_option("-r,--reps", a->reps, "repetitions for every part (default: each part's own)");
  c->add_flag("--no-ospaging", a->no_ospaging, "skip the OS Paging baselines (need root, cgroup v1, zram)");
  c->add_flag("--skip-profile", a->skip_profile, "use the existing device profile instead of measuring it again");
  c->add_option("--only", a->only, "run only these parts (profile footprint ttft accuracy peers)");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return RunPaper(*a);
  });
}

}  // namespace mz::cli
