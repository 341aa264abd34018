// calibrate: workloads of known, adjustable cost, for the regression gate's self-test
// (`memtrade gate-selftest`) and for checking a machine's timing noise.
//   copy     copies the first half of an n-float buffer to another (memory-bound);
//   compute  runs a chain of n dependent multiply-adds (compute-bound); its output y = x is written
//            when the workload is made, so the timed call is the chain alone.
// $MEMTRADE_CALIBRATE_SCALE (default 1, at most 2, read when the workload is made) multiplies the work
// of every call without changing the case: a build run with 1.25 does 1.25x the work under the same
// names, as an implementation that became 25% slower would (copy: one contiguous pass over 1.25 halves
// of the buffer; a second pass over a part would hit the caches and cost less). Memory does not change.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness/registry.hpp"
#include "harness/tensor.hpp"

namespace memtrade::calibrate {

namespace {

struct CalibrateProblem final : Problem {
  std::vector<float> x;
  std::vector<double> oracle;
};

double scale_from_env() {
  const char* s = std::getenv("MEMTRADE_CALIBRATE_SCALE");
  if (!s || !*s) return 1.0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= 0.01 && v <= 2))
    throw Error(std::string("MEMTRADE_CALIBRATE_SCALE must be a number in [0.01, 2], got '") + s + "'");
  return v;
}

class CalibrateWorkload final : public Workload {
 public:
  CalibrateWorkload(const CalibrateProblem& p, Device& dev, bool compute)
      : p_(p), compute_(compute), scale_(scale_from_env()), x_(dev.memory(), p.x.size() * sizeof(float), Tag::io),
        y_(dev.memory(), p.x.size() * sizeof(float), Tag::io) {
    dev.copy(x_.data(), p.x.data(), x_.bytes(), CopyKind::host_to_device);
    // The output the error check reads: y = x, also where `copy`'s call does not reach.
    dev.copy(y_.data(), p.x.data(), y_.bytes(), CopyKind::host_to_device);
  }
  void run() override {
    const std::size_t n = p_.x.size();
    const float* x = x_.as<float>();
    float* y = y_.as<float>();
    if (compute_) {
      // Dependent multiply-adds: one chain, so the time is latency-bound and scales with the steps.
      const auto steps = static_cast<std::size_t>(scale_ * static_cast<double>(n));
      float acc = 1.0f;
      for (std::size_t i = 0; i < steps; ++i) acc = acc * 0.999999f + 1e-7f;
      sink_ = acc;
      return;
    }
    const auto count = std::min(n, static_cast<std::size_t>(std::llround(scale_ * static_cast<double>(n) / 2)));
    std::memcpy(y, x, count * sizeof(float));
  }
  ErrorStats error() override {
    std::vector<double> y(y_.as<float>(), y_.as<float>() + p_.x.size());
    return error_stats(y, p_.oracle);
  }
  Work work() const override {
    Work w;
    const double n = static_cast<double>(p_.x.size());
    if (compute_) w.flops = 2 * n;
    else w.bytes = 4 * n;  // half the buffer read and written
    return w;
  }

 private:
  const CalibrateProblem& p_;
  bool compute_;
  double scale_;
  Buffer x_, y_;
  volatile float sink_ = 0;
};

}  // namespace

void register_technique(Registry& r) {
  Technique t;
  t.name = "calibrate";
  t.description = "workloads of known cost (a copy, a multiply-add chain) for the regression gate's self-test";
  t.schema.params = {int_param("n", "floats copied, and multiply-add steps of the compute chain", nullptr, 1, 1 << 28)};
  t.prepare = [](const Case& c) -> std::unique_ptr<Problem> {
    auto p = std::make_unique<CalibrateProblem>();
    const int64_t n = c.integer("n");
    p->x.resize(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) p->x[static_cast<std::size_t>(i)] = static_cast<float>(i % 1024) * 0.5f - 256.0f;
    p->oracle.assign(p->x.begin(), p->x.end());
    return p;
  };
  for (bool compute : {false, true})
    t.impls.push_back(typed_impl<CalibrateProblem>(
        "calibrate", compute ? "compute" : "copy", compute ? Role::optimized : Role::reference, Backend::cpu,
        compute ? "n dependent multiply-adds (compute-bound)" : "memcpy of n floats (memory-bound)",
        [compute](const CalibrateProblem& p, Device& dev) { return std::make_unique<CalibrateWorkload>(p, dev, compute); }));
  r.add(std::move(t));
}

}  // namespace memtrade::calibrate
