// Runtime SIMD dispatch (Google Highway): which instruction-set target the dispatched kernels run on,
// and a way to restrict it, so that one binary's every path can be tested and measured on one machine
// (an AVX-512 machine also runs the AVX2, SSE4 and scalar paths its users may have).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memtrade::simd {

// The target the dispatched kernels use now, as Highway names it ("AVX3", "AVX2", "SSE4", "EMU128", ...).
std::string target_name();

// Every target this binary holds kernels for and this CPU can run, best first.
std::vector<int64_t> available_targets();
std::string name_of(int64_t target);

// Dispatch only to `target` (one of available_targets()); 0 lifts the restriction.
void restrict_to(int64_t target);
// True while dispatch is restricted to a target below the best one (hand-written kernels for a wider
// instruction set than the restriction stand aside then).
bool restricted_below_best();

// $MEMTRADE_SIMD=NAME (a target name, any case) restricts dispatch for the whole process; memtrade::Error
// naming the available targets when this CPU or binary has no such target. Called by the runner.
void apply_env();

}  // namespace memtrade::simd
