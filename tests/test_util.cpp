#include "test_util.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "env/env.h"
#include "model/synth.h"
#include "runtime/tokenizer.h"

#include <gtest/gtest.h>
#include <memory>

namespace mz::test {

std::string ModelPath(const std::string& shape, const std::string& type) {
  const char* over = std::getenv("MZ_TEST_MODEL_DIR_OVERRIDE");
  std::string dir = over && *over ? over : MZ_TEST_MODEL_DIR;
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::string path = dir + "/" + shape + "-" + type + ".gguf";
  FileInfo info;
  if (Env::Default()->StatPath(path, &info).ok()) return path;
  const ModelSpec* spec = FindModelSpec(shape);
  if (!spec) throw std::runtime_error("unknown shape " + shape);
  SynthOptions o;
  o.type = type;
  o.vocab_dir = std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab";
  // Unique temp per process: SynthesizeModel writes path.tmp, so synthesize to a private name first.
  std::string mine = path + "." + std::to_string(getpid());
  Status st = SynthesizeModel(Env::Default(), *spec, o, mine);
  if (!st.ok()) throw std::runtime_error(st.ToString());
  if (::rename(mine.c_str(), path.c_str()) != 0) throw std::runtime_error("rename failed");
  return path;
}

std::string LongText() {
  for (const char* p : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2"}) {
    std::ifstream f(p);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
  }
  std::string s;
  for (int i = 0; i < 200; ++i)
    s += "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
         "foolishness, it was the epoch of belief, it was the epoch of incredulity. ";
  return s;
}

std::vector<int32_t> PromptTokens(const std::string& path, int n) {
  std::unique_ptr<Tokenizer> tok;
  EXPECT_TRUE(Tokenizer::Load(path, &tok).ok());
  std::vector<int32_t> t;
  if (tok) EXPECT_TRUE(tok->Tokenize(LongText(), true, false, &t).ok());
  t.resize(size_t(n));
  return t;
}

std::string TempDir() {
  std::string d = std::string(MZ_TEST_MODEL_DIR) + "/../tmp-" + std::to_string(getpid());
  std::system(("mkdir -p '" + d + "'").c_str());
  return d;
}

}  // namespace mz::test
