// GEMM through cuBLAS (the vendor library on the GPU); its workspace comes from the tracked pool.
#include "harness/tracked_cublas.hpp"
#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

namespace {
class CublasGemm final : public GemmWorkload {
 public:
  CublasGemm(const GemmProblem& p, Device& dev) : GemmWorkload(p, dev), blas_(as_cuda(dev)) {}
  void run() override {
    const auto [m, n, k] = p_.s;
    blas_.gemm(p_.dtype, false, false, m, n, k, 1.f, a_.data(), k, b_.data(), n, 0.f, c_.data(), n);
  }

 private:
  TrackedCublas blas_;
};
}  // namespace

MEMTRADE_IMPLEMENTATION(typed_impl<GemmProblem>("gemm", "cublas", Role::vendor, Backend::cuda, "cublasGemmEx, fp32 compute",
                                                [](const GemmProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                  return std::make_unique<CublasGemm>(p, dev);
                                                }))

}  // namespace memtrade::gemm
