#include "tools/common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "env/env.h"
#include "model/synth.h"

namespace mz::cli {

std::string CacheDir() {
  std::string dir;
  // The library's rule (mz::CacheDir); the POSIX Env's GetEnvVar does not fail.
  (void)mz::CacheDir(Env::Default(), &dir);
  return dir;
}

std::string VocabDir() {
  if (const char* d = std::getenv("MZ_VOCAB_DIR"); d && *d) return d;
  return std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab";
}

std::string TemplatesDir() {
  if (const char* d = std::getenv("MZ_LLAMA_SRC"); d && *d) return std::string(d) + "/models/templates";
  return std::string(MZ_LLAMA_SRC_STR) + "/models/templates";
}

std::string UseFamilyChatTemplate(const ModelSpec& spec, SynthOptions* o, bool quiet) {
  std::string path;
  Status st = ReadFamilyChatTemplate(Env::Default(), spec, TemplatesDir(), &o->chat_template, &path);
  if (st.ok()) return path;
  if (!quiet)
    std::fprintf(stderr,
                 "note: %s's real chat template not embedded (%s): the model gets a plain ChatML / Llama 3 "
                 "template without tool syntax (serve --chat-template-file gives it one)\n",
                 spec.id.c_str(), st.ToString().c_str());
  return "";
}

std::string LlamaBenchPath() {
  if (const char* d = std::getenv("MZ_LLAMA_BENCH"); d && *d) return d;
  return std::string(MZ_DEPS_PREFIX_STR) + "/bin/llama-bench";
}

std::string LlamaServerPath() {
  if (const char* d = std::getenv("MZ_LLAMA_SERVER"); d && *d) return d;
  return std::string(MZ_DEPS_PREFIX_STR) + "/bin/llama-server";
}

void Progress(const char* what, uint64_t done, uint64_t total) {
  static int last = -1;
  int pct = total ? int(done * 100 / total) : 100;
  bool tty = isatty(2);
  if (!tty && pct / 10 == last / 10 && pct != 100) return;
  if (pct == last) return;
  last = pct;
  std::fprintf(stderr, tty ? "\r%s: %3d%% (%.1f / %.1f MiB)" : "%s: %3d%% (%.1f / %.1f MiB)\n", what, pct,
               double(done) / 1048576.0, double(total) / 1048576.0);
  if (tty && pct == 100) std::fprintf(stderr, "\n");
  if (pct == 100) last = -1;
}

Status EnsureDefaultModel(std::string* path, const std::string& spec_id, const std::string& type) {
  std::string dir = CacheDir() + "/models";
  std::string cmd = "mkdir -p '" + dir + "'";
  if (std::system(cmd.c_str()) != 0) return Status::IOError("cannot create " + dir);
  *path = dir + "/" + spec_id + "-" + type + ".gguf";
  FileInfo info;
  if (Env::Default()->StatPath(*path, &info).ok()) return Status::Ok();
  const ModelSpec* spec = FindModelSpec(spec_id);
  if (!spec) return Status::InvalidArgument("unknown model shape " + spec_id);
  SynthOptions o;
  o.type = type;
  o.vocab_dir = VocabDir();
  UseFamilyChatTemplate(*spec, &o);
  o.progress = [](uint64_t d, uint64_t t) { Progress("synthesizing default model", d, t); };
  std::fprintf(stderr, "making %s (first run only)\n", path->c_str());
  return SynthesizeModel(Env::Default(), *spec, o, *path);
}

int Fail(const Status& st) {
  std::fprintf(stderr, "error: %s\n", st.ToString().c_str());
  return 1;
}

std::string MibText(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / 1048576.0);
  return buf;
}

}  // namespace mz::cli
