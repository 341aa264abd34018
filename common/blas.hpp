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

// The kernel set OpenBLAS chose for this CPU ("SkylakeX", "Haswell", ...; its DYNAMIC_ARCH build picks one
// when the library loads).
const char* core();

// OpenBLAS builds older than the CPU do not recognize it and fall back to their generic SSE3 kernels
// (OpenBLAS 0.3.21, Debian 12's, names a Sapphire Rapids Xeon "Prescott": its sgemm runs several times
// slower than the AVX-512 kernels the CPU can run). The library reads $OPENBLAS_CORETYPE only when it
// loads, so a program that calls this first thing in main() is started again, once, with the variable set
// to the widest kernel set the CPU supports (SkylakeX for AVX-512, Haswell for AVX2 + FMA). Nothing happens
// when the variable is set already, when OpenBLAS recognized the CPU, or when the CPU has neither.
void use_the_cpus_kernels(char** argv);

}  // namespace memtrade::blas

namespace memtrade::blas {
// The same in float64 (oracles).
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc);
}  // namespace memtrade::blas
