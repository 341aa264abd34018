// GEMM through OpenBLAS, row-major, for every CPU technique and the probe.
#pragma once

#include <cstdint>

namespace memtrade::blas {

// C[m x n] = alpha * op(A) * op(B) + beta * C, fp32, row-major; op(A) is m x k, op(B) is k x n.
// OpenBLAS allocates its own packing buffers: those bytes are not in the tracked pools.
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The number of threads OpenBLAS uses.
int threads();

}  // namespace memtrade::blas

namespace memtrade::blas {
// The same in float64 (oracles).
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc);
}  // namespace memtrade::blas
