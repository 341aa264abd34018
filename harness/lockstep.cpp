#include "harness/lockstep.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/common.hpp"
#include "harness/process.hpp"

namespace memtrade {

namespace {

bool write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// One line without its newline; false at end of file or on an error. Lines are short and rare, so
// reading a byte at a time keeps no state between calls.
bool read_line(int fd, std::string& line) {
  line.clear();
  char ch;
  for (;;) {
    const ssize_t n = read(fd, &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (ch == '\n') return true;
    line += ch;
  }
}

// The run's side: the descriptors from $MEMTRADE_LOCKSTEP, or -1 when not in lockstep.
struct ChildEnds {
  int in = -1, out = -1;
  ChildEnds() {
    const char* v = std::getenv("MEMTRADE_LOCKSTEP");
    if (!v || !*v) return;
    if (std::sscanf(v, "%d,%d", &in, &out) != 2 || in < 0 || out < 0) {
      std::fprintf(stderr, "memtrade: ignoring MEMTRADE_LOCKSTEP='%s' (expected R,W file descriptors)\n", v);
      in = out = -1;
    }
  }
  void fail(const char* what) {
    std::fprintf(stderr, "memtrade: lockstep: %s; timing on without waiting for turns\n", what);
    in = out = -1;
  }
};

ChildEnds& child_ends() {
  static ChildEnds ends;
  return ends;
}

void make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("lockstep: pipe failed: ") + std::strerror(errno));
}

}  // namespace

LockstepTurn::LockstepTurn(const std::string& record_name) {
  ChildEnds& e = child_ends();
  if (e.in < 0) return;
  std::string reply;
  if (!write_all(e.out, "ready " + record_name + "\n") || !read_line(e.in, reply) || reply != "go") {
    e.fail("the coordinator did not answer 'go'");
    return;
  }
  active_ = true;
}

LockstepTurn::~LockstepTurn() {
  ChildEnds& e = child_ends();
  if (!active_ || e.in < 0) return;
  std::string reply;
  if (!write_all(e.out, "done\n") || !read_line(e.in, reply) || reply != "next") e.fail("the coordinator did not answer 'next'");
}

LockstepChild start_lockstep_child(const std::vector<std::string>& args, std::string label) {
  int down[2], up[2];  // down: coordinator -> run; up: run -> coordinator
  make_pipe(down);
  make_pipe(up);
  const std::string env = "MEMTRADE_LOCKSTEP=" + std::to_string(down[0]) + "," + std::to_string(up[1]);
  // The run keeps its two ends across exec; the coordinator's ends close (O_CLOEXEC).
  const pid_t pid = spawn(args, [&] {
    fcntl(down[0], F_SETFD, 0);
    fcntl(up[1], F_SETFD, 0);
    putenv(const_cast<char*>(env.c_str()));
  });
  close(down[0]);
  close(up[1]);
  LockstepChild c;
  c.pid = pid;
  c.to_child = down[1];
  c.from_child = up[0];
  c.label = std::move(label);
  return c;
}

namespace {

// Reads the child's next "ready NAME" (current = NAME), or notes that it finished (current empty,
// exit status collected).
void advance(LockstepChild& c) {
  std::string line;
  if (c.from_child >= 0 && read_line(c.from_child, line) && line.rfind("ready ", 0) == 0) {
    c.current = line.substr(6);
    return;
  }
  c.current.clear();
  if (c.from_child >= 0) close(c.from_child), close(c.to_child);
  c.from_child = c.to_child = -1;
  c.exit_status = wait_for(c.pid, "the " + c.label + " run");
}

// Lets the child time its current record and waits until it has; it then waits for "next".
void time_one(LockstepChild& c) {
  std::string line;
  if (!write_all(c.to_child, "go\n") || !read_line(c.from_child, line) || line != "done")
    throw Error("lockstep: the " + c.label + " run stopped while timing " + c.current);
}

void release(LockstepChild& c) {
  if (!write_all(c.to_child, "next\n")) throw Error("lockstep: the " + c.label + " run is gone");
  advance(c);
}

std::ptrdiff_t position(const std::vector<std::string>& order, const std::string& name) {
  const auto it = std::find(order.begin(), order.end(), name);
  return it == order.end() ? -1 : it - order.begin();
}

}  // namespace

int drive_lockstep(LockstepChild& a, LockstepChild& b, const std::function<bool(int)>& a_first) {
  // A run that dies makes writes to its pipe fail (EPIPE, reported as an Error) instead of killing ab.
  struct IgnoreSigpipe {
    void (*old)(int) = signal(SIGPIPE, SIG_IGN);
    ~IgnoreSigpipe() { signal(SIGPIPE, old); }
  } ignore_sigpipe;
  advance(a);
  advance(b);
  int pairs = 0;
  while (!a.current.empty() || !b.current.empty()) {
    if (a.current == b.current) {
      LockstepChild& first = a_first(pairs) ? a : b;
      LockstepChild& second = &first == &a ? b : a;
      time_one(first);
      time_one(second);
      ++pairs;
      release(a);
      release(b);
      continue;
    }
    // Different records: one side has one the other lacks (or skipped: oom, error). The side whose
    // record the other has already passed, or never runs, goes on alone while the other waits.
    LockstepChild* alone = a.current.empty() ? &b : b.current.empty() ? &a : nullptr;
    if (!alone) {
      const auto a_in_b = position(b.order, a.current), b_now = position(b.order, b.current);
      const auto b_in_a = position(a.order, b.current), a_now = position(a.order, a.current);
      if (a_in_b < 0 || a_in_b < b_now) alone = &a;
      else if (b_in_a < 0 || b_in_a < a_now) alone = &b;
      else alone = &a;
    }
    time_one(*alone);
    release(*alone);
  }
  return pairs;
}

}  // namespace memtrade
