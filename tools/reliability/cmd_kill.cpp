// `mzcache reliability kill`: SIGKILL at random points, then reopen: the old state or the new one,
// exactly (issue 25, docs/reliability.md). A thin tool over the public C API (mzcache.h).
//
// Each kill starts a child (`reliability-kill-worker`, hidden) in a fresh folder, waits until it has
// completed its first save (or pool commit), lets it work for a random delay in [0, --max-delay-ms],
// SIGKILLs it and reopens what it left:
//   session  the child appends turns to one context and saves it after each turn
//            (mz_session_save, lossless codec "none"): the kill lands in a decode or a save.
//   evict    as session, but before each save every KV chunk is evicted to storage (a plan of
//            random storage states, lossless codecs none/lz4/zstd), so saves read the swap file and
//            the kill lands in evictions too. The reopening context reuses the child's swap path
//            (the leftover file of a killed process) and evicts to it before its probe.
//   pool     the child runs a pool (a memory budget of the weights only, so idle and active
//            conversations go to storage after every call; write-behind with no idle delay; now and
//            then a conversation is closed, so its stored file becomes its storage tier), appending
//            turns to several conversations and committing each.
// The child reports on its stdout, line by line, what it began and what completed ("begin K" /
// "done K" around a save of K turns, "evict K" / "evicted K", "commit I K" and "durable I D" for
// the pool, D = the turns the pool reports stored). Those lines survive its death in the pipe.
//
// Reopening checks, per state (a session file, or each conversation of the pool):
//   - it opens (a damaged file is a failure: these writes are meant to be crash-safe);
//   - it holds a whole number of turns K, and K is what the child's lines allow: the last save done,
//     or the one begun (session, evict); at most the turns begun, at most one fewer than the turns
//     committed (the turn in flight), and never fewer than the pool said were stored (pool);
//   - the logits of one probe token decoded after it equal, bit for bit, those of a context in this
//     process that decoded the same K turns and was never saved, evicted or killed (lossless codecs
//     everywhere, so "exactly" is exact). A mismatch is a silently wrong state: a failure.
// Outcomes are counted (latest, old, new, turns lost to the write-behind) and written to
// kill.json / kill.md; any failure makes the exit status 1 and keeps that kill's folder.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mzcache.h"
#include "tools/bench/child_process.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

namespace fs = std::filesystem;

struct KillArgs {
  std::string model;
  int kills = 500;
  std::string scenarios = "session,evict,pool";
  uint64_t seed = 1;
  uint64_t stream_seed = 1;  // child: the token streams' seed (the harness's --seed; seed is the child's own)
  int threads = 1;  // crash safety does not depend on it; two spinning threads stall on a busy machine
  int turn = 8;            // tokens per turn
  int chunk = 16;          // tokens per KV chunk (small: many chunks, many units)
  int n_ctx = 1024;
  int convs = 3;           // pool scenario
  int max_delay_ms = 1500;
  std::string out_dir;
  std::string work_dir;
  bool keep = false;
  bool flip_bit = false;  // negative control: damage each stored state before it is reopened
};

// ---- shared by harness and child -----------------------------------------------------------

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Token `pos` of stream s (deterministic in seed; the first token differs per stream, so no two
// streams share a prefix chunk).
std::vector<mz_token> TurnTokens(uint64_t seed, int stream, int turn, int turn_tokens, int n_vocab) {
  std::vector<mz_token> t(turn_tokens);
  const int span = std::max(2, std::min(n_vocab, 32000) - 1);
  for (int i = 0; i < turn_tokens; ++i)
    t[i] = mz_token(1 + Mix(seed * 1000003ull + uint64_t(stream) * 7919ull + uint64_t(turn) * 131ull + i) % span);
  return t;
}

mz_token ProbeToken(int n_vocab) { return mz_token(std::min(n_vocab - 1, 42)); }

uint64_t HashLogits(const float* p, int n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < size_t(n) * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

mz_context_params CtxParams(const KillArgs& a, const char* codec, const std::string& swap) {
  mz_context_params p = mz_context_default_params();
  p.n_ctx = uint32_t(a.n_ctx);
  p.kv_chunk_tokens = uint32_t(a.chunk);
  p.n_threads = a.threads;
  p.kv_codec = codec;
  if (!swap.empty()) p.swap_path = swap.c_str();
  return p;
}

const char* kLossless[] = {"none", "lz4", "zstd"};

// ---- the child -------------------------------------------------------------------------------

// One line to the harness, written whole with write(2) (no stdio buffer to lose at the kill).
void Say(const std::string& line) {
  std::string s = line + "\n";
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = write(1, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      _exit(3);  // the harness is gone
    }
    p += w;
    n -= size_t(w);
  }
}

int WorkerFail(const char* what) {
  Say(std::string("error ") + what + ": " + mz_last_error());
  return 1;
}

// Every KV chunk of ctx to a random storage (or in-memory compressed) state. REQUIRES: all resident
// (after a decode with a lossless codec, compute restored every chunk it read).
int EvictAllKv(mz_context* ctx, int n_layer, int chunk_tokens, std::mt19937_64& rng) {
  const int n = mz_context_n_tokens(ctx);
  const int chunks = (n + chunk_tokens - 1) / chunk_tokens;
  std::vector<mz_placement> items;
  const int32_t states[] = {MZ_STATE_KV_STORAGE_RAW, MZ_STATE_KV_STORAGE_COMPRESSED, MZ_STATE_KV_MEM_COMPRESSED};
  for (int l = n_layer - 1; l >= 0; --l)
    for (int c = chunks - 1; c >= 0; --c) items.push_back({MZ_UNIT_KV, l, c, states[rng() % 3]});
  mz_plan plan{items.data(), items.size()};
  return mz_evict(ctx, 0, &plan, nullptr);
}

int RunWorker(const KillArgs& a, const std::string& scenario, const std::string& dir) {
  mz_model* model = nullptr;
  if (mz_model_load(a.model.c_str(), nullptr, &model) != MZ_OK) return WorkerFail("model");
  std::unique_ptr<mz_model, void (*)(mz_model*)> mguard(model, mz_model_free);
  mz_model_info info{};
  mz_model_get_info(model, &info);
  std::mt19937_64 rng(a.seed);
  const int max_turns = a.n_ctx / a.turn - 1;
  if (scenario == "session" || scenario == "evict") {
    const char* codec = scenario == "evict" ? kLossless[a.seed % 3] : "none";
    const std::string swap = dir + "/ctx.swap";
    mz_context_params p = CtxParams(a, codec, swap);
    mz_context* ctx = nullptr;
    if (mz_context_new(model, &p, &ctx) != MZ_OK) return WorkerFail("context");
    std::unique_ptr<mz_context, void (*)(mz_context*)> cguard(ctx, mz_context_free);
    const std::string path = dir + "/s.mzs";
    Say("ready");
    for (int k = 1; k <= max_turns; ++k) {
      const auto t = TurnTokens(a.stream_seed, 0, k - 1, a.turn, info.n_vocab);
      if (mz_decode(ctx, t.data(), int32_t(t.size()), false) != MZ_OK) return WorkerFail("decode");
      if (scenario == "evict") {
        Say("evict " + std::to_string(k));
        if (EvictAllKv(ctx, info.n_layer, a.chunk, rng) != MZ_OK) return WorkerFail("evict");
        Say("evicted " + std::to_string(k));
      }
      Say("begin " + std::to_string(k));
      if (mz_session_save(ctx, path.c_str(), "none") != MZ_OK) return WorkerFail("save");
      Say("done " + std::to_string(k));
    }
    Say("full");
    pause();
    return 0;
  }
  // pool
  mz_pool_params pp = mz_pool_default_params();
  mz_context_params cp = CtxParams(a, "none", "");
  pp.dir = dir.c_str();
  pp.persist_codec = "none";
  pp.write_behind = true;
  pp.write_behind_idle_ms = 0;
  pp.context = &cp;
  mz_pool* pool = nullptr;
  if (mz_pool_new(model, &pp, &pool) != MZ_OK) return WorkerFail("pool");
  mz_pool_report rep{};
  mz_pool_get_report(pool, &rep);
  // The weights alone: every call ends with the idle conversations out whole and the active one's
  // KV placed by the hybrid swap, so evictions to storage run all the time.
  pp.memory_budget = rep.weights_total;
  mz_pool_free(pool);
  pool = nullptr;
  if (mz_pool_new(model, &pp, &pool) != MZ_OK) return WorkerFail("pool");
  std::unique_ptr<mz_pool, void (*)(mz_pool*)> pguard(pool, mz_pool_free);
  std::vector<int> turns(a.convs, 0);
  std::vector<mz_conversation*> h(a.convs, nullptr);
  Say("ready");
  for (;;) {
    std::vector<int> open_slots;
    for (int i = 0; i < a.convs; ++i)
      if (turns[i] < max_turns) open_slots.push_back(i);
    if (open_slots.empty()) break;
    const int i = open_slots[rng() % open_slots.size()];
    const std::string id = "c" + std::to_string(i);
    if (!h[i] && mz_pool_open(pool, id.c_str(), &h[i]) != MZ_OK) return WorkerFail("open");
    const auto t = TurnTokens(a.stream_seed, i, turns[i], a.turn, info.n_vocab);
    Say("turn " + std::to_string(i) + " " + std::to_string(turns[i] + 1));  // begun: may be stored from now on
    if (mz_conversation_decode(h[i], t.data(), int32_t(t.size()), false) != MZ_OK) return WorkerFail("decode");
    if (mz_conversation_commit(h[i]) != MZ_OK) return WorkerFail("commit");
    turns[i]++;
    Say("commit " + std::to_string(i) + " " + std::to_string(turns[i]));
    mz_conversation_report r{};
    if (mz_pool_conversation_report(pool, id.c_str(), &r) != MZ_OK) return WorkerFail("report");
    Say("durable " + std::to_string(i) + " " + std::to_string(r.stored_tokens / a.turn));
    if (rng() % 8 == 0) {  // closed: persisted now, reopened later from its file as storage tier
      mz_conversation_release(h[i]);
      h[i] = nullptr;
      int st = mz_pool_close(pool, id.c_str());
      if (st != MZ_OK && st != MZ_ERR_BUSY) return WorkerFail("close");
      if (mz_pool_conversation_report(pool, id.c_str(), &r) != MZ_OK) return WorkerFail("report");
      Say("durable " + std::to_string(i) + " " + std::to_string(r.stored_tokens / a.turn));
    }
  }
  Say("full");
  pause();
  return 0;
}

// ---- the harness -----------------------------------------------------------------------------

// Probe logits hashes of a never-evicted context per stream: hashes[k] after k turns.
class Oracle {
 public:
  Oracle(mz_model* m, const KillArgs& a) : m_(m), a_(a) { mz_model_get_info(m, &info_); }
  ~Oracle() {
    for (auto& kv : ctx_) mz_context_free(kv.second);
  }
  // The probe hash after k turns of stream s; false on a library error.
  bool Get(int s, int k, uint64_t* out) {
    auto& hs = hashes_[s];
    if (!ctx_.count(s)) {
      mz_context_params p = CtxParams(a_, "none", "");
      mz_context* c = nullptr;
      if (mz_context_new(m_, &p, &c) != MZ_OK) return false;
      ctx_[s] = c;
    }
    mz_context* c = ctx_[s];
    if (hs.empty()) hs.push_back(0);  // 0 turns: nothing to probe (never asked)
    while (int(hs.size()) <= k) {
      const int t = int(hs.size());  // hash of t turns: decode turn t-1 first
      const auto tok = TurnTokens(a_.seed, s, t - 1, a_.turn, info_.n_vocab);
      if (mz_decode(c, tok.data(), int32_t(tok.size()), false) != MZ_OK) return false;
      const mz_token probe = ProbeToken(info_.n_vocab);
      if (mz_decode(c, &probe, 1, false) != MZ_OK) return false;
      hs.push_back(HashLogits(mz_get_logits(c, 0), info_.n_vocab));
      if (mz_context_truncate(c, mz_context_n_tokens(c) - 1) != MZ_OK) return false;
    }
    *out = hs[k];
    return true;
  }
  const mz_model_info& info() const { return info_; }

 private:
  mz_model* m_;
  const KillArgs& a_;
  mz_model_info info_{};
  std::map<int, mz_context*> ctx_;
  std::map<int, std::vector<uint64_t>> hashes_;
};

// What the child said before it died.
struct ChildLog {
  int last_begin = 0, last_done = 0;  // session, evict
  int last_evict = 0, last_evicted = 0;
  bool ready = false, full = false;
  std::string error;
  std::map<int, int> begun, committed, durable;  // pool: conversation -> turns
  void Parse(const std::string& line) {
    std::istringstream in(line);
    std::string w;
    in >> w;
    int x = 0, y = 0;
    if (w == "ready") ready = true;
    else if (w == "full") full = true;
    else if (w == "error") error = line.substr(6);
    else if (w == "begin" && (in >> x)) last_begin = x;
    else if (w == "done" && (in >> x)) last_done = x;
    else if (w == "evict" && (in >> x)) last_evict = x;
    else if (w == "evicted" && (in >> x)) last_evicted = x;
    else if (w == "turn" && (in >> x >> y)) begun[x] = y;
    else if (w == "commit" && (in >> x >> y)) committed[x] = y;
    else if (w == "durable" && (in >> x >> y)) durable[x] = std::max(durable[x], y);
  }
};

// Reads what fd has until deadline (steady clock) or EOF; feeds whole lines to log. Returns false
// at EOF.
bool Drain(int fd, std::string& buf, ChildLog& log, std::chrono::steady_clock::time_point deadline, bool until_ready) {
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return true;
    if (until_ready && log.ready) return true;
    pollfd p{fd, POLLIN, 0};
    const int ms = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return true;
    char tmp[4096];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf.append(tmp, size_t(n));
    size_t pos;
    while ((pos = buf.find('\n')) != std::string::npos) {
      log.Parse(buf.substr(0, pos));
      buf.erase(0, pos + 1);
    }
  }
}

struct ScenarioTally {
  int kills = 0;
  std::map<std::string, int> outcomes;  // per reopened state
  std::map<std::string, int> phases;    // where the kill landed (as the child's lines tell)
  std::map<int, int> lost_turns;        // pool: committed - reopened, per conversation
  std::vector<std::string> failures;
};

// Reopens a session/evict child's folder and classifies it. Returns the outcome; failure: *why set.
std::string CheckSession(mz_model* m, const KillArgs& a, const std::string& scenario, const std::string& dir,
                         const ChildLog& log, Oracle& oracle, std::string* why) {
  const std::string path = dir + "/s.mzs";
  // The child's swap path: its leftover file (a killed process never removed it) is reused.
  const std::string swap = dir + "/ctx.swap";
  mz_context_params p = CtxParams(a, "none", swap);
  mz_context* ctx = nullptr;
  if (mz_context_new(m, &p, &ctx) != MZ_OK) {
    *why = std::string("context: ") + mz_last_error();
    return "error";
  }
  std::unique_ptr<mz_context, void (*)(mz_context*)> guard(ctx, mz_context_free);
  int k = 0;
  if (fs::exists(path)) {
    if (mz_session_load(ctx, path.c_str()) != MZ_OK) {
      *why = std::string("damaged: ") + mz_last_error();
      return "damaged";
    }
    const int n = mz_context_n_tokens(ctx);
    if (n % a.turn != 0) {
      *why = "torn: " + std::to_string(n) + " tokens";
      return "torn";
    }
    k = n / a.turn;
  }
  std::string outcome;
  if (k == log.last_done && log.last_begin == log.last_done) outcome = k == 0 ? "empty" : "latest";
  else if (k == log.last_done && log.last_begin == log.last_done + 1) outcome = k == 0 ? "empty" : "old";
  else if (k == log.last_begin && k == log.last_done + 1) outcome = "new";
  else {
    *why = "holds " + std::to_string(k) + " turns; the child had done " + std::to_string(log.last_done) +
           " and begun " + std::to_string(log.last_begin);
    return k < log.last_done ? "lost" : "wrong";
  }
  if (k == 0) return outcome;
  if (scenario == "evict") {  // the reused swap path takes every chunk before the probe
    std::mt19937_64 rng(a.seed + 7);
    if (EvictAllKv(ctx, oracle.info().n_layer, a.chunk, rng) != MZ_OK) {
      *why = std::string("evict after reopen: ") + mz_last_error();
      return "error";
    }
  }
  const mz_token probe = ProbeToken(oracle.info().n_vocab);
  if (mz_decode(ctx, &probe, 1, false) != MZ_OK) {
    *why = std::string("probe: ") + mz_last_error();
    return "error";
  }
  uint64_t want = 0;
  if (!oracle.Get(0, k, &want)) {
    *why = std::string("oracle: ") + mz_last_error();
    return "error";
  }
  if (HashLogits(mz_get_logits(ctx, 0), oracle.info().n_vocab) != want) {
    *why = "logits after " + std::to_string(k) + " turns differ from the never-killed context's";
    return "wrong";
  }
  return outcome;
}

// Reopens a pool child's folder; one outcome per conversation into t (failures appended).
void CheckPool(mz_model* m, const KillArgs& a, const std::string& dir, const ChildLog& log, Oracle& oracle,
               ScenarioTally& t, int kill_no) {
  mz_context_params cp = CtxParams(a, "none", "");
  mz_pool_params pp = mz_pool_default_params();
  pp.dir = dir.c_str();
  pp.persist_codec = "none";
  pp.write_behind = false;
  pp.context = &cp;
  mz_pool* pool = nullptr;
  const std::string tag = "kill " + std::to_string(kill_no) + " (pool): ";
  if (mz_pool_new(m, &pp, &pool) != MZ_OK) {
    t.failures.push_back(tag + "pool: " + mz_last_error());
    t.outcomes["error"]++;
    return;
  }
  std::unique_ptr<mz_pool, void (*)(mz_pool*)> guard(pool, mz_pool_free);
  for (int d = 0;; ++d) {
    char buf[512];
    if (mz_pool_damaged(pool, d, buf, sizeof buf) < 0) break;
    t.failures.push_back(tag + "damaged " + buf);
    t.outcomes["damaged"]++;
  }
  for (int i = 0; i < a.convs; ++i) {
    const std::string id = "c" + std::to_string(i);
    const int committed = log.committed.count(i) ? log.committed.at(i) : 0;
    const int begun = log.begun.count(i) ? log.begun.at(i) : 0;
    const int durable = log.durable.count(i) ? log.durable.at(i) : 0;
    mz_conversation_report r{};
    int k = 0;
    if (mz_pool_conversation_report(pool, id.c_str(), &r) == MZ_OK) {
      if (r.stored_tokens % a.turn != 0) {
        t.failures.push_back(tag + id + " torn: " + std::to_string(r.stored_tokens) + " tokens");
        t.outcomes["torn"]++;
        continue;
      }
      k = r.stored_tokens / a.turn;
    }
    // The pool's promise: the stored file is at most one committed turn behind (Commit waits for
    // the previous commit's write), never behind what it reported stored. It may hold the turn
    // begun last (decoded, persisted before its commit line was written, or by the idle write).
    if (k > begun || k < durable || committed - k > 1) {
      t.failures.push_back(tag + id + " holds " + std::to_string(k) + " turns; begun " + std::to_string(begun) +
                           ", committed " + std::to_string(committed) + ", reported stored " + std::to_string(durable));
      t.outcomes[k > begun ? "wrong" : "lost"]++;
      continue;
    }
    t.lost_turns[committed - k]++;  // -1: the turn begun last, stored before its commit returned
    if (k == 0) {
      t.outcomes[committed == 0 ? "empty" : "older"]++;
      continue;
    }
    mz_conversation* c = nullptr;
    if (mz_pool_open(pool, id.c_str(), &c) != MZ_OK) {
      t.failures.push_back(tag + id + " open: " + mz_last_error());
      t.outcomes["error"]++;
      continue;
    }
    const mz_token probe = ProbeToken(oracle.info().n_vocab);
    const int st = mz_conversation_decode(c, &probe, 1, false);
    uint64_t want = 0;
    if (st != MZ_OK || !oracle.Get(i, k, &want)) {
      t.failures.push_back(tag + id + " probe: " + mz_last_error());
      t.outcomes["error"]++;
    } else if (HashLogits(mz_conversation_logits(c, 0), oracle.info().n_vocab) != want) {
      t.failures.push_back(tag + id + " logits after " + std::to_string(k) + " turns differ from the never-killed context's");
      t.outcomes["wrong"]++;
    } else {
      t.outcomes[k == committed ? "latest" : k > committed ? "newer" : "older"]++;
    }
    mz_conversation_release(c);
  }
}

template <class K, class V>
std::string fmt_kv(const K& k, const V& v) {
  std::ostringstream o;
  o << k << ": " << v;
  return o.str();
}

// The negative control (--flip-bit): one bit in the middle of path flipped, if the file exists.
void FlipMiddleBit(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size <= 0) return;
  f.seekg(size / 2);
  char b = 0;
  f.read(&b, 1);
  b = char(b ^ 0x10);
  f.seekp(size / 2);
  f.write(&b, 1);
}

bool IsFailure(const std::string& outcome) {
  return outcome != "latest" && outcome != "old" && outcome != "new" && outcome != "empty" && outcome != "older" &&
         outcome != "newer";
}

int RunKill(KillArgs a) {
  if (a.model.empty()) {
    Status st = EnsureDefaultModel(&a.model);
    if (!st.ok()) return Fail(st);
  }
  if (a.kills < 1 || a.turn < 1 || a.chunk < 1 || a.n_ctx < 4 * a.turn || a.convs < 1 || a.max_delay_ms < 0) {
    std::fprintf(stderr, "error: --kills, --turn, --chunk, --convs must be >= 1, --ctx >= 4 turns\n");
    return 2;
  }
  std::vector<std::string> scen;
  {
    std::stringstream ss(a.scenarios);
    std::string s;
    while (std::getline(ss, s, ','))
      if (s == "session" || s == "evict" || s == "pool") scen.push_back(s);
      else {
        std::fprintf(stderr, "error: unknown scenario '%s' (session, evict, pool)\n", s.c_str());
        return 2;
      }
  }
  if (scen.empty()) return 2;
  if (a.work_dir.empty()) a.work_dir = CacheDir() + "/reliability-kill";
  std::error_code ec;
  fs::create_directories(a.work_dir, ec);
  if (ec) {
    std::fprintf(stderr, "error: %s: %s\n", a.work_dir.c_str(), ec.message().c_str());
    return 1;
  }
  mz_model* model = nullptr;
  if (int rc = mz_model_load(a.model.c_str(), nullptr, &model)) return CFail("loading " + a.model, rc);
  std::unique_ptr<mz_model, void (*)(mz_model*)> mguard(model, mz_model_free);
  Oracle oracle(model, a);
  std::map<std::string, ScenarioTally> tally;
  std::mt19937_64 rng(a.seed);
  const auto t0 = std::chrono::steady_clock::now();
  int failures = 0;
  for (int n = 0; n < a.kills; ++n) {
    const std::string& s = scen[size_t(n) % scen.size()];
    ScenarioTally& t = tally[s];
    const uint64_t child_seed = a.seed * 1000 + uint64_t(n);
    const std::string dir = a.work_dir + "/kill-" + std::to_string(n);
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);
    std::vector<std::string> argv{SelfExe(), "reliability-kill-worker", "--scenario", s, "--dir", dir, "-m", a.model,
                                  "--seed", std::to_string(child_seed), "--stream-seed", std::to_string(a.seed), "-t", std::to_string(a.threads), "--turn",
                                  std::to_string(a.turn), "--chunk", std::to_string(a.chunk), "--ctx",
                                  std::to_string(a.n_ctx), "--convs", std::to_string(a.convs)};
    PipedChild c;
    Status st = SpawnPiped(argv, &c);
    if (!st.ok()) return Fail(st);
    ChildLog log;
    std::string buf;
    const int fd = fileno(c.out);
    bool alive = Drain(fd, buf, log, std::chrono::steady_clock::now() + std::chrono::seconds(120), true);
    // The delay runs from the child's first completed state (its first turn also warms up the
    // compute: ~0.4 s here, which would otherwise take most of the window).
    const auto wait_end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (alive && log.ready && log.last_done < 1 && log.committed.empty() && std::chrono::steady_clock::now() < wait_end)
      alive = Drain(fd, buf, log, std::chrono::steady_clock::now() + std::chrono::milliseconds(5), false);
    const int delay = a.max_delay_ms ? int(rng() % uint64_t(a.max_delay_ms + 1)) : 0;
    if (alive && log.ready)
      alive = Drain(fd, buf, log, std::chrono::steady_clock::now() + std::chrono::milliseconds(delay), false);
    kill(c.pid, SIGKILL);
    while (Drain(fd, buf, log, std::chrono::steady_clock::now() + std::chrono::seconds(30), false)) {
    }
    const int ws = ReapPiped(c, false);
    t.kills++;
    if (a.flip_bit) FlipMiddleBit(s == "pool" ? dir + "/c0.mzs" : dir + "/s.mzs");
    const std::string tag = "kill " + std::to_string(n) + " (" + s + "): ";
    bool failed = false;
    if (!log.ready || !log.error.empty() || !(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL)) {
      t.failures.push_back(tag + "the child " + (log.error.empty() ? "died before the kill" : "failed: " + log.error));
      t.outcomes["child error"]++;
      failed = true;
    } else if (s == "pool") {
      const size_t before = t.failures.size();
      t.phases[log.full ? "after the last turn" : "during turns and write-behind"]++;
      CheckPool(model, a, dir, log, oracle, t, n);
      failed = t.failures.size() != before;
    } else {
      std::string phase = log.full ? "after the last turn"
                          : log.last_begin > log.last_done ? "in a save"
                          : log.last_evict > log.last_evicted ? "in an eviction to storage"
                          : s == "evict" ? "in a decode (restoring from storage)"
                                         : "in a decode";
      t.phases[phase]++;
      std::string why;
      const std::string outcome = CheckSession(model, a, s, dir, log, oracle, &why);
      t.outcomes[outcome]++;
      if (IsFailure(outcome)) {
        t.failures.push_back(tag + outcome + ": " + why);
        failed = true;
      }
    }
    if (failed) {
      failures++;
      std::fprintf(stderr, "%s\n", t.failures.back().c_str());
    }
    if (!failed && !a.keep) fs::remove_all(dir, ec);
    if ((n + 1) % std::max(1, a.kills / 10) == 0 || n + 1 == a.kills)
      std::fprintf(stderr, "reliability kill: %d / %d kills, %d failed, %.0f s\n", n + 1, a.kills, failures,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  nlohmann::json j;
  j["model"] = a.model;
  j["seed"] = a.seed;
  j["kills"] = a.kills;
  j["threads"] = a.threads;
  j["turn_tokens"] = a.turn;
  j["chunk_tokens"] = a.chunk;
  j["n_ctx"] = a.n_ctx;
  j["max_delay_ms"] = a.max_delay_ms;
  j["elapsed_s"] = elapsed;
  j["failures"] = failures;
  std::ostringstream md;
  md << "# reliability kill\n\n" << a.kills << " kills (SIGKILL a random 0-" << a.max_delay_ms
     << " ms after the child's first completed save or commit), model `" << fs::path(a.model).filename().string() << "`, seed " << a.seed << ", " << a.turn
     << "-token turns, " << a.chunk << "-token chunks, " << elapsed << " s. Failures: " << failures << ".\n\n";
  md << "| scenario | kills | where the kill landed | reopened states by outcome | turns lost (pool: committed - stored, per conversation) |\n|---|---|---|---|---|\n";
  for (auto& [name, t] : tally) {
    nlohmann::json js;
    js["kills"] = t.kills;
    js["outcomes"] = t.outcomes;
    js["phases"] = t.phases;
    nlohmann::json lt = nlohmann::json::object();
    for (auto& [d, cnt] : t.lost_turns) lt[std::to_string(d)] = cnt;
    js["lost_turns"] = lt;
    js["failure_messages"] = t.failures;
    j["scenarios"][name] = js;
    auto join = [](const auto& m) {
      std::string out;
      for (auto& [k, v] : m) out += (out.empty() ? "" : ", ") + fmt_kv(k, v);
      return out.empty() ? std::string("-") : out;
    };
    md << "| " << name << " | " << t.kills << " | " << join(t.phases) << " | " << join(t.outcomes) << " | "
       << (name == "pool" ? join(t.lost_turns) : std::string("-")) << " |\n";
  }
  md << "\nOutcomes: latest = the last state the child completed; old / new = killed inside a save, the state "
        "before / after it; empty = killed before the first save; older (pool) = one committed turn fewer, "
        "the turn whose write-behind had not finished (a conversation is never more than one turn behind, nor "
        "behind what the pool reported stored); newer (pool) = the turn begun last, stored before its commit "
        "returned (turns lost -1). Every non-empty "
        "state's probe logits equal a never-killed context's bit for bit. Anything else is a failure.\n";
  if (!a.out_dir.empty()) {
    fs::create_directories(a.out_dir, ec);
    std::ofstream(a.out_dir + "/kill.json") << j.dump(2) << "\n";
    std::ofstream(a.out_dir + "/kill.md") << md.str();
    std::fprintf(stderr, "wrote %s/kill.json, kill.md\n", a.out_dir.c_str());
  }
  std::printf("%s", md.str().c_str());
  return failures ? 1 : 0;
}

}  // namespace

void AddKillCommand(CLI::App* rel, CLI::App& app, Runners& runners) {
  auto a = std::make_shared<KillArgs>();
  auto* k = rel->add_subcommand("kill",
                                "SIGKILL a child at random points of session saves, evictions to storage and the pool's "
                                "write-behind; reopen; check the old or the new state, exactly (logits)");
  k->add_option("-m,--model", a->model, "GGUF (default: the synthesized Qwen3-0.6B)");
  k->add_option("--kills", a->kills, "kills in all, spread round-robin over the scenarios (default 500)");
  k->add_option("--scenarios", a->scenarios, "comma list of session, evict, pool (default all)");
  k->add_option("--seed", a->seed, "seed of the delays, token streams and plans (default 1)");
  k->add_option("-t,--threads", a->threads, "compute threads of child and checker (default 1: crash safety does not depend on it, and ggml's two spinning threads stall on a busy machine)");
  k->add_option("--turn", a->turn, "tokens per turn (default 8)");
  k->add_option("--chunk", a->chunk, "tokens per KV chunk (default 16: many units)");
  k->add_option("--ctx", a->n_ctx, "context size; a child that fills it waits to be killed (default 1024)");
  k->add_option("--convs", a->convs, "conversations of the pool scenario (default 3)");
  k->add_option("--max-delay-ms", a->max_delay_ms,
                "each kill lands a uniform random 0..this many ms after the child's first completed save or commit (default 1500)");
  k->add_option("-o,--out", a->out_dir, "write kill.json and kill.md here");
  k->add_option("--work-dir", a->work_dir, "children's folders (default <cache>/reliability-kill); a failing kill's folder is kept");
  k->add_flag("--keep", a->keep, "keep every kill's folder");
  k->add_flag("--flip-bit", a->flip_bit,
              "negative control: flip one bit in the middle of each stored state before reopening it; every "
              "non-empty state must then be reported damaged (and the run fails)");
  runners.push_back([k, a]() -> int { return k->parsed() ? RunKill(*a) : -1; });

  auto w = std::make_shared<KillArgs>();
  auto scenario = std::make_shared<std::string>();
  auto dir = std::make_shared<std::string>();
  auto* wc = app.add_subcommand("reliability-kill-worker", "child of reliability kill");
  wc->group("");  // hidden
  wc->add_option("--scenario", *scenario)->required();
  wc->add_option("--dir", *dir)->required();
  wc->add_option("-m,--model", w->model)->required();
  wc->add_option("--seed", w->seed);
  wc->add_option("--stream-seed", w->stream_seed);
  wc->add_option("-t,--threads", w->threads);
  wc->add_option("--turn", w->turn);
  wc->add_option("--chunk", w->chunk);
  wc->add_option("--ctx", w->n_ctx);
  wc->add_option("--convs", w->convs);
  runners.push_back([wc, w, scenario, dir]() -> int { return wc->parsed() ? RunWorker(*w, *scenario, *dir) : -1; });
}

}  // namespace mz::cli
