#include "fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "env/env.h"
#include "model/synth.h"

namespace mz::fuzz {
namespace {
std::mutex g_mu;
std::vector<std::string>* g_scratch = nullptr;
void RemoveScratch() {
  if (!g_scratch) return;
  for (const auto& p : *g_scratch) Env::Default()->Remove(p);
}
}  // namespace

std::string ScratchPath(const std::string& name) {
  FileInfo fi;
  std::string dir = Env::Default()->StatPath("/dev/shm", &fi).ok() ? "/dev/shm" : "/tmp";
  std::string p = dir + "/mzfuzz-" + std::to_string(getpid()) + "-" + name;
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_scratch) {
    g_scratch = new std::vector<std::string>();
    std::atexit(RemoveScratch);
  }
  g_scratch->push_back(p);
  return p;
}

void WriteInput(Env* env, const std::string& path, const uint8_t* data, size_t size) {
  std::unique_ptr<File> f;
  Status st = env->Open(path, OpenMode::kCreateTrunc, /*direct=*/false, &f);
  if (st.ok() && size) st = f->Write(data, size, 0);
  if (!st.ok()) Fail("harness: cannot write the input file " + path + ": " + st.ToString());
}

std::string VocabDir() { return std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab"; }

std::string TinyModelPath(const std::string& shape) {
  const char* over = std::getenv("MZ_TEST_MODEL_DIR_OVERRIDE");
  std::string dir = over && *over ? over : MZ_FUZZ_MODEL_DIR;
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::string path = dir + "/" + shape + "-q8_0.gguf";
  FileInfo info;
  if (Env::Default()->StatPath(path, &info).ok()) return path;
  const ModelSpec* spec = FindModelSpec(shape);
  if (!spec) Fail("unknown shape " + shape);
  SynthOptions o;
  o.type = "q8_0";
  o.vocab_dir = VocabDir();
  // A private name first, renamed: safe against a test process synthesizing the same model.
  std::string mine = path + "." + std::to_string(getpid());
  Status st = SynthesizeModel(Env::Default(), *spec, o, mine);
  if (!st.ok()) Fail("cannot synthesize " + shape + ": " + st.ToString());
  st = Env::Default()->Rename(mine, path);
  if (!st.ok()) Fail(st.ToString());
  return path;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz contract violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace mz::fuzz
