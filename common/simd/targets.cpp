#include "common/simd/targets.hpp"

#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "common/common.hpp"

namespace memtrade::simd {

namespace {
int64_t g_restricted = 0;
// Set by restrict_to: restricted_below_best() sits on the quantized matvec's per-call path, and listing
// the targets while restricted probes the CPU again and resets Highway's dispatch (CPUID exits a VM: it
// cost about 40 us a call on a 2-core VM, more than a 576 x 576 int8 matvec).
bool g_below_best = false;
}  // namespace

std::vector<int64_t> available_targets() {
  std::vector<int64_t> t = hwy::SupportedAndGeneratedTargets();
  if (g_restricted) {  // the restriction is a mock of the CPU: list what the CPU itself supports
    hwy::SetSupportedTargetsForTest(0);
    t = hwy::SupportedAndGeneratedTargets();
    hwy::SetSupportedTargetsForTest(g_restricted);
  }
  // Highway's bits: a lower bit is a better target.
  std::sort(t.begin(), t.end());
  return t;
}

std::string name_of(int64_t target) { return hwy::TargetName(target); }

std::string target_name() {
  const auto t = hwy::SupportedAndGeneratedTargets();
  return t.empty() ? "none" : name_of(*std::min_element(t.begin(), t.end()));
}

void restrict_to(int64_t target) {
  const auto all = available_targets();
  if (target && std::find(all.begin(), all.end(), target) == all.end())
    throw Error("SIMD target " + name_of(target) + " is not available in this binary on this CPU");
  g_restricted = target;
  g_below_best = target != 0 && !all.empty() && target != all.front();
  hwy::SetSupportedTargetsForTest(target);
}

bool restricted_below_best() { return g_below_best; }

void apply_env() {
  const char* v = std::getenv("MEMTRADE_SIMD");
  if (!v || !*v) return;
  std::string want(v), names;
  for (auto& ch : want) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  for (int64_t t : available_targets()) {
    if (name_of(t) == want) {
      restrict_to(t);
      return;
    }
    names += (names.empty() ? "" : ", ") + name_of(t);
  }
  throw Error("MEMTRADE_SIMD=" + std::string(v) + ": this binary on this CPU has the SIMD targets " + names);
}

}  // namespace memtrade::simd
