// Replays fuzz inputs without libFuzzer: each argument is a file, or a folder whose files are
// replayed in name order, through the target's LLVMFuzzerTestOneInput. A crash or a broken contract
// aborts (the ctest fails); otherwise prints how many inputs ran. This is how the committed corpus
// (fuzz/corpus/<target>/) and the regression inputs (fuzz/regressions/<target>/) run in every build.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

int main(int argc, char** argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::string> in;
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) in.push_back(e.path().string());
      std::sort(in.begin(), in.end());
      files.insert(files.end(), in.begin(), in.end());
    } else if (std::filesystem::exists(p)) {
      files.push_back(p.string());
    }
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay %s (%zu bytes)\n", f.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("replayed %zu inputs\n", files.size());
  return 0;
}
