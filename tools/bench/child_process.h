// Child processes of the benchmark tools (bench multitask, bench peers, ospaging): one way to
// start them, so every child gets the same care. Between fork and exec the child makes only
// async-signal-safe calls (everything it needs is prepared before fork): it joins a cgroup if asked
// (writes its pid to `cgroup_procs`, so every page it ever touches is charged there; on failure it
// exits with status 126 before exec, so nothing runs outside the cgroup), sets its oom_score_adj
// if asked, asks for SIGKILL when the harness dies (PR_SET_PDEATHSIG: no orphan keeps memory or a
// cgroup busy; it fires when the *thread* that spawned the child ends, so spawn from a thread that
// outlives the child, as every caller does from the main thread), runs with default signal
// handling (signals are blocked across fork, so none of the harness's handlers runs in the child)
// and, with pipes, connects its stdin and stdout to the harness (close-on-exec pipes: no other
// child inherits them). On any failure before the child exists, every descriptor opened is closed
// again.
#pragma once
#include <sys/types.h>

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "core/status.h"

namespace mz::cli {

// The children a harness must kill on every exit path, SIGINT/SIGTERM included: a fixed table of
// atomics, so a signal handler may read it (KillAndReapAll). Add and Remove from one thread each
// at a time per child; a full table drops the pid (it is then not killed by the handler).
template <size_t N>
struct ChildRegistry {
  std::atomic<pid_t> pids[N];
  void Add(pid_t p) {
    for (auto& c : pids) {
      pid_t z = 0;
      if (c.compare_exchange_strong(z, p)) return;
    }
  }
  void Remove(pid_t p) {
    for (auto& c : pids) {
      pid_t x = p;
      if (c.compare_exchange_strong(x, 0)) return;
    }
  }
  // SIGKILL to every child registered, then waits for each (async-signal-safe calls only).
  void KillAndReapAll() {
    for (auto& c : pids)
      if (pid_t q = c.load(); q > 0) kill(q, SIGKILL);
    for (auto& c : pids)
      if (pid_t q = c.load(); q > 0) waitpid(q, nullptr, 0);
  }
};

constexpr int kKeepOomScore = INT_MIN;  // oom_score_adj: leave the child's as inherited

struct ChildProc {
  pid_t pid = -1;
  int in = -1, out = -1;  // harness ends of the pipes (-1 without pipes)
};
// argv[0] is the executable's path (execv: no PATH search). cgroup_procs empty: no cgroup join.
Status SpawnInCgroup(const std::vector<std::string>& argv, const std::string& cgroup_procs, int oom_score_adj,
                     bool pipes, ChildProc* out);
// Path of the running executable, for self re-exec ("/proc/self/exe" itself if the file was
// replaced or removed since this process started: the link still executes the running image).
std::string SelfExe();

// A child spoken to by lines: its stdin as a descriptor, its stdout as a stdio stream. Owns the
// child: destroying it (an early return, an exception) kills and reaps a child still running and
// closes both pipes. Not copyable.
struct PipedChild {
  pid_t pid = -1;
  int in = -1;
  FILE* out = nullptr;
  PipedChild() = default;
  PipedChild(const PipedChild&) = delete;
  PipedChild& operator=(const PipedChild&) = delete;
  ~PipedChild();
};
// SpawnInCgroup with pipes, no cgroup and the inherited oom_score_adj.
Status SpawnPiped(const std::vector<std::string>& argv, PipedChild* c);
// Closes the child's stdin (EOF tells a line worker to finish), SIGKILLs it first if kill_it,
// waits for it, closes its stdout and resets *c. Returns the wait status (-1 if none ran).
int ReapPiped(PipedChild& c, bool kill_it);

}  // namespace mz::cli
