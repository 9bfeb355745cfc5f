// `bench multitask` (issue 6, item 5; paper Fig. 15): an LLM process and memory-hungry "app"
// processes share one memory cgroup (v1) with a fixed limit. Pieces shared by the harness
// (cmd_bench_multitask.cpp) and its two hidden child commands (multitask_worker.cpp):
//   - the reference file: the long context's tokens, the query and the next-token logits computed
//     once with all memory resident, against which every answer is checked ("context intact");
//   - the intact check itself;
//   - child processes started inside the cgroup, and the LLM worker's line protocol.
//
// Worker protocol (one line each, `key=value` fields separated by spaces):
//   worker -> harness  `ready how=<session|prefill> load_s=<s> footprint=<bytes> llm=<bytes>`
//                      `result ok=<0|1> ttft=<s> intact=<0|1> hist=<0|1> top1=<id> ref_top1=<id>
//                       maxdiff=<abs logit diff> bitident=<0|1> remaining=<fraction|-1>
//                       counted=<bytes the LLM counts resident> inram=<of them in RAM (mincore)>
//                       reconciled=<bytes moved to evicted because the kernel took them>
//                       majflt=<major faults during the query> minflt=<minor faults>
//                       wait=<s compute waited for units> reload=<s restoring> restored_bytes=<bytes>
//                       threads=<compute threads while restoring>
//                       measure_ms=<request to the end of the mincore pass> msg=<text>`
//                      `action level=<name> req=<bytes> freed=<bytes> remaining=<fraction>
//                       deferred=<0|1> restored=<0|1> ok=<0|1> step=<points> delay_ms=<ms> msg=<note>`
//                      `event level=<name>` (mzcache mode, asynchronous: a pressure event as received,
//                      then the action the monitor took for it)
//   harness -> worker  `query` (answer the 8-token query over the context, then truncate back),
//                      `quit`.
#pragma once
#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "tools/bench/child_process.h"

namespace CLI {
class App;
}

namespace mz::cli {

// The hidden `multitask-worker` and `multitask-app` (bench multitask itself: AddMultitaskCommands
// in tools/commands.h, which calls this).
void AddMultitaskChildren(CLI::App& app, std::vector<std::function<int()>>& runners);

struct MultitaskRef {
  std::vector<int32_t> context;  // the long context
  std::vector<int32_t> query;    // the query appended after it
  std::vector<float> logits;     // next-token logits after context + query, all memory resident
};
// Binary file: "MZMTREF1", u32 n_context, u32 n_query, u32 n_vocab, u32 0, then the three arrays.
// Read validates the magic and sizes (kCorruption otherwise).
Status WriteMultitaskRef(const std::string& path, const MultitaskRef& ref);
Status ReadMultitaskRef(const std::string& path, MultitaskRef* ref);

// "Context intact" (docs/multitask.md): the token history is exactly the reference context, no
// logit differs from the reference by more than `tol`, and the greedy next token is the
// reference's, or one the reference ranks within 2 x the measured max logit difference of its top
// (a near-tie that a bounded logit error can reorder; top1_equal says whether it was strictly
// equal). bit_identical reports whether the logits are equal bit for bit (expected when every
// placement was lossless: OS Paging, a session reload, KV on storage raw).
struct IntactCheck {
  bool history_ok = false, top1_ok = false, top1_equal = false, bit_identical = false, intact = false;
  int top1 = -1, ref_top1 = -1;
  double max_abs_diff = 0;
  double ref_margin = 0;  // reference: top-1 logit minus the runner-up's (how close a flip is)
};
IntactCheck CheckIntact(const float* logits, const MultitaskRef& ref, bool history_ok, double tol);

// Splits "key=value key=value" (values without spaces, except msg= which takes the rest of the line).
std::map<std::string, std::string> ParseFields(const std::string& line);

// The LLM worker seen from the harness: a reader thread splits its stdout into replies (waited for
// with NextReply) and asynchronous `action`/`event` lines (collected with their arrival time; the
// verb is in field "_").
// Thread-safety: all methods from the harness's main thread; the reader thread is internal.
class WorkerProc {
 public:
  struct Action {
    double t = 0;  // harness clock (NowSeconds) at arrival
    std::map<std::string, std::string> f;
  };
  ~WorkerProc();  // kills (SIGKILL) and reaps the worker if still running
  Status Start(const std::vector<std::string>& argv, const std::string& cgroup_procs, int oom_score_adj);
  // Next non-action line; false on timeout or if the worker closed its stdout (died).
  bool NextReply(double timeout_s, std::string* line);
  bool Send(const std::string& line);
  // Non-blocking: true once the worker has exited (reaped); *status gets the wait status.
  bool Exited(int* status);
  // Closes stdin and waits up to timeout_s for a clean exit, then SIGKILLs. Returns the wait status.
  int Stop(double timeout_s);
  std::vector<Action> TakeActions();
  pid_t pid() const { return c_.pid; }

 private:
  void ReadLoop();
  ChildProc c_;
  bool reaped_ = false;
  int status_ = 0;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> replies_;
  std::vector<Action> actions_;
  bool eof_ = false;
};

}  // namespace mz::cli
