// GEMM through OpenBLAS, row-major, for every CPU technique and the probe.
#pragma once

#include <cstdint>
#include <string>

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

// "" unless OpenBLAS runs kernels narrower than this x86 CPU's widest SIMD (AVX2 or older kernels on an
// AVX-512 CPU, pre-AVX2 ones on an AVX2 + FMA CPU), as when $OPENBLAS_CORETYPE names an older core: then
// a sentence that says so, for the run's output and its results (every OpenBLAS GEMM, the probed sgemm
// ceiling included, is then a figure of the narrower kernels).
std::string narrower_kernels_note();
// The same for a given kernel set, CPU SIMD level (3 AVX-512, 2 AVX2 + FMA, 1 older) and value of
// $OPENBLAS_CORETYPE (nullptr: unset).
std::string narrower_kernels_note(const std::string& core, int cpu_level, const char* coretype_env);

}  // namespace memtrade::blas

namespace memtrade::blas {
// The same in float64 (oracles).
void dgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
           const double* b, int64_t ldb, double beta, double* c, int64_t ldc);
}  // namespace memtrade::blas
