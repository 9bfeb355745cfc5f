#include "test_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "env/env.h"
#include "model/synth.h"
#include "runtime/tokenizer.h"

#include <gtest/gtest.h>
#include <map>
#include <memory>
#include <mutex>

namespace mz::test {

void UseFamilyChatTemplate(const ModelSpec& spec, SynthOptions* o) {
  std::string path;
  // The build requires the pinned source (CMakeLists.txt), so its templates are there.
  Status st = ReadFamilyChatTemplate(Env::Default(), spec, std::string(MZ_LLAMA_SRC_STR) + "/models/templates",
                                     &o->chat_template, &path);
  if (!st.ok() && st.code() != Status::kUnsupported) throw std::runtime_error(st.ToString());
}

std::string ModelPath(const std::string& shape, const std::string& type) {
  const char* over = std::getenv("MZ_TEST_MODEL_DIR_OVERRIDE");
  std::string dir = over && *over ? over : MZ_TEST_MODEL_DIR;
  std::system(("mkdir -p '" + dir + "'").c_str());
  std::string path = dir + "/" + shape + "-" + type + ".gguf";
  const ModelSpec* spec = FindModelSpec(shape);
  if (!spec) throw std::runtime_error("unknown shape " + shape);
  SynthOptions o;
  o.type = type;
  o.vocab_dir = std::string(MZ_DEPS_PREFIX_STR) + "/share/vocab";
  UseFamilyChatTemplate(*spec, &o);
  // A file made by an older recipe is made again. The folder's stamp names the recipe revision
  // (kSynthRecipeRevision) its files are checked against: a file older than the stamp is checked
  // once against the size the recipe plans now (and touched when it passes), so the check costs a
  // plan (~0.1 s) once per file and revision, not per call.
  const std::string stamp = dir + "/synth-recipe-revision";
  std::string rev;
  if (!Env::Default()->ReadSmallFile(stamp, &rev).ok() || rev != std::to_string(kSynthRecipeRevision)) {
    const std::string tmp = stamp + "." + std::to_string(getpid());
    std::ofstream(tmp) << kSynthRecipeRevision;
    std::rename(tmp.c_str(), stamp.c_str());
  }
  // Test processes run in parallel (ctest -j) and may all want the same file: one makes or checks
  // it at a time (an exclusive lock on path.lock), and the others then find it made. Without the
  // lock two processes could both make it and the second rename would replace a file the first
  // process already loaded (its later reads then see "model file changed").
  const std::string lock_path = path + ".lock";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) throw std::runtime_error("cannot open " + lock_path);
  while (::flock(lock_fd, LOCK_EX) != 0)
    if (errno != EINTR) {
      ::close(lock_fd);
      throw std::runtime_error("cannot lock " + lock_path);
    }
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing releases the lock
  } unlock{lock_fd};
  FileInfo info, stamp_info;
  if (Env::Default()->StatPath(path, &info).ok()) {
    if (Env::Default()->StatPath(stamp, &stamp_info).ok() && info.mtime_ns >= stamp_info.mtime_ns) return path;
    ModelFilePlan planned;
    if (PlanModelFile(*spec, o, &planned).ok() && info.size == planned.file_bytes) {
      ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
      return path;
    }
  }
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

namespace {

// The tokens of LongText() for the model at `path`, kept beside the model file as
// `<path>.longtext-<key>.tokens` (a count, then the int32 ids). The key hashes the text and the
// model file's size and modification time, so a re-synthesized model or another text is tokenized
// again. Written to a private temp name and renamed, so concurrent test processes never read half a
// file. Returns false (and the caller tokenizes) when the file is missing or does not read whole.
std::string TokenCachePath(const std::string& path, const std::string& text) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  const size_t key = std::hash<std::string>{}(text + "|" + std::to_string(st.st_size) + "|" +
                                              std::to_string(st.st_mtim.tv_sec) + "." +
                                              std::to_string(st.st_mtim.tv_nsec));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", key);
  return path + ".longtext-" + hex + ".tokens";
}

bool ReadTokenCache(const std::string& file, std::vector<int32_t>* t) {
  std::ifstream f(file, std::ios::binary);
  uint64_t n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), sizeof n) || n == 0 || n > (1u << 24)) return false;
  t->resize(size_t(n));
  if (!f.read(reinterpret_cast<char*>(t->data()), std::streamsize(n * sizeof(int32_t)))) return false;
  return f.peek() == std::char_traits<char>::eof();
}

void WriteTokenCache(const std::string& file, const std::vector<int32_t>& t) {
  const std::string tmp = file + "." + std::to_string(getpid()) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    const uint64_t n = t.size();
    f.write(reinterpret_cast<const char*>(&n), sizeof n);
    f.write(reinterpret_cast<const char*>(t.data()), std::streamsize(n * sizeof(int32_t)));
    if (!f) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

std::vector<int32_t> PromptTokens(const std::string& path, int n) {
  // Loading a tokenizer reads the model's whole vocabulary through libllama (151k entries for the
  // Qwen shapes): 35% of a short unit-table test's CPU in a normal build, and about 6 s per load
  // under TSan. The tokens of LongText() are the same for every call with the same model file, so
  // they are kept in memory for the process and on disk beside the model for the next processes
  // (each ctest case is a process of its own). A failed load is not remembered: each call reports it.
  static std::mutex mu;
  static std::map<std::string, std::vector<int32_t>> tokenized;
  std::vector<int32_t> t;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = tokenized.find(path);
    if (it != tokenized.end()) t = it->second;
  }
  if (t.empty()) {
    const std::string text = LongText();
    const std::string cache = TokenCachePath(path, text);
    if (cache.empty() || !ReadTokenCache(cache, &t)) {
      t.clear();
      std::unique_ptr<Tokenizer> tok;
      EXPECT_TRUE(Tokenizer::Load(path, &tok).ok());
      if (tok) EXPECT_TRUE(tok->Tokenize(text, true, false, &t).ok());
      if (!t.empty() && !cache.empty()) WriteTokenCache(cache, t);
    }
    if (!t.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      tokenized.emplace(path, t);
    }
  }
  t.resize(size_t(n));
  return t;
}

namespace {
std::mutex temp_mu;
std::string temp_dir;  // this process's, once made
pid_t temp_owner = 0;  // the process that made it (a forked child exiting must not remove it)

// At exit of the process that made it: removed if every test passed, kept to look at otherwise.
void RemoveTempDir() {
  if (getpid() != temp_owner || temp_dir.empty()) return;
  if (!::testing::UnitTest::GetInstance()->Passed()) {
    std::fprintf(stderr, "[test_util] kept %s (a test failed)\n", temp_dir.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(temp_dir, ec);
}
}  // namespace

std::string TempDir() {
  std::lock_guard<std::mutex> lock(temp_mu);
  if (temp_dir.empty() || temp_owner != getpid()) {
    temp_dir = std::string(MZ_TEST_MODEL_DIR) + "/../tmp-" + std::to_string(getpid());
    if (temp_owner == 0) std::atexit(RemoveTempDir);
    temp_owner = getpid();
  }
  std::error_code ec;
  std::filesystem::create_directories(temp_dir, ec);
  return temp_dir;
}

}  // namespace mz::test
