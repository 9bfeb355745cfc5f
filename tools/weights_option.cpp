#include "tools/weights_option.h"

#include <CLI/CLI.hpp>

namespace mz::cli {

CLI::Option* AddWeightsOption(CLI::App* c, std::string* form) {
  return c
      ->add_option("--weights", *form,
                   "how the model holds its weights: page-cache (mapped from the model file, clean pages the kernel "
                   "can reclaim: the default; 'file' is the same), anonymous (own memory filled by direct reads) or "
                   "repacked (the matrices this CPU has a repacked kernel for in ggml's repacked layout, in own "
                   "memory, as llama.cpp's default loader holds them; given back a layer at a time under pressure "
                   "and re-made from the file: docs/residency.md)")
      ->check(CLI::IsMember({"page-cache", "file", "anonymous", "repacked"}));
}

int32_t WeightMemoryOf(const std::string& form) {
  if (form == "page-cache" || form == "file") return MZ_WEIGHTS_PAGE_CACHE;
  if (form == "anonymous") return MZ_WEIGHTS_ANONYMOUS;
  if (form == "repacked") return MZ_WEIGHTS_REPACKED;
  return -1;
}

mz_model_params ModelParamsFor(const std::string& form) {
  mz_model_params p = mz_model_default_params();
  if (const int32_t w = WeightMemoryOf(form); w >= 0) p.weight_memory = w;
  return p;
}

const char* WeightsName(int32_t weight_memory) {
  switch (weight_memory) {
    case MZ_WEIGHTS_PAGE_CACHE: return "page-cache";
    case MZ_WEIGHTS_ANONYMOUS: return "anonymous";
    case MZ_WEIGHTS_REPACKED: return "repacked";
    default: return "?";
  }
}

}  // namespace mz::cli
