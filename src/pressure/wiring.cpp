#include "pressure/wiring.h"

#include "env/env.h"

namespace mz {

Status StartPressureMonitor(Env* env, Context* ctx, const PressureWatchOptions& opts,
                            std::unique_ptr<PressureMonitor>* out, std::string* why) {
  out->reset();
  if (!env) env = Env::Default();
  std::string local_why;
  if (!why) why = &local_why;
  std::unique_ptr<PressureSource> src;
  MZ_RETURN_IF_ERROR(CreatePressureSource(env, opts.source, &src, why));
  if (opts.wrap_source) src = opts.wrap_source(std::move(src));
  auto mon = std::make_unique<PressureMonitor>(ctx, std::move(src), opts.amount, env);
  if (opts.on_action) mon->set_on_action(opts.on_action);
  MZ_RETURN_IF_ERROR(mon->Start());
  *out = std::move(mon);
  return Status::Ok();
}

}  // namespace mz
