// Shared test helpers: synthesized test models (made once per build tree, reused), real text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/synth.h"

namespace mz::test {

// Path of a synthesized model of `shape` and weight `type` under the build's test-models folder,
// made on first use (safe against concurrent test processes: written to a temp name and renamed).
std::string ModelPath(const std::string& shape, const std::string& type = "q8_0");
// Sets o->chat_template to the real family's template from the pinned llama.cpp source, as
// make-model does (throws std::runtime_error when the source's file cannot be read).
void UseFamilyChatTemplate(const ModelSpec& spec, SynthOptions* o);
// A long public-domain English text (the GPL text shipped by Debian, or a fallback).
std::string LongText();
// The first n tokens of LongText() tokenized with the model at `path` (a gtest failure if the
// tokenizer cannot load), padded with token 0 past the text's end. Tokenized once per model file:
// kept for the process and beside the model (`<path>.longtext-<key>.tokens`, keyed by the text and
// the file's size and mtime) for later processes. Thread-safe.
std::vector<int32_t> PromptTokens(const std::string& path, int n);
// Scratch directory for this test process (created; removed at exit when every test passed).
std::string TempDir();

}  // namespace mz::test
