// ab's lockstep coordinator against scripted runs that speak the protocol (lockstep.hpp): pairs, the
// alternation of who goes first, a record only one side has, and a run that dies mid-protocol.
#include "harness/lockstep.hpp"

#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/common.hpp"
#include "test_util.hpp"

using namespace memtrade;

namespace {

// A run that, for each name, asks for its turn, logs "<label> <name>" when it gets it and reports done;
// with `die_at`, it exits 3 right after asking for that name's turn.
std::vector<std::string> scripted_run(const std::string& label, const std::vector<std::string>& names,
                                      const std::filesystem::path& log, const std::string& die_at = "") {
  std::string script = "IFS=, read R W <<EOF\n$MEMTRADE_LOCKSTEP\nEOF\neval \"exec 3<&$R 4>&$W\"\n";
  for (const auto& n : names) {
    script += "echo 'ready " + n + "' >&4\n";
    if (n == die_at) script += "exit 3\n";
    script += "read go <&3\necho '" + label + " " + n + "' >> '" + log.string() + "'\necho done >&4\nread next <&3\n";
  }
  return {"bash", "-c", script};
}

std::vector<std::string> lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST(Lockstep, PairsAlternateAndUnmatchedRecordsRunAlone) {
  const auto log = test::scratch_dir() / "lockstep_log.txt";
  std::filesystem::remove(log);
  const std::vector<std::string> a_names = {"x", "y", "z"}, b_names = {"x", "z"};
  LockstepChild a = start_lockstep_child(scripted_run("A", a_names, log), "baseline");
  a.order = a_names;
  LockstepChild b = start_lockstep_child(scripted_run("B", b_names, log), "candidate");
  b.order = b_names;
  const int pairs = drive_lockstep(a, b, [](int i) { return i % 2 == 0; });
  EXPECT_EQ(pairs, 2);
  EXPECT_EQ(a.exit_status, 0);
  EXPECT_EQ(b.exit_status, 0);
  // x: A first (pair 0); y only in A: alone; z: B first (pair 1).
  EXPECT_EQ(lines(log), (std::vector<std::string>{"A x", "B x", "A y", "B z", "A z"}));
  std::filesystem::remove(log);
}

TEST(Lockstep, ARunThatDiesIsAnErrorNotAHang) {
  const auto log = test::scratch_dir() / "lockstep_log2.txt";
  std::filesystem::remove(log);
  LockstepChild a = start_lockstep_child(scripted_run("A", {"x", "y"}, log), "baseline");
  a.order = {"x", "y"};
  LockstepChild b = start_lockstep_child(scripted_run("B", {"x", "y"}, log, "x"), "candidate");
  b.order = {"x", "y"};
  EXPECT_THROW(drive_lockstep(a, b, [](int) { return true; }), Error);
  kill(a.pid, SIGKILL);
  std::filesystem::remove(log);
}
