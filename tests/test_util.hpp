// Small helpers shared by the tests.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

#include <unistd.h>

#include "common/common.hpp"

namespace memtrade::test {

// The message of the memtrade::Error that f() throws, or "(no error)".
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// This test process's own directory under the system's temp directory (memtrade_test_PID), made on first
// use and removed with all it holds when the process exits: test processes running side by side (ctest -j,
// two checkouts on one CI machine) never share a file, and none is left behind. A forked child that exits
// without exec leaves it to the process that made it.
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    pid_t owner = ::getpid();
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("memtrade_test_" + std::to_string(owner));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      if (::getpid() != owner) return;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir d;
  return d.path;
}

}  // namespace memtrade::test
