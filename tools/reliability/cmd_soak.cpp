// `mzcache reliability soak` (issue 25): seeded random cycles of evict / restore / restore_generate /
// decode / truncate / session save+load on a "subject" context, checked against an "oracle" context
// of the same model file that is never evicted, with RSS and file-descriptor drift checks.
//
// Contract of the tool (a thin command over the public C API, mzcache.h; nothing of src/):
//  * The cycles are split into epochs, round-robin over the codecs (--codecs). Each epoch makes a
//    fresh pair of contexts on two handles of the same model file (so weight evictions of the
//    subject never touch the oracle's weights): the subject with that kv_codec and its swap file in
//    a private temporary folder, the oracle never evicted. Both start with the same random prefill.
//  * Each cycle draws one operation from a std::mt19937_64 seeded by (--seed, epoch index), so one
//    epoch replays alone (--epoch) with the same operations:
//      decode            the same random tokens into both (sometimes all rows of logits); compared
//      evict             subject only: the policy's plan (NULL) for a random amount, or an explicit
//                        plan: whole KV to memory-compressed / storage-raw / storage-compressed
//                        (backward- or forward-out, maybe with weight layers), weight units, or a
//                        random mix of placements; random bytes (0: the whole plan)
//      restore           subject only (mz_restore): then every unit must be resident
//      restore_generate  subject (random overlap, attend_compressed, threads) vs mz_decode of the
//                        same tokens on the oracle; compared
//      truncate          both to the same random shorter length
//      session           subject saved (its codec or a lossless one), maybe decoded further alone,
//                        then loaded into itself or into a fresh subject context; then one token in
//                        both, compared
//    A decode that would pass n_ctx is first tried on the subject and must be refused with
//    MZ_ERR_CONTEXT_FULL, the conversation unchanged; then both are truncated and it goes on.
//  * Comparison of a logits row (subject vs oracle): a lossless codec (none, lz4, zstd) must be bit
//    identical (any difference is a failure; the max |diff| is reported). A lossy codec (q8, q4,
//    cachegen) is compared by KL(oracle || subject) of the softmax over the vocabulary (double
//    precision, nats) and top-1 agreement. Non-finite logits are a failure for every codec.
//    The lossy bound, and why it is principled: the oracle never evicts, so the subject's error is
//    the codec's quantization of the KV it holds, propagated through later layers and tokens: real,
//    and bounded by what one pass through the codec does, because the codecs are idempotent
//    (re-encoding a decoded chunk reproduces it; a partial chunk that grew between evictions is
//    re-encoded with new ranges by q4's key groups and cachegen's anchors, which the ratio below
//    measures). So the yardstick is measured live, on the same model and conversation: for a share
//    of the lossy comparisons (--reference-rate) the oracle's conversation is saved with the codec
//    and loaded into a probe context (every KV row through the codec once), which decodes the same
//    tokens: KL(oracle || probe). Two checks:
//      per comparison  KL <= --max-kl (per codec): a guard against gross errors (a wrong or stale
//                      chunk), set with a margin over the largest KL measured (kMaxKlHelp);
//      per run         mean subject KL / mean reference KL over the same rows <= --max-kl-ratio
//                      (from kMinRefPairs rows): about 1 when cycles add no error beyond one pass;
//                      growing error (accumulation, a codec that is not idempotent) fails it.
//  * Invariants checked after every operation (a violation is a failure): equal token counts in
//    both contexts; the memory report's in_memory == weights_resident + kv_resident +
//    swap_stack_mapped and n_kv_lost == 0; after mz_restore everything resident; after a decode or
//    restore_generate no weight dropped and no KV on storage (and, unless q8 is read in place, none
//    compressed in memory); after an explicit whole-KV plan applied whole, every chunk in its target
//    state; an eviction or restore leaves the last logits row unchanged.
//  * Status codes: every call must return MZ_OK except: a random mixed plan, or a whole-KV plan over
//    chunks the report shows in states that plan cannot move, may be refused with
//    MZ_ERR_INVALID_ARG (counted as refusals; the context must stay intact, which later comparisons
//    check); the over-long decode must return MZ_ERR_CONTEXT_FULL. Anything else is a failure,
//    printed with mz_last_error().
//  * Drift: VmRSS/VmHWM (/proc/self/status) and the number of open file descriptors
//    (/proc/self/fd) are sampled at the start (models loaded), after the first epoch's teardown,
//    after the middle epoch's teardown and at the end (the last epoch's contexts freed). A failure
//    if the end has more descriptors than the start, if the RSS at the end exceeds the RSS after
//    the first teardown by more than --rss-margin MiB, or if the contexts left files in the
//    temporary folder. Each teardown restores the subject first, so the shared weights are resident
//    at every sample, and every sample follows malloc_trim(0), so memory the allocator caches after
//    a free does not count: what is measured is memory in use (a leak), not allocator retention.
//  * Output: progress on stderr, each failure with a replay command (--epoch E), every cycle with
//    --verbose; the markdown report on stdout and, with -o DIR, DIR/soak.md and DIR/soak.json
//    (cycles per operation and codec, plans, comparisons, max |logit diff| of lossless codecs, KL
//    mean/p99/max, top-1 agreement and the one-pass reference ratio of lossy ones, refusals,
//    failures, RSS (anonymous / file) and descriptors at each sample and after every epoch, wall
//    time). Exit 0 when no failure, 1 otherwise (or on a setup error). No exception escapes.
#include <CLI/CLI.hpp>
#include <dirent.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

// Default per-comparison KL bounds (nats) of the lossy codecs: about 4x the largest KL measured on
// the tiny-qwen3 test model over 3 x 10^4 + 3 x 2000 + 3 x 1000 cycles (q8 0.027, q4 0.36,
// cachegen 0.068). A guard against gross errors; the run-level ratio below is the fine check.
constexpr double kDefaultMaxKlQ8 = 0.1;
constexpr double kDefaultMaxKlQ4 = 1.5;
constexpr double kDefaultMaxKlCachegen = 0.3;

// The run-level check of a lossy codec: mean KL of the subject over the rows that got a one-pass
// reference, divided by the mean reference KL, at most this (when at least kMinRefPairs rows).
// Measured on tiny-qwen3: 0.94-1.37 per codec over 35-544 rows (3 x 2000 and 3 x 10^4 cycles); the
// ratio of means over 8 rows drawn from 289 measured ones stayed below 2.3 in 99.9% of draws
// (cachegen, the noisiest).
constexpr double kDefaultMaxKlRatio = 3.0;
constexpr size_t kMinRefPairs = 8;

const char* const kMaxKlHelp =
    "per-comparison bound on KL(oracle || subject) in nats for the lossy codecs: one number for all, "
    "or CODEC=X,... (defaults q8=0.1, q4=1.5, cachegen=0.3). The oracle never evicts, so the "
    "subject's divergence is the codec's quantization of the KV it holds, propagated to later "
    "tokens; the codecs are idempotent, so it does not grow with the number of cycles (what "
    "--max-kl-ratio checks). These defaults guard against gross errors (a wrong or stale chunk): "
    "about 4x the largest KL measured over 10^4 cycles on the random-weight tiny-qwen3 test model, "
    "where q4 keeps only ~82% top-1 agreement with exact KV (random weights amplify KV error more "
    "than a trained model does; a trained model can take tighter bounds)";

enum Op { kDecode = 0, kEvict, kRestore, kRestoreGenerate, kTruncate, kSession, kNumOps };
const char* const kOpNames[kNumOps] = {"decode", "evict", "restore", "restore_generate", "truncate", "session"};
// Relative weights of the operations drawn per cycle.
const int kOpWeights[kNumOps] = {24, 26, 8, 20, 10, 12};

enum PlanKind { kPolicy = 0, kKvMem, kKvStorageRaw, kKvStorageCompressed, kWeightsPlan, kRandomPlan, kNumPlans };
const char* const kPlanNames[kNumPlans] = {"policy",      "whole-kv-mem-compressed", "whole-kv-storage-raw",
                                           "whole-kv-storage-compressed", "weights", "random-mix"};

bool IsLossless(const std::string& codec) { return codec == "none" || codec == "lz4" || codec == "zstd"; }

struct SoakArgs {
  std::string model;
  uint64_t cycles = 10000;
  uint64_t seed = 1;
  int threads = 2;
  int n_ctx = 1024;
  int chunk_tokens = 64;
  int max_tokens = 64;
  int epoch_cycles = 0;  // 0: automatic
  int only_epoch = -1;
  std::vector<std::string> codecs{"none", "q8", "q4", "cachegen", "lz4", "zstd"};
  std::string max_kl;
  uint64_t rss_margin_mib = 16;
  std::string out_dir;
  std::string work_dir;
  bool stop_on_failure = false;
  bool verbose = false;
  double ref_rate = 0.5;
  double max_kl_ratio = kDefaultMaxKlRatio;
};

// One sample of the process's memory and descriptors (-1 when unreadable).
struct ProcSample {
  int64_t rss_kib = -1, hwm_kib = -1, anon_kib = -1, file_kib = -1;
  int fds = -1;
};

// Samples the process. First hands the allocator's free memory back to the OS (glibc keeps freed
// blocks in per-thread arenas), so the RSS counts what is in use: a leak, not allocator caching.
ProcSample SampleProc() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  ProcSample s;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f)) {
      long long v = 0;
      if (std::sscanf(line, "VmRSS: %lld kB", &v) == 1) s.rss_kib = v;
      if (std::sscanf(line, "VmHWM: %lld kB", &v) == 1) s.hwm_kib = v;
      if (std::sscanf(line, "RssAnon: %lld kB", &v) == 1) s.anon_kib = v;
      if (std::sscanf(line, "RssFile: %lld kB", &v) == 1) s.file_kib = v;
    }
    std::fclose(f);
  }
  if (DIR* d = opendir("/proc/self/fd")) {
    int n = 0;
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
    s.fds = n - 1;  // not counting the descriptor of the listing itself
  }
  return s;
}

nlohmann::json SampleJson(const ProcSample& s) {
  return {{"rss_kib", s.rss_kib}, {"hwm_kib", s.hwm_kib}, {"rss_anon_kib", s.anon_kib}, {"rss_file_kib", s.file_kib}, {"fds", s.fds}};
}

// mkdir -p: true when dir exists (as a folder) afterwards.
bool MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);  // errors: checked below
  struct stat st;
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Names in dir (without . and ..); empty when it cannot be listed.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

// KL(softmax(p) || softmax(q)) in nats, in double. REQUIRES every value finite, n >= 1.
double Kl(const float* p, const float* q, int n) {
  double mp = p[0], mq = q[0];
  for (int i = 1; i < n; ++i) {
    mp = std::max(mp, double(p[i]));
    mq = std::max(mq, double(q[i]));
  }
  double sp = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    sp += std::exp(double(p[i]) - mp);
    sq += std::exp(double(q[i]) - mq);
  }
  const double lse_p = mp + std::log(sp), lse_q = mq + std::log(sq);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double lp = double(p[i]) - lse_p;
    if (lp < -745) continue;  // p_i underflows to 0: no contribution
    kl += std::exp(lp) * (lp - (double(q[i]) - lse_q));
  }
  return std::max(0.0, kl);
}

int ArgMax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

struct CodecStats {
  std::string codec;
  bool lossless = false;
  double max_kl = 0;  // the bound (lossy codecs)
  int epochs = 0;
  uint64_t cycles = 0, ops[kNumOps] = {}, plans[kNumPlans] = {};
  uint64_t comparisons = 0, identical = 0, top1_agree = 0;
  double max_abs_diff = 0;
  std::vector<double> kl;  // every comparison's KL (lossy codecs)
  std::vector<double> ref_kl, ref_subject_kl;  // one-pass reference KL, and the subject's at the same rows
  uint64_t refusals = 0, context_full_probes = 0, fresh_subjects = 0;
  uint64_t bytes_freed = 0, failures = 0;
};

struct Failure {
  int64_t cycle;  // -1: outside the cycles (setup, teardown, drift)
  int epoch;
  std::string codec, op, message;
};

struct Percentiles {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
};

Percentiles Summarize(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double s = 0;
  for (double x : v) s += x;
  p.mean = s / double(v.size());
  auto at = [&](double f) { return v[std::min(v.size() - 1, size_t(f * double(v.size() - 1) + 0.5))]; };
  p.p50 = at(0.5);
  p.p99 = at(0.99);
  p.max = v.back();
  return p;
}

// Mean subject KL over the mean one-pass reference KL of the same rows (0 without reference rows;
// infinity when the reference is exactly 0 and the subject is not).
double RefRatio(const CodecStats& c) {
  if (c.ref_kl.empty()) return 0;
  const double r = Summarize(c.ref_kl).mean, s = Summarize(c.ref_subject_kl).mean;
  if (r > 0) return s / r;
  return s > 0 ? HUGE_VAL : 1.0;
}

std::string Fmt(const char* f, double x) {
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

class Soak {
 public:
  explicit Soak(const SoakArgs& a) : a_(a) {}
  ~Soak() { FreeAll(); }
  int Run();

 private:
  // ---- setup and teardown ----
  bool ParseMaxKl();
  bool Setup();
  bool NewContext(mz_model* m, const std::string& codec, const std::string& swap, mz_context** out);
  bool StartEpoch(int epoch);
  void EndEpoch();
  void FreeAll();

  // ---- one epoch ----
  void RunCycle(int64_t cycle);
  void OpDecode();
  void OpEvict();
  void OpRestore();
  void OpRestoreGenerate();
  void OpTruncate();
  void OpSession();

  // ---- helpers ----
  int Uniform(int lo, int hi) { return lo >= hi ? lo : int(std::uniform_int_distribution<int>(lo, hi)(rng_)); }
  double Unit() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  bool Chance(double p) { return Unit() < p; }
  std::vector<mz_token> RandomTokens(int n);
  int NTokens() const { return mz_context_n_tokens(sub_); }
  int NChunks() const { return (NTokens() + a_.chunk_tokens - 1) / a_.chunk_tokens; }
  // Makes room for n more tokens: truncates both to a random length that leaves it. False on a
  // failure (recorded).
  bool MakeRoom(int n);
  // Decodes the same tokens into both and compares the last row (all rows when all_logits).
  bool DecodeBoth(const std::vector<mz_token>& t, bool all_logits, const char* what);
  // Compares one subject row with the oracle's; records the result. Returns the KL (lossy codecs;
  // else or on a failure -1).
  double Compare(const float* sub, const float* ora, const std::string& what);
  // The one-pass reference of a lossy codec: RefBefore (before the oracle decodes) draws whether
  // this comparison gets one and, if so, loads the oracle's conversation passed once whole through
  // the codec (a session saved with it) into the probe context; RefAfter decodes the same tokens
  // into the probe and records KL(oracle || probe) beside the subject's KL of the same row.
  bool RefBefore();
  void RefAfter(const std::vector<mz_token>& t, int oracle_row, double subject_kl);
  bool Ok(int rc, const std::string& call);
  void Fail(const std::string& msg);
  bool Report(mz_context* c, mz_memory_report* r);
  void CheckReport(const std::string& after);
  void CheckComputeResidency(bool q8_in_place, const std::string& after);
  void SaveLastLogits();
  void CheckLastLogitsUnchanged(const std::string& after);
  std::string Reproducer(int epoch) const;
  nlohmann::json ToJson() const;
  std::string ToMarkdown() const;
  bool WriteOutputs();

  SoakArgs a_;
  std::map<std::string, double> max_kl_;
  mz_model* m_sub_ = nullptr;
  mz_model* m_ora_ = nullptr;
  int n_vocab_ = 0, n_layer_ = 0;
  std::string tmp_;  // private temporary folder (swap files, session files)
  std::vector<CodecStats> stats_;
  std::vector<Failure> failures_;
  uint64_t total_failures_ = 0;
  uint64_t op_count_[kNumOps] = {};
  double op_seconds_[kNumOps] = {};
  // Run-level figures, for the outputs.
  ProcSample start_, first_teardown_, middle_, end_;
  std::vector<ProcSample> teardowns_;  // after each epoch's teardown
  int n_epochs_ = 0, epochs_run_ = 0;
  uint64_t per_epoch_ = 0, cycles_run_ = 0;
  double wall_s_ = 0;

  // The running epoch.
  int epoch_ = -1;
  int64_t cycle_ = -1;
  int op_ = -1;
  CodecStats* cs_ = nullptr;
  std::string codec_;
  std::mt19937_64 rng_;
  mz_context* sub_ = nullptr;
  mz_context* ora_ = nullptr;
  mz_context* probe_ = nullptr;  // lossy epochs: the one-pass reference
  int sub_generation_ = 0;
  std::string session_path_;
  std::vector<float> last_logits_;  // subject's last row while it should stay unchanged
  std::string detail_;              // what the running cycle did (--verbose)
};

bool Soak::ParseMaxKl() {
  max_kl_ = {{"q8", kDefaultMaxKlQ8}, {"q4", kDefaultMaxKlQ4}, {"cachegen", kDefaultMaxKlCachegen}};
  if (a_.max_kl.empty()) return true;
  std::stringstream ss(a_.max_kl);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    char* end = nullptr;
    const std::string num = eq == std::string::npos ? item : item.substr(eq + 1);
    const double v = std::strtod(num.c_str(), &end);
    if (num.empty() || *end || !(v >= 0)) {
      std::fprintf(stderr, "error: --max-kl: bad value in '%s'\n", item.c_str());
      return false;
    }
    if (eq == std::string::npos) {
      for (auto& kv : max_kl_) kv.second = v;
    } else {
      const std::string c = item.substr(0, eq);
      if (!max_kl_.count(c)) {
        std::fprintf(stderr, "error: --max-kl: '%s' is not a lossy codec (q8, q4, cachegen)\n", c.c_str());
        return false;
      }
      max_kl_[c] = v;
    }
  }
  return true;
}

bool Soak::Setup() {
  if (!ParseMaxKl()) return false;
  if (a_.codecs.empty()) {
    std::fprintf(stderr, "error: --codecs is empty\n");
    return false;
  }
  for (const auto& c : a_.codecs) {
    if (c != "none" && c != "q8" && c != "q4" && c != "cachegen" && c != "lz4" && c != "zstd") {
      std::fprintf(stderr, "error: unknown codec '%s' (none, q8, q4, cachegen, lz4, zstd)\n", c.c_str());
      return false;
    }
    CodecStats s;
    s.codec = c;
    s.lossless = IsLossless(c);
    s.max_kl = s.lossless ? 0 : max_kl_[c];
    stats_.push_back(std::move(s));
  }
  if (a_.model.empty()) {
    Status st = EnsureDefaultModel(&a_.model);
    if (!st.ok()) {
      cli::Fail(st);
      return false;
    }
  }
  if (mz_model_load(a_.model.c_str(), nullptr, &m_sub_) != MZ_OK ||
      mz_model_load(a_.model.c_str(), nullptr, &m_ora_) != MZ_OK) {
    std::fprintf(stderr, "error: loading %s: %s\n", a_.model.c_str(), mz_last_error());
    return false;
  }
  mz_model_info info{};
  if (mz_model_get_info(m_sub_, &info) != MZ_OK) {
    std::fprintf(stderr, "error: model info: %s\n", mz_last_error());
    return false;
  }
  n_vocab_ = info.n_vocab;
  n_layer_ = info.n_layer;
  std::string base = a_.work_dir;
  if (base.empty()) {
    const char* t = std::getenv("TMPDIR");
    base = t && *t ? t : "/var/tmp";
  }
  // --work-dir may not exist yet (ctest can start the soak before anything made the build's
  // reliability/ folder): it is created with its parents.
  std::error_code mk_err;
  std::filesystem::create_directories(base, mk_err);
  std::string templ = base + "/mzcache-soak-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {
    std::fprintf(stderr, "error: cannot create a folder in %s: %s\n", base.c_str(), std::strerror(errno));
    return false;
  }
  tmp_ = buf.data();
  return true;
}

bool Soak::NewContext(mz_model* m, const std::string& codec, const std::string& swap, mz_context** out) {
  mz_context_params cp = mz_context_default_params();
  cp.n_ctx = uint32_t(a_.n_ctx);
  cp.kv_chunk_tokens = uint32_t(a_.chunk_tokens);
  cp.n_threads = a_.threads;
  cp.kv_codec = codec.c_str();
  cp.swap_path = swap.c_str();
  *out = nullptr;
  return Ok(mz_context_new(m, &cp, out), "mz_context_new(" + codec + ")");
}

void Soak::FreeAll() {
  if (sub_) mz_context_free(sub_);
  if (ora_) mz_context_free(ora_);
  if (probe_) mz_context_free(probe_);
  sub_ = ora_ = probe_ = nullptr;
  if (m_sub_) mz_model_free(m_sub_);
  if (m_ora_) mz_model_free(m_ora_);
  m_sub_ = m_ora_ = nullptr;
  if (!tmp_.empty()) {
    for (const auto& f : ListDir(tmp_)) std::remove((tmp_ + "/" + f).c_str());
    rmdir(tmp_.c_str());
    tmp_.clear();
  }
}

std::string Soak::Reproducer(int epoch) const {
  std::string c;
  for (const auto& x : a_.codecs) c += (c.empty() ? "" : ",") + x;
  std::string s = "mzcache reliability soak -m " + a_.model + " --seed " + std::to_string(a_.seed) + " --cycles " +
                  std::to_string(a_.cycles) + " --codecs " + c + " --ctx " + std::to_string(a_.n_ctx) +
                  " --chunk-tokens " + std::to_string(a_.chunk_tokens) + " --max-tokens " +
                  std::to_string(a_.max_tokens) + " --threads " + std::to_string(a_.threads);
  if (a_.epoch_cycles) s += " --epoch-cycles " + std::to_string(a_.epoch_cycles);
  if (!a_.max_kl.empty()) s += " --max-kl " + a_.max_kl;
  if (a_.max_kl_ratio != kDefaultMaxKlRatio) s += " --max-kl-ratio " + Fmt("%g", a_.max_kl_ratio);
  if (a_.ref_rate != SoakArgs().ref_rate) s += " --reference-rate " + Fmt("%g", a_.ref_rate);
  if (epoch >= 0) s += " --epoch " + std::to_string(epoch) + " --stop-on-failure";
  return s;
}

void Soak::Fail(const std::string& msg) {
  ++total_failures_;
  if (cs_) ++cs_->failures;
  const std::string op = op_ >= 0 ? kOpNames[op_] : epoch_ >= 0 ? "epoch setup/teardown" : "run";
  if (failures_.size() < 200) failures_.push_back({cycle_, epoch_, codec_, op, msg});
  if (total_failures_ <= 50)
    std::fprintf(stderr, "\nFAIL cycle %lld (epoch %d, codec %s, %s): %s\n  replay: %s\n", (long long)cycle_, epoch_,
                 codec_.c_str(), op.c_str(), msg.c_str(), Reproducer(epoch_).c_str());
}

bool Soak::Ok(int rc, const std::string& call) {
  if (rc == MZ_OK) return true;
  Fail(call + " returned " + std::to_string(rc) + " (" + mz_status_str(rc) + "): " + mz_last_error());
  return false;
}

bool Soak::Report(mz_context* c, mz_memory_report* r) {
  *r = mz_memory_report{};
  return Ok(mz_get_memory_report(c, r), "mz_get_memory_report");
}

void Soak::CheckReport(const std::string& after) {
  const int ns = mz_context_n_tokens(sub_), no = mz_context_n_tokens(ora_);
  if (ns != no) Fail("after " + after + ": subject has " + std::to_string(ns) + " tokens, oracle " + std::to_string(no));
  mz_memory_report r;
  if (!Report(sub_, &r)) return;
  if (r.in_memory != r.weights_resident + r.kv_resident + r.swap_stack_mapped)
    Fail("after " + after + ": report in_memory " + std::to_string(r.in_memory) + " != weights_resident + kv_resident + swap_stack_mapped");
  if (r.n_kv_lost != 0) Fail("after " + after + ": " + std::to_string(r.n_kv_lost) + " KV chunks lost");
}

// After a decode / restore_generate: compute needed every weight and every chunk, so nothing is
// dropped or on storage; chunks stay compressed in memory only when q8 is read in place.
void Soak::CheckComputeResidency(bool q8_in_place, const std::string& after) {
  mz_memory_report r;
  if (!Report(sub_, &r)) return;
  std::string bad;
  if (r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED]) bad += std::to_string(r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED]) + " weight units dropped; ";
  if (r.n_kv_chunks[MZ_STATE_KV_STORAGE_RAW] || r.n_kv_chunks[MZ_STATE_KV_STORAGE_COMPRESSED])
    bad += std::to_string(r.n_kv_chunks[MZ_STATE_KV_STORAGE_RAW] + r.n_kv_chunks[MZ_STATE_KV_STORAGE_COMPRESSED]) +
           " KV chunks on storage; ";
  if (!q8_in_place && r.n_kv_chunks[MZ_STATE_KV_MEM_COMPRESSED])
    bad += std::to_string(r.n_kv_chunks[MZ_STATE_KV_MEM_COMPRESSED]) + " KV chunks compressed in memory; ";
  if (!bad.empty()) Fail("after " + after + ": " + bad + "compute should have restored them");
}

void Soak::SaveLastLogits() {
  const float* l = mz_get_logits(sub_, 0);
  if (l)
    last_logits_.assign(l, l + n_vocab_);
  else
    last_logits_.clear();
}

void Soak::CheckLastLogitsUnchanged(const std::string& after) {
  if (last_logits_.empty()) return;
  const float* l = mz_get_logits(sub_, 0);
  if (!l || std::memcmp(l, last_logits_.data(), last_logits_.size() * sizeof(float)) != 0)
    Fail(after + " changed the last logits row (" + (l ? "different values" : "now NULL") + ")");
}

std::vector<mz_token> Soak::RandomTokens(int n) {
  std::vector<mz_token> t(size_t(std::max(n, 0)));
  for (auto& x : t) x = mz_token(Uniform(0, n_vocab_ - 1));
  return t;
}

bool Soak::MakeRoom(int n) {
  const int have = NTokens();
  if (have + n <= a_.n_ctx) return true;
  // Nearly full. Sometimes first check the refusal: an over-long decode changes nothing.
  if (Chance(0.5)) {
    ++cs_->context_full_probes;
    const auto t = RandomTokens(n);
    const int rc = mz_decode(sub_, t.data(), n, false);
    if (rc != MZ_ERR_CONTEXT_FULL)
      Fail("a decode past n_ctx returned " + std::to_string(rc) + " (" + mz_status_str(rc) + "), expected context full: " + mz_last_error());
    if (NTokens() != have) Fail("a refused decode changed the token count");
  }
  const int keep = Uniform(0, a_.n_ctx - n);
  mz_context_truncate(sub_, keep);
  mz_context_truncate(ora_, keep);
  last_logits_.clear();
  return NTokens() == keep || (Fail("truncate to " + std::to_string(keep) + " left " + std::to_string(NTokens())), false);
}

double Soak::Compare(const float* sub, const float* ora, const std::string& what) {
  if (!sub || !ora) {
    Fail(what + ": no logits (" + (sub ? "oracle" : "subject") + ")");
    return -1;
  }
  ++cs_->comparisons;
  bool finite = true;
  for (int i = 0; i < n_vocab_; ++i)
    if (!std::isfinite(sub[i]) || !std::isfinite(ora[i])) {
      finite = false;
      break;
    }
  if (!finite) {
    Fail(what + ": non-finite logits");
    return -1;
  }
  const bool top1 = ArgMax(sub, n_vocab_) == ArgMax(ora, n_vocab_);
  cs_->top1_agree += top1;
  if (cs_->lossless) {
    double d = 0;
    for (int i = 0; i < n_vocab_; ++i) d = std::max(d, double(std::fabs(sub[i] - ora[i])));
    cs_->max_abs_diff = std::max(cs_->max_abs_diff, d);
    if (std::memcmp(sub, ora, size_t(n_vocab_) * sizeof(float)) == 0)
      ++cs_->identical;
    else
      Fail(what + ": lossless codec, logits differ from the oracle's (max |diff| " + Fmt("%.3g", d) + ")");
    return -1;
  }
  const double kl = Kl(ora, sub, n_vocab_);
  cs_->kl.push_back(kl);
  if (std::memcmp(sub, ora, size_t(n_vocab_) * sizeof(float)) == 0) ++cs_->identical;
  if (kl > cs_->max_kl) Fail(what + ": KL(oracle || subject) " + Fmt("%.3g", kl) + " above the bound " + Fmt("%.3g", cs_->max_kl));
  return kl;
}

bool Soak::RefBefore() {
  const bool draw = Chance(a_.ref_rate);
  if (!draw || !probe_) return false;
  const std::string path = tmp_ + "/reference.sess";
  const bool ok = Ok(mz_session_save(ora_, path.c_str(), codec_.c_str()), "mz_session_save (oracle, reference)") &&
                  Ok(mz_session_load(probe_, path.c_str()), "mz_session_load (probe, reference)");
  std::remove(path.c_str());
  return ok;
}

void Soak::RefAfter(const std::vector<mz_token>& t, int oracle_row, double subject_kl) {
  if (!Ok(mz_decode(probe_, t.data(), int(t.size()), false), "mz_decode (probe, reference)")) return;
  const float* p = mz_get_logits(probe_, 0);
  const float* o = mz_get_logits(ora_, oracle_row);
  if (!p || !o || subject_kl < 0) return;
  for (int i = 0; i < n_vocab_; ++i)
    if (!std::isfinite(p[i])) {
      Fail("reference: non-finite logits");
      return;
    }
  cs_->ref_kl.push_back(Kl(o, p, n_vocab_));
  cs_->ref_subject_kl.push_back(subject_kl);
}

bool Soak::DecodeBoth(const std::vector<mz_token>& t, bool all_logits, const char* what) {
  const int n = int(t.size());
  const bool ref = RefBefore();
  if (!Ok(mz_decode(sub_, t.data(), n, all_logits), std::string("mz_decode (subject, ") + what + ")")) return false;
  if (!Ok(mz_decode(ora_, t.data(), n, all_logits), std::string("mz_decode (oracle, ") + what + ")")) return false;
  const int rows = all_logits ? n : 1;
  double kl = -1;
  for (int i = 0; i < rows; ++i)
    kl = Compare(mz_get_logits(sub_, i), mz_get_logits(ora_, i), std::string(what) + " row " + std::to_string(i));
  if (ref) RefAfter(t, rows - 1, kl);
  return true;
}

void Soak::OpDecode() {
  const int n = Chance(0.75) ? Uniform(1, 8) : Uniform(1, a_.max_tokens);
  if (!MakeRoom(n)) return;
  const auto t = RandomTokens(n);
  if (DecodeBoth(t, Chance(0.2), "decode")) CheckComputeResidency(codec_ == "q8", "mz_decode");
}

void Soak::OpRestoreGenerate() {
  const int n = Chance(0.75) ? Uniform(1, 8) : Uniform(1, a_.max_tokens);
  if (!MakeRoom(n)) return;
  const auto t = RandomTokens(n);
  mz_restore_params rp = mz_restore_default_params();
  rp.overlap = Uniform(MZ_OVERLAP_NONE, MZ_OVERLAP_FULL);
  rp.attend_compressed = Chance(0.75) ? 1 : 0;
  rp.io_threads = Uniform(1, 2);
  rp.decode_threads = Uniform(1, 2);
  mz_restore_stats st{};
  const std::string what = "restore_generate(overlap " + std::to_string(rp.overlap) + ", attend_compressed " +
                           std::to_string(rp.attend_compressed) + ")";
  detail_ = ", " + what + " io " + std::to_string(rp.io_threads) + " decode " + std::to_string(rp.decode_threads);
  const bool ref = RefBefore();
  if (!Ok(mz_restore_generate(sub_, t.data(), n, &rp, &st), "mz_restore_generate (subject)")) return;
  if (!Ok(mz_decode(ora_, t.data(), n, false), "mz_decode (oracle)")) return;
  const double kl = Compare(mz_get_logits(sub_, 0), mz_get_logits(ora_, 0), what);
  if (ref) RefAfter(t, 0, kl);
  CheckComputeResidency(codec_ == "q8" && rp.attend_compressed, what);
}

void Soak::OpTruncate() {
  const int have = NTokens();
  // Mostly a short step back (an edit of the last turn), sometimes anywhere down to empty.
  const int keep = Chance(0.3) ? Uniform(0, have) : std::max(0, have - Uniform(1, 48));
  if (!Ok(mz_context_truncate(sub_, keep), "mz_context_truncate (subject)")) return;
  if (!Ok(mz_context_truncate(ora_, keep), "mz_context_truncate (oracle)")) return;
  if (NTokens() != std::min(keep, have)) Fail("truncate to " + std::to_string(keep) + " left " + std::to_string(NTokens()));
  last_logits_.clear();
}

void Soak::OpRestore() {
  if (!Ok(mz_restore(sub_), "mz_restore")) return;
  mz_memory_report r;
  if (!Report(sub_, &r)) return;
  int kv = 0, w = 0;
  for (int s = 0; s < 5; ++s) {
    kv += r.n_kv_chunks[s];
    w += r.n_weight_units[s];
  }
  if (r.n_kv_chunks[MZ_STATE_RESIDENT] != kv || r.n_weight_units[MZ_STATE_RESIDENT] != w)
    Fail("after mz_restore: " + std::to_string(kv - r.n_kv_chunks[MZ_STATE_RESIDENT]) + " KV chunks and " +
         std::to_string(w - r.n_weight_units[MZ_STATE_RESIDENT]) + " weight units not resident");
  CheckLastLogitsUnchanged("mz_restore");
}

void Soak::OpEvict() {
  mz_memory_report before;
  if (!Report(sub_, &before)) return;
  int total_chunks = 0;
  for (int s = 0; s < 5; ++s) total_chunks += before.n_kv_chunks[s];
  const int L = n_layer_, C = NChunks();
  // Draws first, so the sequence does not depend on figures read from the context.
  const int kind = Uniform(0, kNumPlans - 1);
  const double frac = Unit();
  const bool whole = Chance(0.4);     // bytes = 0: the whole plan
  const bool all_bytes = Chance(0.15);  // policy: more than there is
  const bool forward = Chance(0.3);
  const bool with_weights = Chance(0.3);
  const bool restore_first = Chance(0.5);
  ++cs_->plans[kind];

  std::vector<mz_placement> items;
  auto kv = [&](int l, int c, int st) { items.push_back({MZ_UNIT_KV, l, c, st}); };
  auto weights = [&](int l, int st) { items.push_back({MZ_UNIT_WEIGHTS, l, 0, st}); };
  auto rear_weights = [&] {
    const int from = Uniform(0, L - 1);
    for (int l = L - 1; l >= from; --l) weights(l, MZ_STATE_WEIGHTS_DROPPED);
    if (Chance(0.3)) weights(-1, MZ_STATE_WEIGHTS_DROPPED);
  };
  bool may_refuse = false, check_target = false;
  int target = MZ_STATE_RESIDENT;
  uint64_t bytes = 0;
  switch (kind) {
    case kPolicy:
      break;
    case kKvMem:
    case kKvStorageRaw:
    case kKvStorageCompressed: {
      target = kind == kKvMem ? MZ_STATE_KV_MEM_COMPRESSED
                              : kind == kKvStorageRaw ? MZ_STATE_KV_STORAGE_RAW : MZ_STATE_KV_STORAGE_COMPRESSED;
      // Which states this plan can move a chunk from (design.md, unit states): resident, the target
      // itself, and memory-compressed to storage-compressed (CompKV).
      int movable = before.n_kv_chunks[MZ_STATE_RESIDENT] + before.n_kv_chunks[target];
      if (target == MZ_STATE_KV_STORAGE_COMPRESSED) movable += before.n_kv_chunks[MZ_STATE_KV_MEM_COMPRESSED];
      const bool valid = movable == total_chunks;
      const bool prefix_restore = !valid && restore_first;  // restore each chunk first: always valid
      may_refuse = !valid && !prefix_restore;
      for (int i = 0; i < L; ++i) {
        const int l = forward ? i : L - 1 - i;
        for (int j = 0; j < C; ++j) {
          const int c = forward ? j : C - 1 - j;
          if (prefix_restore) kv(l, c, MZ_STATE_RESIDENT);
          kv(l, c, target);
        }
      }
      if (with_weights) rear_weights();
      check_target = whole && !may_refuse;
      break;
    }
    case kWeightsPlan:
      rear_weights();
      if (Chance(0.3)) weights(Uniform(-1, L - 1), MZ_STATE_RESIDENT);
      break;
    case kRandomPlan: {
      const int n = Uniform(1, 2 * (L * std::max(C, 1) + L + 1));
      for (int i = 0; i < n; ++i) {
        if (C == 0 || Chance(0.2))
          weights(Uniform(-1, L - 1), Chance(0.8) ? MZ_STATE_WEIGHTS_DROPPED : MZ_STATE_RESIDENT);
        else
          kv(Uniform(0, L - 1), Uniform(0, C - 1), Uniform(MZ_STATE_RESIDENT, MZ_STATE_KV_STORAGE_COMPRESSED));
      }
      if (Chance(0.05)) kv(Uniform(0, L - 1), C, MZ_STATE_KV_STORAGE_RAW);  // no such chunk: refused
      may_refuse = true;
      break;
    }
  }
  if (kind == kPolicy)
    bytes = all_bytes ? (uint64_t(1) << 50) : uint64_t(frac * double(before.in_memory));
  else
    bytes = whole ? 0 : uint64_t(frac * double(before.in_memory)) + 1;

  uint64_t freed = 0;
  mz_plan plan{items.data(), items.size()};
  const std::string what = std::string("mz_evict(") + kPlanNames[kind] + ", " + std::to_string(items.size()) +
                           " placements, " + std::to_string(bytes) + " bytes)";
  const int rc = mz_evict(sub_, bytes, kind == kPolicy ? nullptr : &plan, &freed);
  detail_ = ", " + what + " -> " + std::to_string(rc) + ", freed " + std::to_string(freed);
  if (a_.verbose && kind == kRandomPlan)
    for (const auto& x : items) detail_ += " [" + std::to_string(x.kind) + " " + std::to_string(x.layer) + " " + std::to_string(x.chunk) + " " + std::to_string(x.state) + "]";
  if (rc == MZ_ERR_INVALID_ARG && may_refuse) {
    ++cs_->refusals;
  } else if (!Ok(rc, what)) {
    return;
  }
  cs_->bytes_freed += freed;
  mz_memory_report after;
  if (!Report(sub_, &after)) return;
  if (rc == MZ_OK && check_target && after.n_kv_chunks[target] != total_chunks)
    Fail(what + " applied whole left " + std::to_string(total_chunks - after.n_kv_chunks[target]) + " of " +
         std::to_string(total_chunks) + " chunks outside state " + std::to_string(target));
  if (freed > before.in_memory) Fail(what + " reported " + std::to_string(freed) + " bytes freed of " + std::to_string(before.in_memory) + " in memory");
  CheckLastLogitsUnchanged(what);
}

void Soak::OpSession() {
  // Lossless subjects save losslessly (else the comparison could not be exact); lossy ones with
  // their own codec or a lossless one (a coarser codec would leave the codec's bound).
  static const char* const kLossless[] = {"none", "lz4", "zstd"};
  const std::string scodec = Chance(0.4) ? codec_ : kLossless[Uniform(0, 2)];
  const bool diverge = Chance(0.3), fresh = Chance(0.5);
  const int saved = NTokens();
  detail_ = ", codec " + scodec + (diverge ? ", diverged" : "") + (fresh ? ", fresh context" : "");
  if (!Ok(mz_session_save(sub_, session_path_.c_str(), scodec.c_str()), "mz_session_save(" + scodec + ")")) return;
  if (diverge) {  // the subject goes on alone; the load must take it back
    const int n = Uniform(1, 8);
    if (saved + n <= a_.n_ctx) {
      const auto t = RandomTokens(n);
      if (!Ok(mz_decode(sub_, t.data(), n, false), "mz_decode (subject, diverging)")) return;
    }
  }
  if (fresh) {
    ++cs_->fresh_subjects;
    mz_context* c = nullptr;
    const std::string swap = tmp_ + "/subject-" + std::to_string(epoch_) + "-" + std::to_string(++sub_generation_) + ".swap";
    if (!NewContext(m_sub_, codec_, swap, &c)) return;
    if (!Ok(mz_session_load(c, session_path_.c_str()), "mz_session_load (fresh subject)")) {
      mz_context_free(c);
      return;
    }
    mz_context_free(sub_);
    sub_ = c;
  } else if (!Ok(mz_session_load(sub_, session_path_.c_str()), "mz_session_load (subject)")) {
    return;
  }
  last_logits_.clear();
  if (NTokens() != saved) {
    Fail("the loaded session has " + std::to_string(NTokens()) + " tokens, saved " + std::to_string(saved));
    return;
  }
  if (Chance(0.5)) std::remove(session_path_.c_str());
  const int n = Uniform(1, 4);
  if (!MakeRoom(n)) return;
  const auto t = RandomTokens(n);
  if (DecodeBoth(t, false, ("after session " + scodec + (fresh ? " into a fresh context" : "")).c_str()))
    CheckComputeResidency(codec_ == "q8", "decode after session load");
}

void Soak::RunCycle(int64_t cycle) {
  int total = 0;
  for (int w : kOpWeights) total += w;
  int x = Uniform(0, total - 1), op = 0;
  while (x >= kOpWeights[op]) x -= kOpWeights[op++];
  cycle_ = cycle;
  op_ = op;
  ++cs_->cycles;
  ++cs_->ops[op];
  ++op_count_[op];
  const auto t0 = std::chrono::steady_clock::now();
  const int tokens_before = NTokens();
  detail_.clear();
  switch (op) {
    case kDecode: OpDecode(); break;
    case kEvict: OpEvict(); break;
    case kRestore: OpRestore(); break;
    case kRestoreGenerate: OpRestoreGenerate(); break;
    case kTruncate: OpTruncate(); break;
    case kSession: OpSession(); break;
  }
  op_seconds_[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a_.verbose) {
    mz_memory_report r{};
    mz_get_memory_report(sub_, &r);
    std::fprintf(stderr, "cycle %lld %s: %d -> %d tokens%s; chunks res/memc/stoRaw/stoC %d/%d/%d/%d, weights dropped %d\n",
                 (long long)cycle, kOpNames[op], tokens_before, NTokens(), detail_.c_str(), r.n_kv_chunks[0],
                 r.n_kv_chunks[1], r.n_kv_chunks[2], r.n_kv_chunks[3], r.n_weight_units[MZ_STATE_WEIGHTS_DROPPED]);
  }
  CheckReport(kOpNames[op]);
  if (op == kDecode || op == kRestoreGenerate || op == kSession) SaveLastLogits();
}

bool Soak::StartEpoch(int epoch) {
  epoch_ = epoch;
  cycle_ = -1;
  op_ = -1;
  cs_ = &stats_[size_t(epoch) % stats_.size()];
  codec_ = cs_->codec;
  ++cs_->epochs;
  std::seed_seq seq{uint64_t(a_.seed & 0xffffffffu), uint64_t(a_.seed >> 32), uint64_t(epoch)};
  rng_.seed(seq);
  sub_generation_ = 0;
  session_path_ = tmp_ + "/epoch-" + std::to_string(epoch) + ".sess";
  last_logits_.clear();
  if (!NewContext(m_sub_, codec_, tmp_ + "/subject-" + std::to_string(epoch) + "-0.swap", &sub_)) return false;
  if (!NewContext(m_ora_, "none", tmp_ + "/oracle-" + std::to_string(epoch) + ".swap", &ora_)) return false;
  if (!cs_->lossless && a_.ref_rate > 0 &&
      !NewContext(m_ora_, "none", tmp_ + "/probe-" + std::to_string(epoch) + ".swap", &probe_))
    return false;
  // A random prefill, so epochs start at any depth.
  const int n = Uniform(0, a_.n_ctx * 3 / 4);
  if (n > 0 && DecodeBoth(RandomTokens(n), false, "prefill")) SaveLastLogits();
  return true;
}

void Soak::EndEpoch() {
  op_ = -1;
  cycle_ = -1;
  // The weights are the model's: bring them back so every teardown sample sees the same weights.
  if (sub_) Ok(mz_restore(sub_), "mz_restore (teardown)");
  if (sub_) mz_context_free(sub_);
  if (ora_) mz_context_free(ora_);
  if (probe_) mz_context_free(probe_);
  sub_ = ora_ = probe_ = nullptr;
  std::remove(session_path_.c_str());
  const auto left = ListDir(tmp_);
  if (!left.empty()) {
    std::string names;
    for (const auto& f : left) names += " " + f;
    Fail("files left after the contexts were freed:" + names);
    for (const auto& f : left) std::remove((tmp_ + "/" + f).c_str());
  }
}

nlohmann::json Soak::ToJson() const {
  nlohmann::json j;
  j["model"] = a_.model;
  j["seed"] = a_.seed;
  j["cycles_requested"] = a_.cycles;
  j["cycles_run"] = cycles_run_;
  j["epochs"] = n_epochs_;
  j["epochs_run"] = epochs_run_;
  j["cycles_per_epoch"] = per_epoch_;
  if (a_.only_epoch >= 0) j["only_epoch"] = a_.only_epoch;
  j["n_ctx"] = a_.n_ctx;
  j["chunk_tokens"] = a_.chunk_tokens;
  j["max_tokens"] = a_.max_tokens;
  j["threads"] = a_.threads;
  j["wall_s"] = wall_s_;
  j["reproduce"] = Reproducer(-1);
  nlohmann::json ops = nlohmann::json::object();
  for (int o = 0; o < kNumOps; ++o) ops[kOpNames[o]] = {{"cycles", op_count_[o]}, {"seconds", op_seconds_[o]}};
  j["ops"] = ops;
  j["codecs"] = nlohmann::json::array();
  for (const auto& c : stats_) {
    nlohmann::json x;
    x["codec"] = c.codec;
    x["lossless"] = c.lossless;
    x["epochs"] = c.epochs;
    x["cycles"] = c.cycles;
    for (int o = 0; o < kNumOps; ++o) x["ops"][kOpNames[o]] = c.ops[o];
    for (int p = 0; p < kNumPlans; ++p) x["evict_plans"][kPlanNames[p]] = c.plans[p];
    x["comparisons"] = c.comparisons;
    x["identical"] = c.identical;
    x["top1_agree"] = c.top1_agree;
    if (c.lossless) {
      x["max_abs_logit_diff"] = c.max_abs_diff;
    } else {
      const Percentiles k = Summarize(c.kl);
      x["kl"] = {{"bound", c.max_kl}, {"mean", k.mean}, {"p50", k.p50}, {"p99", k.p99}, {"max", k.max}};
      const Percentiles r = Summarize(c.ref_kl), rs = Summarize(c.ref_subject_kl);
      x["one_pass_reference"] = {{"rows", c.ref_kl.size()},        {"kl_mean", r.mean},
                                 {"kl_max", r.max},                {"subject_kl_mean", rs.mean},
                                 {"ratio", RefRatio(c)},           {"ratio_bound", a_.max_kl_ratio},
                                 {"checked", c.ref_kl.size() >= kMinRefPairs}};
    }
    x["refusals"] = c.refusals;
    x["context_full_probes"] = c.context_full_probes;
    x["fresh_subjects"] = c.fresh_subjects;
    x["bytes_freed"] = c.bytes_freed;
    x["failures"] = c.failures;
    j["codecs"].push_back(x);
  }
  j["process"] = {{"start", SampleJson(start_)},
                  {"after_first_epoch", SampleJson(first_teardown_)},
                  {"middle", SampleJson(middle_)},
                  {"end", SampleJson(end_)},
                  {"after_each_epoch", [&] {
                     nlohmann::json a = nlohmann::json::array();
                     for (const auto& t : teardowns_) a.push_back(SampleJson(t));
                     return a;
                   }()},
                  {"rss_margin_mib", a_.rss_margin_mib}};
  j["failures_total"] = total_failures_;
  j["failures"] = nlohmann::json::array();
  for (const auto& f : failures_)
    j["failures"].push_back(
        {{"cycle", f.cycle}, {"epoch", f.epoch}, {"codec", f.codec}, {"op", f.op}, {"message", f.message}});
  j["passed"] = total_failures_ == 0;
  return j;
}

std::string Soak::ToMarkdown() const {
  std::ostringstream m;
  m << "# mzcache reliability soak\n\n";
  m << "Model `" << a_.model << "`, seed " << a_.seed << ", " << cycles_run_ << " of " << a_.cycles << " cycles in "
    << epochs_run_ << " epochs of " << per_epoch_ << " (n_ctx " << a_.n_ctx << ", chunks of " << a_.chunk_tokens
    << " tokens, " << a_.threads << " threads), wall time " << Fmt("%.1f", wall_s_) << " s. **"
    << (total_failures_ ? std::to_string(total_failures_) + " failures" : std::string("No failure")) << "**.\n\n";
  m << "Reproduce: `" << Reproducer(-1) << "`\n\n";
  m << "## Cycles per operation and codec\n\n| codec | epochs | cycles |";
  for (const char* o : kOpNames) m << " " << o << " |";
  m << "\n|---|---|---|";
  for (int o = 0; o < kNumOps; ++o) m << "---|";
  m << "\n";
  for (const auto& c : stats_) {
    m << "| " << c.codec << " | " << c.epochs << " | " << c.cycles << " |";
    for (int o = 0; o < kNumOps; ++o) m << " " << c.ops[o] << " |";
    m << "\n";
  }
  m << "| all | | " << cycles_run_ << " |";
  for (int o = 0; o < kNumOps; ++o) m << " " << op_count_[o] << " |";
  m << "\n| seconds | | |";
  for (int o = 0; o < kNumOps; ++o) m << " " << Fmt("%.1f", op_seconds_[o]) << " |";
  m << "\n\nEviction plans:\n\n| codec |";
  for (const char* p : kPlanNames) m << " " << p << " |";
  m << " refused (expected) | bytes freed (MiB) |\n|---|";
  for (int p = 0; p < kNumPlans; ++p) m << "---|";
  m << "---|---|\n";
  for (const auto& c : stats_) {
    m << "| " << c.codec << " |";
    for (int p = 0; p < kNumPlans; ++p) m << " " << c.plans[p] << " |";
    m << " " << c.refusals << " | " << Fmt("%.0f", double(c.bytes_freed) / 1048576.0) << " |\n";
  }
  m << "\n## Against the oracle\n\n";
  m << "| codec | comparisons | bit-identical | top-1 agreement | max abs logit diff | KL mean | KL p99 | KL max | KL "
       "bound | one-pass reference KL mean (rows) | subject / reference | failures |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& c : stats_) {
    const Percentiles k = Summarize(c.kl);
    const std::string agree = c.comparisons ? Fmt("%.4f", double(c.top1_agree) / double(c.comparisons)) : "-";
    m << "| " << c.codec << " | " << c.comparisons << " | " << c.identical << " | " << agree << " | "
      << (c.lossless ? Fmt("%.3g", c.max_abs_diff) : "-") << " | " << (c.lossless ? "-" : Fmt("%.2e", k.mean)) << " | "
      << (c.lossless ? "-" : Fmt("%.2e", k.p99)) << " | " << (c.lossless ? "-" : Fmt("%.2e", k.max)) << " | "
      << (c.lossless ? "exact" : Fmt("%.3g", c.max_kl)) << " | "
      << (c.lossless ? "-" : Fmt("%.2e", Summarize(c.ref_kl).mean) + " (" + std::to_string(c.ref_kl.size()) + ")")
      << " | "
      << (c.lossless || c.ref_kl.empty()
              ? std::string("-")
              : Fmt("%.2f", RefRatio(c)) + (c.ref_kl.size() >= kMinRefPairs ? "" : " (too few rows to check)"))
      << " | " << c.failures << " |\n";
  }
  m << "\nLossless codecs must equal the oracle bit for bit. A lossy codec fails a comparison whose "
       "KL(oracle || subject) exceeds its bound, and the run if the subject's mean KL over the rows that also got "
       "the one-pass reference (the oracle's conversation passed once whole through the codec) exceeds "
    << Fmt("%.2f", a_.max_kl_ratio) << "x the reference's mean (checked from " << kMinRefPairs << " rows).\n";
  auto mib = [](int64_t kib) { return kib < 0 ? std::string("?") : Fmt("%.1f", double(kib) / 1024.0); };
  m << "\n## Process (drift)\n\n| when | RSS MiB | anonymous MiB | file MiB | peak RSS (VmHWM) MiB | open fds "
       "|\n|---|---|---|---|---|---|\n";
  const std::pair<const char*, const ProcSample*> rows[] = {{"start (models loaded)", &start_},
                                                            {"after the first epoch's teardown", &first_teardown_},
                                                            {"after the middle epoch's teardown", &middle_},
                                                            {"end (all contexts freed)", &end_}};
  for (const auto& r : rows)
    m << "| " << r.first << " | " << mib(r.second->rss_kib) << " | " << mib(r.second->anon_kib) << " | "
      << mib(r.second->file_kib) << " | " << mib(r.second->hwm_kib) << " | " << r.second->fds << " |\n";
  if (!teardowns_.empty()) {
    int64_t lo = teardowns_[0].rss_kib, hi = lo;
    int fd_hi = teardowns_[0].fds;
    for (const auto& t : teardowns_) {
      lo = std::min(lo, t.rss_kib);
      hi = std::max(hi, t.rss_kib);
      fd_hi = std::max(fd_hi, t.fds);
    }
    m << "\nAfter each of the " << teardowns_.size() << " epochs' teardown: RSS " << mib(lo) << " to " << mib(hi)
      << " MiB, at most " << fd_hi << " fds (soak.json: after_each_epoch). Samples are taken after malloc_trim(0).\n";
  }
  m << "\nChecks: fds at the end <= at the start; RSS at the end <= RSS after the first epoch + " << a_.rss_margin_mib
    << " MiB; no file left by the freed contexts.\n";
  if (!failures_.empty()) {
    m << "\n## Failures\n\n| cycle | epoch | codec | op | message |\n|---|---|---|---|---|\n";
    for (const auto& f : failures_) {
      std::string msg = f.message;
      for (auto& ch : msg)
        if (ch == '\n') ch = ' ';
      for (size_t i = msg.find('|'); i != std::string::npos; i = msg.find('|', i + 2)) msg.insert(i, "\\");
      m << "| " << f.cycle << " | " << f.epoch << " | " << f.codec << " | " << f.op << " | " << msg << " |\n";
    }
    if (total_failures_ > failures_.size()) m << "\n(" << total_failures_ - failures_.size() << " more not listed)\n";
  }
  return m.str();
}

bool Soak::WriteOutputs() {
  const std::string md = ToMarkdown();
  std::fputs(md.c_str(), stdout);
  if (a_.out_dir.empty()) return true;
  if (!MakeDirs(a_.out_dir)) {
    std::fprintf(stderr, "error: cannot create %s\n", a_.out_dir.c_str());
    return false;
  }
  std::ofstream j(a_.out_dir + "/soak.json", std::ios::trunc);
  j << ToJson().dump(1) << "\n";
  std::ofstream f(a_.out_dir + "/soak.md", std::ios::trunc);
  f << md;
  if (!j || !f) {
    std::fprintf(stderr, "error: cannot write %s/soak.{json,md}\n", a_.out_dir.c_str());
    return false;
  }
  std::fprintf(stderr, "wrote %s/soak.json and %s/soak.md\n", a_.out_dir.c_str(), a_.out_dir.c_str());
  return true;
}

int Soak::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  if (!Setup()) return 1;
  start_ = SampleProc();
  const uint64_t nc = uint64_t(a_.codecs.size());
  per_epoch_ = uint64_t(a_.epoch_cycles);
  if (per_epoch_ == 0) per_epoch_ = std::clamp<uint64_t>(a_.cycles / (2 * nc), 10, 200);
  n_epochs_ = int((a_.cycles + per_epoch_ - 1) / per_epoch_);
  if (a_.only_epoch >= n_epochs_) {
    std::fprintf(stderr, "error: --epoch %d: this run has %d epochs\n", a_.only_epoch, n_epochs_);
    return 1;
  }
  const int e0 = a_.only_epoch >= 0 ? a_.only_epoch : 0, e1 = a_.only_epoch >= 0 ? a_.only_epoch + 1 : n_epochs_;
  auto epoch_cycles = [&](int e) { return std::min<uint64_t>(per_epoch_, a_.cycles - uint64_t(e) * per_epoch_); };
  uint64_t to_run = 0;
  for (int e = e0; e < e1; ++e) to_run += epoch_cycles(e);
  std::fprintf(stderr, "soak: %s, %llu cycles in %d epochs of %llu over %llu codecs, seed %llu, work dir %s\n",
               a_.model.c_str(), (unsigned long long)to_run, e1 - e0, (unsigned long long)per_epoch_,
               (unsigned long long)nc, (unsigned long long)a_.seed, tmp_.c_str());
  bool have_first = false, have_middle = false;
  for (int e = e0; e < e1; ++e) {
    const uint64_t base = uint64_t(e) * per_epoch_, n = epoch_cycles(e);
    ++epochs_run_;
    if (StartEpoch(e)) {
      for (uint64_t i = 0; i < n; ++i) {
        RunCycle(int64_t(base + i));
        Progress("soak cycles [1 MiB = 1 cycle]", (++cycles_run_) << 20, to_run << 20);
        if (a_.stop_on_failure && total_failures_) break;
      }
    }
    EndEpoch();
    teardowns_.push_back(SampleProc());
    if (!have_first) {
      first_teardown_ = teardowns_.back();
      have_first = true;
    }
    if (e == (e0 + e1 - 1) / 2) {
      middle_ = teardowns_.back();
      have_middle = true;
    }
    if (a_.stop_on_failure && total_failures_) break;
  }
  // The models stay loaded (as at the start): the end is the same process state as the start.
  end_ = SampleProc();
  if (!have_middle) middle_ = end_;
  // Run-level check of the lossy codecs against their one-pass reference.
  op_ = -1;
  cycle_ = -1;
  epoch_ = -1;
  for (auto& c : stats_) {
    if (c.lossless || c.ref_kl.size() < kMinRefPairs) continue;
    cs_ = &c;
    codec_ = c.codec;
    const double ratio = RefRatio(c);
    if (ratio > a_.max_kl_ratio)
      Fail("mean KL of the subject " + Fmt("%.3g", Summarize(c.ref_subject_kl).mean) + " is " + Fmt("%.2f", ratio) +
           "x the one-pass reference's " + Fmt("%.3g", Summarize(c.ref_kl).mean) + " over " +
           std::to_string(c.ref_kl.size()) + " rows (bound " + Fmt("%.2f", a_.max_kl_ratio) + "x): error accumulates");
  }
  cs_ = nullptr;
  codec_.clear();
  epoch_ = -1;
  if (end_.fds < 0 || end_.rss_kib < 0) Fail("cannot read /proc/self/status or /proc/self/fd");
  if (end_.fds > start_.fds)
    Fail("file descriptors: " + std::to_string(end_.fds) + " open at the end, " + std::to_string(start_.fds) +
         " at the start");
  const int64_t margin_kib = int64_t(a_.rss_margin_mib) * 1024;
  if (end_.rss_kib > first_teardown_.rss_kib + margin_kib)
    Fail("RSS drift: " + Fmt("%.1f", double(end_.rss_kib) / 1024.0) + " MiB at the end, " +
         Fmt("%.1f", double(first_teardown_.rss_kib) / 1024.0) + " MiB after the first epoch (margin " +
         std::to_string(a_.rss_margin_mib) + " MiB)");
  wall_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool wrote = WriteOutputs();
  return total_failures_ || !wrote ? 1 : 0;
}

}  // namespace

void AddSoakCommand(CLI::App* reliability, Runners& runners) {
  auto a = std::make_shared<SoakArgs>();
  auto* c = reliability->add_subcommand(
      "soak", "seeded random evict/restore/restore_generate/decode/truncate/session cycles against a never-evicted "
              "oracle: exact for lossless codecs, bounded KL for lossy ones; RSS and fd drift checks");
  c->add_option("-m,--model", a->model,
                "GGUF path (default: the synthesized Qwen3-0.6B q8_0; build/test-models/tiny-qwen3-q8_0.gguf is much faster)");
  c->add_option("--cycles", a->cycles, "random cycles in all, split over the codecs in epochs")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
  c->add_option("--seed", a->seed, "seed of the operations (each epoch: this seed and the epoch index)");
  c->add_option("-t,--threads", a->threads, "compute threads of each context")->check(CLI::Range(1, 256));
  c->add_option("-c,--ctx", a->n_ctx, "context size in tokens (n_ctx); near it the contexts are truncated")
      ->check(CLI::Range(16, 1 << 20));
  c->add_option("--chunk-tokens", a->chunk_tokens, "tokens per KV chunk (small: many chunks, many states)")
      ->check(CLI::Range(1, 65536));
  c->add_option("--max-tokens", a->max_tokens, "most tokens of one decode / restore_generate (a quarter of them; else 1..8)")
      ->check(CLI::Range(1, 1 << 16));
  c->add_option("--codecs", a->codecs, "KV codecs, comma-separated (none, q8, q4, cachegen, lz4, zstd)")->delimiter(',');
  c->add_option("--epoch-cycles", a->epoch_cycles,
                "cycles per epoch (fresh contexts each epoch; 0: cycles / (2 x codecs), clamped to 10..200)")
      ->check(CLI::Range(0, 1 << 30));
  c->add_option("--epoch", a->only_epoch, "run only this epoch (0-based) of the same run: a failure's replay")
      ->check(CLI::Range(0, 1 << 30));
  c->add_option("--max-kl", a->max_kl, kMaxKlHelp);
  c->add_option("--reference-rate", a->ref_rate,
                "share of the lossy comparisons that also measure the one-pass reference: the oracle's "
                "conversation passed once whole through the codec (session save/load into a probe context)")
      ->check(CLI::Range(0.0, 1.0));
  c->add_option("--max-kl-ratio", a->max_kl_ratio,
                "run-level bound of a lossy codec: its mean KL over the rows that also got the one-pass "
                "reference, divided by the reference's mean KL (checked from 8 such rows). ~1 means cycles "
                "add no error beyond one pass through the codec")
      ->check(CLI::Range(0.0, 1e9));
  c->add_option("--rss-margin", a->rss_margin_mib,
                "MiB the RSS at the end may exceed the RSS after the first epoch's teardown (both after "
                "malloc_trim; measured: within 1.5 MiB over 50 epochs on tiny-qwen3)");
  c->add_option("-o,--out", a->out_dir, "folder for soak.json and soak.md");
  c->add_option("--work-dir", a->work_dir, "where the private temporary folder goes (default $TMPDIR, else /var/tmp)");
  c->add_flag("--stop-on-failure", a->stop_on_failure, "stop at the first failure");
  c->add_flag("-v,--verbose", a->verbose, "print every cycle: operation, its parameters, token count and unit states");
  for (CLI::Option* o : c->get_options()) o->capture_default_str();  // --help shows the defaults
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    try {
      Soak s(*a);
      return s.Run();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    } catch (...) {
      std::fprintf(stderr, "error: unknown exception\n");
      return 1;
    }
  });
}

}  // namespace mz::cli
