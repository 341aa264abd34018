#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

void register_technique(Registry& r) {
  Technique t;
  t.name = "gemm";
  t.description = "dense matrix multiply C = A B with fp32 accumulation";
  t.validate = [](const Case& c) { case_shape(c); };
  t.prepare = [](const Case& c) -> std::unique_ptr<Problem> { return prepare(c); };
  using Factory = std::unique_ptr<Workload> (*)(const GemmProblem&, Device&);
  auto impl = [&](const char* name, Role role, Backend be, const char* desc, Factory f, bool fp32_only) {
    Impl i = typed_impl(t.name, name, role, be, desc, f);
    if (fp32_only)
      i.not_applicable = [](const Case& c) {
        return c.text("dtype") == "fp32" ? std::string() : std::string("fp32 inputs only");
      };
    t.impls.push_back(std::move(i));
  };
  impl("reference", Role::reference, Backend::cpu, "plain loops, float64 accumulation", make_reference, true);
  impl("openblas", Role::vendor, Backend::cpu, "OpenBLAS sgemm", make_openblas, true);
  impl("cuda-naive", Role::reference, Backend::cuda, "shared-memory tiled kernel, fp32 accumulation", make_cuda_naive, false);
  impl("cublas", Role::vendor, Backend::cuda, "cublasGemmEx, fp32 compute", make_cublas, false);
  r.add(std::move(t));
}

#ifndef MEMTRADE_WITH_CUDA
// Without the CUDA backend the CUDA implementations stay listed and record "skipped" with the reason.
std::unique_ptr<Workload> make_cuda_naive(const GemmProblem&, Device&) { throw Skip(cuda_status().reason); }
std::unique_ptr<Workload> make_cublas(const GemmProblem&, Device&) { throw Skip(cuda_status().reason); }
#endif

}  // namespace memtrade::gemm
