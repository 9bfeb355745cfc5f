#include "tools/bench/report.h"

#include "env/env.h"
#include "tools/bench/bench_util.h"
#include "tools/common.h"

namespace mz::cli {

Status MzStatus(int rc) {
  const std::string msg = mz_last_error();
  switch (rc) {
    case MZ_OK: return Status::Ok();
    case MZ_ERR_INVALID_ARG: return Status::InvalidArgument(msg);
    case MZ_ERR_IO: return Status::IOError(msg);
    case MZ_ERR_CORRUPT: return Status::Corruption(msg);
    case MZ_ERR_UNSUPPORTED: return Status::Unsupported(msg);
    case MZ_ERR_NO_MEMORY: return Status::NoMemory(msg);
    case MZ_ERR_NO_SPACE: return Status::NoSpace(msg);
    case MZ_ERR_BUSY: return Status::Busy(msg);
    case MZ_ERR_CONTEXT_FULL: return Status::ContextFull(msg);
    case MZ_ERR_MODEL_CHANGED: return Status::ModelChanged(msg);
    case MZ_ERR_TIMEOUT: return Status::Timeout(msg);
    case MZ_ERR_CANCELLED: return Status::Cancelled(msg);
    default: return Status::Internal(msg);
  }
}

Status BenchModelPath(const std::string& model, const std::string& type, std::string* path) {
  if (model.empty()) return EnsureDefaultModel(path);
  if (model.find('/') != std::string::npos || model.find(".gguf") != std::string::npos) {
    *path = model;
    FileInfo fi;
    if (!Env::Default()->StatPath(model, &fi).ok()) return Status::InvalidArgument("no such model file: " + model);
    return Status::Ok();
  }
  return EnsureDefaultModel(path, model, type);
}

Status OpenBenchModel(const std::string& model, const std::string& type, std::string* path,
                      std::unique_ptr<Model>* out, const ModelOptions& mo) {
  MZ_RETURN_IF_ERROR(BenchModelPath(model, type, path));
  return Model::Load(Env::Default(), *path, mo, out);
}

Status OpenBenchModel(const std::string& model, const std::string& type, std::string* path, MzModel* out) {
  MZ_RETURN_IF_ERROR(BenchModelPath(model, type, path));
  mz_model* m = nullptr;
  MZ_RETURN_IF_ERROR(MzStatus(mz_model_load(path->c_str(), nullptr, &m)));
  out->reset(m);
  return Status::Ok();
}

bool WriteReport(const std::string& dir, const std::string& stem, const std::string& md, const nlohmann::json& doc) {
  const bool md_ok = WriteFile(dir, stem + ".md", md);
  return WriteFile(dir, stem + ".json", doc.dump(2)) && md_ok;
}

std::string PlotPng(const std::string& dir, const std::string& name, const std::string& script) {
  WriteFile(dir, name + ".gp", script);
  int rc = 0;
  RunCapture("cd '" + dir + "' && gnuplot '" + name + ".gp' 2>&1", &rc);
  return rc == 0 ? name + ".png" : "";
}

}  // namespace mz::cli
