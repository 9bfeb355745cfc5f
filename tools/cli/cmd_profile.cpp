// profile: measures this device's restoration throughputs (paper §4.3 offline profiling) and writes
// the profile the eviction policy balances with. A thin command over mz_profile_device.
#include <cstdio>
#include <memory>
#include <string>

#include "mzcache.h"
#include "tools/cli/c_api_text.h"
#include "tools/commands.h"
#include "tools/common.h"

namespace mz::cli {
namespace {

struct ProfileArgs {
  std::string model;
  std::string out;
  std::string dir = "/var/tmp";
  int file_mib = 512;
  int threads = 2;
  bool quick = false;
  std::string remote, remote_ca_file;
};

void PrintReport(const char* text, void*) { std::fputs(text, stdout); }

void PrintProgress(const char* step, int32_t done, int32_t total, void*) {
  std::fflush(stdout);
  std::fprintf(stderr, "  profile: %s (%d/%d)\n", step, int(done), int(total));
}

}  // namespace

void AddProfileCommands(CLI::App& app, Runners& runners) {
  auto a = std::make_shared<ProfileArgs>();
  auto* p = app.add_subcommand("profile", "measure codec, storage and allocation throughputs; write the device profile");
  p->add_option("-m,--model", a->model, "model whose real KV is used for codec throughput (default: Qwen3-0.6B)");
  p->add_option("-o,--out", a->out, "profile path (default: <cache>/profile.json)");
  p->add_option("--dir", a->dir, "folder on the storage to profile (where the swap file lives)");
  p->add_option("--file-mib", a->file_mib, "size of the read test file")->check(CLI::Range(1, 1 << 20));
  p->add_option("-t,--threads", a->threads, "max decode threads to measure")->check(CLI::Range(1, 256));
  p->add_flag("--quick", a->quick,
              "small and fast (seconds; noisier figures): fewer repetitions, smaller tests, a 16 MiB read test "
              "file unless --file-mib is given");
  p->add_option("--remote", a->remote,
                 "redis://[user[:password]@]host:port[/db]: also measure the remote tier's read rate (a few "
                 "chunk-sized values written, read back and removed); without it not measured");
  p->add_option("--remote-ca-file", a->remote_ca_file,
                "rediss:// only: PEM certificate authorities to trust (a private CA; default: the system's)");
  runners.push_back([p, a]() -> int {
    if (!p->parsed()) return -1;
    if (a->model.empty()) {
      Status st = EnsureDefaultModel(&a->model);
      if (!st.ok()) return Fail(st);
    }
    if (a->out.empty()) a->out = CacheDir() + "/profile.json";
    mz_profile_params pp = mz_profile_default_params();
    pp.dir = a->dir.c_str();
    pp.file_mib = uint32_t(a->quick && p->count("--file-mib") == 0 ? 16 : a->file_mib);
    pp.threads = a->threads;
    pp.quick = a->quick;
    pp.remote_url = a->remote.empty() ? nullptr : a->remote.c_str();
    pp.remote_ca_file = a->remote_ca_file.empty() ? nullptr : a->remote_ca_file.c_str();
    pp.progress = PrintProgress;
    pp.report = PrintReport;
    const int rc = mz_profile_device(a->model.c_str(), &pp, a->out.c_str());
    if (rc != MZ_OK) return CFail("profiling the device", rc);
    std::printf("profile written to %s\n", a->out.c_str());
    return 0;
  });
}

}  // namespace mz::cli
