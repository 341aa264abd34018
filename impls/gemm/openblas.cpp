// GEMM through OpenBLAS sgemm (the vendor library on the CPU).
#include "common/blas.hpp"
#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

namespace {
class OpenBlas final : public GemmWorkload {
 public:
  using GemmWorkload::GemmWorkload;
  void run() override {
    const auto [m, n, k] = p_.s;
    blas::sgemm(false, false, m, n, k, 1.f, a_.as<float>(), k, b_.as<float>(), n, 0.f, c_.as<float>(), n);
  }
};
}  // namespace

MEMTRADE_IMPLEMENTATION(fp32_only(typed_impl<GemmProblem>("gemm", "openblas", Role::vendor, Backend::cpu, "OpenBLAS sgemm",
                                                          [](const GemmProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                            return std::make_unique<OpenBlas>(p, dev);
                                                          })))

}  // namespace memtrade::gemm
