// GEMM reference: the plainest correct code. Each output row is accumulated in float64 in a
// tracked workspace row, then rounded to fp32.
#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

namespace {
class Reference final : public GemmWorkload {
 public:
  using GemmWorkload::GemmWorkload;
  void run() override {
    const auto [m, n, k] = p_.s;
    Buffer acc(dev_.memory(), n * sizeof(double), Tag::workspace);
    const float* a = a_.as<float>();
    const float* b = b_.as<float>();
    float* c = c_.as<float>();
    for (int64_t i = 0; i < m; ++i) {
      row_times_matrix_f64(a + i * k, b, k, n, acc.as<double>());
      for (int64_t j = 0; j < n; ++j) c[i * n + j] = static_cast<float>(acc.as<double>()[j]);
    }
  }
};
}  // namespace

MEMTRADE_IMPLEMENTATION(fp32_only(typed_impl<GemmProblem>("gemm", "reference", Role::reference, Backend::cpu,
                                                          "plain loops, float64 accumulation",
                                                          [](const GemmProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                            return std::make_unique<Reference>(p, dev);
                                                          })))

}  // namespace memtrade::gemm
