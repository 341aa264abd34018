// GEMM through cuBLAS, row-major, on a caller's stream and workspace. Callers hand it a buffer from the
// tracked allocator (tag workspace), so cuBLAS's scratch memory is in the peak figures.
#pragma once

#include <cublas_v2.h>

#include <cuda_runtime.h>

#include <cstddef>

#include "common/dtype.hpp"

namespace memtrade {

// A cuBLAS handle bound to a stream and a workspace the caller owns (and keeps alive longer than the
// handle). The handle's own small allocations are not tracked; they show up in the runner's
// cudaMemGetInfo cross-check.
class Cublas {
 public:
  static constexpr std::size_t kDefaultWorkspace = 32u << 20;  // cuBLAS's recommendation for Hopper
  Cublas(cudaStream_t stream, void* workspace, std::size_t workspace_bytes);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  cublasHandle_t get() const { return handle_; }

  // C[m x n] = alpha * op(A) * op(B) + beta * C, row-major. A, B and C share `dtype` (fp32, bf16 or
  // fp16); accumulation is fp32 (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs).
  void gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
            int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc);

 private:
  cublasHandle_t handle_ = nullptr;
};

void cublas_check(cublasStatus_t s, const char* what);

}  // namespace memtrade
