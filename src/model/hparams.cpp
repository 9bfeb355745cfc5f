#include "model/hparams.h"

#include <cmath>

#include "gguf.h"

namespace mz {

const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kQwen3: return "qwen3";
  }
  return "?";
}

namespace {

Status GetU32(const gguf_context* g, const std::string& key, bool required, uint32_t* out) {
  int64_t id = gguf_find_key(g, key.c_str());
  if (id < 0) {
    if (required) return Status::Corruption("missing metadata key '" + key + "'");
    return Status::Ok();
  }
  switch (gguf_get_kv_type(g, id)) {
    case GGUF_TYPE_UINT32: *out = gguf_get_val_u32(g, id); break;
    case GGUF_TYPE_INT32: {
      int32_t v = gguf_get_val_i32(g, id);
      if (v < 0) return Status::Corruption("metadata key '" + key + "' is negative");
      *out = uint32_t(v);
      break;
    }
    case GGUF_TYPE_UINT64: {
      uint64_t v = gguf_get_val_u64(g, id);
      if (v > UINT32_MAX) return Status::Corruption("metadata key '" + key + "' out of range");
      *out = uint32_t(v);
      break;
    }
    default: return Status::Corruption("metadata key '" + key + "' has the wrong type");
  }
  return Status::Ok();
}

Status GetF32(const gguf_context* g, const std::string& key, float* out) {
  int64_t id = gguf_find_key(g, key.c_str());
  if (id < 0) return Status::Ok();
  if (gguf_get_kv_type(g, id) == GGUF_TYPE_FLOAT32) *out = gguf_get_val_f32(g, id);
  else if (gguf_get_kv_type(g, id) == GGUF_TYPE_FLOAT64) *out = float(gguf_get_val_f64(g, id));
  else return Status::Corruption("metadata key '" + key + "' has the wrong type");
  if (!std::isfinite(*out)) return Status::Corruption("metadata key '" + key + "' is not finite");
  return Status::Ok();
}

}  // namespace

Status ReadHParams(const gguf_context* g, HParams* hp) {
  int64_t id = gguf_find_key(g, "general.architecture");
  if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_STRING)
    return Status::Corruption("missing metadata key 'general.architecture'");
  std::string arch = gguf_get_val_str(g, id);
  if (arch == "llama") {
    hp->arch = Arch::kLlama;
    hp->rope_type = RopeType::kNorm;
  } else if (arch == "qwen2") {
    hp->arch = Arch::kQwen2;
    hp->rope_type = RopeType::kNeox;
    hp->qkv_bias = true;
  } else if (arch == "qwen3") {
    hp->arch = Arch::kQwen3;
    hp->rope_type = RopeType::kNeox;
    hp->qk_norm = true;
  } else {
    return Status::Unsupported("architecture '" + arch + "' is not supported (supported: llama, qwen2, qwen3)");
  }
  if (int64_t n = gguf_find_key(g, "general.name"); n >= 0 && gguf_get_kv_type(g, n) == GGUF_TYPE_STRING)
    hp->name = gguf_get_val_str(g, n);

  const std::string p = arch + ".";
  MZ_RETURN_IF_ERROR(GetU32(g, p + "context_length", true, &hp->n_ctx_train));
  MZ_RETURN_IF_ERROR(GetU32(g, p + "embedding_length", true, &hp->n_embd));
  MZ_RETURN_IF_ERROR(GetU32(g, p + "block_count", true, &hp->n_layer));
  MZ_RETURN_IF_ERROR(GetU32(g, p + "feed_forward_length", true, &hp->n_ff));
  MZ_RETURN_IF_ERROR(GetU32(g, p + "attention.head_count", true, &hp->n_head));
  hp->n_head_kv = hp->n_head;
  MZ_RETURN_IF_ERROR(GetU32(g, p + "attention.head_count_kv", false, &hp->n_head_kv));
  if (hp->n_head == 0 || hp->n_embd == 0 || hp->n_layer == 0 || hp->n_ff == 0)
    return Status::Corruption("hyper-parameters must be positive (embedding_length, block_count, head_count, feed_forward_length)");
  hp->head_dim = hp->n_embd / hp->n_head;
  MZ_RETURN_IF_ERROR(GetU32(g, p + "attention.key_length", false, &hp->head_dim));
  uint32_t vdim = hp->head_dim;
  MZ_RETURN_IF_ERROR(GetU32(g, p + "attention.value_length", false, &vdim));
  if (vdim != hp->head_dim) return Status::Unsupported("key_length != value_length is not supported");
  hp->n_rot = hp->head_dim;
  MZ_RETURN_IF_ERROR(GetU32(g, p + "rope.dimension_count", false, &hp->n_rot));
  MZ_RETURN_IF_ERROR(GetF32(g, p + "attention.layer_norm_rms_epsilon", &hp->rms_eps));
  MZ_RETURN_IF_ERROR(GetF32(g, p + "rope.freq_base", &hp->rope_freq_base));
  float scale_factor = 0.0f;
  MZ_RETURN_IF_ERROR(GetF32(g, p + "rope.scaling.factor", &scale_factor));
  if (int64_t t = gguf_find_key(g, (p + "rope.scaling.type").c_str()); t >= 0) {
    std::string type = gguf_get_kv_type(g, t) == GGUF_TYPE_STRING ? gguf_get_val_str(g, t) : "";
    if (type == "linear" && scale_factor > 0) hp->rope_freq_scale = 1.0f / scale_factor;
    else if (type != "none" && type != "linear" && !type.empty() && type != "llama3")
      return Status::Unsupported("rope scaling type '" + type + "' is not supported");
  }
  if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
    return Status::Corruption("head_count (" + std::to_string(hp->n_head) + ") is not a multiple of head_count_kv (" +
                              std::to_string(hp->n_head_kv) + ")");
  if (hp->head_dim == 0 || hp->head_dim % 8 != 0 || hp->head_dim > 512)
    return Status::Unsupported("head dimension " + std::to_string(hp->head_dim) + " is not supported (multiple of 8, <= 512)");
  if (hp->n_rot != hp->head_dim) return Status::Unsupported("partial rotary embeddings are not supported");
  if (hp->n_layer > 1024 || hp->n_embd > 65536 || hp->n_head > 1024 || hp->n_ff > 1u << 20)
    return Status::Corruption("hyper-parameters out of range");
  if (!(hp->rms_eps > 0 && hp->rms_eps < 1)) return Status::Corruption("rms epsilon out of range");
  if (!(hp->rope_freq_base > 0)) return Status::Corruption("rope freq_base must be positive");
  return Status::Ok();
}

}  // namespace mz
