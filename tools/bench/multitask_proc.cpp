// Reference file, intact check and child processes of `bench multitask` (see multitask.h).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "tools/bench/bench_util.h"
#include "tools/bench/multitask.h"

namespace mz::cli {

namespace {
constexpr char kRefMagic[8] = {'M', 'Z', 'M', 'T', 'R', 'E', 'F', '1'};
}

Status WriteMultitaskRef(const std::string& path, const MultitaskRef& ref) {
  FILE* f = std::fopen((path + ".tmp").c_str(), "wb");
  if (!f) return Status::FromErrno(errno, "create " + path);
  const uint32_t h[4] = {uint32_t(ref.context.size()), uint32_t(ref.query.size()), uint32_t(ref.logits.size()), 0};
  bool ok = std::fwrite(kRefMagic, 1, 8, f) == 8 && std::fwrite(h, sizeof h, 1, f) == 1 &&
            std::fwrite(ref.context.data(), 4, ref.context.size(), f) == ref.context.size() &&
            std::fwrite(ref.query.data(), 4, ref.query.size(), f) == ref.query.size() &&
            std::fwrite(ref.logits.data(), 4, ref.logits.size(), f) == ref.logits.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
    std::remove((path + ".tmp").c_str());
    return Status::IOError("cannot write " + path);
  }
  return Status::Ok();
}

Status ReadMultitaskRef(const std::string& path, MultitaskRef* ref) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::FromErrno(errno, "open " + path);
  char magic[8];
  uint32_t h[4];
  Status st;
  if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, kRefMagic, 8) != 0 || std::fread(h, sizeof h, 1, f) != 1 ||
      h[0] == 0 || h[0] > (1u << 24) || h[1] == 0 || h[1] > 4096 || h[2] == 0 || h[2] > (1u << 22)) {
    st = Status::Corruption(path + ": not a multitask reference file");
  } else {
    ref->context.resize(h[0]);
    ref->query.resize(h[1]);
    ref->logits.resize(h[2]);
    if (std::fread(ref->context.data(), 4, h[0], f) != h[0] || std::fread(ref->query.data(), 4, h[1], f) != h[1] ||
        std::fread(ref->logits.data(), 4, h[2], f) != h[2])
      st = Status::Corruption(path + ": truncated");
  }
  std::fclose(f);
  return st;
}

IntactCheck CheckIntact(const float* logits, const MultitaskRef& ref, bool history_ok, double tol) {
  IntactCheck c;
  c.history_ok = history_ok;
  if (!logits) return c;
  const size_t n = ref.logits.size();
  size_t a = 0, b = 0;
  c.bit_identical = std::memcmp(logits, ref.logits.data(), n * sizeof(float)) == 0;
  for (size_t i = 0; i < n; ++i) {
    if (logits[i] > logits[a]) a = i;
    if (ref.logits[i] > ref.logits[b]) b = i;
    const double d = std::fabs(double(logits[i]) - double(ref.logits[i]));
    if (!(d <= c.max_abs_diff)) c.max_abs_diff = std::isnan(d) ? INFINITY : d;
  }
  double second = -INFINITY;
  for (size_t i = 0; i < n; ++i)
    if (i != b) second = std::max(second, double(ref.logits[i]));
  c.ref_margin = double(ref.logits[b]) - second;
  c.top1 = int(a);
  c.ref_top1 = int(b);
  c.top1_equal = a == b;
  c.top1_ok = c.top1_equal || double(ref.logits[b]) - double(ref.logits[a]) <= 2 * c.max_abs_diff;
  c.intact = c.history_ok && c.top1_ok && c.max_abs_diff <= tol;
  return c;
}

std::map<std::string, std::string> ParseFields(const std::string& line) {
  std::map<std::string, std::string> m;
  std::istringstream ss(line);
  std::string w;
  ss >> w;
  m["_"] = w;  // the verb
  while (ss >> w) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) continue;
    std::string k = w.substr(0, eq), v = w.substr(eq + 1);
    if (k == "msg") {
      std::string rest;
      std::getline(ss, rest);
      v += rest;
    }
    m[k] = v;
  }
  return m;
}

WorkerProc::~WorkerProc() {
  if (c_.pid > 0 && !reaped_) {
    kill(c_.pid, SIGKILL);
    waitpid(c_.pid, &status_, 0);
    reaped_ = true;
  }
  if (c_.in >= 0) close(c_.in);
  if (reader_.joinable()) reader_.join();  // EOF once the worker is gone
  if (c_.out >= 0) close(c_.out);
}

Status WorkerProc::Start(const std::vector<std::string>& argv, const std::string& cgroup_procs, int oom_score_adj) {
  MZ_RETURN_IF_ERROR(SpawnInCgroup(argv, cgroup_procs, oom_score_adj, true, &c_));
  reader_ = std::thread([this] { ReadLoop(); });
  return Status::Ok();
}

void WorkerProc::ReadLoop() {
  std::string buf;
  char chunk[4096];
  for (;;) {
    const ssize_t n = read(c_.out, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, size_t(n));
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos;) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      std::lock_guard<std::mutex> lk(mu_);
      if (line.rfind("action ", 0) == 0 || line.rfind("event ", 0) == 0) {
        actions_.push_back({NowSeconds(), ParseFields(line)});
      } else {
        replies_.push_back(std::move(line));
        cv_.notify_all();
      }
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  eof_ = true;
  cv_.notify_all();
}

bool WorkerProc::NextReply(double timeout_s, std::string* line) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return !replies_.empty() || eof_; });
  if (replies_.empty()) return false;
  *line = std::move(replies_.front());
  replies_.pop_front();
  return true;
}

bool WorkerProc::Send(const std::string& line) {
  const std::string s = line + "\n";
  // A dead worker must not kill the harness with SIGPIPE: the harness ignores SIGPIPE (EPIPE here).
  return c_.in >= 0 && write(c_.in, s.data(), s.size()) == ssize_t(s.size());
}

bool WorkerProc::Exited(int* status) {
  if (c_.pid <= 0) return true;
  if (!reaped_) {
    const pid_t r = waitpid(c_.pid, &status_, WNOHANG);
    if (r == c_.pid) reaped_ = true;
  }
  if (reaped_ && status) *status = status_;
  return reaped_;
}

int WorkerProc::Stop(double timeout_s) {
  if (c_.in >= 0) {
    Send("quit");
    close(c_.in);
    c_.in = -1;
  }
  const double t0 = NowSeconds();
  while (!Exited(nullptr) && NowSeconds() - t0 < timeout_s) usleep(10000);
  if (!Exited(nullptr)) {
    kill(c_.pid, SIGKILL);
    waitpid(c_.pid, &status_, 0);
    reaped_ = true;
  }
  if (reader_.joinable()) reader_.join();
  return status_;
}

std::vector<WorkerProc::Action> WorkerProc::TakeActions() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Action> a;
  a.swap(actions_);
  return a;
}

}  // namespace mz::cli
