// Helpers shared by `bench peers` and `bench accuracy`: real-text token streams, contexts built once
// by prefill and kept as session files (the same files `bench ttft` uses:
// <cache>/contexts/<model-stem>-<n>.sess), one restore_generate measurement from a remaining-memory
// level, page-cache control for files that must come from storage, and printf into strings (the report helpers are in report.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "restore/restore_pipeline.h"
#include "store/q8_kv.h"
#include "tools/bench/os_memory.h"  // DropFileCache, FileCachedFraction
#include "tools/bench/report.h"

namespace mz {
class Context;
}

namespace mz::cli {

// File name without folder and ".gguf" ("qwen3-0.6b-q8_0").
std::string ModelStem(const std::string& model_path);
// The first n tokens of the real text (tools/bench/real_text.h) under the model's tokenizer, with BOS. The
// prefix is the same whatever n is (the text is cut far past the n-th token), so a context of n
// tokens is followed by the real continuation toks[n...].
Status RealTokens(const std::string& model_path, int n, std::vector<int32_t>* toks);
// <cache>/contexts/<stem>-<n>.sess; for KV type q8_0 <stem>-<n>-q8_0.sess (a context whose KV was
// written live as q8 rows by its own prefill: its later layers differ from the q8 encoding of an
// f16 context's KV, since each layer attends over the previous layers' q8 rows).
std::string SessionPathFor(const std::string& model_path, int n, KvType kv_type = KvType::kF16);
// Makes ctx hold exactly toks[0, n): loaded from SessionPathFor(n, ctx's KV type) if that file
// exists and holds these tokens, else built by prefill (512-token batches, progress on stderr) and
// saved there (codec "none": lossless, and a q8_0 context's KV reloads bit for bit) for later runs.
// *built tells which happened. ctx must be empty or is truncated; REQUIRES n <= toks.size() and
// ctx's n_ctx >= n.
Status EnsureSessionContext(Context& ctx, const std::string& model_path, const std::vector<int32_t>& toks, int n,
                            std::string* session_path, bool* built = nullptr);

struct LevelRun {
  double ttft = 0;        // restore_generate: call to logits of the last query token
  double remaining = 0;   // reached before the query (base unit excluded, as the paper)
  double alloc = 0, reload = 0;
  uint64_t bytes_from_storage = 0, bytes_decoded = 0;
  int top1 = -1;          // greedy next token after the query
};
// Restores everything, truncates to `base` tokens, evicts with the context's policy (hybrid swap)
// down to `level` (0..1) of the footprint remaining in memory (base unit excluded; level >= 1: no
// eviction), then restore_generate of the query. The context keeps base + query tokens afterwards.
Status MeasureLevel(Context& ctx, double level, const std::vector<int32_t>& query, int base, LevelRun* out,
                    const PipelineOptions& po = PipelineOptions());


// A comma-separated list of KV types ("f16,q8_0"; "q8" is q8_0) in the given order, without
// repeats; InvalidArgument naming `option` for an unknown or an empty list.
Status ParseKvTypeList(const std::string& list, const char* option, std::vector<KvType>* out);

// printf into a std::string.
std::string Sprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace mz::cli
