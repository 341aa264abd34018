// Shared by the CPU and CUDA attention tests.
#pragma once

#include "harness/suite.hpp"

namespace memtrade::test {

inline Case attn_case(Json params) {
  Case c;
  c.suite = "attention";
  c.params = std::move(params);
  c.id = case_id(c.params);
  c.x = c.params.value("n", 0);
  return c;
}

}  // namespace memtrade::test
