// Lockstep timing: ab starts the baseline's and the candidate's `run` at once and lets them take turns
// timing each case, invocation by invocation of the benchmark function (each repetition is one), while
// the other process waits, so that a round's two times of a case interleave within fractions of a
// second and share the machine's speed of that moment (on a shared machine it drifts by tens of
// percent within seconds; see README, "Regression rules").
//
// A run started with $MEMTRADE_LOCKSTEP=R,W (two inherited file descriptors) brackets each timed
// invocation with a LockstepTurn:
//     run -> "ready NAME\n"   coordinator -> "go\n"     (the run times NAME)
//     run -> "done\n"         coordinator -> "next\n"   (both go on preparing their next case)
// The coordinator answers "go" to one process only while the other is blocked, so timing never
// overlaps the other's preparation (oracles, calibration). Without the variable a turn costs nothing.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace memtrade {

class LockstepTurn {
 public:
  explicit LockstepTurn(const std::string& record_name);  // returns when it is this process's turn
  ~LockstepTurn();                                        // reports the timing done; waits for "next"
  LockstepTurn(const LockstepTurn&) = delete;
  LockstepTurn& operator=(const LockstepTurn&) = delete;

 private:
  bool active_ = false;
};

// Coordinator side: one started run.
struct LockstepChild {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  std::string label;       // "baseline" / "candidate", for messages
  std::string current;     // the record it waits to time; empty once it has finished
  std::vector<std::string> order;  // the records it will run, in order (`run --list`)
  int exit_status = -1;
};

// Starts `args` (no shell) with $MEMTRADE_LOCKSTEP set to the child's ends of two pipes.
LockstepChild start_lockstep_child(const std::vector<std::string>& args, std::string label);

// Drives both runs to their end: each invocation both are ready to time is timed by one, then the other
// (`a` first when a_first(i) for the i-th such pair); what only one side has (a case the other lacks or
// skipped, an extra invocation) runs alone. Sets exit_status of both. Returns the number of pairs.
int drive_lockstep(LockstepChild& a, LockstepChild& b, const std::function<bool(int)>& a_first);

}  // namespace memtrade
