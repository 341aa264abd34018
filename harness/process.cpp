#include "harness/process.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/common.hpp"

namespace memtrade {

pid_t spawn(const std::vector<std::string>& args, const std::function<void()>& in_child) {
  if (args.empty()) throw Error("spawn: no program");
  std::vector<char*> argv;
  for (const auto& x : args) argv.push_back(const_cast<char*>(x.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw Error("cannot start " + args[0]);
  if (pid == 0) {
    if (in_child) in_child();
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "memtrade: cannot run %s\n", args[0].c_str());
    _exit(127);
  }
  return pid;
}

int wait_for(pid_t pid, const std::string& what) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error("waiting for " + what + " failed");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_program(const std::vector<std::string>& args) { return wait_for(spawn(args), args.at(0)); }

std::string capture_program(const std::vector<std::string>& args) {
  int up[2];
  if (pipe2(up, O_CLOEXEC) != 0) throw Error("capture_program: pipe failed");
  const pid_t pid = spawn(args, [&] { dup2(up[1], STDOUT_FILENO); });
  close(up[1]);
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(up[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  close(up[0]);
  if (wait_for(pid, args[0]) != 0) {
    std::string cmd;
    for (const auto& x : args) cmd += (cmd.empty() ? "" : " ") + x;
    throw Error("'" + cmd + "' failed");
  }
  return out;
}

}  // namespace memtrade
