#include "pressure/psi_source.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "env/env.h"
#include "pressure/sysfs.h"

namespace mz {

namespace {
constexpr uint32_t kMinWindowUs = 500000, kMaxWindowUs = 10000000, kUnprivGranUs = 2000000;

bool ParseLine(const std::string& line, PsiLine* out) {
  std::istringstream ss(line);
  std::string kind;
  ss >> kind;
  int got = 0;
  for (std::string kv; ss >> kv;) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos) return false;
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    char* end = nullptr;
    if (k == "total") {
      out->total_us = std::strtoull(v.c_str(), &end, 10);
    } else {
      double d = std::strtod(v.c_str(), &end);
      if (k == "avg10") out->avg10 = d;
      else if (k == "avg60") out->avg60 = d;
      else if (k == "avg300") out->avg300 = d;
    }
    if (end == v.c_str() || *end != '\0') return false;
    ++got;
  }
  out->present = got >= 4;
  return out->present;
}
}  // namespace

Status ParsePsi(const std::string& content, PsiStats* out) {
  *out = PsiStats();
  std::istringstream ss(content);
  for (std::string line; std::getline(ss, line);) {
    if (line.rfind("some ", 0) == 0 && !ParseLine(line, &out->some))
      return Status::Corruption("bad PSI line: " + line);
    if (line.rfind("full ", 0) == 0 && !ParseLine(line, &out->full))
      return Status::Corruption("bad PSI line: " + line);
  }
  if (!out->some.present) return Status::Corruption("no 'some' line in PSI content");
  return Status::Ok();
}

Status ValidatePsiTrigger(uint32_t stall_us, uint32_t window_us, bool privileged) {
  if (window_us < kMinWindowUs || window_us > kMaxWindowUs)
    return Status::InvalidArgument("PSI window " + std::to_string(window_us) + " us outside [500000, 10000000]");
  if (stall_us == 0 || stall_us > window_us)
    return Status::InvalidArgument("PSI stall threshold " + std::to_string(stall_us) + " us must be in (0, window " +
                                   std::to_string(window_us) + " us]");
  if (!privileged && window_us % kUnprivGranUs != 0)
    return Status::InvalidArgument("PSI window " + std::to_string(window_us) +
                                   " us must be a multiple of 2 s without CAP_SYS_RESOURCE");
  return Status::Ok();
}

std::string FormatPsiTrigger(bool full, uint32_t stall_us, uint32_t window_us) {
  std::string s = std::string(full ? "full " : "some ") + std::to_string(stall_us) + " " + std::to_string(window_us);
  s.push_back('\0');
  return s;
}

void MakePsiTriggerUnprivileged(uint32_t* stall_us, uint32_t* window_us) {
  uint64_t w = *window_us == 0 ? kUnprivGranUs : (uint64_t(*window_us) + kUnprivGranUs - 1) / kUnprivGranUs * kUnprivGranUs;
  if (w > kMaxWindowUs) w = kMaxWindowUs;
  uint64_t s = *window_us ? uint64_t(*stall_us) * w / *window_us : *stall_us;
  if (s == 0) s = 1;
  if (s > w) s = w;
  *stall_us = uint32_t(s);
  *window_us = uint32_t(w);
}

PsiSource::PsiSource(Env* env, std::string path, bool full, uint32_t stall_us, uint32_t window_us)
    : env_(env ? env : Env::Default()), path_(std::move(path)), full_(full), stall_us_(stall_us), window_us_(window_us) {
  stop_status_ = env_->NewEventCounter(&stop_);
}

Status PsiSource::Headroom(uint64_t* available, uint64_t* limit) {
  if (!headroom_) {
    const std::string file = "/memory.pressure";
    std::string dir;
    if (path_.size() > file.size() && path_.compare(path_.size() - file.size(), file.size(), file) == 0)
      dir = path_.substr(0, path_.size() - file.size());
    std::string what;
    headroom_ = WatermarkSource::DefaultSampler(env_, dir, &what);
  }
  return headroom_(available, limit);
}

Status PsiSource::FreeBeforeReclaim(uint64_t* available, uint64_t* limit) {
  if (!strict_) {
    const std::string file = "/memory.pressure";
    std::string dir, what;
    if (path_.size() > file.size() && path_.compare(path_.size() - file.size(), file.size(), file) == 0)
      dir = path_.substr(0, path_.size() - file.size());
    strict_ = WatermarkSource::DefaultSampler(env_, dir, &what, /*credit_inactive=*/false);
  }
  return strict_(available, limit);
}

PsiSource::~PsiSource() = default;

std::string PsiSource::name() const {
  return "psi:" + path_ + " " + (full_ ? "full " : "some ") + std::to_string(stall_us_) + "/" +
         std::to_string(window_us_) + "us";
}

namespace {
Status Arm(Env* env, const std::string& path, bool full, uint32_t stall, uint32_t window,
           std::unique_ptr<WaitHandle>* out) {
  if (!sysfs::Exists(env, path)) return Status::Unsupported(path + " does not exist (kernel without PSI or psi=0)");
  MZ_RETURN_IF_ERROR(ValidatePsiTrigger(stall, window, sysfs::HasCapSysResource(env)));
  std::unique_ptr<WaitHandle> h;
  Status s = env->OpenNotifyFile(path, /*write=*/true, &h);
  if (!s.ok()) {
    if (s.code() == Status::kUnsupported) return Status::Unsupported("PSI disabled (" + s.message() + ")");
    return s;
  }
  const std::string trig = FormatPsiTrigger(full, stall, window);
  s = h->WriteOnce(trig.data(), trig.size());
  if (!s.ok()) {
    if (s.code() == Status::kUnsupported) return Status::Unsupported("PSI disabled in this kernel (psi=0)");
    return s.With("PSI trigger '" + trig.substr(0, trig.size() - 1) + "' on " + path);
  }
  *out = std::move(h);
  return Status::Ok();
}
}  // namespace

bool PsiSource::Probe(Env* env, const std::string& path, bool full, uint32_t stall_us, uint32_t window_us,
                      std::string* why) {
  std::unique_ptr<WaitHandle> h;
  Status s = Arm(env ? env : Env::Default(), path, full, stall_us, window_us, &h);
  if (!s.ok()) {
    *why = s.message();
    return false;
  }
  return true;  // h closes the probe's trigger
}

Status PsiSource::Start() {
  if (!stop_) return stop_status_;
  if (stopped_.load()) return Status::Cancelled("PSI source was stopped");
  trigger_.reset();
  return Arm(env_, path_, full_, stall_us_, window_us_, &trigger_);
}

Status PsiSource::Wait(int timeout_ms, PressureEvent* ev) {
  if (stopped_.load()) return Status::Cancelled("pressure source stopped");
  if (!trigger_) return Status::InvalidArgument("PSI source not started");
  PollEntry p[2];
  p[0].handle = trigger_.get();
  p[0].priority = true;
  p[1].handle = stop_.get();
  int n = 0;
  MZ_RETURN_IF_ERROR(env_->Poll(p, 2, timeout_ms, &n).With("waiting on " + path_));
  if (stopped_.load() || p[1].ready) return Status::Cancelled("pressure source stopped");
  if (n == 0) return Status::Timeout("no pressure event");
  if (p[0].error) return Status::IOError("PSI trigger on " + path_ + " is gone (cgroup removed?)");
  if (!p[0].ready) return Status::Timeout("spurious wake-up");
  ev->level = full_ ? PressureLevel::kCritical : PressureLevel::kLow;
  ev->time_ns = env_->NowNs();
  ev->bytes_hint = 0;
  ev->source = name();
  return Status::Ok();
}

void PsiSource::Stop() {
  stopped_.store(true);
  if (stop_) (void)SignalEvent(stop_.get());  // a full counter (never here) still leaves stopped_ set
}

}  // namespace mz
