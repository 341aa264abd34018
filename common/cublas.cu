#include "common/cublas.hpp"

namespace memtrade {

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS error in ") + what + ": " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

Cublas::Cublas(cudaStream_t stream, void* workspace, std::size_t workspace_bytes) {
  cublas_check(cublasCreate(&handle_), "cublasCreate");
  cublas_check(cublasSetStream(handle_, stream), "cublasSetStream");
  cublas_check(cublasSetWorkspace(handle_, workspace, workspace_bytes), "cublasSetWorkspace");
}

Cublas::~Cublas() { cublasDestroy(handle_); }

static cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: throw Error("cuBLAS gemm: unsupported dtype " + std::string(dtype_name(t)));
  }
}

void Cublas::gemm(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                  const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const cudaDataType_t t = cuda_type(dtype);
  cublas_check(cublasGemmEx(handle_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                            static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b, t,
                            static_cast<int>(ldb), a, t, static_cast<int>(lda), &beta, c, t, static_cast<int>(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace memtrade
