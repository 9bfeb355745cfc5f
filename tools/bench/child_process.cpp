// Child processes of the benchmark tools (see child_process.h).
#include "tools/bench/child_process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mz::cli {

std::string SelfExe() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "/proc/self/exe";
  exe[n] = 0;
  const std::string s = exe;
  // Rebuilt while running: the path names a new file (or none); the magic link still execs this one.
  const std::string del = " (deleted)";
  if (s.size() > del.size() && s.compare(s.size() - del.size(), del.size(), del) == 0) return "/proc/self/exe";
  return s;
}

Status SpawnInCgroup(const std::vector<std::string>& argv, const std::string& cgroup_procs, int oom_score_adj,
                     bool pipes, ChildProc* out) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> av;
  for (auto& s : argv) av.push_back(const_cast<char*>(s.c_str()));
  av.push_back(nullptr);
  char adj[32] = "";
  if (oom_score_adj != kKeepOomScore) std::snprintf(adj, sizeof adj, "%d", oom_score_adj);
  int to[2] = {-1, -1}, from[2] = {-1, -1};
  if (pipes && (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)) {
    Status s = Status::FromErrno(errno, "pipe");
    for (int fd : {to[0], to[1], from[0], from[1]})
      if (fd >= 0) close(fd);
    return s;
  }
  const pid_t parent = getpid();
  // Every signal blocked across fork: the child must not run the harness's handlers (cgroup and
  // zram teardown) before it has reset them.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = fork();
  if (pid < 0) {
    Status s = Status::FromErrno(errno, "fork");
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    for (int fd : {to[0], to[1], from[0], from[1]})
      if (fd >= 0) close(fd);
    return s;
  }
  if (pid == 0) {
    for (int sig = 1; sig < NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    if (!cgroup_procs.empty()) {
      const int fd = open(cgroup_procs.c_str(), O_WRONLY);
      char me[32];
      const int n = std::snprintf(me, sizeof me, "%d", int(getpid()));  // snprintf of an int: no allocation
      if (fd < 0 || write(fd, me, size_t(n)) != n) _exit(126);
      close(fd);
    }
    const int afd = adj[0] ? open("/proc/self/oom_score_adj", O_WRONLY) : -1;
    if (afd >= 0) {
      (void)!write(afd, adj, strlen(adj));
      close(afd);
    }
    if (pipes) {
      // dup2 onto itself keeps close-on-exec (possible when the harness runs with stdin closed:
      // the pipe then got descriptor 0), so that case clears the flag instead.
      if (to[0] == 0) fcntl(0, F_SETFD, 0);
      else dup2(to[0], 0);
      if (from[1] == 1) fcntl(1, F_SETFD, 0);
      else dup2(from[1], 1);
    }
    execv(av[0], av.data());
    _exit(127);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  out->pid = pid;
  if (pipes) {
    close(to[0]);
    close(from[1]);
    out->in = to[1];
    out->out = from[0];
  }
  return Status::Ok();
}

Status SpawnPiped(const std::vector<std::string>& argv, PipedChild* c) {
  ChildProc p;
  MZ_RETURN_IF_ERROR(SpawnInCgroup(argv, "", kKeepOomScore, true, &p));
  c->pid = p.pid;
  c->in = p.in;
  c->out = fdopen(p.out, "r");
  if (!c->out) {
    const Status s = Status::FromErrno(errno, "fdopen");
    close(p.out);
    ReapPiped(*c, true);
    return s;
  }
  return Status::Ok();
}

int ReapPiped(PipedChild& c, bool kill_it) {
  if (c.pid <= 0) return -1;
  if (kill_it) kill(c.pid, SIGKILL);
  if (c.in >= 0) close(c.in);
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (c.out) std::fclose(c.out);
  c.pid = -1;
  c.in = -1;
  c.out = nullptr;
  return status;
}

PipedChild::~PipedChild() { (void)ReapPiped(*this, true); }

}  // namespace mz::cli
