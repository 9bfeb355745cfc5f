// --weights: how a command's model holds its weights (one option, one name, on run, chat, serve,
// bench models and bench field-notes), mapped onto mz_model_params.weight_memory (include/mzcache.h):
//   page-cache  mapped from the model file, clean pages the kernel can reclaim (the default;
//               `file` is the same form, the field notes' name for it);
//   anonymous   own anonymous memory filled by reads (direct I/O);
//   repacked    each layer's matrices this CPU has a repacked kernel for held in ggml's repacked
//               layout in anonymous memory, given back one layer at a time under pressure and
//               re-made from the file (MZ_WEIGHTS_REPACKED, docs/residency.md "the third way").
#pragma once
#include <string>

#include "mzcache.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mz::cli {

// Adds --weights to c, stored in *form (its value must outlive c's parse; left as it was when the
// option is not given), refusing any other value at parse time with the list of the accepted ones.
// Returns the option (for extra checks or groups).
CLI::Option* AddWeightsOption(CLI::App* c, std::string* form);

// The MZ_WEIGHTS_* of a --weights value ("page-cache", "file", "anonymous", "repacked"); -1 for any
// other string (a value AddWeightsOption's check let through cannot be one).
int32_t WeightMemoryOf(const std::string& form);

// mz_model_default_params() with weight_memory set from form (unknown: left at the default).
mz_model_params ModelParamsFor(const std::string& form);

// The name of an MZ_WEIGHTS_* value as --weights spells it ("page-cache", "anonymous", "repacked";
// "?" for another value).
const char* WeightsName(int32_t weight_memory);

}  // namespace mz::cli
