#include "runtime/memory_plan.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <vector>

#include "ggml.h"
#include "model/model.h"

namespace mz {

namespace {

constexpr double kMiB = 1048576.0;

std::string MiB(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", double(b) / kMiB);
  return buf;
}

// "key:  value kB" of /proc/meminfo or /proc/self/status, in bytes.
bool Field(const std::string& s, const char* key, uint64_t* v) {
  const std::string k = std::string(key) + ":";
  size_t p = 0;
  while ((p = s.find(k, p)) != std::string::npos) {
    if (p == 0 || s[p - 1] == '\n') {
      char* end = nullptr;
      const unsigned long long x = std::strtoull(s.c_str() + p + k.size(), &end, 10);
      if (end == s.c_str() + p + k.size()) return false;
      const bool kb = std::string(end, std::min<size_t>(4, s.size() - size_t(end - s.c_str()))).find("kB") != std::string::npos;
      *v = kb ? uint64_t(x) * 1024 : uint64_t(x);
      return true;
    }
    p += k.size();
  }
  return false;
}

// The first number in a cgroup file; false for "max" or unreadable.
bool ReadNumber(Env* env, const std::string& path, uint64_t* v) {
  std::string c;
  if (!env->ReadSmallFile(path, &c).ok() || c.empty() || c[0] < '0' || c[0] > '9') return false;
  *v = std::strtoull(c.c_str(), nullptr, 10);
  return true;
}

// Bytes of the matmul work buffer per element of activations converted for weights of type t.
double WorkBytesPerElem(int t) {
  switch (ggml_type(t)) {
    case GGML_TYPE_F32: return 0.0;
    case GGML_TYPE_F16: return 2.0;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return 292.0 / 256.0;  // q8_K
    default: return 34.0 / 32.0;               // q8_0 (q8_0, q4_0, ...)
  }
}

// Per vocabulary token: llama.cpp's vocabulary (token text, scores, the lookup maps, BPE ranks),
// measured with tools `mzcache plan --calibrate` on this build (docs/plan.md).
constexpr uint64_t kTokenizerBytesPerToken = 240;
// Fixed: the model's tensor metadata context, the forward pass's graph metadata buffer, the ggml
// CPU backend and the unit table (measured the same way).
constexpr uint64_t kFixedOverhead = 6ull << 20;

}  // namespace

PlanShape ShapeOfModel(const Model& m) {
  PlanShape s;
  s.hp = m.hparams();
  s.weights_file_backed = m.file_backed();
  std::map<int, uint64_t> by_type;
  for (int u = 0; u < m.n_units(); ++u) {
    const WeightUnit& w = m.unit(u);
    s.weight_bytes += w.region_bytes;
    for (const TensorExtent& t : w.tensors) {
      s.weight_params += uint64_t(ggml_nelements(t.tensor));
      if (ggml_n_dims(t.tensor) >= 2) by_type[int(t.tensor->type)] += t.bytes;
    }
  }
  uint64_t best = 0;
  for (const auto& [t, b] : by_type)
    if (b > best) best = b, s.weight_type = t;
  return s;
}

uint64_t KvBytesPerToken(const HParams& hp, KvType t) {
  const uint64_t rows = 2ull * hp.n_layer * hp.n_head_kv;  // K and V rows of one token
  return t == KvType::kQ8 ? rows * (2ull + hp.head_dim) : rows * hp.head_dim * 2ull;
}

uint64_t KvBytes(const HParams& hp, KvType t, int n_ctx, int chunk_tokens) {
  if (n_ctx <= 0 || chunk_tokens <= 0) return 0;
  const uint64_t chunks = (uint64_t(n_ctx) + uint64_t(chunk_tokens) - 1) / uint64_t(chunk_tokens);
  return chunks * uint64_t(chunk_tokens) * KvBytesPerToken(hp, t);
}

uint64_t ComputeBytes(const PlanShape& s, int n) {
  if (n <= 0) return 0;
  const HParams& hp = s.hp;
  const uint64_t N = uint64_t(n), E = hp.n_embd, F = hp.n_ff, Q = hp.n_embd_q(), KV = hp.n_embd_kv(),
                 V = hp.n_vocab;
  // The graph allocator's buffer: the largest live set of the per-layer graph. FFN: gate, up and
  // their product [F, n], the residual h and the norm [E, n]. Attention: q (and its norm / rope
  // copies), k, v, the attention output [Q or KV, n] and the norm [E, n]. The head graph: the norm
  // of one row and its [V] logits.
  const uint64_t ffn = (3 * F + 2 * E) * N * 4;
  const uint64_t attn = (3 * Q + 3 * KV + 2 * E) * N * 4;
  const uint64_t head = (E + V) * 4;
  const uint64_t galloc = std::max({ffn, attn, head});
  // The matmul work buffer: the largest activation converted for the weight type ([F, n] for
  // ffn_down), the residual stream act_ [E, n] and the logits row [V] the Forward keeps.
  const uint64_t work = uint64_t(WorkBytesPerElem(s.weight_type) * double(F * N));
  return galloc + work + E * N * 4 + V * 4;
}

uint64_t EstimateModelOverhead(const PlanShape& s) {
  return kFixedOverhead + uint64_t(s.hp.n_vocab) * kTokenizerBytesPerToken;
}

MemoryEstimate EstimatePeak(const PlanShape& s, const PlanRequest& r) {
  MemoryEstimate e;
  e.weights = s.weight_bytes;
  e.weights_file_backed = s.weights_file_backed;
  e.kv = KvBytes(s.hp, r.kv_type, r.n_ctx, r.chunk_tokens);
  e.compute = ComputeBytes(s, std::min(r.n_ubatch, r.n_ctx));
  e.swap_stack = 0;
  e.overhead = r.overhead;
  return e;
}

bool ReadSelfMemory(Env* env, SelfMemory* out) { return ReadProcessMemory(env, 0, out); }

bool ReadProcessMemory(Env* env, int pid, SelfMemory* out) {
  std::string st;
  const std::string path = pid > 0 ? "/proc/" + std::to_string(pid) + "/status" : std::string("/proc/self/status");
  if (!env->ReadSmallFile(path, &st).ok()) return false;
  SelfMemory m;
  if (!Field(st, "VmRSS", &m.rss)) return false;
  Field(st, "RssAnon", &m.rss_anon);
  Field(st, "RssFile", &m.rss_file);
  Field(st, "VmHWM", &m.hwm);
  *out = m;
  return true;
}

uint64_t MemoryLimits::effective() const {
  uint64_t e = 0;
  for (uint64_t v : {cgroup_limit, system_cap(), budget})
    if (v && (e == 0 || v < e)) e = v;
  return e;
}

const char* MemoryLimits::binding() const {
  const uint64_t e = effective();
  if (e == 0) return "";
  if (budget == e) return "memory budget";
  if (cgroup_limit == e) return "cgroup limit";
  return "MemAvailable";
}

MemoryLimits ReadMemoryLimits(Env* env, uint64_t budget) {
  MemoryLimits l;
  l.budget = budget;
  std::string mi;
  if (env->ReadSmallFile("/proc/meminfo", &mi).ok()) {
    Field(mi, "MemAvailable", &l.mem_available);
    Field(mi, "MemTotal", &l.mem_total);
  }
  SelfMemory self;
  if (ReadSelfMemory(env, &self)) l.self_anon = self.rss_anon;
  // The process's cgroup: "0::/path" (v2, under /sys/fs/cgroup) or "N:...memory...:/path" (v1,
  // under /sys/fs/cgroup/memory). A v1 limit near 2^63 means none.
  std::string cg;
  if (env->ReadSmallFile("/proc/self/cgroup", &cg).ok()) {
    std::istringstream ss(cg);
    for (std::string line; std::getline(ss, line);) {
      const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
      std::string file;
      if (ctrls.empty()) file = "/sys/fs/cgroup" + (path == "/" ? "" : path) + "/memory.max";
      else if (("," + ctrls + ",").find(",memory,") != std::string::npos)
        file = "/sys/fs/cgroup/memory" + (path == "/" ? "" : path) + "/memory.limit_in_bytes";
      else continue;
      uint64_t v = 0;
      if (ReadNumber(env, file, &v) && v > 0 && v < (1ull << 62) && (l.cgroup_limit == 0 || v < l.cgroup_limit)) {
        l.cgroup_limit = v;
        l.cgroup_path = file;
      }
    }
  }
  return l;
}

int LargestContext(const PlanShape& s, PlanRequest r, uint64_t limit, double margin, int max_ctx) {
  if (limit == 0) return max_ctx;
  const double cap = double(limit) * (1.0 - margin);
  const int T = std::max(1, r.chunk_tokens);
  // The peak grows with the context (KV chunks, then the ubatch's buffers up to n_ubatch): a
  // binary search over whole chunks.
  int lo = 0, hi = max_ctx / T;
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    r.n_ctx = mid * T;
    if (double(EstimatePeak(s, r).peak()) <= cap) lo = mid;
    else hi = mid - 1;
  }
  return lo * T;
}

Status CheckFits(const PlanShape& s, const PlanRequest& r, const MemoryLimits& lim) {
  const uint64_t limit = lim.effective();
  const MemoryEstimate e = EstimatePeak(s, r);
  if (limit == 0 || e.peak() <= limit) return Status::Ok();
  const int max_ctx = 1 << 24;
  std::string m = "a context of " + std::to_string(r.n_ctx) + " tokens needs a peak of " + MiB(e.peak()) +
                  " (weights " + MiB(e.weights) + (e.weights_file_backed ? " file-backed" : " anonymous") +
                  ", KV " + KvTypeName(r.kv_type) + " " + MiB(e.kv) + ", compute " + MiB(e.compute) +
                  ", overhead " + MiB(e.overhead) + ") but the " + lim.binding() + " allows " + MiB(limit) + ". ";
  std::vector<std::string> fits;
  const int c = LargestContext(s, r, limit, 0.0, std::min(r.n_ctx, max_ctx));
  if (c > 0) fits.push_back("n_ctx " + std::to_string(c) + " (the largest context at this memory)");
  if (r.kv_type == KvType::kF16) {
    PlanRequest q = r;
    q.kv_type = KvType::kQ8;
    const int cq = LargestContext(s, q, limit, 0.0, r.n_ctx);
    if (cq >= r.n_ctx) fits.push_back("q8_0 KV at n_ctx " + std::to_string(r.n_ctx));
    else if (cq > c) fits.push_back("q8_0 KV up to n_ctx " + std::to_string(cq));
  }
  if (c < r.n_ctx && s.weight_params > 0) {
    // q4_0: 4.5 bits per weight. Only if it is smaller than what the model has now.
    const double bpw = 8.0 * double(s.weight_bytes) / double(s.weight_params);
    if (bpw > 5.0) {
      PlanShape q4 = s;
      q4.weight_bytes = uint64_t(double(s.weight_bytes) * 4.5 / bpw);
      const int c4 = LargestContext(q4, r, limit, 0.0, r.n_ctx);
      if (c4 > c)
        fits.push_back("q4_0 weights (about " + MiB(q4.weight_bytes) + ") at n_ctx " + std::to_string(c4));
    }
  }
  if (fits.empty()) m += "Nothing this model can run fits: not even one KV chunk.";
  else {
    m += "What fits: ";
    for (size_t i = 0; i < fits.size(); ++i) m += (i ? "; or " : "") + fits[i];
    m += ".";
  }
  m += " (memory_check off, or --no-memory-check, creates it anyway.)";
  return Status::NoMemory(m);
}

}  // namespace mz
