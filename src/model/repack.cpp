#include "model/repack.h"

#include <cstring>

#include "core/ggml_log.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace mz {

ggml_backend_buffer_type* RepackBufferType() {
  static ggml_backend_buffer_type* const buft = []() -> ggml_backend_buffer_type* {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) return nullptr;
    auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
    if (!get) return nullptr;
    for (ggml_backend_buffer_type_t* b = get(dev); b && *b; ++b)
      if (std::strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    return nullptr;
  }();
  return buft;
}

ggml_backend_buffer* RepackTagBuffer() {
  static ggml_backend_buffer* const buf = []() -> ggml_backend_buffer* {
    InitLibraryLogging();  // ggml logs one line per repacked tensor: only errors reach stderr
    ggml_backend_buffer_type* buft = RepackBufferType();
    // Not size 0: ggml gives a zero-sized request a buffer without the type's functions.
    return buft ? ggml_backend_buft_alloc_buffer(buft, 64) : nullptr;
  }();
  return buf;
}

bool CanRepack(ggml_tensor* t) {
  ggml_backend_buffer* tag = RepackTagBuffer();
  if (!tag || !t || ggml_n_dims(t) != 2 || t->ne[0] % 8 != 0) return false;
  void* const extra = t->extra;
  ggml_backend_buffer* const buffer = t->buffer;
  // The type's init_tensor picks the kernel traits for t (nullptr: none for this type/shape/CPU).
  (void)ggml_backend_buffer_init_tensor(tag, t);
  const bool ok = t->extra != nullptr;
  t->extra = extra;
  t->buffer = buffer;
  return ok;
}

void RepackInto(ggml_tensor* t, void* data, const void* src) {
  ggml_backend_buffer* tag = RepackTagBuffer();
  t->data = data;
  t->buffer = tag;
  (void)ggml_backend_buffer_init_tensor(tag, t);
  ggml_backend_tensor_set(t, src, 0, ggml_nbytes(t));
}

void UnbindRepacked(ggml_tensor* t) {
  t->data = nullptr;
  t->buffer = nullptr;
  t->extra = nullptr;
}

}  // namespace mz
