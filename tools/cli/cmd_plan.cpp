// plan: the peak memory a run will need, before it starts (issue 24 §2), and plan --recommend: the
// model shapes, quants and contexts a device tier holds with headroom (§6). A thin command over
// mz_plan_estimate / mz_plan_estimate_shape (docs/plan.md).
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "env/cpu_topology.h"
#include "env/env.h"
#include "model/synth.h"
#include "mzcache.h"
#include "policy/device_profile.h"
#include "policy/tier_failure.h"
#include "tools/bench/footprint_calc.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

constexpr double kMiB = 1048576.0, kGiB = 1073741824.0;

struct PlanArgs {
  std::string model;
  std::string ctx = "8192";
  std::string kv_type = "f16";
  uint64_t budget_mib = 0;
  bool anonymous = false;
  int chunk = 256;
  int ubatch = 512;
  double margin = 0.1;
  bool json = false;
  // --recommend
  bool recommend = false;
  double ram_gib = 0;      // 0: this machine's MemTotal
  double reserve_gib = -1; // < 0: the field notes' share (see docs/plan.md)
  int cores = 0;           // 0: this machine's (the fastest cluster's)
  double read_mbps = 0;    // 0: the device profile's
  std::string profile;
  std::vector<std::string> shapes{"qwen3-0.6b", "qwen2.5-0.5b", "llama3.2-1b", "qwen3-1.7b", "llama3.2-3b", "qwen3-4b",
                                  "llama3.1-8b", "qwen3-8b"};
  std::vector<std::string> quants{"f16", "q8_0", "q4_k", "q4_0"};
  // --recommend, the residency table (policy/tier_failure.h): phone tiers in GB of MemTotal.
  std::vector<double> tiers{6, 8, 12};
  std::vector<std::string> res_shapes{"llama3.1-8b", "qwen3-8b"};
  std::vector<std::string> res_quants{"q4_k_m", "q4_0", "q3_k_m", "q8_0"};
  std::string isa = "arm-dotprod";
  bool third_way = false;   // also the third way's row (TierConfig::give_back; MZ_WEIGHTS_REPACKED)
  double repack_mbps = 0;   // its re-make estimate: repack MB/s (0: not shown)
};

std::string MibCell(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", double(b) / kMiB);
  return buf;
}
std::string Limit(uint64_t b) { return b ? MibCell(b) + " MiB" : "none"; }

nlohmann::json ResultJson(const mz_plan_result& r, const std::string& kv_type) {
  nlohmann::json j;
  j["n_ctx"] = r.n_ctx;
  j["kv_type"] = kv_type;
  j["peak_bytes"] = r.peak;
  j["parts"] = {{"weights", r.weights},   {"weights_file_backed", r.weights_file_backed},
                {"kv", r.kv},             {"compute", r.compute},
                {"swap_stack", r.swap_stack}, {"overhead", r.overhead}};
  j["kv_bytes_per_token"] = r.kv_bytes_per_token;
  j["limits"] = {{"cgroup_limit", r.cgroup_limit}, {"mem_available", r.mem_available},
                 {"self_anon", r.self_anon},       {"memory_budget", r.memory_budget},
                 {"mem_total", r.mem_total},       {"limit", r.limit},
                 {"binding", r.binding}};
  j["fits"] = r.fits;
  j["max_ctx"] = r.max_ctx;
  j["max_ctx_q8_0"] = r.max_ctx_q8;
  return j;
}

int RunPlan(PlanArgs& a) {
  if (a.model.empty()) {
    Status st = EnsureDefaultModel(&a.model);
    if (!st.ok()) return Fail(st);
  }
  mz_plan_params p = mz_plan_default_params();
  if (a.ctx == "auto") p.n_ctx = 0;
  else {
    try {
      size_t pos = 0;
      const long v = std::stol(a.ctx, &pos);
      if (pos != a.ctx.size() || v < 1 || v > (1 << 24)) throw std::invalid_argument(a.ctx);
      p.n_ctx = uint32_t(v);
    } catch (...) {
      std::fprintf(stderr, "error: --ctx must be a token count (1..16777216) or auto, not '%s'\n", a.ctx.c_str());
      return 2;
    }
  }
  if (a.kv_type != "f16" && a.kv_type != "q8_0") {
    std::fprintf(stderr, "error: --kv-type must be f16 or q8_0\n");
    return 2;
  }
  p.kv_type = a.kv_type == "q8_0" ? MZ_KV_Q8_0 : MZ_KV_F16;
  p.kv_chunk_tokens = uint32_t(a.chunk);
  p.n_ubatch = uint32_t(a.ubatch);
  p.weight_memory = a.anonymous ? MZ_WEIGHTS_ANONYMOUS : MZ_WEIGHTS_PAGE_CACHE;
  p.memory_budget = a.budget_mib << 20;
  p.margin = float(a.margin);
  mz_plan_result r;
  int rc = mz_plan_estimate(a.model.c_str(), &p, &r);
  if (rc != MZ_OK) return CFail("planning " + a.model, rc);
  if (a.json) {
    nlohmann::json j = ResultJson(r, a.kv_type);
    j["model"] = a.model;
    j["margin"] = a.margin;
    std::printf("%s\n", j.dump(2).c_str());
    return r.fits ? 0 : 3;
  }
  std::printf("## Memory plan: %s\n\n", a.model.c_str());
  std::printf("%d layers, %d KV heads x %d dims, %d-token vocabulary, %.2fB parameters\n\n", r.n_layer, r.n_head_kv,
              r.head_dim, r.n_vocab, double(r.weight_params) / 1e9);
  std::printf("| part | MiB | |\n|---|---:|---|\n");
  std::printf("| weights | %s | %s |\n", MibCell(r.weights).c_str(),
              r.weights_file_backed ? "file-backed (page cache): short of memory, a run thrashes"
                                    : "anonymous: short of memory, a run is killed");
  std::printf("| KV %s at %u tokens | %s | %.1f KiB per token, in %d-token chunks |\n", a.kv_type.c_str(), r.n_ctx,
              MibCell(r.kv).c_str(), double(r.kv_bytes_per_token) / 1024.0, a.chunk);
  std::printf("| compute buffers | %s | one ubatch of %d tokens |\n", MibCell(r.compute).c_str(),
              std::min<int>(a.ubatch, int(r.n_ctx)));
  std::printf("| swap stack | %s | holds only KV that left RAM, compressed |\n", MibCell(r.swap_stack).c_str());
  std::printf("| overhead | %s | this process + tokenizer + metadata |\n", MibCell(r.overhead).c_str());
  std::printf("| **peak** | **%s** | |\n\n", MibCell(r.peak).c_str());
  std::printf("| limit | |\n|---|---:|\n");
  std::printf("| cgroup limit | %s |\n", Limit(r.cgroup_limit).c_str());
  std::printf("| MemAvailable + own anonymous | %s |\n",
              r.mem_available ? (MibCell(r.mem_available + r.self_anon) + " MiB").c_str() : "unknown");
  std::printf("| --memory-budget | %s |\n\n", Limit(r.memory_budget).c_str());
  if (r.limit == 0) std::printf("No limit is known: nothing to set the peak against.\n");
  else if (r.fits)
    std::printf("Fits: peak %s MiB is %.0f%% of the %s (%s MiB).\n", MibCell(r.peak).c_str(),
                100.0 * double(r.peak) / double(r.limit), r.binding, MibCell(r.limit).c_str());
  else
    std::printf("DOES NOT FIT: peak %s MiB exceeds the %s (%s MiB). A context would be refused at creation.\n",
                MibCell(r.peak).c_str(), r.binding, MibCell(r.limit).c_str());
  std::printf("Largest context with a %.0f%% margin (at most the training context): %u tokens with %s KV", 100.0 * a.margin,
              r.max_ctx, a.kv_type.c_str());
  if (a.kv_type == "f16") std::printf(", %u with q8_0 KV", r.max_ctx_q8);
  std::printf(".\n");
  return r.fits ? 0 : 3;
}

// ---- --recommend: device tiers ----

struct Device {
  double ram = 0, usable = 0, reserve = 0;
  int cores = 0;
  double read_Bps = 0;
  std::string ram_from, read_from;
};

std::string PlanFmt(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string PlanFmt(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// The matrix format mz_plan_estimate_shape knows for a recipe (the mixed K-quant recipes use q8_K
// activations as q4_k does).
const char* PlanWeightType(const std::string& q) {
  if (q == "q4_k_m" || q == "q3_k_m") return "q4_k";
  return q.c_str();
}

// The residency table of --recommend: for each shape, recipe and weight layout (llama.cpp's
// repacked default, --no-repack), the failure it meets on each phone tier and why
// (policy/tier_failure.h). Markdown to stdout unless a.json; rows appended to *rows. Exit status.
int ResidencyTable(const PlanArgs& a, double flash_Bps, const std::string& flash_from, nlohmann::json* rows) {
  RepackIsa isa;
  if (a.isa == "arm-dotprod") isa = RepackIsa::kArmDotprod;
  else if (a.isa == "x86-avx2") isa = RepackIsa::kX86Avx2;
  else {
    std::fprintf(stderr, "error: --isa must be arm-dotprod or x86-avx2\n");
    return 2;
  }
  const uint32_t n_ctx = 4096;
  const double kv_scale = a.kv_type == "q8_0" ? 34.0 / 64.0 : 1.0;  // q8_0: 34 bytes per 32 fp16 values
  const uint64_t scratch = 200000000;  // the notes' compute scratch, 0.20 GB
  if (!a.json) {
    std::printf("\n## Residency on phone tiers (llama.cpp's loader, the field notes' model: docs/plan.md)\n\n");
    std::printf("KV %s at %u tokens, scratch 0.20 GB, repack table %s, flash %.0f MB/s (%s). Tier = MemTotal in GB; "
                "of it OS 32.5%%, background apps 15%%, app runtime 0.50 GB (the notes' 8 GB phone: 2.60, 1.20, 0.50).\n\n",
                a.kv_type.c_str(), n_ctx, a.isa.c_str(), flash_Bps / 1e6, flash_from.c_str());
    std::printf("| model | quant | file GB | weights |");
    for (double t : a.tiers) std::printf(" %g GB |", t);
    std::printf("\n|---|---|---:|---|");
    for (size_t i = 0; i < a.tiers.size(); ++i) std::printf("---|");
    std::printf("\n");
  }
  for (const std::string& id : a.res_shapes) {
    const ModelSpec* spec = FindModelSpec(id);
    if (!spec) {
      std::fprintf(stderr, "error: unknown shape %s\n", id.c_str());
      return 2;
    }
    for (const std::string& q : a.res_quants) {
      ModelFilePlan fp;
      SynthOptions so;
      so.type = q;
      so.vocab_dir = VocabDir();
      UseFamilyChatTemplate(*spec, &so, true);
      if (Status st = PlanModelFile(*spec, so, &fp); !st.ok()) return Fail(st);
      for (int layout = 0; layout < (a.third_way ? 3 : 2); ++layout) {
        const bool repack = layout != 1;
        TierConfig cfg;
        cfg.repack = repack;
        cfg.give_back = layout == 2;
        cfg.repack_Bps = a.repack_mbps * 1e6;
        cfg.isa = isa;
        cfg.kv_bytes = uint64_t(double(KvBytesFor(*spec, n_ctx)) * kv_scale);
        cfg.scratch_bytes = scratch;
        cfg.tied = spec->tied;
        const char* layout_name = layout == 0 ? "repacked (default)" : layout == 1 ? "--no-repack"
                                                                    : "third way (MZ_WEIGHTS_REPACKED)";
        if (!a.json)
          std::printf("| %s | %s | %.2f | %s |", spec->real_name.c_str(), q.c_str(), fp.file_bytes / 1e9, layout_name);
        nlohmann::json per = nlohmann::json::array();
        for (double gb : a.tiers) {
          const PhoneTier tier = PhoneTier::FromRam(gb * 1e9, flash_Bps);
          const TierVerdict v = ClassifyOnTier(fp, tier, cfg);
          std::string cell = TierFailureName(v.failure);
          if (v.failure == TierFailure::kKilledAtLoad)
            cell = PlanFmt("**killed at load**: %.2f GB unevictable > %g", v.quiet_demand / 1e9, gb);
          else if (v.failure == TierFailure::kKilledOnReturn)
            cell = PlanFmt("**killed on return**: %.2f GB with background apps back > %g", v.busy_demand / 1e9, gb);
          else if (v.failure == TierFailure::kThrash)
            cell = PlanFmt("**thrash**: >= %.2f GB per token from flash (%.1f s)", v.reread_per_token / 1e9,
                           v.reread_per_token / flash_Bps);
          else
            cell = PlanFmt("fits: %.2f GB of page cache spare", (v.page_cache - v.streamed_file) / 1e9);
          if (cfg.give_back && v.failure != TierFailure::kKilledAtLoad && v.failure != TierFailure::kKilledOnReturn) {
            cell += PlanFmt("; %d of %d layers repacked with apps back, %d quiet", v.repacked_layers_busy, v.n_layer,
                            v.repacked_layers_quiet);
            if (v.remake_layer_s > 0) cell += PlanFmt("; re-making a layer %.2f s", v.remake_layer_s);
          }
          if (!a.json) std::printf(" %s |", cell.c_str());
          per.push_back({{"tier_gb", gb}, {"failure", TierFailureName(v.failure)}, {"why", v.why},
                         {"weights_anon_bytes", v.weights_anon}, {"weights_file_bytes", v.weights_file},
                         {"quiet_demand_bytes", v.quiet_demand}, {"busy_demand_bytes", v.busy_demand},
                         {"reread_per_token_bytes", v.reread_per_token},
                         {"repacked_layers_busy", v.repacked_layers_busy},
                         {"repacked_layers_quiet", v.repacked_layers_quiet},
                         {"remake_layer_s", v.remake_layer_s}});
        }
        if (!a.json) std::printf("\n");
        rows->push_back({{"model", spec->real_name}, {"quant", q}, {"file_bytes", fp.file_bytes},
                         {"repack", repack}, {"third_way", cfg.give_back}, {"kv_bytes", cfg.kv_bytes},
                         {"tiers", per}});
      }
    }
  }
  if (!a.json)
    std::printf("\nkilled at load: the app's unevictable memory (runtime, scratch, KV, repacked weights) and the OS "
                "exceed RAM even with every background app killed. killed on return: it loads on a quiet phone, but "
                "when the background apps come back the app holds the largest anonymous set and lmkd kills it. "
                "thrash: the weights left in the file mapping that every token reads exceed the page cache left, so "
                "each token re-reads at least the difference from flash (an LRU over a cyclic scan re-reads more). "
                "`--json` gives each cell's full reason.%s\n",
                a.third_way ? " third way: mzcache with MZ_WEIGHTS_REPACKED (docs/residency.md): layers "
                              "repacked while memory allows, given back one at a time and re-made from the file; killed only "
                              "when the app does not fit without any weights." : "");
  return 0;
}

int RunRecommend(PlanArgs& a) {
  Env* env = Env::Default();
  Device d;
  std::string mi;
  uint64_t total = 0;
  if (env->ReadSmallFile("/proc/meminfo", &mi).ok()) {
    const size_t pos = mi.find("MemTotal:");
    if (pos != std::string::npos) total = std::strtoull(mi.c_str() + pos + 9, nullptr, 10) * 1024;
  }
  d.ram = a.ram_gib > 0 ? a.ram_gib * kGiB : double(total);
  d.ram_from = a.ram_gib > 0 ? "--ram-gib" : "MemTotal";
  if (d.ram <= 0) {
    std::fprintf(stderr, "error: cannot read MemTotal: give --ram-gib\n");
    return 2;
  }
  // What an app may hold: the field notes' 8 GB phone gives 2.60 GB to the OS, 1.20 to background
  // apps kept warm and 0.50 to the app runtime: 4.30 of 8 (54%) is not the model's.
  // This machine (no --ram-gib): what it can give now, MemAvailable.
  uint64_t avail = 0;
  const size_t ap = mi.find("MemAvailable:");
  if (ap != std::string::npos) avail = std::strtoull(mi.c_str() + ap + 13, nullptr, 10) * 1024;
  if (a.reserve_gib >= 0) d.reserve = a.reserve_gib * kGiB;
  else if (a.ram_gib <= 0 && avail > 0) d.reserve = d.ram - double(avail);
  else d.reserve = 0.54 * d.ram;
  d.usable = d.ram - d.reserve;
  CpuTopology topo;
  if (a.cores > 0) d.cores = a.cores;
  else if (ReadCpuTopology(env, &topo).ok() && !topo.clusters.empty())
    d.cores = int(topo.clusters[0].cpus.size());
  std::string ppath = a.profile.empty() ? CacheDir() + "/profile.json" : a.profile;
  DeviceProfile prof = DeviceProfile::Default();
  FileInfo fi;
  const bool have_profile = env->StatPath(ppath, &fi).ok() && DeviceProfile::Load(ppath, &prof, env).ok();
  d.read_Bps = a.read_mbps > 0 ? a.read_mbps * 1e6 : prof.MappedReadBps(64ull << 20);
  d.read_from = a.read_mbps > 0 ? "--read-mbps" : have_profile ? ppath : "the default profile (run `mzcache profile`)";
  if (d.usable <= 0) {
    std::fprintf(stderr, "error: --reserve-gib leaves no memory\n");
    return 2;
  }
  const std::string vocab_dir = VocabDir();
  mz_plan_params p = mz_plan_default_params();
  p.memory_budget = uint64_t(d.usable);
  p.margin = float(a.margin);
  p.kv_chunk_tokens = uint32_t(a.chunk);
  p.n_ubatch = uint32_t(a.ubatch);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    std::printf("## Device tier: %.1f GiB RAM (%s), %.1f GiB usable by the model (%.1f reserved), %d cores, "
                "storage %.0f MB/s (%s)\n\n",
                d.ram / kGiB, d.ram_from.c_str(), d.usable / kGiB, d.reserve / kGiB, d.cores, d.read_Bps / 1e6,
                d.read_from.c_str());
    std::printf("Headroom: a row fits when its peak is at most %.0f%% of the usable memory.\n\n",
                100.0 * (1.0 - a.margin));
    std::printf("| model | quant | weights GiB | max ctx (f16 KV) | max ctx (q8_0 KV) | peak GiB at 4096 tokens | cold load s | verdict |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---|\n");
  }
  for (const std::string& id : a.shapes) {
    const ModelSpec* spec = FindModelSpec(id);
    if (!spec) {
      std::fprintf(stderr, "error: unknown shape %s\n", id.c_str());
      return 2;
    }
    for (const std::string& q : a.quants) {
      ModelFilePlan wb;
      SynthOptions so;
      so.type = q;
      so.vocab_dir = vocab_dir;
      UseFamilyChatTemplate(*spec, &so, true);
      if (Status st = PlanModelFile(*spec, so, &wb); !st.ok()) return Fail(st);
      mz_plan_shape sh{spec->n_layer, spec->n_head, spec->n_head_kv, spec->head_dim, spec->n_embd, spec->n_ff,
                       int32_t(wb.n_vocab), wb.tensor_bytes, wb.params, PlanWeightType(q)};
      mz_plan_result r;
      p.n_ctx = 4096;
      int rc = mz_plan_estimate_shape(&sh, &p, &r);
      if (rc != MZ_OK) return CFail("planning " + id + " (" + q + ")", rc);
      const uint32_t cap = uint32_t(spec->n_ctx_train);
      const uint32_t c16 = std::min(r.max_ctx, cap), c8 = std::min(r.max_ctx_q8, cap);
      const double load_s = double(wb.tensor_bytes) / d.read_Bps;
      // Why: the binding part and the smallest useful context (2048 tokens).
      std::string verdict;
      if (c8 < 2048)
        verdict = "no: weights + overhead leave " + std::to_string(c8) + " tokens even with q8_0 KV";
      else if (c16 >= 8192)
        verdict = "yes: long conversations (" + std::to_string(c16) + " tokens f16)";
      else if (c16 >= 2048)
        verdict = "yes, short context: " + std::to_string(c16) + " tokens f16, " + std::to_string(c8) + " q8_0";
      else
        verdict = "only with q8_0 KV: " + std::to_string(c8) + " tokens";
      if (c8 >= 2048 && load_s > 10) verdict += "; cold load over 10 s";
      if (a.json) {
        rows.push_back({{"model", spec->real_name}, {"quant", q}, {"weight_bytes", wb.tensor_bytes},
                        {"max_ctx_f16", c16}, {"max_ctx_q8_0", c8}, {"peak_4096", r.peak},
                        {"cold_load_s", load_s}, {"fits", c8 >= 2048}, {"verdict", verdict}});
      } else {
        std::printf("| %s | %s | %.2f | %u | %u | %.2f | %.1f | %s |\n", spec->real_name.c_str(), q.c_str(),
                    double(wb.tensor_bytes) / kGiB, c16, c8, double(r.peak) / kGiB, load_s, verdict.c_str());
      }
    }
  }
  if (!a.json) {
    std::printf("\nmax ctx: the largest context (whole %d-token chunks, at most the model's training context) whose "
                "peak (weights + KV + compute + overhead) stays under the headroom line. Cold load: the weights read "
                "at the storage speed. Threads: %d (the fastest cluster's cores).\n",
                a.chunk, d.cores);
  }
  // The residency table after the device's own (its rows go into the JSON document).
  nlohmann::json residency = nlohmann::json::array();
  const double flash_Bps = a.read_mbps > 0 ? a.read_mbps * 1e6 : 800e6;
  if (int rc = ResidencyTable(a, flash_Bps, a.read_mbps > 0 ? "--read-mbps" : "the notes' UFS 2.2", &residency); rc != 0)
    return rc;
  if (a.json) {
    nlohmann::json j;
    j["device"] = {{"ram_bytes", d.ram},     {"ram_from", d.ram_from}, {"reserve_bytes", d.reserve},
                   {"usable_bytes", d.usable}, {"cores", d.cores},     {"read_Bps", d.read_Bps},
                   {"read_from", d.read_from}, {"margin", a.margin}};
    j["rows"] = rows;
    j["residency"] = residency;
    std::printf("%s\n", j.dump(2).c_str());
  }
  return 0;
}

}  // namespace

void AddPlanCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = app.add_subcommand("plan", "the peak memory a run will need, set against what the process may use");
  c->add_option("-m,--model", a->model, "GGUF path (default: the synthesized Qwen3-0.6B q8_0, made if missing)");
  c->add_option("-c,--ctx", a->ctx, "context tokens to plan, or auto: the largest that fits with --margin");
  c->add_option("--kv-type", a->kv_type, "KV element format: f16 or q8_0");
  c->add_option("--memory-budget", a->budget_mib, "a RAM budget in MiB to plan against (0: none)");
  c->add_flag("--anonymous", a->anonymous, "weights in anonymous memory (default: file-backed page cache)");
  c->add_option("--chunk-tokens", a->chunk, "tokens per KV chunk")->check(CLI::Range(1, 65536));
  c->add_option("--ubatch", a->ubatch, "tokens per forward graph")->check(CLI::Range(1, 1 << 20));
  c->add_option("--margin", a->margin, "share of the limit kept free by auto and the largest context")
      ->check(CLI::Range(0.0, 0.9));
  c->add_flag("--json", a->json, "print JSON instead of tables");
  c->add_flag("--recommend", a->recommend,
              "device tiers: the model shapes, quants and contexts this device (or --ram-gib ...) holds with headroom");
  c->add_option("--ram-gib", a->ram_gib, "--recommend: the device's RAM in GiB (default: this machine's MemTotal)");
  c->add_option("--reserve-gib", a->reserve_gib,
                "--recommend: RAM not the model's (OS, background apps, app runtime; default: with --ram-gib 54% of "
                "it, the field notes' 8 GB phone; else MemTotal - MemAvailable)");
  c->add_option("--cores", a->cores, "--recommend: cores (default: the fastest cluster's)");
  c->add_option("--read-mbps", a->read_mbps, "--recommend: storage read MB/s (default: the device profile's)");
  c->add_option("--profile", a->profile, "--recommend: device profile (default: <cache>/profile.json)");
  c->add_option("--shapes", a->shapes, "--recommend: model shapes (make-model ids)");
  c->add_option("--quants", a->quants, "--recommend: weight recipes (make-model --type: f16, q8_0, q4_k, q4_0, q4_k_m, q3_k_m)");
  c->add_option("--tiers", a->tiers, "--recommend, residency table: phone tiers, MemTotal in GB (default 6 8 12)");
  c->add_option("--residency-shapes", a->res_shapes, "--recommend, residency table: model shapes (default the 8Bs)");
  c->add_option("--residency-quants", a->res_quants, "--recommend, residency table: weight recipes");
  c->add_option("--isa", a->isa, "--recommend, residency table: whose repack table, arm-dotprod (the notes' phone) or x86-avx2");
  c->add_flag("--third-way", a->third_way,
              "--recommend, residency table: also plan the third way (repacked while memory allows, given back a layer "
              "at a time, re-made from the file: MZ_WEIGHTS_REPACKED, docs/residency.md)");
  c->add_option("--repack-mbps", a->repack_mbps,
                "--recommend, --third-way: repack throughput in MB/s for the time to re-make a layer (bench_repack)");
  c->footer("Exit status: 0 fits, 3 does not fit (plan), 1 error.");
  runners.push_back([c, a]() -> int {
    if (!c->parsed()) return -1;
    return a->recommend ? RunRecommend(*a) : RunPlan(*a);
  });
}

}  // namespace mz::cli
