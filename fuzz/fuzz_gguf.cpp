// Fuzz target: the GGUF loader (Model::Load with load_weights=false): header, metadata, hyper-
// parameters, tensor infos and the unit plan. Contract checked: any file is either rejected with a
// Status or yields a model whose every tensor lies inside the file and whose units are consistent.
#include <cstdint>
#include <memory>
#include <string>

#include "env/env.h"
#include "fuzz_util.h"
#include "model/model.h"

namespace {
std::string* g_path = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_path = new std::string(mz::fuzz::ScratchPath("model.gguf"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mz::Env* env = mz::Env::Default();
  mz::fuzz::WriteInput(env, *g_path, data, size);
  mz::ModelOptions o;
  o.load_weights = false;
  std::unique_ptr<mz::Model> m;
  mz::Status st = mz::Model::Load(env, *g_path, o, &m);
  if (!st.ok()) {
    if (m) mz::fuzz::Fail("Load failed but produced a model");
    return 0;
  }
  // An accepted file: every tensor and read run lies inside the file, units are dropped.
  const uint64_t fsize = m->identity().size;
  if (fsize != size) mz::fuzz::Fail("identity size differs from the file size");
  if (m->n_units() != int(m->hparams().n_layer) + 1) mz::fuzz::Fail("unit count");
  for (int u = 0; u < m->n_units(); ++u) {
    const mz::WeightUnit& w = m->unit(u);
    if (w.resident()) mz::fuzz::Fail("unit resident with load_weights=false");
    for (const auto& t : w.tensors)
      if (t.file_off > fsize || t.bytes > fsize - t.file_off) mz::fuzz::Fail("tensor past end of file");
    for (const auto& r : w.runs)
      if (r.need > r.len || r.file_off > fsize || r.need > fsize - r.file_off) mz::fuzz::Fail("read run past end of file");
  }
  return 0;
}
