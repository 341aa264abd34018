// Small helpers shared by the tests.
#pragma once

#include <string>

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

}  // namespace memtrade::test
