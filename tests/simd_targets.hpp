// Runs a test body once per SIMD target this binary holds and this CPU runs (AVX-512, AVX2, SSE4, scalar,
// ...), with dispatch restricted to it: every path is tested on every machine, not only the best one.
#pragma once

#include <gtest/gtest.h>

#include "common/simd/targets.hpp"

namespace memtrade::test {

template <class Fn>
void for_each_simd_target(Fn fn) {
  for (int64_t t : simd::available_targets()) {
    simd::restrict_to(t);
    SCOPED_TRACE("SIMD target " + simd::name_of(t));
    fn(t);
  }
  simd::restrict_to(0);
}

}  // namespace memtrade::test
