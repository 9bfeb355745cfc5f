// The benches' shared first and last steps: opening the model a bench runs on (through the public
// C API where the bench needs nothing more, or as the internal Model where it does), and writing
// its report (markdown + JSON, gnuplot figures).
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "core/status.h"
#include "model/model.h"
#include "mzcache.h"

namespace mz::cli {

// Owning handles for the C API's objects.
struct MzModelFree {
  void operator()(mz_model* m) const { mz_model_free(m); }
};
struct MzContextFree {
  void operator()(mz_context* c) const { mz_context_free(c); }
};
struct MzSamplerFree {
  void operator()(mz_sampler* s) const { mz_sampler_free(s); }
};
using MzModel = std::unique_ptr<mz_model, MzModelFree>;
using MzContext = std::unique_ptr<mz_context, MzContextFree>;
using MzSampler = std::unique_ptr<mz_sampler, MzSamplerFree>;

// A C API return code as a Status: MZ_OK -> Ok, else the same code with mz_last_error() as the
// message (read at once: it is the calling thread's last error).
Status MzStatus(int rc);

// The model file a bench runs on: `model` is a GGUF path (contains '/' or ends in .gguf: it must
// exist), a synthesized shape (`qwen3-0.6b`, see make-model --list) of weight `type` in
// <cache>/models made on first use, or empty for the default (qwen3-0.6b).
Status BenchModelPath(const std::string& model, const std::string& type, std::string* path);
// BenchModelPath, then the model loaded as the internal Model (benches that set up contexts the
// C API does not offer) with `mo`. *path receives the file.
Status OpenBenchModel(const std::string& model, const std::string& type, std::string* path,
                      std::unique_ptr<Model>* out, const ModelOptions& mo = ModelOptions());
// The same through the public C API with default mz_model_params (as an app would load it).
Status OpenBenchModel(const std::string& model, const std::string& type, std::string* path, MzModel* out);

// Writes dir/<stem>.md and dir/<stem>.json (doc.dump(2)), creating dir; false if either failed
// (a bench reports and goes on: its figures are on stdout/stderr too).
bool WriteReport(const std::string& dir, const std::string& stem, const std::string& md, const nlohmann::json& doc);
// Writes dir/name.gp and runs gnuplot in dir; returns "name.png" on success, "" otherwise.
std::string PlotPng(const std::string& dir, const std::string& name, const std::string& script);

}  // namespace mz::cli
