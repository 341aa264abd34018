#include "impls/gemm/gemm.hpp"

namespace memtrade::gemm {

void register_technique(Registry& r) {
  Technique t;
  t.name = "gemm";
  t.description = "dense matrix multiply C = A B with fp32 accumulation";
  t.validate = [](const Case& c) { case_shape(c); };
  t.schema.params = {
      int_param("n", "columns of C (and m, k unless given)"),
      int_param("m", "rows of C", derived("n")),
      int_param("k", "inner dimension", derived("n")),
      text_param("dtype", "input and output dtype (fp32 accumulation)", nullptr, {"fp32", "bf16", "fp16"}),
  };
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
  impl("reference", Role::reference, Backend::cpu, "plain loops, float64 accumulation", make_reference_cpu, true);
  impl("openblas", Role::vendor, Backend::cpu, "OpenBLAS sgemm", make_openblas_cpu, true);
  impl("tiled", Role::reference, Backend::cuda, "shared-memory tiled kernel, fp32 accumulation", MT_CUDA_FACTORY(make_tiled_cuda), false);
  impl("cublas", Role::vendor, Backend::cuda, "cublasGemmEx, fp32 compute", MT_CUDA_FACTORY(make_cublas_cuda), false);
  r.add(std::move(t));
}


}  // namespace memtrade::gemm
