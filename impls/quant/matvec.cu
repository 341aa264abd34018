// CUDA quantized matvec y = deq(W) x: the launchers of matvec_kernels.cuh's kernels.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "harness/cuda_device.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/matvec.hpp"
#include "impls/quant/matvec_kernels.cuh"

namespace memtrade::quant {

namespace {

using namespace matvec_kernels;

template <Format F>
void launch(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, cudaStream_t stream) {
  if (rows_kernel_fits<F>(L, d_blob, d_x)) {
    const auto blocks = static_cast<unsigned>((L.rows + kBlockRows - 1) / kBlockRows);
    matvec_rows_kernel<F><<<blocks, kRowThreads, 0, stream>>>(L, d_blob, d_x, d_y);
  } else {
    const auto blocks = static_cast<unsigned>((L.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    matvec_any_kernel<F><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(L, d_blob, d_x, d_y);
  }
}

template <class W>
void launch_dense(const W* w, const float* x, float* y, int64_t N, int64_t K, cudaStream_t stream) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_cuda: empty matrix");
  if (!w || !x || !y) throw Error("matvec_dense_cuda: null pointer");
  constexpr int64_t E = 16 / sizeof(W);
  const bool chunks = K % E == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  if (chunks)
    matvec_dense_kernel<W><<<static_cast<unsigned>((N + kBlockRows - 1) / kBlockRows), kRowThreads, 0, stream>>>(w, x, y, N, K);
  else
    matvec_dense_any_kernel<W><<<static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(w, x, y, N, K);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("matvec_dense_cuda: launch failed: ") + cudaGetErrorString(e));
}

}  // namespace

void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, CUstream_st* stream) {
  if (L.rows <= 0 || L.cols <= 0) throw Error("matvec_cuda: empty layout");
  if (!d_blob || !d_x || !d_y) throw Error("matvec_cuda: null pointer");
  if (L.rows > int64_t{2147483647} * kWarpsPerBlock) throw Error("matvec_cuda: too many rows for one grid");
  switch (L.spec.format) {
    case Format::int8: launch<Format::int8>(L, d_blob, d_x, d_y, stream); break;
    case Format::int4: launch<Format::int4>(L, d_blob, d_x, d_y, stream); break;
    case Format::int4_asym: launch<Format::int4_asym>(L, d_blob, d_x, d_y, stream); break;
    case Format::fp8_e4m3: launch<Format::fp8_e4m3>(L, d_blob, d_x, d_y, stream); break;
    case Format::fp8_e5m2: launch<Format::fp8_e5m2>(L, d_blob, d_x, d_y, stream); break;
    case Format::nf4: launch<Format::nf4>(L, d_blob, d_x, d_y, stream); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("matvec_cuda: launch failed: ") + cudaGetErrorString(e));
}

void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, Device& dev) {
  matvec_cuda(L, d_blob, d_x, d_y, as_cuda(dev).stream());
}

void matvec_dense_cuda(const float* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev) {
  launch_dense(d_w, d_x, d_y, N, K, as_cuda(dev).stream());
}

void matvec_dense_cuda(const bf16_t* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev) {
  launch_dense(d_w, d_x, d_y, N, K, as_cuda(dev).stream());
}

}  // namespace memtrade::quant
