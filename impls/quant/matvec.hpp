// Quantized matrix-vector and matrix-matrix products: y = deq(W) x and Y = X deq(W)^T, with W a
// quantized [N x K] blob (see formats.hpp). A reference (plain loops, float64 accumulation), an
// optimized CPU path (AVX-512 where available, OpenMP over rows; matmul through OpenBLAS on dequantized
// panels), dense fp32 / bf16 baselines, and a CUDA matvec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.hpp"
#include "impls/quant/formats.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*
namespace memtrade {
class Device;
}

namespace memtrade::quant {

// y[N] = deq(W) x[K]: each dequantized weight (float, as dequantize() gives it) times x, summed in
// float64, rounded to float once. Host.
void matvec_reference(const QLayout& L, const uint8_t* blob, const float* x, float* y);

// Y[M x N] = X[M x K] deq(W)^T, the same way (row-major X and Y). Host.
void matmul_reference(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y);

// Optimized host matvec: every packed byte read once, decoded in registers, fp32 accumulation (the
// group's scale applied once to the group's partial sum), OpenMP over rows. No allocation.
void matvec_cpu(const QLayout& L, const uint8_t* blob, const float* x, float* y);
// Which path matvec_cpu takes for this layout now: "avx512-blocked" (the hand-written 4-bit kernel, where
// compiled in and dispatch is not restricted below AVX-512) or "hwy-<target>" (simd/matvec_simd.hpp).
std::string matvec_cpu_path(const QLayout& L);

// Rows of X up to which matmul_cpu takes its small-batch path.
inline constexpr int64_t kMatmulSmallBatch = 64;
// Which path matmul_cpu takes for M rows of X: "small-batch" or "panels".
std::string matmul_cpu_path(const QLayout& L, int64_t M);
// Rows of W dequantized per panel by matmul_cpu.
int64_t matmul_panel_rows(const QLayout& L);
// Bytes of fp32 workspace matmul_cpu needs (a panel, panel rows x K floats, or for M <= kMatmulSmallBatch
// one small-batch scratch where that is larger); the caller allocates it.
std::size_t matmul_workspace_bytes(const QLayout& L, int64_t M);
// Optimized host matmul. Up to kMatmulSmallBatch rows of X (decode batches): blocks of W's rows decoded
// tile by tile into per-thread scratch in `workspace` and multiplied there with every row of X in fp32
// multiply-adds (simd/matvec_simd.hpp's matmul_small; the codes read once, nothing written to memory but
// the scratch). More rows (prefill): panels of W rows dequantized into `workspace` and multiplied with
// cblas_sgemm into the matching columns of Y. `workspace`: matmul_workspace_bytes, any alignment of a float
// (the same size either way; a workspace too small for one scratch takes the panel path).
void matmul_cpu(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* workspace);

// Dense baselines y[N] = W[N x K] x[K], fp32 accumulation, OpenMP over rows.
void matvec_dense_f32(const float* W, const float* x, float* y, int64_t N, int64_t K);
void matvec_dense_bf16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K);
// Dense small batch Y[M x N] = X[M x K] W^T (accumulate: Y +=), fp32 accumulation (bf16 W widened exactly), for M up to
// kMatmulSmallBatch (decode batches): W read from memory once, where a BLAS sgemm packs all of W for every
// call (SmolLM2's decode at batch 4 spent 43% of its samples in OpenBLAS's packing). Host.
void matmul_dense_f32(const float* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate = false);
void matmul_dense_bf16(const bf16_t* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate = false);

// CUDA matvec (matvec.cu, kernels in matvec_kernels.cuh): d_blob, d_x, d_y in device memory; asynchronous
// on `stream`. Rows in 16-byte-aligned chunks: 8 rows per block of 256 threads, each thread loading a chunk
// of 16 codes of all 8 rows and decoding them in registers (integer codes through float bits); otherwise
// one warp per row, code by code through the formats.hpp functions. fp32 accumulation, warp-shuffle
// reductions.
void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, CUstream_st* stream);
// The same on a CUDA Device's stream (memtrade::Error for another backend).
void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, Device& dev);
// The dense baselines on the GPU: y = W x with W [N x K] row-major in device memory.
void matvec_dense_cuda(const float* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev);
void matvec_dense_cuda(const bf16_t* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev);

}  // namespace memtrade::quant
