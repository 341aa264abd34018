// Child processes without a shell (paths with quotes or spaces pass as they are): ab's runs, the
// lockstep pair, the report script.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace memtrade {

// Starts `args` (argv[0] looked up in PATH); `in_child` runs in the child before exec (descriptor set-up).
// A program that cannot be started exits 127 after saying so on stderr.
pid_t spawn(const std::vector<std::string>& args, const std::function<void()>& in_child = {});

// Waits for the child: its exit status, or 128 + the signal that ended it.
int wait_for(pid_t pid, const std::string& what);

// Runs a program and waits for it: its exit status, 128 + the signal, or 127 when it could not be started.
int run_program(const std::vector<std::string>& args);

// Runs a program and returns what it wrote to stdout; throws Error on a non-zero exit.
std::string capture_program(const std::vector<std::string>& args);

}  // namespace memtrade
