// The training step's GEMM for 16-bit operands (the bf16-mixed, fp16-mixed and bf16-pure policies), in
// portable SIMD (Google Highway: every target built, the best one chosen at run time).
//
// The BLAS multiplies fp32 only (Debian's OpenBLAS is built without sbgemm). Here the operands are widened
// while they are packed: A into blocks of MR rows stored column by column, B into panels of two vectors'
// columns (at most kGemm16Panel), and a register-blocked kernel (MR rows x 2 vectors of fp32
// accumulators) streams them. Products and sums are fp32, fused multiply-adds where the target has them;
// each element of C is summed over k in order, by one thread, so the result does not depend on the thread
// count, and is the same on every target with FMA.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade::simd {

constexpr int64_t kGemm16Panel = 32;   // B's columns per packed panel at most (two vectors; zero-padded)
constexpr int64_t kGemm16KBlock = 512;  // k per packed block of B

// Floats of workspace gemm16 needs: the widened A (m x k), and B's packed block.
int64_t gemm16_a_floats(int64_t m, int64_t k);
int64_t gemm16_b_floats(int64_t n, int64_t k);

// C[m x n] = op(A) op(B), or C += op(A) op(B) when acc (C's row stride ldc). op(A) is m x k (A is [k x m]
// when ta), op(B) k x n (B is [n x k] when tb), row-major with row strides lda, ldb. wa, wb:
// gemm16_a_floats and gemm16_b_floats floats. threads: the OpenMP team's size.
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
            int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads);
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
            int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads);
// The same with C in the operands' type: each element rounded once, from the fp32 sum (plus C's old value
// when acc). k at most kGemm16KBlock (memtrade::Error otherwise).
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
            int64_t ldb, bf16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads);
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
            int64_t ldb, f16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads);

}  // namespace memtrade::simd
