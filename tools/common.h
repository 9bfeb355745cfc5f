// Helpers shared by the CLI subcommands.
#pragma once
#include <cstdio>
#include <string>

#include "core/status.h"
#include "model/synth.h"

namespace mz::cli {

// ~/.cache/mzcache (or $MZ_CACHE_DIR): mz::CacheDir (env/env.h) on the default Env.
std::string CacheDir();
// Folder with llama.cpp's ggml-vocab-*.gguf ($MZ_VOCAB_DIR, else the pinned deps install).
std::string VocabDir();
// The pinned llama.cpp source's models/templates ($MZ_LLAMA_SRC/models/templates when set, else
// the source this binary was built against): the real models' chat templates make-model embeds.
std::string TemplatesDir();
// Sets o->chat_template to the real family's template of spec (TemplatesDir, read now); when it
// cannot be read, leaves the plain one and says so on stderr (unless quiet). Returns the path used
// ("" for the plain template).
std::string UseFamilyChatTemplate(const ModelSpec& spec, SynthOptions* o, bool quiet = false);
// llama-bench from the pinned deps install ($MZ_LLAMA_BENCH overrides).
std::string LlamaBenchPath();
// llama-server from the pinned deps install ($MZ_LLAMA_SERVER overrides; scripts/deps.sh builds it
// with MZ_DEPS_SERVER=1).
std::string LlamaServerPath();
// The default model: synthesized Qwen3-0.6B q8_0 in the cache dir; made if missing.
Status EnsureDefaultModel(std::string* path, const std::string& spec = "qwen3-0.6b", const std::string& type = "q8_0");
// Prints a one-line progress bar to stderr (only when stderr is a terminal, else every 10%).
void Progress(const char* what, uint64_t done, uint64_t total);
int Fail(const Status& st);
// "12.3 MiB": bytes in MiB with one decimal.
std::string MibText(uint64_t bytes);

}  // namespace mz::cli
