// bench ttft: time to first token of a short query over a long context, restored from every
// remaining-memory level, for mzcache, the Partial Offload baseline and all-in-memory, with the
// physical lower bound measured in the same run, plus the paper's ablations (Fig. 10-12).
// Contexts are built once by real prefill of real text and kept as session files.
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include "model/model.h"
#include "model/synth.h"
#include "runtime/context.h"
#include "runtime/tokenizer.h"
#include "runtime/session_file.h"
#include "tools/bench/bench_util.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/bench/ospaging.h"
#include "tools/bench/peers_common.h"
#include "tools/bench/real_text.h"

namespace mz::cli {
namespace {

struct TtftArgs {
  std::vector<std::string> models{"qwen3-0.6b", "llama3.2-1b"};
  std::string type = "q8_0";
  std::vector<int> ctxs{8192, 16384, 32768};
  std::vector<int> levels{0, 25, 50, 75};
  int reps = 3;
  int query = 8;
  int threads = 2;
  std::string out = "results/bench-ttft";
  std::string swap_dir = "/var/tmp";
  bool quick = false;
  bool no_ablations = false;
  bool no_ospaging = false;
  bool prepare = false;
  std::vector<std::string> extra;  // extra systems (Systems() with extra set), alternating with the others
};

// A system under test: how it evicts and how it restores. The main ones ("mzcache", "partial",
// "memory") are always measured; the extra ones answer one-off questions (--extra-systems), measured
// alternately with the main ones. Every field's default is mzcache's.
struct System {
  std::string name, what;
  bool extra = true;              // offered by --extra-systems
  bool evict = true;              // false: all in memory, nothing evicted
  bool partial = false;           // Partial Offload: its eviction, sequential reload then prefill
  bool anon = false;              // weights and KV on storage re-read into anonymous memory (direct I/O)
  bool single_path = false;       // every evicted KV chunk raw on storage
  bool restore_first = false;     // restore everything (not timed) before the query
  bool paper_costs = false;       // the policy plans with the paper's unit times (ContextOptions::cost_restore_paths off)
  bool no_reconcile = false;      // the table's count of resident units is trusted (ContextOptions::reconcile_min_missing 0)
  bool no_touch = false;          // restored pages are first read by compute, not by the restore thread (touch_restored off)
  void (*pipeline)(PipelineOptions&) = nullptr;  // restore_generate options the system changes
};

const std::vector<System>& Systems() {
  static const std::vector<System> v = [] {
    std::vector<System> s;
    auto add = [&](System x) { s.push_back(std::move(x)); return &s.back(); };
    add({"mzcache", "mzcache (the default)", false});
    add({"partial", "Partial Offload", false})->partial = true;
    add({"memory", "all in memory", false})->evict = false;
    add({"mznoft", "mzcache with compute on n-1 threads until restoration ends (full_threads_for_io off)"})->pipeline =
        [](PipelineOptions& p) { p.full_threads_for_io = false; };
    add({"mzprio", "mzcache with restoration threads at a raised priority (nice -5 relative) and compute on all threads from the start (restore_nice)"})
        ->pipeline = [](PipelineOptions& p) { p.restore_nice = -5; };
    add({"mzsto", "mzcache with every evicted KV chunk raw on storage (single-path policy, parallel pipeline)"})->single_path = true;
    add({"mznoload", "mzcache reading q8 chunks in memory in place but restoring (decoding) those on storage"})->pipeline =
        [](PipelineOptions& p) { p.load_compressed = false; };
    add({"mzio1", "mzcache with one storage worker instead of two (io_threads 1)"})->pipeline =
        [](PipelineOptions& p) { p.io_threads = 1; };
    add({"mzio4", "mzcache with four storage workers instead of two (io_threads 4: four small KV reads in flight)"})->pipeline =
        [](PipelineOptions& p) { p.io_threads = 4; };
    add({"mznocoalesce", "mzcache reading every KV chunk on storage with a request of its own (coalesce_bytes 0) instead of one request per run of back-to-back chunks"})
        ->pipeline = [](PipelineOptions& p) { p.coalesce_bytes = 0; };
    add({"mzdecomp", "mzcache restoring every unit before compute reads it, as the paper (q8 chunks in memory decoded, not read in place; the policy costs them as decoded)"})
        ->pipeline = [](PipelineOptions& p) { p.attend_compressed = false; };
    add({"mzrestored", "evict as mzcache, restore everything (not timed), then the query: what restored memory costs at query time"})
        ->restore_first = true;
    add({"mzanon", "mzcache with dropped weights and KV chunks on storage re-read into anonymous memory by direct I/O (the previous default) instead of mapped through the page cache"})
        ->anon = true;
    add({"partialanon", "Partial Offload with weights and KV re-read into anonymous memory by direct I/O"})->partial = true;
    s.back().anon = true;
    add({"mzpapercost", "mzcache planning with the paper's unit times (direct reads into fresh memory, compressed chunks decoded) instead of its own restore paths' (KV mapped, q8 read in place)"})
        ->paper_costs = true;
    add({"mznoreconcile", "mzcache not asking the kernel which resident units it reclaimed (reconcile_min_missing 0): what checking residency costs when nothing was taken"})
        ->no_reconcile = true;
    add({"mznotouch", "mzcache leaving the first read of each restored page to compute instead of the restore thread (touch_restored off)"})
        ->no_touch = true;
    return s;
  }();
  return v;
}

// The system named `name`, or nullptr.
const System* FindSystem(const std::string& name) {
  for (const System& s : Systems())
    if (s.name == name) return &s;
  return nullptr;
}

struct Run {
  double ttft = 0, alloc = 0, reload = 0, wait = 0, cpu = 0, remaining = 0;
  double mem_busy = 0, sto_busy = 0;
  double mem_done = 0, sto_done = 0;  // each path's finish time after reload start
  uint64_t bytes_sto = 0, bytes_dec = 0, bytes_inplace = 0, bytes_restored = 0;
  uint64_t evicted = 0;  // RAM released by the eviction before the query
  int runs = 0, chunks_in_runs = 0;  // coalesced storage reads and the chunks they loaded
  uint64_t weights_cached = 0;  // bytes of dropped weights the page cache still held at the query
};
uint64_t g_max_weights_cached = 0;  // the most any run saw (reported)
uint64_t g_max_kv_cached = 0;       // the same for the extents of KV chunks on storage



// A context of n tokens of real text: loaded from its session file, or built by prefill and saved.
Status EnsureContext(Context& ctx, const std::string& model_path, int n, std::vector<int32_t>* query, int q,
                     std::string* sess_out) {
  std::unique_ptr<Tokenizer> tok;
  MZ_RETURN_IF_ERROR(Tokenizer::Load(model_path, &tok));
  std::string text;
  MZ_RETURN_IF_ERROR(RealText(size_t(n + q) * 8, &text));
  std::vector<int32_t> toks;
  MZ_RETURN_IF_ERROR(tok->Tokenize(text.substr(0, size_t(n + q) * 8), true, false, &toks));
  if (int(toks.size()) < n + q) return Status::Internal("not enough text");
  query->assign(toks.begin() + n, toks.begin() + n + q);
  std::string stem = model_path.substr(model_path.find_last_of('/') + 1);
  stem = stem.substr(0, stem.rfind(".gguf"));
  const std::string sess = CacheDir() + "/contexts/" + stem + "-" + std::to_string(n) + ".sess";
  *sess_out = sess;
  FileInfo fi;
  if (Env::Default()->StatPath(sess, &fi).ok()) {
    double t0 = NowSeconds();
    Status st = LoadSession(ctx, sess);
    if (st.ok()) {
      std::fprintf(stderr, "  context %d: loaded %s in %.1f s (built earlier by prefill; no re-prefill)\n", n,
                   sess.c_str(), NowSeconds() - t0);
      return st;
    }
    std::fprintf(stderr, "  context %d: session unusable (%s); rebuilding\n", n, st.ToString().c_str());
  }
  std::system(("mkdir -p '" + CacheDir() + "/contexts'").c_str());
  std::fprintf(stderr, "  context %d: building by prefill of real text (once; saved to %s)\n", n, sess.c_str());
  ctx.Truncate(0);
  // A shorter context of the same model and text is a prefix of this one: continue from it
  // (checked token by token; tokenization at the shorter text's cut may differ, then start over).
  int start = 0;
  for (int m : {n / 2, n / 4}) {
    const std::string prev = CacheDir() + "/contexts/" + stem + "-" + std::to_string(m) + ".sess";
    if (m < 512 || !Env::Default()->StatPath(prev, &fi).ok() || !LoadSession(ctx, prev).ok()) continue;
    const auto& h = ctx.history();
    if (h.size() == size_t(m) && std::equal(h.begin(), h.end(), toks.begin())) {
      start = m;
      std::fprintf(stderr, "  context %d: continuing from the %d-token context (same text prefix)\n", n, m);
      break;
    }
    ctx.Truncate(0);
  }
  double t0 = NowSeconds();
  for (int off = start; off < n; off += 512) {
    const int m = std::min(512, n - off);
    MZ_RETURN_IF_ERROR(ctx.Decode(toks.data() + off, m, false));
    std::fprintf(stderr, "\r  prefill %d/%d tokens (%.0f s)", off + m, n, NowSeconds() - t0);
  }
  std::fprintf(stderr, "\n");
  return SaveSession(ctx, sess, "none");
}

// The paper's mzCache pipeline: every evicted unit restored before compute reads it (the ablations
// measure its mechanisms; mzcache's default reads q8 chunks in memory in place).
PipelineOptions PaperPipeline() {
  PipelineOptions p;
  p.attend_compressed = false;
  return p;
}

// Sets the context up as `sys` evicts and restores (weight memory, mapped swap, eviction policy,
// what the policy plans for) and adjusts the pipeline options *p to the system's.
void Configure(Context& ctx, const System& sys, EvictOrder order, bool hybrid, PipelineOptions* p) {
  p->sequential = sys.partial;
  if (sys.pipeline) sys.pipeline(*p);
  // How dropped weights come back: the model's default (page cache) unless the system says otherwise.
  ctx.model()->set_weight_memory(sys.anon ? WeightMemory::kAnonymous : WeightMemory::kPageCache);
  ctx.set_map_swap(!sys.anon);
  ctx.SetEvictionPolicy(sys.partial, order, hybrid && !sys.single_path);
  // The policy plans for how this run restores: compressed chunks read in place only if it does.
  ctx.set_attend_compressed(p->attend_compressed);
  ctx.set_cost_restore_paths(!sys.paper_costs);
  ctx.set_reconcile_min_missing(sys.no_reconcile ? 0 : ContextOptions().reconcile_min_missing);
  ctx.set_touch_restored(!sys.no_touch);
}

// One measurement: evict (system's policy) to `level` remaining, then restore_generate the query.
Status MeasureOnce(Context& ctx, const std::string& system, double level, const std::vector<int32_t>& query,
                   int base, const PipelineOptions& po, EvictOrder order, uint64_t seed, bool hybrid, Run* r) {
  const System* sys = FindSystem(system);
  if (!sys) return Status::InvalidArgument("bench ttft: unknown system " + system);
  PipelineOptions p = po;
  MZ_RETURN_IF_ERROR(ctx.Restore());
  ctx.Truncate(base);
  Configure(ctx, *sys, order, hybrid, &p);
  if (sys->evict) {
    MemoryReport m = ctx.Report();
    const double in_mem = double(m.in_memory() - m.base_resident), foot = double(m.footprint() - m.base_total);
    const double target = level * foot;
    if (in_mem > target) MZ_RETURN_IF_ERROR(ctx.EvictBytes(uint64_t(in_mem - target), nullptr));
    const MemoryReport after = ctx.Report();
    r->evicted = uint64_t(std::max(0.0, in_mem - double(after.in_memory() - after.base_resident)));
  }
  r->remaining = ctx.Report().remaining(true);
  // The page cache must not be what the restore reads: dropped weights left it at eviction.
  std::vector<int> cached_units;
  // A folio shared with the resident neighbour may stay (up to 2 MiB per boundary): recorded.
  r->weights_cached = ctx.model()->DroppedBytesCached(&cached_units);
  g_max_weights_cached = std::max(g_max_weights_cached, r->weights_cached);
  if (const uint64_t cached = r->weights_cached; cached > (uint64_t(4) << 20)) {
    std::string units;
    for (int u : cached_units) units += " " + std::to_string(u);
    return Status::Internal(std::to_string(cached >> 10) + " KiB of dropped weights (units" + units +
                            ") are still in the page cache: the measurement would not read the disk");
  }
  // Nor may it hold KV chunks on storage (a chunk mapped from the swap leaves it when evicted).
  uint64_t kv_cached = 0;
  MZ_RETURN_IF_ERROR(ctx.units().SwapBytesCached(&kv_cached));
  g_max_kv_cached = std::max(g_max_kv_cached, kv_cached);
  if (kv_cached > (uint64_t(4) << 20))
    return Status::Internal(std::to_string(kv_cached >> 10) +
                            " KiB of KV chunks on storage are in the page cache: the measurement would not read the disk");
  if (sys->restore_first) MZ_RETURN_IF_ERROR(ctx.Restore());
  (void)seed;
  RestoreGenerateStats st;
  MZ_RETURN_IF_ERROR(ctx.RestoreGenerate(query.data(), int(query.size()), p, &st));
  r->ttft = st.ttft_s;
  r->alloc = st.pipeline.alloc_s;
  r->reload = st.pipeline.reload_s;
  r->wait = st.wait_s;
  r->runs = st.pipeline.storage_runs;
  r->chunks_in_runs = st.pipeline.chunks_in_runs;
  r->cpu = st.cpu_s;
  r->bytes_sto = st.pipeline.bytes_from_storage;
  // The placement's compressed bytes (raw size), whether decoded or read in place: the bound
  // charges them at the decode throughput either way.
  r->bytes_dec = st.pipeline.bytes_decoded + st.pipeline.bytes_read_compressed;
  r->bytes_inplace = st.pipeline.bytes_read_compressed;
  r->bytes_restored = st.pipeline.bytes_restored;
  r->mem_busy = st.pipeline.mem_path_busy_s;
  r->sto_busy = st.pipeline.sto_path_busy_s;
  r->mem_done = st.pipeline.mem_path_done_s;
  r->sto_done = st.pipeline.sto_path_done_s;
  ctx.Truncate(base);
  return Status::Ok();
}

double Median(std::vector<double> v) { return Summarize(v).median; }

// Ctrl-C / SIGTERM during the OS Paging runs must not leave zram swap on or cgroups behind. Not
// async-signal-safe, deliberately: the process is about to exit and only these side effects matter.
OsPagingEnv* g_ose = nullptr;
void OnTtftSignal(int sig) {
  if (const int w = OsPagingWorkerPid(); w > 0) {  // its cgroup cannot be removed while it lives
    kill(w, SIGKILL);
    waitpid(w, nullptr, 0);
  }
  if (g_ose) OsPagingTeardown(g_ose);
  std::system(("rmdir /sys/fs/cgroup/memory/mzcache-ospaging-" + std::to_string(getpid()) + " 2>/dev/null").c_str());
  _exit(128 + sig);
}

// Decode throughput (raw bytes/s, one thread) of the context's codec on its own KV, measured now.
double MeasureDecode(Context& ctx) {
  const KvGeometry& g = ctx.kv().geometry();
  const KvCodec& codec = ctx.units().codec();
  ChunkShape s{g.n_kv_head, g.chunk_tokens, g.head_dim, g.chunk_tokens, 0, g.n_layer};
  std::vector<std::vector<uint8_t>> enc;
  for (int l = 0; l < g.n_layer; ++l) {
    std::vector<uint8_t> e(codec.MaxEncodedSize(s));
    size_t n = 0;
    s.layer = l;
    if (!codec.Encode(s, ctx.kv().chunk(l, 0), e.data(), e.size(), &n).ok()) return 1e9;
    e.resize(n);
    enc.push_back(std::move(e));
  }
  std::vector<uint16_t> out(s.raw_bytes() / 2);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = NowSeconds();
    for (int l = 0; l < g.n_layer; ++l) {
      s.layer = l;
      (void)codec.Decode(s, enc[size_t(l)].data(), enc[size_t(l)].size(), out.data());
    }
    best = std::max(best, double(s.raw_bytes()) * g.n_layer / (NowSeconds() - t0));
  }
  return best;
}

Stats TtftStats(const std::vector<Run>& v) {
  std::vector<double> x;
  for (auto& r : v) x.push_back(r.ttft);
  return Summarize(x);
}

// bench ttft's run-wide state: what is measured once per run, and the report being built.
struct TtftRun {
  explicit TtftRun(const TtftArgs& args) : a(args), ablations_done(args.no_ablations) {}
  const TtftArgs& a;
  nlohmann::json doc;
  std::string md;
  nlohmann::json rows = nlohmann::json::array();
  // Fig. 3/4: full reload from storage (Partial Offload at 0% remaining) and OS Paging, normalized
  // to all-in-memory, with the allocation / storage read / prefill breakdown, across contexts.
  std::string fig34_md, fig34_dat;
  bool ablations_done;
  double populate_s_per_byte = 0;
  int cores = 1;
  double read_Bps = 0;  // the run-start storage read rate (the best kind of read)
  OsPagingEnv ose;
  std::string os_reason;  // empty: OS Paging is measured
  // The disk's rate drifts within a run on some machines: it is measured again before every
  // repetition of every level, and each cell also gets a bound at the rate measured during it.
  std::unique_ptr<StorageProbe> probe;
};

// One model at one context length: its context, query and every run measured on it.
struct TtftCell {
  std::string m, path, sess;  // the model as given, its file, the context's session file
  Model* model = nullptr;
  int n = 0;
  std::vector<int32_t> query;
  double dec_Bps = 0;
  PipelineOptions po;
  std::map<std::string, std::map<int, std::vector<Run>>> runs;  // system -> level -> runs
  std::map<int, std::vector<double>> cell_read;  // level -> storage read rate before each repetition
  std::map<int, std::vector<OsPagingRun>> osr;   // level -> OS Paging runs
  std::string tag() const { return m + "-" + std::to_string(n); }
};

// The run-start figures: the cost of populating fresh memory, the cores, the storage read rate.
Status MeasureMachine(TtftRun* R) {
  const TtftArgs& a = R->a;
  R->populate_s_per_byte = MeasurePopulateCost();  // (the profiler's)
  if (R->populate_s_per_byte < 0) return Status::NoMemory("cannot map 256 MiB to measure the cost of populating memory");
  R->cores = int(std::max(1u, std::thread::hardware_concurrency()));
  std::fprintf(stderr, "populating fresh memory: %.3f ms/MiB (best of 3, 256 MiB, measured now); %d cores\n",
               R->populate_s_per_byte * 1048576e3, R->cores);
  nlohmann::json& doc = R->doc;
  doc["machine"] = MachineDescription();
  doc["threads"] = a.threads;
  doc["reps"] = a.reps;
  doc["query_tokens"] = a.query;
  doc["populate_ms_per_MiB"] = R->populate_s_per_byte * 1048576e3;
  doc["cores"] = R->cores;
  // The bound uses the disk's best: one request in flight, or two (the pipeline's io_threads).
  // ... or the page cache's readahead, as file-backed weights are read: whichever is faster.
  double mapped = 0;
  const std::vector<double> reads = MeasureDirectReads(a.swap_dir, size_t(256) << 20, size_t(4) << 20, {1, 2}, &mapped);
  const double read1 = reads[0], read2 = reads[1];
  R->read_Bps = std::max({read1, read2, mapped});
  std::fprintf(stderr, "storage read: %.2f GB/s (the best of: direct I/O, 4 MiB requests, %.2f with 1 in flight, %.2f with 2; page-cache readahead of 64 MiB mappings, 2 threads, %.2f; measured now)\n",
               R->read_Bps / 1e9, read1 / 1e9, read2 / 1e9, mapped / 1e9);
  doc["storage_read_GBps"] = R->read_Bps / 1e9;
  doc["storage_read_GBps_qd1"] = read1 / 1e9;
  doc["storage_read_GBps_qd2"] = read2 / 1e9;
  doc["storage_read_GBps_page_cache"] = mapped / 1e9;
  R->md = "# bench ttft\n\nmachine: " + MachineDescription() + "; threads " + std::to_string(a.threads) +
          "; query " + std::to_string(a.query) + " tokens; medians of " + std::to_string(a.reps) +
          " runs (min-max); storage read " + std::to_string(R->read_Bps / 1e9).substr(0, 4) +
          " GB/s (the best of direct I/O with 4 MiB requests, 1 and 2 in flight: " +
          std::to_string(read1 / 1e9).substr(0, 4) + " / " + std::to_string(read2 / 1e9).substr(0, 4) +
          ", and page-cache readahead of 64 MiB mappings: " + std::to_string(mapped / 1e9).substr(0, 4) +
          "; measured in this run)\n";
  return Status::Ok();
}

// Whether the OS Paging baseline can run here (R->os_reason says why not).
void ProbeOsPaging(TtftRun* R) {
  if (!R->a.no_ospaging && !R->a.prepare) {
    Status ps = OsPagingProbe(&R->ose);
    if (!ps.ok()) R->os_reason = ps.ToString();
    std::fprintf(stderr, "OS Paging baseline: %s\n",
                 ps.ok() ? ("memory cgroup v1 + " + R->ose.swap).c_str() : R->os_reason.c_str());
  } else {
    R->os_reason = "skipped (--no-ospaging)";
  }
  R->doc["os_paging"] = R->os_reason.empty() ? "memory cgroup v1 + " + R->ose.swap : R->os_reason;
}

// Every system at every level, a->reps times, the storage rate read before each repetition.
Status MeasureSystems(TtftRun* R, Context& ctx, TtftCell* c) {
  const TtftArgs& a = R->a;
  std::vector<std::string> systems{"mzcache", "partial", "memory"};
  for (const std::string& x : a.extra) systems.push_back(x);
  for (int rep = 0; rep < a.reps; ++rep) {
    for (int lv : a.levels) {
      // The order rotates every repetition (and every 25 points of level): a system's TTFT
      // depends a little on what the one before it left (measured: the same placement 10-15%
      // apart by position).
      c->cell_read[lv].push_back(R->probe->ReadNow());
      std::vector<std::string> order = systems;
      std::rotate(order.begin(), order.begin() + (rep + lv / 25) % order.size(), order.end());
      for (const std::string& sys : order) {
        if (sys == "memory" && lv != a.levels.front()) continue;
        Run r;
        MZ_RETURN_IF_ERROR(MeasureOnce(ctx, sys, lv / 100.0, c->query, c->n, c->po, EvictOrder::kBackwardOut, 1, true, &r));
        c->runs[sys][sys == "memory" ? -1 : lv].push_back(r);
        // Where the time went: restoration's span (reload start to last unit), how long
        // compute waited for layers, and the process's CPU-seconds over the query.
        std::fprintf(stderr, "  rep %d level %3d%% %-8s TTFT %.3f s (remaining %.1f%%, %.0f MiB from storage, %.0f MiB compressed, %.0f read in place; reload %.3f s, compute waited %.3f s, CPU %.2f s, %d chunks in %d coalesced reads)\n",
                     rep + 1, lv, sys.c_str(), r.ttft, 100 * r.remaining, r.bytes_sto / 1048576.0,
                     r.bytes_dec / 1048576.0, r.bytes_inplace / 1048576.0, r.reload, r.wait, r.cpu, r.chunks_in_runs, r.runs);
      }
    }
  }
  return Status::Ok();
}

// The OS Paging worker maps the same model file. Weights this process holds in the page cache
// would be shared with it (charged here, never reclaimed under its limit): drop them all first (as
// mzcache evicts, not as whichever system ran last), and check that none stayed cached.
Status DropWeightsForOsPaging(Context& ctx, const TtftCell& c) {
  PipelineOptions unused = c.po;
  Configure(ctx, *FindSystem("mzcache"), EvictOrder::kBackwardOut, true, &unused);
  MZ_RETURN_IF_ERROR(ctx.EvictBytes(UINT64_MAX, nullptr));
  for (int u = 0; u < c.model->n_units(); ++u)
    if (c.model->unit(u).resident()) return Status::Internal("weight unit " + std::to_string(u) + " still resident before OS Paging");
  if (c.model->DroppedBytesCached() > (uint64_t(4) << 20))
    return Status::Internal("the model's weights are still in the page cache before OS Paging");
  return Status::Ok();
}

// The OS Paging baseline at every level; its first failure stops it for the rest of the run
// (R->os_reason).
void MeasureOsPaging(TtftRun* R, TtftCell* c) {
  const TtftArgs& a = R->a;
  for (int rep = 0; rep < a.reps; ++rep)
    for (int lv : a.levels) {
      OsPagingRun r;
      Status st = OsPagingMeasure(&R->ose, c->path, c->sess, c->n + a.query + 64, c->query, a.threads, lv / 100.0, &r);
      if (!st.ok()) {
        R->os_reason = st.ToString();
        break;
      }
      c->osr[lv].push_back(r);
      std::fprintf(stderr, "  rep %d level %3d%% ospaging TTFT %.3f s (remaining %.1f%%%s, swapped %.0f MiB, zram holds %.0f MiB)\n",
                   rep + 1, lv, r.ttft, 100 * r.remaining, r.reached ? "" : ", limit not reachable",
                   r.swapped / 1048576.0, r.zram_compressed / 1048576.0);
    }
}

// What one level's runs give: the systems' TTFTs, the bounds, and the room for the targets.
struct LevelFigures {
  Stats mz, po, mem;
  Run r0;                 // mzcache's first run (its bytes: the placement is deterministic)
  double lb = 0;          // lower bound at the run-start storage rate
  double cell_Bps = 0;    // storage rate measured during the cell
  double lb_cell = 0;     // lower bound at that rate
  double mem_cpu = 0;     // all-in-memory CPU-seconds (median)
  double cpu_floor = 0, lb_cpu = 0;
  double mz_fill = 0, po_fill = 0;  // rates of filling memory from storage
  double ceiling = 0, own = 0;      // speedup ceilings at Partial Offload's and mzcache's own fill rate
};

// The rate at which a system filled fresh memory from storage in a cell (bytes from storage over
// the storage path's span, from reload start to its last unit; median of the repetitions).
double FillRate(const std::vector<Run>& v) {
  std::vector<double> x;
  for (const Run& r : v) {
    const double span = r.sto_done > 0 ? r.sto_done : r.reload;  // the storage path's own span
    if (span > 0 && r.bytes_sto > 0) x.push_back(double(r.bytes_sto) / span);
  }
  return x.empty() ? 0.0 : Median(x);
}

LevelFigures ComputeLevel(const TtftRun& R, TtftCell& c, int lv) {
  LevelFigures f;
  f.mem = TtftStats(c.runs["memory"][-1]);
  f.mz = TtftStats(c.runs["mzcache"][lv]);
  f.po = TtftStats(c.runs["partial"][lv]);
  f.r0 = c.runs["mzcache"][lv].front();
  const double dec_s = double(f.r0.bytes_dec) / (c.dec_Bps * c.po.decode_threads);
  f.lb = std::max({f.mem.median, double(f.r0.bytes_sto) / R.read_Bps, dec_s});
  // The same bound at the storage rate measured during this cell (median of the reads between
  // its repetitions that succeeded; the run-start rate if none did).
  std::vector<double> cell_ok;
  for (double x : c.cell_read[lv])
    if (x > 0) cell_ok.push_back(x);
  f.cell_Bps = cell_ok.empty() ? R.read_Bps : Median(cell_ok);
  f.lb_cell = std::max({f.mem.median, double(f.r0.bytes_sto) / f.cell_Bps, dec_s});
  // CPU floor (an estimate, not the bound): the query's own CPU-seconds all in memory
  // plus populating every byte the restoration brings back (q8 chunks read in place are not
  // brought back), spread perfectly over the cores. Decoding and syscalls come on top.
  std::vector<double> mem_cpu;
  for (auto& r : c.runs["memory"][-1]) mem_cpu.push_back(r.cpu);
  f.mem_cpu = Median(mem_cpu);
  f.cpu_floor = (f.mem_cpu + double(f.r0.bytes_restored) * R.populate_s_per_byte) / R.cores;
  f.lb_cpu = std::max(f.lb, f.cpu_floor);
  // At Partial Offload's fill rate (one thread, sequential), mzcache's own bytes take mz_bytes /
  // that rate at least, so no overlap beats PO / max(all-in-memory, that time): the ceiling of
  // the speedup unless mzcache fills memory faster than Partial Offload does.
  f.mz_fill = FillRate(c.runs["mzcache"][lv]);
  f.po_fill = FillRate(c.runs["partial"][lv]);
  const double ceiling_s = f.po_fill > 0 ? std::max(f.mem.median, double(f.r0.bytes_sto) / f.po_fill) : 0;
  f.ceiling = ceiling_s > 0 ? f.po.median / ceiling_s : 0;
  const double own_s = f.mz_fill > 0 ? std::max(f.mem.median, double(f.r0.bytes_sto) / f.mz_fill) : 0;
  f.own = own_s > 0 ? f.po.median / own_s : 0;
  return f;
}

// The OS Paging cell of a level's row ("not measured" without runs); its JSON row too.
std::string OsPagingCell(TtftRun* R, TtftCell& c, int lv) {
  if (c.osr[lv].empty()) return "not measured";
  std::vector<double> t, rem;
  for (auto& x : c.osr[lv]) t.push_back(x.ttft), rem.push_back(x.remaining);
  Stats so = Summarize(t);
  char b[128];
  std::snprintf(b, sizeof b, "%.3f (%.3f-%.3f) (%.0f%%)", so.median, so.min, so.max, 100 * Median(rem));
  R->rows.push_back({{"model", c.m}, {"ctx", c.n}, {"level", lv}, {"os_paging", {{"median", so.median}, {"min", so.min},
                    {"max", so.max}, {"remaining_reached", Median(rem)}, {"reached", c.osr[lv].front().reached}}}});
  return b;
}

std::string LevelRow(const LevelFigures& f, int lv, const std::string& os_cell) {
  char line[512];
  std::snprintf(line, sizeof line, "| %d%% | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %.2fx | %.2fx | %.3f | %.2f | %.0f | %.0f (%.0f) | %.3f | %.2f | %.2f | %.2f | %s |\n", lv,
                f.mz.median, f.mz.min, f.mz.max, f.po.median, f.po.min, f.po.max, f.po.median / f.mz.median, f.po.median / f.lb, f.lb,
                f.mz.median / f.lb, f.r0.bytes_sto / 1048576.0, f.r0.bytes_dec / 1048576.0, f.r0.bytes_inplace / 1048576.0, f.cpu_floor,
                f.mz.median / f.lb_cpu, f.cell_Bps / 1e9, f.mz.median / f.lb_cell, os_cell.c_str());
  return line;
}

std::string TargetsRow(const LevelFigures& f, int lv) {
  const double speed = f.po.median / f.mz.median, reach = f.po.median / f.lb_cpu, ratio = f.mz.median / f.lb;
  char line[512];
  std::snprintf(line, sizeof line, "| %d%% | %s (%.2fx) | %.2fx%s | %s (%.2f) | %.2f%s | %.2f, %.2f | %.2fx%s | %.2fx%s |\n", lv,
                speed >= 2 ? "met" : "missed", speed, reach, reach < 2 ? " (2x out of reach in this run)" : "",
                ratio <= 1.25 ? "met" : "missed", ratio, f.cpu_floor / f.lb,
                f.cpu_floor / f.lb > 1.25 ? " (1.25x out of reach in this run)" : "", f.mz_fill / 1e9, f.po_fill / 1e9,
                f.ceiling, f.ceiling > 0 && f.ceiling < 2 ? " (2x out of reach at that rate)" : "", f.own,
                f.own > 0 && f.own < 2 ? " (2x out of reach at that rate)" : "");
  return line;
}

// A level's line of the plot data: mzcache, Partial Offload, bound, OS Paging (NaN if none).
std::string DatRow(const LevelFigures& f, TtftCell& c, int lv) {
  Stats osx;
  if (!c.osr[lv].empty()) {
    std::vector<double> t;
    for (auto& x : c.osr[lv]) t.push_back(x.ttft);
    osx = Summarize(t);
  }
  char d[256];
  std::snprintf(d, sizeof d, "%d %.4f %.4f %.4f %.4f %.4f %.4f %.4f %s\n", lv, f.mz.median, f.mz.min, f.mz.max,
                f.po.median, f.po.min, f.po.max, f.lb,
                c.osr[lv].empty() ? "NaN NaN NaN"
                                  : (std::to_string(osx.median) + " " + std::to_string(osx.min) + " " +
                                     std::to_string(osx.max)).c_str());
  return d;
}

nlohmann::json LevelJson(const LevelFigures& f, TtftCell& c, int lv) {
  std::vector<double> cell_all;
  for (double x : c.cell_read[lv]) cell_all.push_back(x / 1e9);
  const double mz = f.mz.median, po = f.po.median;
  return {{"model", c.m}, {"ctx", c.n}, {"level", lv}, {"mzcache", {{"median", mz}, {"min", f.mz.min}, {"max", f.mz.max}}},
          {"partial_offload", {{"median", po}, {"min", f.po.min}, {"max", f.po.max}}},
          {"all_in_memory", {{"median", f.mem.median}, {"min", f.mem.min}, {"max", f.mem.max}}},
          {"lower_bound", f.lb}, {"speedup_vs_partial", po / mz}, {"partial_over_bound", po / f.lb}, {"ratio_to_bound", mz / f.lb},
          {"bytes_from_storage", f.r0.bytes_sto}, {"bytes_compressed", f.r0.bytes_dec}, {"bytes_read_in_place", f.r0.bytes_inplace},
          {"bytes_restored", f.r0.bytes_restored},
          {"remaining_actual", f.r0.remaining}, {"decode_GBps", c.dec_Bps / 1e9},
          {"evicted_bytes", f.r0.evicted}, {"cpu_floor", f.cpu_floor}, {"all_in_memory_cpu_s", f.mem_cpu},
          {"ratio_to_bound_or_cpu_floor", mz / f.lb_cpu},
          {"fill_GBps_mzcache", f.mz_fill / 1e9}, {"fill_GBps_partial", f.po_fill / 1e9},
          {"speedup_ceiling_at_partial_fill_rate", f.ceiling}, {"speedup_ceiling_at_own_fill_rate", f.own},
          {"storage_read_GBps_cell", f.cell_Bps / 1e9}, {"storage_read_GBps_cell_all", cell_all},
          {"lower_bound_cell", f.lb_cell}, {"ratio_to_bound_cell", mz / f.lb_cell},
          {"partial_over_bound_cell", po / f.lb_cell},
          {"target_2x_partial_met", po / mz >= 2}, {"target_2x_partial_reachable", po / f.lb_cpu >= 2},
          {"target_bound_125_met", mz / f.lb <= 1.25}, {"target_bound_125_reachable", f.cpu_floor / f.lb <= 1.25}};
}

// The cell's main table (one row per level), its targets table, and the plot data (*dat).
void ReportLevels(TtftRun* R, TtftCell& c, std::string* dat) {
  const Stats mem = TtftStats(c.runs["memory"][-1]);
  char line[512];
  R->md += "\n## " + c.m + " (" + c.model->hparams().name + "), context " + std::to_string(c.n) + "\n\n";
  std::snprintf(line, sizeof line, "all-in-memory TTFT: %.3f s (%.3f-%.3f)\n\n", mem.median, mem.min, mem.max);
  R->md += line;
  R->md += "| remaining | mzcache s | Partial Offload s | speedup | Partial Offload / bound (the most any system could show) | lower bound s | mzcache / bound | from storage MiB | compressed MiB (read in place) | CPU floor s | mzcache / max(bound, CPU floor) | storage during the cell GB/s | mzcache / bound at that rate | OS Paging s (reached remaining) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  // The two targets per level, and whether this run left room for them: no system
  // can beat max(bound, CPU floor), so 2x Partial Offload is out of reach when Partial Offload
  // is under twice that, and 1.25x the bound when the CPU floor alone is above 1.25x it.
  std::string targets_md =
      "\nTargets (issue: at least 2x faster than Partial Offload, within 1.25x of the lower bound), and the room this run "
      "left for them (the best any system could show is max(bound, CPU floor)). The last two columns: mzcache's speedup if it "
      "filled fresh memory from storage no faster than Partial Offload's reload did in this cell, PO / max(all-in-memory, "
      "mzcache's bytes from storage / that rate), and the same at the rate mzcache's own restoration reached (what perfect "
      "overlap would give at that rate):\n\n"
      "| remaining | 2x Partial Offload | most reachable speedup (PO / max(bound, CPU floor)) | within 1.25x of the bound | "
      "CPU floor / bound | fill rate from storage GB/s: mzcache, Partial Offload | speedup ceiling at Partial Offload's fill rate | "
      "at mzcache's own |\n|---|---|---|---|---|---|---|---|\n";
  for (int lv : R->a.levels) {
    const LevelFigures f = ComputeLevel(*R, c, lv);
    const std::string os_cell = OsPagingCell(R, c, lv);
    R->md += LevelRow(f, lv, os_cell);
    targets_md += TargetsRow(f, lv);
    *dat += DatRow(f, c, lv);
    R->rows.push_back(LevelJson(f, c, lv));
  }
  R->md += targets_md;
}

// Fig. 3/4's row of this cell: Partial Offload from 0% remaining (full reload) and OS Paging,
// normalized to all-in-memory (only when the first level is 0%).
void ReportFig34(TtftRun* R, TtftCell& c) {
  if (c.runs["partial"][R->a.levels.front()].empty() || R->a.levels.front() != 0) return;
  std::vector<double> al, re, pf, tt;
  for (auto& r : c.runs["partial"][0]) al.push_back(r.alloc), re.push_back(r.reload), pf.push_back(r.ttft - r.alloc - r.reload), tt.push_back(r.ttft);
  double os_med = 0, os_rem = 0;
  if (!c.osr[0].empty()) {
    std::vector<double> t, rem;
    for (auto& x : c.osr[0]) t.push_back(x.ttft), rem.push_back(x.remaining);
    os_med = Median(t), os_rem = Median(rem);
  }
  const double base = TtftStats(c.runs["memory"][-1]).median;
  char line[512];
  std::snprintf(line, sizeof line, "| %s | %d | %.3f | %.3f (%.1fx) | %.3f | %.3f | %.3f | %s |\n", c.m.c_str(), c.n, base, Median(tt),
                Median(tt) / base, Median(al), Median(re), Median(pf),
                os_med > 0 ? (std::to_string(os_med).substr(0, 5) + " (" + std::to_string(os_med / base).substr(0, 4) +
                              "x, reached " + std::to_string(int(100 * os_rem)) + "%)").c_str()
                           : "not measured");
  R->fig34_md += line;
  char d[256];
  std::snprintf(d, sizeof d, "\"%s %dk\" %.4f %.4f %.4f %.4f\n", c.m.c_str(), c.n / 1024, Median(al) / base, Median(re) / base,
                Median(pf) / base, os_med > 0 ? os_med / base : 0.0);
  R->fig34_dat += d;
  R->doc["fig34"].push_back({{"model", c.m}, {"ctx", c.n}, {"all_in_memory", base}, {"full_reload", Median(tt)}, {"alloc", Median(al)},
                             {"reload", Median(re)}, {"prefill", Median(pf)}, {"os_paging", os_med}, {"os_paging_remaining", os_rem}});
}

// Fig. 13 (energy proxy; no power meter here): CPU-seconds and bytes read per restoration.
void ReportEnergy(TtftRun* R, TtftCell& c) {
  R->md += "\nFig. 13 proxy (per restoration, medians): CPU-seconds of the process and bytes read from storage\n\n"
           "| remaining | mzcache CPU s | Partial Offload CPU s | mzcache MiB read | Partial Offload MiB read |\n|---|---|---|---|---|\n";
  char line[512];
  for (int lv : R->a.levels) {
    std::vector<double> cm, cp, bm, bp;
    for (auto& r : c.runs["mzcache"][lv]) cm.push_back(r.cpu), bm.push_back(double(r.bytes_sto) / 1048576.0);
    for (auto& r : c.runs["partial"][lv]) cp.push_back(r.cpu), bp.push_back(double(r.bytes_sto) / 1048576.0);
    std::snprintf(line, sizeof line, "| %d%% | %.2f | %.2f | %.0f | %.0f |\n", lv, Median(cm), Median(cp), Median(bm), Median(bp));
    R->md += line;
    R->doc["energy_proxy"].push_back({{"model", c.m}, {"ctx", c.n}, {"level", lv}, {"mzcache_cpu_s", Median(cm)},
                                      {"partial_cpu_s", Median(cp)}, {"mzcache_bytes_read", Median(bm) * 1048576.0},
                                      {"partial_bytes_read", Median(bp) * 1048576.0}});
  }
}

// The extra systems' TTFTs next to mzcache's (--extra-systems).
void ReportExtraSystems(TtftRun* R, TtftCell& c) {
  const TtftArgs& a = R->a;
  if (a.extra.empty()) return;
  std::string& md = R->md;
  md += "\nExtra systems (TTFT s, median (min-max), same repetitions):\n\n| remaining | mzcache |";
  for (auto& x : a.extra) md += " " + x + " |";
  md += "\n|---|---|";
  for (size_t i = 0; i < a.extra.size(); ++i) md += "---|";
  md += "\n";
  char line[512];
  for (int lv : a.levels) {
    const Stats z = TtftStats(c.runs["mzcache"][lv]);
    std::snprintf(line, sizeof line, "| %d%% | %.3f (%.3f-%.3f) |", lv, z.median, z.min, z.max);
    md += line;
    for (auto& x : a.extra) {
      const Stats e = TtftStats(c.runs[x][lv]);
      std::snprintf(line, sizeof line, " %.3f (%.3f-%.3f) |", e.median, e.min, e.max);
      md += line;
      R->doc["extra_systems"].push_back({{"model", c.m}, {"ctx", c.n}, {"level", lv}, {"system", x},
                                         {"median", e.median}, {"min", e.min}, {"max", e.max}});
    }
    md += "\n";
  }
}

// ttft-<tag>.{dat,png}: TTFT by remaining level, every system, the bound and all-in-memory.
void PlotCell(TtftRun* R, TtftCell& c, const std::string& dat) {
  const std::string tag = c.tag();
  const double mem = TtftStats(c.runs["memory"][-1]).median;
  WriteFile(R->a.out, "ttft-" + tag + ".dat", dat);
  std::string gp = "set terminal pngcairo size 800,500\nset output 'ttft-" + tag + ".png'\nset title 'TTFT, " + c.m +
                   ", " + std::to_string(c.n) + "-token context, " + std::to_string(R->a.query) +
                   "-token query'\nset xlabel 'remaining in memory (%)'\nset ylabel 'TTFT (s)'\nset key top right\n"
                   "set xrange [-5:80]\nset yrange [0:*]\nplot 'ttft-" + tag + ".dat' u 1:2:3:4 w yerrorlines t 'mzcache', "
                   "'' u 1:5:6:7 w yerrorlines t 'Partial Offload', '' u 1:9:10:11 w yerrorlines t 'OS Paging (zram)', "
                   "'' u 1:8 w lp dt 2 t 'lower bound', " +
                   std::to_string(mem) + " w l dt 3 t 'all in memory'\n";
  if (!PlotPng(R->a.out, "ttft-" + tag, gp).empty()) R->md += "\n![TTFT " + tag + "](ttft-" + tag + ".png)\n";
}

// Fig. 10: breakdown, Partial Offload vs mzcache without overlap (50% remaining).
Status AblationBreakdown(TtftRun* R, Context& ctx, const TtftCell& c, nlohmann::json* ab) {
  std::map<std::string, std::vector<Run>> br;
  for (int rep = 0; rep < R->a.reps; ++rep) {
    for (const char* sys : {"partial", "mzcache"}) {
      PipelineOptions p = PaperPipeline();
      p.overlap = Overlap::kNone;
      Run r;
      MZ_RETURN_IF_ERROR(MeasureOnce(ctx, sys, 0.5, c.query, c.n, p, EvictOrder::kBackwardOut, 1, true, &r));
      std::fprintf(stderr, "  ablation Fig. 10 rep %d %-8s TTFT %.3f s (allocation %.3f, reload %.3f)\n", rep + 1, sys,
                   r.ttft, r.alloc, r.reload);
      br[sys].push_back(r);
    }
  }
  R->md += "Fig. 10 breakdown (no overlap), medians:\n\n| system | allocation s | reload s | prefill s | TTFT s | CPU s |\n|---|---|---|---|---|---|\n";
  char line[512];
  for (const char* sys : {"partial", "mzcache"}) {
    std::vector<double> al, re, pf, tt, cpu;
    for (auto& r : br[sys]) al.push_back(r.alloc), re.push_back(r.reload), pf.push_back(r.ttft - r.alloc - r.reload),
        tt.push_back(r.ttft), cpu.push_back(r.cpu);
    std::snprintf(line, sizeof line, "| %s | %.3f | %.3f | %.3f | %.3f | %.2f |\n",
                  std::string(sys) == "partial" ? "Partial Offload" : "mzcache (mz_NO)", Median(al), Median(re),
                  Median(pf), Median(tt), Median(cpu));
    R->md += line;
    (*ab)["breakdown"][sys] = {{"alloc", Median(al)}, {"reload", Median(re)}, {"prefill", Median(pf)}, {"ttft", Median(tt)}, {"cpu", Median(cpu)}};
  }
  return Status::Ok();
}

// Fig. 11a's variants: the overlap modes, plus the full pipeline without each of its helpers.
struct Variant {
  const char* label;
  const char* key;
  PipelineOptions p = PaperPipeline();
};
std::vector<Variant> OverlapVariants() {
  std::vector<Variant> vars;
  for (Overlap o : {Overlap::kNone, Overlap::kAllocReload, Overlap::kReloadPrefill, Overlap::kFull}) {
    PipelineOptions p = PaperPipeline();
    p.overlap = o;
    vars.push_back({o == Overlap::kNone            ? "mz_NO"
                    : o == Overlap::kAllocReload   ? "mz_AR"
                    : o == Overlap::kReloadPrefill ? "mz_RP"
                                                   : "mzcache (full)",
                    OverlapName(o), p});
  }
  vars.push_back({"full, compute thread does not help restore", "full-no-compute-help", PaperPipeline()});
  vars.back().p.compute_helps = false;
  vars.push_back({"full, no allocation ahead (each worker maps its unit)", "full-no-alloc-ahead", PaperPipeline()});
  vars.back().p.alloc_ahead = false;
  vars.push_back({"full, compute on n-1 threads until restoration ends", "full-no-threads-for-io", PaperPipeline()});
  vars.back().p.full_threads_for_io = false;
  vars.push_back({"full, q8 chunks in memory read in place (mzcache default)", "full-read-in-place", PipelineOptions()});
  return vars;
}

// Fig. 11a: the variants alternate within every repetition, at 50% and 0% remaining.
Status AblationOverlap(TtftRun* R, Context& ctx, const TtftCell& c, nlohmann::json* ab) {
  const std::vector<Variant> vars = OverlapVariants();
  std::string& md = R->md;
  md += "\nFig. 11a overlap variants (TTFT s, median):\n\n| remaining |";
  for (const Variant& v : vars) md += std::string(" ") + v.label + " |";
  md += "\n|---|";
  for (size_t v = 0; v < vars.size(); ++v) md += "---|";
  char line[512];
  for (int lv : {50, 0}) {
    std::vector<std::vector<double>> x(vars.size());
    for (int rep = 0; rep < R->a.reps; ++rep)
      for (size_t v = 0; v < vars.size(); ++v) {
        Run r;
        MZ_RETURN_IF_ERROR(MeasureOnce(ctx, "mzcache", lv / 100.0, c.query, c.n, vars[v].p, EvictOrder::kBackwardOut, 1, true, &r));
        std::fprintf(stderr, "  ablation Fig. 11a rep %d level %3d%% %s: TTFT %.3f s\n", rep + 1, lv, vars[v].key, r.ttft);
        x[v].push_back(r.ttft);
      }
    md += "\n| " + std::to_string(lv) + "% |";
    for (size_t v = 0; v < vars.size(); ++v) {
      std::snprintf(line, sizeof line, " %.3f |", Median(x[v]));
      md += line;
      // (the 50% row keeps the JSON keys earlier reports used)
      (*ab)[lv == 50 ? "overlap" : "overlap_at_0"][vars[v].key] = Median(x[v]);
    }
  }
  return Status::Ok();
}

// Fig. 11b: eviction orders (random-out over 3 seeds per rep).
Status AblationOrders(TtftRun* R, Context& ctx, const TtftCell& c, nlohmann::json* ab) {
  R->md += "\n\nFig. 11b eviction orders (TTFT s, median, forward-in restore):\n\n| backward-out | forward-out | random-out |\n|---|---|---|\n|";
  char line[512];
  for (EvictOrder ord : {EvictOrder::kBackwardOut, EvictOrder::kForwardOut, EvictOrder::kRandomOut}) {
    std::vector<double> x;
    for (int rep = 0; rep < R->a.reps; ++rep) {
      Run r;
      ctx.SetEvictionPolicy(false, ord, true);
      MZ_RETURN_IF_ERROR(MeasureOnce(ctx, "mzcache", 0.5, c.query, c.n, PaperPipeline(), ord, uint64_t(rep + 1), true, &r));
      std::fprintf(stderr, "  ablation Fig. 11b rep %d %s: TTFT %.3f s\n", rep + 1, EvictOrderName(ord), r.ttft);
      x.push_back(r.ttft);
    }
    std::snprintf(line, sizeof line, " %.3f |", Median(x));
    R->md += line;
    (*ab)["order"][EvictOrderName(ord)] = Median(x);
  }
  return Status::Ok();
}

// Fig. 12: parallel vs sequential hybrid swap restoration (no prefill overlap).
Status AblationHybrid(TtftRun* R, Context& ctx, const TtftCell& c, nlohmann::json* ab) {
  R->md += "\n\nFig. 12 hybrid swap restoration time (s, median; sequential = in-memory path then storage path):\n\n"
           "| remaining | parallel | sequential | in-memory path done (parallel) | storage path done (parallel) |\n|---|---|---|---|---|\n";
  char line[512];
  for (int lv : {25, 50, 75}) {
    std::vector<double> par, seq, mb, sb;
    for (int rep = 0; rep < R->a.reps; ++rep) {
      for (bool parallel : {true, false}) {
        PipelineOptions p = PaperPipeline();
        p.overlap = Overlap::kAllocReload;
        p.parallel_paths = parallel;
        Run r;
        MZ_RETURN_IF_ERROR(MeasureOnce(ctx, "mzcache", lv / 100.0, c.query, c.n, p, EvictOrder::kBackwardOut, 1, true, &r));
        std::fprintf(stderr, "  ablation Fig. 12 rep %d level %3d%% %s: restoration %.3f s\n", rep + 1, lv,
                     parallel ? "parallel" : "sequential", r.reload);
        (parallel ? par : seq).push_back(r.reload);
        if (parallel) mb.push_back(r.mem_done), sb.push_back(r.sto_done);
      }
    }
    std::snprintf(line, sizeof line, "| %d%% | %.3f | %.3f | %.3f | %.3f |\n", lv, Median(par), Median(seq), Median(mb), Median(sb));
    R->md += line;
    (*ab)["hybrid_parallel"][std::to_string(lv)] = {{"parallel", Median(par)}, {"sequential", Median(seq)},
                                                    {"mem_path_done", Median(mb)}, {"storage_path_done", Median(sb)}};
  }
  return Status::Ok();
}

// The paper's ablations (Fig. 10-12), once per run, on the first cell (50% remaining).
Status RunAblations(TtftRun* R, Context& ctx, const TtftCell& c) {
  R->ablations_done = true;
  R->md += "\n### Ablations (" + c.tag() + ", 50% remaining)\n\nThe paper's pipeline: every unit restored before compute reads it (attend_compressed off), unless a column says otherwise.\n\n";
  nlohmann::json ab;
  MZ_RETURN_IF_ERROR(AblationBreakdown(R, ctx, c, &ab));
  MZ_RETURN_IF_ERROR(AblationOverlap(R, ctx, c, &ab));
  MZ_RETURN_IF_ERROR(AblationOrders(R, ctx, c, &ab));
  MZ_RETURN_IF_ERROR(AblationHybrid(R, ctx, c, &ab));
  R->doc["ablations"] = ab;
  return Status::Ok();
}

// One model at one context length: the context (loaded or built), every system, OS Paging, the
// report sections, and the ablations if not done yet.
Status RunCell(TtftRun* R, const std::string& m, const std::string& path, Model* model, int n) {
  const TtftArgs& a = R->a;
  std::fprintf(stderr, "== %s, context %d ==\n", m.c_str(), n);
  ContextOptions co;
  co.n_ctx = n + a.query + 64;
  co.n_threads = a.threads;
  co.swap_path = a.swap_dir + "/mzcache-bench.swap";
  Context ctx(model, co);
  TtftCell c;
  c.m = m, c.path = path, c.model = model, c.n = n;
  MZ_RETURN_IF_ERROR(ctx.Init());
  MZ_RETURN_IF_ERROR(EnsureContext(ctx, path, n, &c.query, a.query, &c.sess));
  if (a.prepare) return Status::Ok();
  c.dec_Bps = MeasureDecode(ctx);
  MZ_RETURN_IF_ERROR(MeasureSystems(R, ctx, &c));
  if (R->os_reason.empty()) {
    MZ_RETURN_IF_ERROR(DropWeightsForOsPaging(ctx, c));
    MeasureOsPaging(R, &c);
  }
  model->set_weight_memory(WeightMemory::kPageCache);
  MZ_RETURN_IF_ERROR(ctx.Restore());
  std::string dat;
  ReportLevels(R, c, &dat);
  ReportFig34(R, c);
  ReportEnergy(R, c);
  ReportExtraSystems(R, c);
  PlotCell(R, c, dat);
  if (!R->ablations_done) MZ_RETURN_IF_ERROR(RunAblations(R, ctx, c));
  return Status::Ok();
}

// The report's closing sections (Fig. 3/4, the OS Paging note, the page-cache checks), written
// to bench-ttft.{md,json} and printed.
void FinishTtftReport(TtftRun* R) {
  const TtftArgs& a = R->a;
  std::string& md = R->md;
  nlohmann::json& doc = R->doc;
  if (!R->fig34_md.empty()) {
    md += "\n## Fig. 3/4: full reload from storage and OS Paging vs all-in-memory (0% remaining)\n\n"
          "Full reload = Partial Offload from 0% remaining: allocate, read everything (direct I/O), then prefill.\n\n"
          "| model | context | all-in-memory s | full reload s | allocation s | storage read s | prefill s | OS Paging s |\n"
          "|---|---|---|---|---|---|---|---|\n" + R->fig34_md;
    WriteFile(a.out, "fig34.dat", R->fig34_dat);
    const std::string gp =
        "set terminal pngcairo size 900,500\nset output 'fig34.png'\nset title 'TTFT from 0% remaining, normalized to all-in-memory'\n"
        "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\nset boxwidth 0.35\n"
        "set ylabel 'TTFT / all-in-memory TTFT'\nset key top left\nset xtics rotate by -20\n"
        "plot 'fig34.dat' u 2:xtic(1) t 'allocation', '' u 3 t 'storage read', '' u 4 t 'prefill', "
        "'' u 0:($5>0?$5:1/0) w p pt 7 ps 1.5 t 'OS Paging (total)'\n";
    if (!PlotPng(a.out, "fig34", gp).empty()) md += "\n![Fig. 3/4](fig34.png)\n";
  }
  md += "\nOS Paging: weights mmap'd from the GGUF, KV anonymous, in a memory cgroup (v1) whose limit is lowered to the "
        "level (the kernel drops weight pages and swaps KV to zram), then lifted before the query: " +
        (R->os_reason.empty() ? doc["os_paging"].get<std::string>() : "not measured: " + R->os_reason) + "\n";
  doc["rows"] = R->rows;
  // Checked before every timed restore (over 4 MiB fails the run): what of the dropped weights the
  // page cache still held, at most.
  doc["dropped_weights_in_page_cache_max_MiB"] = double(g_max_weights_cached) / 1048576.0;
  md += "\nDropped weights still in the page cache at a query: at most " +
        std::to_string(double(g_max_weights_cached) / 1048576.0).substr(0, 5) +
        " MiB (checked with mincore before every timed restore; folios shared with a resident neighbour).\n";
  doc["kv_on_storage_in_page_cache_max_MiB"] = double(g_max_kv_cached) / 1048576.0;
  md += "KV chunks on storage in the page cache at a query: at most " +
        std::to_string(double(g_max_kv_cached) / 1048576.0).substr(0, 5) + " MiB (same check).\n";
  WriteReport(a.out, "bench-ttft", md, doc);
  std::fputs(md.c_str(), stdout);
  std::fprintf(stderr, "wrote %s/bench-ttft.{md,json} and plots\n", a.out.c_str());
}

// bench ttft: the run-start figures, then every model at every context length, then the report.
Status RunTtft(const TtftArgs& a) {
  for (const std::string& x : a.extra)
    if (!FindSystem(x) || !FindSystem(x)->extra)
      return Status::InvalidArgument("--extra-systems: unknown system '" + x + "' (see --help)");
  TtftRun R(a);
  MZ_RETURN_IF_ERROR(MeasureMachine(&R));
  ProbeOsPaging(&R);
  struct Teardown {
    OsPagingEnv* e;
    ~Teardown() { OsPagingTeardown(e); }
  } teardown{&R.ose};  // zram is switched off again on every exit path
  g_ose = &R.ose;
  signal(SIGINT, OnTtftSignal);
  signal(SIGTERM, OnTtftSignal);
  if (!a.prepare) {
    R.probe = std::make_unique<StorageProbe>(Env::Default(), a.swap_dir, size_t(256) << 20);  // as the run-start figure
    if (!R.probe->ok()) return Status::IOError("cannot write the read-probe file in " + a.swap_dir);
  }
  for (const std::string& m : a.models) {
    std::string path;
    std::unique_ptr<Model> model;
    MZ_RETURN_IF_ERROR(OpenBenchModel(m, a.type, &path, &model));
    for (int n : a.ctxs) MZ_RETURN_IF_ERROR(RunCell(&R, m, path, model.get(), n));
  }
  if (a.prepare) {
    std::fprintf(stderr, "contexts ready in %s/contexts\n", CacheDir().c_str());
    return Status::Ok();
  }
  FinishTtftReport(&R);
  return Status::Ok();
}

}  // namespace

void AddTtftBench(CLI::App* bench, Runners& runners) {
  auto a = std::make_shared<TtftArgs>();
  auto* c = bench->add_subcommand("ttft", "TTFT of a short query over 8k-32k contexts from 0/25/50/75% remaining: "
                                          "mzcache vs Partial Offload vs all-in-memory, lower bound, ablations");
  c->add_option("-m,--models", a->models, "model shapes (see make-model --list) or GGUF paths");
  c->add_option("--type", a->type, "weight type for synthesized shapes");
  c->add_option("--ctx", a->ctxs, "context lengths");
  c->add_option("--levels", a->levels, "remaining-memory levels in percent");
  c->add_option("-r,--reps", a->reps, "repetitions (systems alternate within each)");
  c->add_option("-q,--query", a->query, "query tokens");
  c->add_option("-t,--threads", a->threads, "compute threads");
  c->add_option("-o,--out", a->out, "results folder");
  c->add_option("--swap-dir", a->swap_dir, "folder for swap files (storage under test)");
  c->add_flag("--quick", a->quick, "8k context, one model (CI-sized)");
  c->add_flag("--no-ablations", a->no_ablations, "skip Fig. 10-12 ablations");
  c->add_flag("--no-ospaging", a->no_ospaging, "skip the OS Paging baseline (needs root, cgroup v1, swap/zram)");
  c->add_flag("--prepare", a->prepare, "only synthesize the models and build the contexts (session files), then exit");
  std::string extra_help = "extra systems, measured alternately with the others:";
  for (const System& x : Systems())
    if (x.extra) extra_help += " " + x.name + " (" + x.what + ");";
  c->add_option("--extra-systems", a->extra, extra_help);
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    if (a->quick) a->ctxs = {8192}, a->models.resize(1);
    Status st = RunTtft(*a);
    return st.ok() ? 0 : Fail(st);
  });
}

}  // namespace mz::cli
