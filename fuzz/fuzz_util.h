// Helpers shared by the fuzz targets (fuzz/fuzz_*.cpp): where the input goes on disk, where the
// test model and the vocabularies are. Each target is built twice: with libFuzzer (MZ_FUZZ=ON,
// clang) and, in every build, as a replay program (replay_main.cpp) that runs the committed corpus
// and regression inputs under ctest.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace mz {
class Env;
}

namespace mz::fuzz {

// A scratch file path private to this process (on tmpfs when /dev/shm exists), named `name`;
// removed at exit.
std::string ScratchPath(const std::string& name);
// Writes [data, data+size) to path through env (created or truncated): the fuzz input as a file
// for the loaders that take a path. Aborts on an I/O error (the harness, not the library, failed).
void WriteInput(Env* env, const std::string& path, const uint8_t* data, size_t size);
// The synthesized tiny model of `shape` (q8_0), made on first use in the test-model folder
// (MZ_TEST_MODEL_DIR_OVERRIDE or the build's test-models, as tests/test_util.h).
std::string TinyModelPath(const std::string& shape);
// Folder holding llama.cpp's ggml-vocab-*.gguf (from the pinned deps).
std::string VocabDir();
// Aborts with a message: a broken contract the fuzzer must report as a crash.
[[noreturn]] void Fail(const std::string& what);

}  // namespace mz::fuzz
