// GEMM, the first technique: C = A B (row-major, A m x k, B k x n), inputs in fp32, bf16 or fp16, fp32
// accumulation, C in the input dtype.
//   reference (cpu)  plain loops, float64 accumulation
//   openblas  (cpu)  OpenBLAS sgemm (fp32 only)
//   tiled (cuda)     a shared-memory tiled CUDA kernel, fp32 accumulation
//   cublas (cuda)    cublasGemmEx, CUBLAS_COMPUTE_32F
// Case parameters: n (and optionally m, k; both default to n), dtype.
#pragma once

#include <memory>
#include <vector>

#include "harness/registry.hpp"
#include "harness/tensor.hpp"

namespace memtrade::gemm {

struct Shape3 {
  int64_t m, n, k;
};
Shape3 case_shape(const Case& c);

// Host inputs (already rounded to the case dtype, held as float64) and the float64 oracle for a subset
// of output rows: every row when m <= 512, else 128 evenly spaced rows.
struct GemmProblem final : Problem {
  Shape3 s;
  DType dtype;
  std::vector<double> a, b;
  std::vector<int64_t> rows;     // output rows the oracle covers
  std::vector<double> oracle;    // rows.size() x n
};

// The reference implementation's row computation: out[j] = sum_p a_row[p] * b[p, j] in float64, over
// j in [0, n). (The oracle is OpenBLAS's dgemm, a separate code path.)
template <class TA, class TB>
void row_times_matrix_f64(const TA* a_row, const TB* b, int64_t k, int64_t n, double* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = 0;
  for (int64_t p = 0; p < k; ++p) {
    const double av = static_cast<double>(a_row[p]);
    const TB* brow = b + p * n;
    for (int64_t j = 0; j < n; ++j) out[j] += av * static_cast<double>(brow[j]);
  }
}

std::unique_ptr<GemmProblem> prepare(const Case& c);

// Common workload shape: inputs and output on the device; error() reads the output rows the oracle covers.
class GemmWorkload : public Workload {
 public:
  GemmWorkload(const GemmProblem& p, Device& dev);
  ErrorStats error() override;
  Work work() const override;

 protected:
  const GemmProblem& p_;
  Device& dev_;
  Tensor a_, b_, c_;
};

// An implementation that takes fp32 inputs only (the CPU ones).
Impl fp32_only(Impl i);

void register_technique(Registry& r);

}  // namespace memtrade::gemm
