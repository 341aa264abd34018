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
  // The implementations register themselves (reference.cpp, openblas.cpp, tiled.cu, cublas.cu).
  r.add(std::move(t));
}


Impl fp32_only(Impl i) {
  i.not_applicable = [](const Case& c) { return c.text("dtype") == "fp32" ? std::string() : std::string("fp32 inputs only"); };
  return i;
}

}  // namespace memtrade::gemm
