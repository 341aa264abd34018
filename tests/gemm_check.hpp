// Shared by the CPU and CUDA GEMM tests: a case, and the error of a plain same-precision reference
// (fp32 accumulation, output rounded to the case dtype) for the FlashAttention-style tolerance rule.
#pragma once

#include "impls/gemm/gemm.hpp"

namespace memtrade::test {

inline Case gemm_case(int64_t m, int64_t n, int64_t k, const char* dtype) {
  Case c;
  c.suite = "gemm";
  c.params = Json{{"m", m}, {"n", n}, {"k", k}, {"dtype", dtype}};
  c.id = "m=" + std::to_string(m) + ",n=" + std::to_string(n) + ",k=" + std::to_string(k) + "," + dtype;
  c.x = static_cast<double>(n);
  return c;
}

inline ErrorStats same_precision_reference_error(const gemm::GemmProblem& p) {
  const auto [m, n, k] = p.s;
  std::vector<double> out(p.rows.size() * n);
  for (std::size_t r = 0; r < p.rows.size(); ++r)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      for (int64_t q = 0; q < k; ++q)
        acc += static_cast<float>(p.a[p.rows[r] * k + q]) * static_cast<float>(p.b[q * n + j]);
      out[r * n + j] = p.dtype == DType::f32    ? acc
                       : p.dtype == DType::bf16 ? to_f32(to_bf16(acc))
                                                : to_f32(to_f16(acc));
    }
  return error_stats(out, p.oracle);
}

}  // namespace memtrade::test
